//! The retention job: deletes rows that finished their life long enough ago,
//! in bounded batches.
//!
//! Each batch is one statement (its own short transaction) that locks at most
//! `batch_size` rows with `FOR UPDATE SKIP LOCKED` and re-checks the eligibility
//! condition as it deletes, so it never waits for (or blocks) a relay or a
//! consumer and never removes a row that is not finished: an unpublished or
//! parked outbox row, an unprocessed inbox row. Batches walk the primary key in
//! order (keyset pagination), so no batch rescans what earlier ones deleted.
//!
//! On MariaDB (feature `mysql`, SQL in the child module `mysql`) every
//! target runs alike: each batch is chosen with a plain read, then its rows
//! are locked by primary key `FOR UPDATE SKIP LOCKED` and deleted.
//!
//! ```no_run
//! # async fn run(pool: sqlx::PgPool) -> Result<(), txoutbox_runtime::ops::OpsError> {
//! use chrono::{TimeDelta, Utc};
//! use txoutbox_runtime::ops::cleanup::{Purge, Target};
//!
//! let cutoff = Utc::now() - TimeDelta::days(7);
//! let mut purge = Purge::new(Target::PublishedOutbox, cutoff).batch_size(5_000);
//! let deleted = purge.run(&pool, |_batch| {}).await?;
//! println!("deleted {deleted} published outbox rows older than 7 days");
//! # Ok(()) }
//! ```

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use sqlx::postgres::PgRow;
use uuid::Uuid;

use super::{Database, OpsError};

#[cfg(feature = "mysql")]
mod mysql;

/// A kind of finished row the retention job removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// `outbox_event` rows published before the cutoff (never parked ones).
    PublishedOutbox,
    /// `outbox_event` dead letters an operator discarded before the cutoff.
    DiscardedOutbox,
    /// `processed_event` dedup rows processed before the cutoff.
    ProcessedEvent,
    /// `inbox_event` rows processed before the cutoff.
    ProcessedInbox,
    /// `inbox_event` dead letters an operator discarded before the cutoff.
    DiscardedInbox,
    /// `saga_state` rows of sagas that finished (completed or compensated)
    /// before the cutoff; running sagas are never removed.
    FinishedSaga,
}

impl Target {
    /// Every target, in the order the CLI runs them.
    pub const ALL: [Target; 6] = [
        Target::PublishedOutbox,
        Target::DiscardedOutbox,
        Target::ProcessedEvent,
        Target::ProcessedInbox,
        Target::DiscardedInbox,
        Target::FinishedSaga,
    ];

    fn sql(self) -> TargetSql {
        // `$1` is the cutoff. Conditions use the alias `t` and are evaluated
        // twice per batch: when choosing rows and again when deleting them.
        match self {
            Target::PublishedOutbox => TargetSql {
                table: "outbox_event",
                key: Key::Id,
                condition: "t.published_at < $1 AND t.parked_at IS NULL",
            },
            Target::DiscardedOutbox => TargetSql {
                table: "outbox_event",
                key: Key::Id,
                // A discarded row is always parked: saying so lets the
                // scan use ix_outbox_event_parked (migration 0010 took
                // parked rows out of ix_outbox_event_unpublished).
                condition: "t.discarded_at < $1 AND t.published_at IS NULL AND t.parked_at IS NOT NULL",
            },
            Target::ProcessedEvent => TargetSql {
                table: "processed_event",
                key: Key::GroupAndEventId,
                condition: "t.processed_at < $1",
            },
            // The inbox's key is the group's and the event id: an event id
            // is in the table once per consumer group that received it.
            Target::ProcessedInbox => TargetSql {
                table: "inbox_event",
                key: Key::GroupAndEventId,
                condition: "t.processed AND t.processed_at < $1",
            },
            Target::DiscardedInbox => TargetSql {
                table: "inbox_event",
                key: Key::GroupAndEventId,
                condition: "t.discarded_at < $1 AND NOT t.processed",
            },
            Target::FinishedSaga => TargetSql {
                table: "saga_state",
                key: Key::SagaTypeAndId,
                condition: "t.finished_at < $1",
            },
        }
    }
}

struct TargetSql {
    table: &'static str,
    key: Key,
    condition: &'static str,
}

