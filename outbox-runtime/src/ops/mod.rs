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

pub mod cleanup;
pub mod dead_letters;
pub mod notify;
pub mod replay;
pub mod sagas;
pub mod status;

/// Failure of an operator operation.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// The database refused or could not be reached.
    #[error("database error: {}", txoutbox_core::DbErrorDisplay(.0))]
    Database(#[from] sqlx::Error),
    /// The request cannot be carried out as asked (e.g. a selection that does
    /// not apply to the chosen table).
    #[error("{0}")]
    InvalidRequest(String),
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
