//! What the runtime's benches share: a scratch database of their own (made
//! by `txoutbox-testkit`), with the outbox migrations applied, a backlog of
//! unpublished events, and settings from the environment.
#![allow(dead_code)] // each bench uses some of it

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

/// `name` from the environment as a number, else `default`.
pub(crate) fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Inserts `n` unpublished events of `topic` in one statement (about 250
/// bytes of JSON each, `OrderCreated` of order `order-{g % keys}`), then
/// vacuums and analyzes the table, as a relay's backlog.
pub(crate) async fn outbox_backlog(pool: &PgPool, topic: &str, n: usize, keys: usize) {
    sqlx::query(
        "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type, payload,
                                   topic, partition_key)
         SELECT id, 'Order', k, 'OrderCreated',
                jsonb_build_object('event_id', id, 'order_id', k, 'amount', g,
                                   'currency', 'EUR', 'note', repeat('x', 140)),
                $2, k
         FROM (SELECT gen_random_uuid() AS id, 'order-' || (g % $3) AS k, g
               FROM generate_series(1, $1) AS g) s",
    )
    .bind(n as i64)
    .bind(topic)
    .bind(keys as i64)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("VACUUM ANALYZE outbox_event")
        .execute(pool)
        .await
        .unwrap();
}

/// `(min, median, max)` of `values` (not empty), for the figures of rounds.
pub(crate) fn spread(values: &[f64]) -> (f64, f64, f64) {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    (
        sorted[0],
        sorted[sorted.len() / 2],
        sorted[sorted.len() - 1],
    )
}
