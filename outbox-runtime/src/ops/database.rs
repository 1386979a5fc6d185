//! The database an operator operation runs on: the one seam between the
//! operations and their SQL. Every public operation takes
//! `impl Into<Database<'_>>` (so `&PgPool` and, feature `mysql`,
//! `&MySqlPool` as they are) and matches once, at its entry, on the
//! backend: PostgreSQL's SQL stays in the operation's module, MariaDB's in
//! its child module `mysql`.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::OpsError;

/// The service database an operation reads or changes: a `&PgPool`, or
/// (feature `mysql`) a `&MySqlPool` on MariaDB >= 10.6, where the outbox's
/// own tables exist (`outbox_event`, `outbox_scheduled`,
/// `outbox_relay_member`) and the consumer tables do not yet.
///
/// Every operation takes `impl Into<Database<'_>>`, so callers pass their
/// pool as it is:
///
/// ```no_run
/// # async fn run(pg: sqlx::PgPool) -> Result<(), txoutbox_runtime::ops::OpsError> {
/// use txoutbox_runtime::ops::status;
///
/// let status = status::collect(&pg, 5).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Database<'a> {
    /// PostgreSQL: every operation.
    Postgres(&'a PgPool),
    /// MariaDB >= 10.6 (feature `mysql`): status, dead letters and
    /// retention of the outbox's own tables; an operation on a consumer
    /// table fails with [`OpsError::PostgresOnly`].
    #[cfg(feature = "mysql")]
    MySql(&'a sqlx::MySqlPool),
}

impl<'a> From<&'a PgPool> for Database<'a> {
    fn from(pool: &'a PgPool) -> Self {
        Self::Postgres(pool)
    }
}

#[cfg(feature = "mysql")]
impl<'a> From<&'a sqlx::MySqlPool> for Database<'a> {
    fn from(pool: &'a sqlx::MySqlPool) -> Self {
        Self::MySql(pool)
    }
}

/// The database a relay was given, for the operations on it.
impl<'a> From<&'a crate::relay::Database> for Database<'a> {
    fn from(database: &'a crate::relay::Database) -> Self {
        match database {
            crate::relay::Database::Postgres(pool) => Self::Postgres(pool),
            #[cfg(feature = "mysql")]
            crate::relay::Database::MySql(pool) => Self::MySql(pool),
        }
    }
}

impl Database<'_> {
    /// The database's clock, in UTC (PostgreSQL's `now()`, MariaDB's
    /// `UTC_TIMESTAMP(6)`): the clock that wrote the tables' timestamps,
    /// for cutoffs such as retention's.
    pub async fn now(self) -> Result<DateTime<Utc>, OpsError> {
        Ok(match self {
            Self::Postgres(pool) => sqlx::query_scalar("SELECT now()").fetch_one(pool).await?,
            #[cfg(feature = "mysql")]
            Self::MySql(pool) => {
                sqlx::query_scalar("SELECT UTC_TIMESTAMP(6)")
                    .fetch_one(pool)
                    .await?
            }
        })
    }
}

/// A transaction of an operation on MariaDB, at `READ COMMITTED` whatever
/// the server's default (InnoDB's is `REPEATABLE READ`): its locking reads
/// lock the rows they return and no gaps. The level is set for this one
/// transaction, in the round trip that starts it.
#[cfg(feature = "mysql")]
pub(super) async fn begin_mysql(
    pool: &sqlx::MySqlPool,
) -> sqlx::Result<sqlx::Transaction<'static, sqlx::MySql>> {
    pool.begin_with("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION")
        .await
}

/// The rows of `ids`, as MariaDB reads a list: a JSON array for
/// `JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT PATH '$'))`.
#[cfg(feature = "mysql")]
pub(super) fn json_ids(ids: &[i64]) -> String {
    serde_json::to_string(ids).expect("integers serialize")
}