/// A table's primary key: batches walk it in order, and the last row of a
/// batch is where the next one starts, so it must be the whole key (a part
/// of it would pass over the rows that share it with a batch's last one).
#[derive(Clone, Copy)]
enum Key {
    Id,
    GroupAndEventId,
    SagaTypeAndId,
}

impl Key {
    fn columns(self) -> &'static str {
        match self {
            Key::Id => "id",
            Key::GroupAndEventId => "consumer_group, event_id",
            Key::SagaTypeAndId => "saga_type, saga_id",
        }
    }

    fn qualified(self, alias: &str) -> String {
        self.columns()
            .split(", ")
            .map(|c| format!("{alias}.{c}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The keyset condition "after the cursor", with parameters from `$3`.
    fn after(self) -> &'static str {
        match self {
            Key::Id => "t.id > $3",
            Key::GroupAndEventId => "(t.consumer_group, t.event_id) > ($3, $4)",
            Key::SagaTypeAndId => "(t.saga_type, t.saga_id) > ($3, $4)",
        }
    }
}

/// Where the previous batch stopped.
#[derive(Debug, Clone)]
enum Cursor {
    Start,
    Id(i64),
    GroupAndEventId(String, Uuid),
    SagaTypeAndId(String, String),
    /// Where a pass on MariaDB stopped.
    #[cfg(feature = "mysql")]
    MySql(mysql::Position),
    Done,
}

/// Counts the rows of `target` finished before `cutoff` (what a purge would
/// delete right now).
pub async fn count<'a>(
    database: impl Into<Database<'a>>,
    target: Target,
    cutoff: DateTime<Utc>,
) -> Result<i64, OpsError> {
    match database.into() {
        Database::Postgres(pool) => count_postgres(pool, target, cutoff).await,
        #[cfg(feature = "mysql")]
        Database::MySql(pool) => mysql::count(pool, target, cutoff).await,
    }
}

async fn count_postgres(
    pool: &PgPool,
    target: Target,
    cutoff: DateTime<Utc>,
) -> Result<i64, OpsError> {
    let TargetSql {
        table, condition, ..
    } = target.sql();
    let count = sqlx::query_scalar(super::trusted(format!(
        "SELECT count(*) FROM {table} t WHERE {condition}"
    )))
    .bind(cutoff)
    .fetch_one(pool)
    .await?;
    Ok(count)
}

/// One retention pass over one [`Target`], batch by batch.
#[derive(Debug, Clone)]
pub struct Purge {
    target: Target,
    cutoff: DateTime<Utc>,
    batch_size: i64,
    cursor: Cursor,
}

impl Purge {
    /// Default rows per batch: large enough to amortize the round trip, small
    /// enough that a batch's transaction stays in the tens of milliseconds.
    pub const DEFAULT_BATCH_SIZE: i64 = 1_000;

    /// A purge of the rows of `target` finished before `cutoff`, with
    /// [`Self::DEFAULT_BATCH_SIZE`].
    pub fn new(target: Target, cutoff: DateTime<Utc>) -> Self {
        Self {
            target,
            cutoff,
            batch_size: Self::DEFAULT_BATCH_SIZE,
            cursor: Cursor::Start,
        }
    }

    /// Sets the most rows one batch deletes (at least 1).
    pub fn batch_size(mut self, rows: i64) -> Self {
        self.batch_size = rows.max(1);
        self
    }

    /// Whether the pass reached the end of the table.
    pub fn is_done(&self) -> bool {
        matches!(self.cursor, Cursor::Done)
    }

