//! What the outbox, the inbox and the sagas look like right now, and health
//! thresholds on it.
//!
//! On MariaDB (feature `mysql`, SQL in the child module `mysql`) the outbox,
//! its scheduled events, its relays, the inbox, the consumers' dead letters
//! and the sagas are read alike (a schema migrated before the consumer
//! tables names them in [`Status::not_on_this_database`]).
//!
//! ```no_run
//! # async fn run(pool: sqlx::PgPool) -> Result<(), txoutbox_runtime::ops::OpsError> {
//! use std::time::Duration;
//! use txoutbox_runtime::ops::status::{self, Thresholds};
//!
//! let status = status::collect(&pool, 10).await?;
//! let thresholds = Thresholds { max_backlog: Some(10_000), max_age: Some(Duration::from_secs(30)), ..Default::default() };
//! for breach in thresholds.check(&status) {
//!     eprintln!("unhealthy: {breach}");
//! }
//! # Ok(()) }
//! ```

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use super::sagas::{self, SagaTypeOverview};
use super::{Database, OpsError};

#[cfg(feature = "mysql")]
mod mysql;

/// A snapshot of the framework's tables.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    /// The outbox side (`outbox_event`).
    pub outbox: QueueStatus,
    /// The inbox side (`inbox_event`).
    pub inbox: QueueStatus,
    /// Inbox keys whose oldest pending row is of an event type that no
    /// running processor of its group handles: they wait (with every later
    /// row of the key) until a processor that knows the type runs, e.g. the
    /// new version during a rolling deploy that adds a handler.
    pub inbox_unclaimed: Vec<UnclaimedKeys>,
    /// Size of each framework table (`outbox_scheduled`, the scheduled
    /// events not due yet, from migration 0007 on).
    pub tables: Vec<TableSize>,
    /// The relays running against this database (empty before migration 6).
    pub relays: Vec<RelayMember>,
    /// Sagas per type (empty before migration 8, or without sagas).
    pub sagas: Vec<SagaTypeOverview>,
    /// Messages consumers could not publish to their dead-letter topics,
    /// kept in `consumer_dead_letter` (migration 9).
    pub consumer_dead_letters: ConsumerDeadLetters,
    /// The framework's tables this database does not have, so the parts
    /// above that read them are left empty, not measured, and their
    /// thresholds cannot be exceeded: on MariaDB, a schema migrated before
    /// MySQL migrations 0004, 0005 and 0006 lacks `processed_event` and
    /// `consumer_dead_letter` ([`Self::consumer_dead_letters`] empty),
    /// `inbox_event` ([`Self::inbox`] all zeros, [`Self::inbox_unclaimed`]
    /// empty) and `saga_state` ([`Self::sagas`] empty) until `outbox
    /// migrate`. Empty on PostgreSQL and on a migrated MariaDB (and then
    /// left out of the JSON).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_on_this_database: Vec<&'static str>,
}

/// Dead letters that their topic refused (missing, not writable, too
/// large for it), kept in `consumer_dead_letter` by the consumers.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ConsumerDeadLetters {
    /// Rows not republished yet.
    pub unpublished: i64,
    /// When the oldest of them was kept.
    pub oldest_parked_at: Option<DateTime<Utc>>,
    /// Up to the sample size of them, oldest first.
    pub rows: Vec<ConsumerDeadLetterRow>,
}

/// One message a consumer could not dead-letter.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct ConsumerDeadLetterRow {
    /// The row's id.
    pub id: i64,
    /// The consumer group that set the message aside.
    pub consumer_group: String,
    /// Where the message was read.
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Why it was set aside (a `dlq_reason`, e.g. `not_json`).
    pub reason: String,
    /// The error that set it aside.
    pub error: String,
    /// The dead-letter topic that refused it.
    pub dead_letter_topic: String,
    /// Why the dead-letter topic refused it.
    pub publish_error: String,
    /// When it was kept here.
    pub parked_at: DateTime<Utc>,
}

pub use crate::relay::membership::{HeldTopic, RelayMember};

/// Counts of one queue table (`outbox_event` or `inbox_event`).
///
/// "Pending" means waiting for the relay (outbox: `published_at IS NULL`) or
/// the processor (inbox: `NOT processed`) and not parked.
#[derive(Debug, Clone, Serialize)]
pub struct QueueStatus {
    /// Pending rows.
    pub pending: i64,
    /// When the oldest pending row was written (`created_at` / `received_at`).
    pub oldest_pending_at: Option<DateTime<Utc>>,
    /// Age of the oldest pending row in seconds, by the database clock.
    pub oldest_pending_age_secs: Option<f64>,
    /// Pending rows per topic (the inbox's topic column may be null).
    pub topics: Vec<TopicBacklog>,
    /// Pending rows that failed at least once and wait for a retry.
    pub failing: i64,
    /// Up to the sample size of the failing rows, oldest first.
    pub failing_rows: Vec<ProblemRow>,
    /// Parked rows (dead letters) not discarded.
    pub parked: i64,
    /// Up to the sample size of the parked rows, oldest first.
    pub parked_rows: Vec<ProblemRow>,
    /// Parked rows an operator discarded, kept until retention removes them.
    pub discarded: i64,
}

