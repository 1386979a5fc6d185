//! The database a relay publishes from, as given to [`Relay::builder`](super::Relay::builder).

use sqlx::PgPool;

/// The service's database, as a relay takes it: a `PgPool`, or (feature
/// `mysql`) a `MySqlPool` on MariaDB >= 10.6. Built by `From`, so
/// [`Relay::builder`](super::Relay::builder) takes either pool as it is.
///
/// ```no_run
/// # async fn run(pool: sqlx::PgPool) -> Result<(), txoutbox_runtime::relay::BuildError> {
/// use txoutbox_runtime::relay::{Database, Relay};
///
/// let database = Database::from(pool);
/// let mut kafka = rdkafka::ClientConfig::new();
/// kafka.set("bootstrap.servers", "localhost:9092");
/// let relay = Relay::builder(database, kafka).spawn()?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Database {
    /// PostgreSQL.
    Postgres(PgPool),
    /// MariaDB >= 10.6 (feature `mysql`): lanes are named locks
    /// (`GET_LOCK`), claims `FOR UPDATE SKIP LOCKED` at `READ COMMITTED`;
    /// no `LISTEN`, so commits of other processes are seen within
    /// `poll_interval` (see `docs/mysql.md`).
    #[cfg(feature = "mysql")]
    MySql(sqlx::MySqlPool),
}

impl From<PgPool> for Database {
    fn from(pool: PgPool) -> Self {
        Self::Postgres(pool)
    }
}

#[cfg(feature = "mysql")]
impl From<sqlx::MySqlPool> for Database {
    fn from(pool: sqlx::MySqlPool) -> Self {
        Self::MySql(pool)
    }
}