    /// Deletes the next batch and returns how many rows it deleted (`0` once
    /// [`Self::is_done`]). Rows locked by someone else are skipped: a later run
    /// takes them.
    pub async fn step<'a>(&mut self, database: impl Into<Database<'a>>) -> Result<u64, OpsError> {
        match database.into() {
            Database::Postgres(pool) => self.step_postgres(pool).await,
            #[cfg(feature = "mysql")]
            Database::MySql(pool) => self.step_mysql(pool).await,
        }
    }

    async fn step_postgres(&mut self, pool: &PgPool) -> Result<u64, OpsError> {
        let TargetSql {
            table,
            key,
            condition,
        } = self.target.sql();
        let after = match self.cursor {
            Cursor::Done => return Ok(0),
            Cursor::Start => "TRUE",
            // A pass begun on MariaDB, continued here: from the start.
            #[cfg(feature = "mysql")]
            Cursor::MySql(_) => "TRUE",
            _ => key.after(),
        };
        let columns = key.columns();
        let (doomed, matched) = (key.qualified("d"), key.qualified("t"));
        let sql = format!(
            "WITH doomed AS (
                 SELECT {matched} FROM {table} t
                 WHERE {after} AND {condition}
                 ORDER BY {matched} LIMIT $2
                 FOR UPDATE SKIP LOCKED),
             deleted AS (
                 DELETE FROM {table} t USING doomed d
                 WHERE ({matched}) = ({doomed}) AND {condition}
                 RETURNING 1)
             SELECT (SELECT count(*) FROM doomed) AS locked,
                    (SELECT count(*) FROM deleted) AS deleted,
                    last.*
             FROM (SELECT {columns} FROM doomed ORDER BY {columns} DESC LIMIT 1) last"
        );
        let mut query = sqlx::query(super::trusted(sql))
            .bind(self.cutoff)
            .bind(self.batch_size);
        query = match &self.cursor {
            Cursor::Id(id) => query.bind(*id),
            Cursor::GroupAndEventId(group, event_id) => query.bind(group.clone()).bind(*event_id),
            Cursor::SagaTypeAndId(saga_type, saga_id) => {
                query.bind(saga_type.clone()).bind(saga_id.clone())
            }
            Cursor::Start | Cursor::Done => query,
            #[cfg(feature = "mysql")]
            Cursor::MySql(_) => query,
        };
        // READ COMMITTED whatever the database's default (see `crate::txn`):
        // under REPEATABLE READ, a row changed after the snapshot would fail
        // the batch instead of being skipped or re-checked.
        let mut tx = crate::txn::begin(pool).await?;
        let row = query.fetch_optional(&mut *tx).await?;
        tx.commit().await?;
        let Some(row) = row else {
            self.cursor = Cursor::Done;
            return Ok(0);
        };
        let (locked, deleted, next) = decode(&row, key)?;
        self.cursor = if locked < self.batch_size {
            Cursor::Done
        } else {
            next
        };
        Ok(deleted as u64)
    }

    /// The next batch on MariaDB: chosen after where the previous one
    /// stopped, locked `FOR UPDATE SKIP LOCKED`, deleted.
    #[cfg(feature = "mysql")]
    async fn step_mysql(&mut self, pool: &sqlx::MySqlPool) -> Result<u64, OpsError> {
        let after = match &self.cursor {
            Cursor::Done => return Ok(0),
            Cursor::MySql(position) => Some(position),
            // Start, or a pass begun on PostgreSQL: from the start.
            _ => None,
        };
        let batch = mysql::step(pool, self.target, self.cutoff, self.batch_size, after).await?;
        self.cursor = match batch.last {
            Some(last) if batch.chosen >= self.batch_size => Cursor::MySql(last),
            _ => Cursor::Done,
        };
        Ok(batch.deleted)
    }

    /// Runs batches until the end of the table, calling `on_batch` with each
    /// batch's deleted count, and returns the total deleted.
    pub async fn run<'a>(
        &mut self,
        database: impl Into<Database<'a>>,
        mut on_batch: impl FnMut(u64),
    ) -> Result<u64, OpsError> {
        let database = database.into();
        let mut total = 0;
        while !self.is_done() {
            let deleted = self.step(database).await?;
            total += deleted;
            on_batch(deleted);
        }
        Ok(total)
    }
}

fn decode(row: &PgRow, key: Key) -> Result<(i64, i64, Cursor), sqlx::Error> {
    use sqlx::Row;
    let locked: i64 = row.try_get("locked")?;
    let deleted: i64 = row.try_get("deleted")?;
    let next = match key {
        Key::Id => Cursor::Id(row.try_get("id")?),
        Key::GroupAndEventId => {
            Cursor::GroupAndEventId(row.try_get("consumer_group")?, row.try_get("event_id")?)
        }
        Key::SagaTypeAndId => {
            Cursor::SagaTypeAndId(row.try_get("saga_type")?, row.try_get("saga_id")?)
        }
    };
    Ok((locked, deleted, next))
}