/// Backlog of one topic.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct TopicBacklog {
    /// The topic (`None` for inbox rows written without one).
    pub topic: Option<String>,
    /// Pending rows of the topic.
    pub pending: i64,
    /// When its oldest pending row was written.
    pub oldest_pending_at: Option<DateTime<Utc>>,
}

/// A failing or parked row.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct ProblemRow {
    /// `outbox_event.id` (`None` for inbox rows, whose key is the event id).
    pub id: Option<i64>,
    /// The event id.
    pub event_id: Uuid,
    /// Topic, when known.
    pub topic: Option<String>,
    /// Event type, when known.
    pub event_type: Option<String>,
    /// Failed attempts so far.
    pub attempts: i32,
    /// The last failure's message.
    pub last_error: Option<String>,
    /// When the row was written (`created_at` / `received_at`).
    pub written_at: DateTime<Utc>,
    /// When it was parked, for parked rows.
    pub parked_at: Option<DateTime<Utc>>,
    /// When the next attempt is due, for failing rows.
    pub next_attempt_at: Option<DateTime<Utc>>,
}

pub use crate::consumer::inbox::unclaimed::UnclaimedKeys;

/// Size of one table.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct TableSize {
    /// Table name.
    pub table: String,
    /// Row count: the planner's estimate (`pg_class.reltuples`, summed over
    /// the partitions of a partitioned table; cheap on huge tables), or an
    /// exact count when the table was never analyzed.
    pub rows: i64,
    /// Whether `rows` is an estimate.
    pub estimated: bool,
    /// Bytes on disk including indexes and TOAST.
    pub total_bytes: i64,
}

/// Reads the status of the framework's tables, with up to `sample` example
/// rows of each problem list: on a `&PgPool`, or (feature `mysql`) a
/// `&MySqlPool`, where the consumer tables of a schema migrated before them
/// are listed in [`Status::not_on_this_database`] instead.
pub async fn collect<'a>(
    database: impl Into<Database<'a>>,
    sample: i64,
) -> Result<Status, OpsError> {
    match database.into() {
        Database::Postgres(pool) => collect_postgres(pool, sample).await,
        #[cfg(feature = "mysql")]
        Database::MySql(pool) => mysql::collect(pool, sample).await,
    }
}

async fn collect_postgres(pool: &PgPool, sample: i64) -> Result<Status, OpsError> {
    let outbox = queue_status(pool, &OUTBOX, sample).await?;
    let inbox = queue_status(pool, &INBOX, sample).await?;
    let inbox_unclaimed = crate::consumer::inbox::unclaimed::inbox_unclaimed(pool, None).await?;
    let mut tables = Vec::new();
    for table in ["outbox_event", "inbox_event", "processed_event"] {
        tables.push(table_size(pool, table).await?);
    }
    // Scheduled events not due yet (migration 0007; absent before it).
    let scheduled: bool = sqlx::query_scalar("SELECT to_regclass('outbox_scheduled') IS NOT NULL")
        .fetch_one(pool)
        .await?;
    if scheduled {
        tables.insert(1, table_size(pool, "outbox_scheduled").await?);
    }
    let relays = crate::relay::members(pool).await?;
    let sagas = sagas::overview(pool).await?;
    let consumer_dead_letters = consumer_dead_letters(pool, sample).await?;
    if consumer_dead_letters.unpublished > 0 {
        tables.push(table_size(pool, "consumer_dead_letter").await?);
    }
    Ok(Status {
        outbox,
        inbox,
        inbox_unclaimed,
        tables,
        relays,
        sagas,
        consumer_dead_letters,
        not_on_this_database: Vec::new(),
    })
}

