//! Operator operations on the framework's tables: status, retention, dead
//! letters, replay, sagas, and the trigger that wakes relays across processes.
//!
//! These are the SQL (and, for replay, the Kafka publishing) behind the
//! `outbox` command-line tool, exposed as a library so services, health
//! endpoints and tests can run them too. Every operation is safe to run while
//! relays and consumers are running: writes happen in short statements that
//! re-check, in the statement that changes a row, the condition that made it
//! eligible (retention deletes in batches chosen `FOR UPDATE SKIP LOCKED`, so
//! it never waits for a relay's or processor's lock).
//!
//! ```no_run
//! # async fn run(pool: sqlx::PgPool) -> Result<(), txoutbox_runtime::ops::OpsError> {
//! use txoutbox_runtime::ops::status;
//!
//! let status = status::collect(&pool, 5).await?;
//! println!("{} events wait for the relay", status.outbox.pending);
//! # Ok(()) }
//! ```
//!
//! Status, dead letters, retention, sagas and replay take a [`Database`]: a
//! `&PgPool`, or (feature `mysql`) a `&MySqlPool` on MariaDB, where they
//! cover the outbox's tables (`outbox_event`, `outbox_scheduled`,
//! `outbox_relay_member`, `outbox_replay_run`), the consumers' (`inbox_event`
//! with `inbox_key`, `processed_event`, `consumer_dead_letter`) and the
//! sagas' (`saga_state`) alike. Only `notify` takes a `&PgPool`: MariaDB has
//! no `LISTEN` / `NOTIFY`.

pub mod cleanup;
mod database;
pub mod dead_letters;
pub mod notify;
pub mod replay;
pub mod sagas;
pub mod status;

pub use database::Database;

/// Failure of an operator operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpsError {
    /// The database refused or could not be reached.
    #[error("database error: {}", txoutbox_core::DbErrorDisplay(.0))]
    Database(#[from] sqlx::Error),
    /// Inbox dead letters were selected by numeric id
    /// ([`Selection::Ids`](dead_letters::Selection::Ids)), which inbox rows
    /// do not have.
    #[error("inbox rows have no numeric id; select them by event id")]
    InboxRowsHaveNoId,
    /// The header names given to
    /// [`Replay::header_names`](replay::Replay::header_names) cannot be used
    /// (see [`HeaderNames::problem`](crate::relay::HeaderNames::problem)).
    #[error("invalid header names: {0}")]
    HeaderNames(String),
    /// The CloudEvents setting given to
    /// [`Replay::cloudevents`](replay::Replay::cloudevents) cannot be used.
    #[error("invalid CloudEvents setting: {0}")]
    CloudEvents(String),
    /// A rebuild ([`Replay::rebuild`](replay::Replay::rebuild)) was asked
    /// without the live topic in its filter.
    #[error("a rebuild replays one live topic: set the filter's topic (--topic)")]
    RebuildWithoutTopic,
    /// A rebuild was asked to send to the live topic it replays.
    #[error(
        "a rebuild must send to a topic of its own, not to the live topic \
         '{topic}' (its copies would interleave with live events)"
    )]
    RebuildIntoLiveTopic {
        /// The live topic.
        topic: String,
    },
    /// A topic a rebuild reads or sends to is not on the cluster.
    #[error(
        "topic '{topic}' does not exist on the cluster: a rebuild reads the live \
         topic's end offsets and sends to a replay topic that must be created first \
         (any partition count)"
    )]
    TopicMissing {
        /// The missing topic.
        topic: String,
    },
    /// The consumer group given to a rebuild's hand-over has committed
    /// offsets already.
    #[error(
        "consumer group '{group}' already has a committed offset on {topic} \
         (partition {partition} at {offset:?}): a rebuild needs a new group of its own \
         (dedup rows in processed_event are per group); choose another group name"
    )]
    GroupHasOffsets {
        /// The consumer group.
        group: String,
        /// The topic of the committed offset.
        topic: String,
        /// Its partition.
        partition: i32,
        /// The committed offset.
        offset: rdkafka::Offset,
    },
    /// The replay of a rebuild has not finished (or failed), so its end
    /// offsets are unknown.
    #[error(
        "the replay into {replay_topic} has not finished (or failed): its end is not known, \
         so the group cannot switch to {live_topic} yet"
    )]
    ReplayNotFinished {
        /// The replay topic.
        replay_topic: String,
        /// The live topic.
        live_topic: String,
    },
    /// A replay run's recorded hand-over is not one this version reads.
    #[error("outbox_replay_run {run_id} has a hand-over this version cannot read: {source}")]
    UnreadableHandover {
        /// The `outbox_replay_run.id`.
        run_id: i64,
        /// Why it could not be read.
        #[source]
        source: serde_json::Error,
    },
    /// A stored saga has a status this version does not know.
    #[error("saga {saga_type} `{saga_id}` has an unknown status `{status}`")]
    UnknownSagaStatus {
        /// The saga's type.
        saga_type: String,
        /// The saga's id.
        saga_id: String,
        /// The stored status.
        status: String,
    },
    /// A stored saga's pending compensation lacks a field, or has an
    /// invalid one.
    #[error("saga {saga_type} `{saga_id}`: stored compensation {position} has no valid {field}")]
    InvalidCompensation {
        /// The saga's type.
        saga_type: String,
        /// The saga's id.
        saga_id: String,
        /// The compensation's position in the stored list, from 1.
        position: usize,
        /// The missing or invalid field (`event_id`, `event_type`, `topic`,
        /// `partition_key`).
        field: &'static str,
    },
    /// The Kafka client failed (configuration, or a delivery).
    #[error("kafka error: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// A replay run stopped before publishing every selected event. The run is
    /// recorded in `outbox_replay_run` with this error.
    #[error("replay run {run_id} stopped after {published} events: {source}")]
    ReplayFailed {
        /// The `outbox_replay_run.id` of the failed run.
        run_id: i64,
        /// Events delivered before the failure.
        published: u64,
        /// What went wrong.
        #[source]
        source: Box<OpsError>,
    },
}

/// The one condition for "parked and not discarded", on either table (with
/// the table's own "not finished": `published_at IS NULL` for the outbox,
/// `NOT processed` for the inbox): rows an operator may list, retry or
/// discard. Discarded rows stay parked as evidence and match nothing here.
pub(crate) const PARKED_NOT_DISCARDED: &str = "parked_at IS NOT NULL AND discarded_at IS NULL";

/// Marks a statement assembled with `format!` as safe for sqlx: every dynamic
/// statement in this module is built only from constant fragments (table and
/// column names, fixed conditions) defined here; values from users always
/// travel as bind parameters.
fn trusted(sql: String) -> sqlx::AssertSqlSafe<String> {
    sqlx::AssertSqlSafe(sql)
}
