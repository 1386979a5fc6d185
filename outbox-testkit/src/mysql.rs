//! Scratch databases on the MySQL / MariaDB server of `MYSQL_URL` (default
//! `mysql://root@127.0.0.1:3306/test`, the machine's MariaDB), for the
//! MySQL backend's tests and benches.

use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::{ConnectOptions, Connection, MySqlConnection, MySqlPool};

/// `MYSQL_URL`, else the local MariaDB's `test` database as `root`.
pub fn mysql_url() -> String {
    std::env::var("MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

/// A uniquely named database on the server of [`mysql_url`], with a pool on
/// it; dropped by [`MySqlScratch::drop`]. Migrations are the caller's.
#[derive(Debug)]
pub struct MySqlScratch {
    server: MySqlConnectOptions,
    /// The database's name.
    pub name: String,
    /// A pool on it.
    pub pool: MySqlPool,
}

impl MySqlScratch {
    /// Creates the database and a pool of at most `max_connections` on it.
    ///
    /// # Panics
    /// If the server cannot be reached.
    pub async fn create(max_connections: u32) -> Self {
        let url = mysql_url();
        let server: MySqlConnectOptions = url.parse().expect("MYSQL_URL");
        let name = crate::db::unique_name("outbox_test");
        let mut admin = server.connect().await.unwrap_or_else(|e| {
            panic!("MySQL / MariaDB at {url}: {e} (the machine runs MariaDB at 127.0.0.1:3306)")
        });
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await
            .unwrap();
        admin.close().await.unwrap();
        let pool = MySqlPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(server.clone().database(&name))
            .await
            .unwrap();
        Self { server, name, pool }
    }

    /// The URL of the database (`MYSQL_URL` with this database's name).
    pub fn url(&self) -> String {
        let url = mysql_url();
        let base = url.split('?').next().unwrap_or(&url);
        let server = base.rsplit_once('/').map_or(base, |(server, _)| server);
        format!("{server}/{}", self.name)
    }

    /// The connection settings of the database.
    pub fn options(&self) -> MySqlConnectOptions {
        self.server.clone().database(&self.name)
    }

    /// A connection of its own to the database.
    ///
    /// # Panics
    /// If the server cannot be reached.
    pub async fn connection(&self) -> MySqlConnection {
        self.options().connect().await.unwrap()
    }

    /// Closes the pool and drops the database.
    ///
    /// # Panics
    /// If the server cannot be reached.
    pub async fn drop(self) {
        self.pool.close().await;
        drop_databases(&[&self.name]).await.unwrap();
    }
}

/// Drops each of `names` that exists on the server of [`mysql_url`]. The
/// names are the caller's own (generated or constant): they are not quoted.
pub async fn drop_databases<S: AsRef<str>>(names: &[S]) -> Result<(), sqlx::Error> {
    let server: MySqlConnectOptions = mysql_url().parse()?;
    let mut admin = server.connect().await?;
    for name in names {
        let sql = format!("DROP DATABASE IF EXISTS {}", name.as_ref());
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut admin)
            .await?;
    }
    admin.close().await
}