/// The consumers' unpublished dead letters (none before migration 9).
async fn consumer_dead_letters(
    pool: &PgPool,
    sample: i64,
) -> Result<ConsumerDeadLetters, OpsError> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('consumer_dead_letter') IS NOT NULL")
        .fetch_one(pool)
        .await?;
    if !exists {
        return Ok(ConsumerDeadLetters::default());
    }
    let (unpublished, oldest_parked_at): (i64, Option<DateTime<Utc>>) = sqlx::query_as(
        "SELECT count(*), min(parked_at) FROM consumer_dead_letter WHERE republished_at IS NULL",
    )
    .fetch_one(pool)
    .await?;
    let rows = sqlx::query_as(
        r#"SELECT id, consumer_group, topic, "partition" AS partition, "offset" AS offset, reason,
                  error, dead_letter_topic, publish_error, parked_at
           FROM consumer_dead_letter WHERE republished_at IS NULL
           ORDER BY parked_at, id LIMIT $1"#,
    )
    .bind(sample)
    .fetch_all(pool)
    .await?;
    Ok(ConsumerDeadLetters {
        unpublished,
        oldest_parked_at,
        rows,
    })
}

/// The column names that differ between the two queue tables.
struct QueueSql {
    table: &'static str,
    id: &'static str,
    written_at: &'static str,
    /// Rows the relay / processor has not finished (parked or not). Every
    /// query adds whether it means the pending or the parked ones: each of
    /// the two has a partial index of its own (outbox:
    /// `ix_outbox_event_unpublished` and `ix_outbox_event_parked`), so every
    /// query stays on a small set.
    unfinished: &'static str,
}

const OUTBOX: QueueSql = QueueSql {
    table: "outbox_event",
    id: "id",
    written_at: "created_at",
    unfinished: "published_at IS NULL",
};

const INBOX: QueueSql = QueueSql {
    table: "inbox_event",
    id: "NULL::int8",
    written_at: "received_at",
    unfinished: "NOT processed",
};

async fn queue_status(pool: &PgPool, q: &QueueSql, sample: i64) -> Result<QueueStatus, OpsError> {
    let QueueSql {
        table,
        id,
        written_at,
        unfinished,
    } = q;
    let topics: Vec<TopicBacklog> = sqlx::query_as(super::trusted(format!(
        "SELECT topic, count(*)::int8 AS pending, min({written_at}) AS oldest_pending_at
         FROM {table} WHERE {unfinished} AND parked_at IS NULL
         GROUP BY topic ORDER BY topic"
    )))
    .fetch_all(pool)
    .await?;
    let (oldest_pending_at, oldest_pending_age_secs): (Option<DateTime<Utc>>, Option<f64>) =
        sqlx::query_as(super::trusted(format!(
            "SELECT min({written_at}), EXTRACT(EPOCH FROM now() - min({written_at}))::float8
             FROM {table} WHERE {unfinished} AND parked_at IS NULL"
        )))
        .fetch_one(pool)
        .await?;
    let parked_condition = super::PARKED_NOT_DISCARDED;
    // One count per partial index: pending rows (the relay's or the
    // processor's hot set) and parked ones are indexed apart, and no index
    // holds both (migration 0010), so a single scan over `{unfinished}`
    // would read the whole table. A discarded row is always parked.
    let (failing, parked, discarded): (i64, i64, i64) = sqlx::query_as(super::trusted(format!(
        "SELECT (SELECT count(*) FROM {table}
                 WHERE {unfinished} AND parked_at IS NULL AND attempts > 0),
                (SELECT count(*) FROM {table} WHERE {unfinished} AND {parked_condition}),
                (SELECT count(*) FROM {table}
                 WHERE {unfinished} AND parked_at IS NOT NULL AND discarded_at IS NOT NULL)"
    )))
    .fetch_one(pool)
    .await?;
    let rows = |which: &str| {
        format!(
            "SELECT {id} AS id, event_id, topic, event_type, attempts, last_error,
                    {written_at} AS written_at, parked_at, next_attempt_at
             FROM {table} WHERE {unfinished} AND {which}
             ORDER BY {written_at} LIMIT $1"
        )
    };
    let failing_rows = sqlx::query_as(super::trusted(rows("parked_at IS NULL AND attempts > 0")))
        .bind(sample)
        .fetch_all(pool)
        .await?;
    let parked_rows = sqlx::query_as(super::trusted(rows(super::PARKED_NOT_DISCARDED)))
        .bind(sample)
        .fetch_all(pool)
        .await?;
    Ok(QueueStatus {
        pending: topics.iter().map(|t| t.pending).sum(),
        oldest_pending_at,
        oldest_pending_age_secs,
        topics,
        failing,
        failing_rows,
        parked,
        parked_rows,
        discarded,
    })
}

