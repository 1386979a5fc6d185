//! What the runtime's benches share: a scratch database of their own.

use sqlx::{Connection, PgPool};
use uuid::Uuid;

/// Creates a database named `<prefix>_<random>` next to `DATABASE_URL`'s,
/// with the outbox migrations applied; returns a pool of `connections` and
/// its name (for [`drop_database`]).
pub(crate) async fn scratch_database(prefix: &str, connections: u32) -> (PgPool, String) {
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let name = format!("{prefix}_{}", Uuid::new_v4().simple());
    let mut admin = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut admin)
        .await
        .unwrap();
    let pool = connect(&name, connections).await;
    txoutbox_runtime::migrations::run(&pool).await.unwrap();
    (pool, name)
}

/// A pool of `connections` to database `name` on `DATABASE_URL`'s server.
#[allow(dead_code)] // not every bench reconnects
pub(crate) async fn connect(name: &str, connections: u32) -> PgPool {
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let options: sqlx::postgres::PgConnectOptions = url.parse().unwrap();
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(connections)
        .connect_with(options.database(name))
        .await
        .unwrap()
}

/// Drops a database made by [`scratch_database`].
pub(crate) async fn drop_database(name: &str) {
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let mut admin = sqlx::PgConnection::connect(&url).await.unwrap();
    let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .execute(&mut admin)
    .await;
}
