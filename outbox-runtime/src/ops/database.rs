//! The database an operator operation runs on: the one seam between the
//! operations and their SQL. Every public operation but `notify` (which
//! takes a `&PgPool`: MariaDB has no `LISTEN` / `NOTIFY`) takes
//! `impl Into<Database<'_>>` (so `&PgPool` and, feature `mysql`,
//! `&MySqlPool` as they are) and matches once, at its entry, on the
//! backend: PostgreSQL's SQL stays in the operation's module, MariaDB's in
//! its child module `mysql`.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::OpsError;

/// The service database an operation reads or changes: a `&PgPool`, or
/// (feature `mysql`) a `&MySqlPool` on MariaDB >= 10.6, where the outbox's
/// own tables (`outbox_event`, `outbox_scheduled`, `outbox_relay_member`,
/// `outbox_replay_run` from MySQL migration 0007), the consumer's
/// (`inbox_event`, `processed_event`, `consumer_dead_letter`, from MySQL
/// migrations 0004 and 0005) and the sagas' (`saga_state`, 0006) are read
/// alike.
///
/// Every operation (but `notify`) takes `impl Into<Database<'_>>`, so
/// callers pass their pool as it is:
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
    /// MariaDB >= 10.6 (feature `mysql`): every operation but `notify`
    /// (which takes a `&PgPool`).
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
    /// Which relays of this process a commit here wakes: those of this
    /// database (by its name).
    pub(crate) fn wakeup_scope(self) -> Option<txoutbox_core::__private::wakeup::Scope> {
        let name = match self {
            Self::Postgres(pool) => pool.connect_options().get_database().map(str::to_owned),
            #[cfg(feature = "mysql")]
            Self::MySql(pool) => pool.connect_options().get_database().map(str::to_owned),
        };
        txoutbox_core::__private::wakeup::Scope::of_database(name.as_deref())
    }

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

/// `bytes` in lowercase hexadecimal, for MariaDB's `UNHEX`.
#[cfg(feature = "mysql")]
pub(super) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut out, b| {
            let _ = write!(out, "{b:02x}");
            out
        })
}

/// Primary keys `(consumer_group, event_id)` of `inbox_event` or
/// `processed_event`, as MariaDB reads a list: a JSON array of `[group,
/// event id]` pairs in hexadecimal (group ids are `VARBINARY`), for
/// [`JSON_KEYS`].
#[cfg(feature = "mysql")]
pub(super) fn json_keys<'a>(keys: impl IntoIterator<Item = (&'a [u8], uuid::Uuid)>) -> String {
    let pairs: Vec<[String; 2]> = keys
        .into_iter()
        .map(|(group, event_id)| [hex(group), hex(event_id.as_bytes())])
        .collect();
    serde_json::to_string(&pairs).expect("strings serialize")
}

/// The rows of a [`json_keys`] list (alias `f`, columns `g` and `e`):
/// join on `t.consumer_group = UNHEX(f.g) AND t.event_id = UNHEX(f.e)`.
#[cfg(feature = "mysql")]
pub(super) const JSON_KEYS: &str = "JSON_TABLE(?, '$[*]' COLUMNS (
             g VARCHAR(2048) CHARACTER SET ascii PATH '$[0]',
             e CHAR(32) CHARACTER SET ascii PATH '$[1]')) f";

/// The consumer groups with rows in `inbox_event`, in byte order: one probe
/// of its primary key per group (a loose index scan), however many rows
/// each holds. Reads of the unfinished inbox rows name them so that
/// `ix_inbox_event_group_processed (consumer_group, processed, ..)` narrows
/// every group to its unprocessed rows (MySQL has no partial index, and no
/// index leads with `processed`).
#[cfg(feature = "mysql")]
pub(super) async fn inbox_groups(pool: &sqlx::MySqlPool) -> sqlx::Result<Vec<Vec<u8>>> {
    sqlx::query_scalar("SELECT DISTINCT consumer_group FROM inbox_event ORDER BY consumer_group")
        .fetch_all(pool)
        .await
}

/// Pushes `t.consumer_group IN (<groups>)` (`FALSE` for no group) to
/// `query`, the groups bound.
#[cfg(feature = "mysql")]
pub(super) fn push_groups(query: &mut sqlx::QueryBuilder<sqlx::MySql>, groups: &[Vec<u8>]) {
    if groups.is_empty() {
        query.push("FALSE");
        return;
    }
    query.push("t.consumer_group IN (");
    let mut list = query.separated(", ");
    for group in groups {
        list.push_bind(group.as_slice());
    }
    query.push(")");
}

/// A group id or a key stored as bytes, read back (the consumer stored
/// UTF-8).
#[cfg(feature = "mysql")]
pub(super) fn text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}