async fn table_size(pool: &PgPool, table: &str) -> Result<TableSize, OpsError> {
    // A partitioned table holds nothing itself (and is never analyzed): sum its
    // leaf partitions instead.
    let (reltuples, never_analyzed, total_bytes): (f64, Option<bool>, i64) = sqlx::query_as(
        "WITH leaves AS (
             SELECT c.oid, c.reltuples FROM pg_class c
             WHERE c.relkind = 'r'
               AND (c.oid = to_regclass($1)
                    OR c.oid IN (SELECT relid FROM pg_partition_tree(to_regclass($1)) WHERE isleaf)))
         SELECT coalesce(sum(greatest(reltuples, 0)), 0)::float8,
                bool_and(reltuples < 0),
                coalesce(sum(pg_total_relation_size(oid)), 0)::int8
         FROM leaves",
    )
    .bind(table)
    .fetch_one(pool)
    .await?;
    // reltuples is -1 until the first ANALYZE; autovacuum analyzes long before a
    // table is large, so counting exactly then is cheap.
    let (rows, estimated) = if never_analyzed.unwrap_or(true) {
        let exact: i64 =
            sqlx::query_scalar(super::trusted(format!("SELECT count(*) FROM {table}")))
                .fetch_one(pool)
                .await?;
        (exact, false)
    } else {
        (reltuples as i64, true)
    };
    Ok(TableSize {
        table: table.to_owned(),
        rows,
        estimated,
        total_bytes,
    })
}

/// Health limits on a [`Status`]; `None` disables a limit. A limit on a
/// part the database does not have ([`Status::not_on_this_database`]) is
/// never exceeded.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Thresholds {
    /// Most pending outbox rows allowed.
    pub max_backlog: Option<i64>,
    /// Oldest pending outbox row's greatest allowed age.
    pub max_age: Option<Duration>,
    /// Most parked rows allowed: outbox, inbox and the consumers' dead
    /// letters their topic refused, together.
    pub max_parked: Option<i64>,
    /// Most pending inbox rows allowed.
    pub max_inbox_backlog: Option<i64>,
    /// Oldest pending inbox row's greatest allowed age.
    pub max_inbox_age: Option<Duration>,
    /// Longest a running saga may go without a step (of any type).
    pub max_saga_age: Option<Duration>,
}

/// A threshold the status exceeds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Breach {
    /// The threshold's name, as its command-line flag without dashes
    /// (`max-backlog`, `max-age`, ...).
    pub threshold: &'static str,
    /// The limit, human-readable.
    pub limit: String,
    /// The measured value, human-readable.
    pub actual: String,
}

impl fmt::Display for Breach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} exceeded: {} (limit {})",
            self.threshold, self.actual, self.limit
        )
    }
}

impl Thresholds {
    /// Every threshold `status` exceeds (counts first, then ages).
    pub fn check(&self, status: &Status) -> Vec<Breach> {
        let mut breaches = Vec::new();
        let mut count = |threshold, limit: Option<i64>, actual: i64, what: &str| {
            if let Some(limit) = limit.filter(|limit| actual > *limit) {
                breaches.push(Breach {
                    threshold,
                    limit: limit.to_string(),
                    actual: format!("{actual} {what}"),
                });
            }
        };
        count(
            "max-backlog",
            self.max_backlog,
            status.outbox.pending,
            "unpublished events",
        );
        count(
            "max-parked",
            self.max_parked,
            status.outbox.parked + status.inbox.parked + status.consumer_dead_letters.unpublished,
            "parked events",
        );
        count(
            "max-inbox-backlog",
            self.max_inbox_backlog,
            status.inbox.pending,
            "unprocessed inbox events",
        );
        let mut age = |threshold, limit: Option<Duration>, queue: &QueueStatus, what: &str| {
            let actual = queue.oldest_pending_age_secs.unwrap_or(0.0);
            if let Some(limit) = limit.filter(|limit| actual > limit.as_secs_f64()) {
                breaches.push(Breach {
                    threshold,
                    limit: format!("{}s", limit.as_secs_f64()),
                    actual: format!("oldest {what} is {actual:.0}s old"),
                });
            }
        };
        age("max-age", self.max_age, &status.outbox, "unpublished event");
        age(
            "max-inbox-age",
            self.max_inbox_age,
            &status.inbox,
            "unprocessed inbox event",
        );
        let oldest_saga = status
            .sagas
            .iter()
            .filter_map(|s| Some((s.oldest_running_age_secs?, s.saga_type.as_str())))
            .max_by(|a, b| a.0.total_cmp(&b.0));
        if let (Some(limit), Some((actual, saga_type))) = (self.max_saga_age, oldest_saga)
            && actual > limit.as_secs_f64()
        {
            breaches.push(Breach {
                threshold: "max-saga-age",
                limit: format!("{}s", limit.as_secs_f64()),
                actual: format!("a running {saga_type} saga has not moved for {actual:.0}s"),
            });
        }
        breaches
    }
}
