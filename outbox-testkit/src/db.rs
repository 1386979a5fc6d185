//! Scratch databases on the PostgreSQL server of `DATABASE_URL`, and record
//! counting. (Most tests get their database from `#[sqlx::test]` instead.)

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};
use uuid::Uuid;

/// `DATABASE_URL` (`.cargo/config.toml` sets it), else the local server's
/// `postgres` database as user `postgres`.
pub fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// Scheme, credentials and host of [`database_url`] (`postgres://user@host:port`),
/// without the database name and query string.
pub fn server_url() -> String {
    let url = database_url();
    let base = url.split('?').next().unwrap_or(&url);
    let (server, _database) = base
        .rsplit_once('/')
        .expect("DATABASE_URL names a database");
    server.to_owned()
}

/// The URL of database `name` on the server of [`database_url`].
pub fn url_of(name: &str) -> String {
    format!("{}/{name}", server_url())
}

/// `<prefix>_<random>`: a database name no other test uses.
pub fn unique_name(prefix: &str) -> String {
    format!("{prefix}_{}", Uuid::new_v4().simple())
}

async fn admin() -> Result<PgConnection, sqlx::Error> {
    PgConnection::connect(&database_url()).await
}

/// Creates database `name` on the server of [`database_url`].
///
/// # Panics
/// If the server cannot be reached or the database exists.
pub async fn create_database(name: &str) {
    let mut admin = admin().await.expect("connect to DATABASE_URL");
    let sql = format!("CREATE DATABASE \"{name}\"");
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&mut admin)
        .await
        .unwrap_or_else(|e| panic!("create database {name}: {e}"));
}

/// Drops each of `names` that exists, ending its connections.
pub async fn drop_databases<S: AsRef<str>>(names: &[S]) -> Result<(), sqlx::Error> {
    let mut admin = admin().await?;
    for name in names {
        let sql = format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", name.as_ref());
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut admin)
            .await?;
    }
    Ok(())
}

/// A pool of at most `max_connections` on database `name` of the server of
/// [`database_url`].
///
/// # Panics
/// If no connection can be made within 30 s.
pub async fn connect(name: &str, max_connections: u32) -> PgPool {
    let options: PgConnectOptions = database_url().parse().expect("DATABASE_URL");
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options.database(name))
        .await
        .unwrap_or_else(|e| panic!("connect to database {name}: {e}"))
}

/// A database of its own for a test or bench; [`ScratchDatabase::drop`]
/// removes it.
#[derive(Debug)]
pub struct ScratchDatabase {
    /// Its name, `<prefix>_<random>`.
    pub name: String,
    /// A pool on it.
    pub pool: PgPool,
}

impl ScratchDatabase {
    /// Creates an empty database named [`unique_name`]`(prefix)` and connects
    /// a pool of at most `max_connections` to it.
    pub async fn create(prefix: &str, max_connections: u32) -> Self {
        let name = unique_name(prefix);
        create_database(&name).await;
        let pool = connect(&name, max_connections).await;
        Self { name, pool }
    }

    /// Its URL.
    pub fn url(&self) -> String {
        url_of(&self.name)
    }

    /// Closes the pool and drops the database, ignoring failures.
    pub async fn drop(self) {
        self.pool.close().await;
        let _ = drop_databases(&[&self.name]).await;
    }
}

/// The single `bigint` that `sql` returns (`SELECT count(*) FROM ...`).
///
/// # Panics
/// If the query fails.
pub async fn count(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// The number of rows of `table`.
///
/// # Panics
/// If the query fails.
pub async fn count_rows(pool: &PgPool, table: &str) -> i64 {
    let sql = format!("SELECT count(*) FROM {table}");
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("counting {table}: {e}"))
}
