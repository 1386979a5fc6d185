//! What the runtime's benches share: a scratch database of their own (made
//! by `txoutbox-testkit`), with the outbox migrations applied.

use sqlx::PgPool;
use txoutbox_testkit::db::{ScratchDatabase, drop_databases};

/// A pool of connections to a database on `DATABASE_URL`'s server (for a
/// bench that reconnects after changing the database's settings).
#[allow(unused_imports)] // not every bench reconnects
pub(crate) use txoutbox_testkit::db::connect;

/// Creates a database named `<prefix>_<random>` next to `DATABASE_URL`'s,
/// with the outbox migrations applied; returns a pool of `connections` and
/// its name (for [`drop_database`]).
pub(crate) async fn scratch_database(prefix: &str, connections: u32) -> (PgPool, String) {
    let database = ScratchDatabase::create(prefix, connections).await;
    txoutbox_runtime::migrations::run(&database.pool)
        .await
        .unwrap();
    (database.pool, database.name)
}

/// Drops a database made by [`scratch_database`] (failures ignored).
pub(crate) async fn drop_database(name: &str) {
    let _ = drop_databases(&[name]).await;
}
