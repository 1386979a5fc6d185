//! Why a relay could not be built, or stopped for good.

/// A relay could not be built: what [`RelayBuilder::build`](super::RelayBuilder::build)
/// and [`spawn`](super::RelayBuilder::spawn) refuse.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The Kafka configuration disables idempotence or weakens `acks`.
    #[error(
        "the outbox relay's producer must run with enable.idempotence=true \
         and acks=all, but `{setting}={value}` was configured; remove that setting"
    )]
    IdempotenceRequired {
        /// The librdkafka setting at fault.
        setting: String,
        /// Its configured value.
        value: String,
    },
    /// A tuning value is out of range.
    #[error("invalid relay configuration: {0}")]
    InvalidConfig(&'static str),
    /// The [`HeaderNames`](super::HeaderNames) given to
    /// [`RelayBuilder::header_names`](super::RelayBuilder::header_names)
    /// cannot be used (empty, the same twice, or a header the framework sets).
    #[error("invalid relay header names: {0}")]
    HeaderNames(String),
    /// The [`CloudEvents`](super::CloudEvents) setting cannot be used (an
    /// empty source or data schema base).
    #[error("invalid CloudEvents setting: {0}")]
    CloudEvents(String),
    /// librdkafka refused the configuration.
    #[error("could not create the relay's kafka producer: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
}

/// A running relay stopped on its own.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// Another relay runs against the same database with a different
    /// [`RelayBuilder::lanes`](super::RelayBuilder::lanes). Lanes of different counts cover different
    /// keys, so both relays would publish some keys, out of order: the relay
    /// that joins last is refused (its task ends with this error).
    #[error(
        "this relay is configured with {configured} lanes, but the relay {member} runs \
         against the same database with {running} lanes; every relay of a database must \
         use the same `lanes` (per-key order): configure {running}, or stop every relay \
         to change the count"
    )]
    LaneCountMismatch {
        /// This relay's lane count.
        configured: u32,
        /// The running relay's lane count.
        running: u32,
        /// The running relay: process, host and backend pid.
        member: String,
    },
    /// The relay's own connection is not a database session of its own: its
    /// lanes are session-level advisory locks, which a transaction-mode
    /// connection pooler hands to other clients.
    #[error(
        "the relay's own database connection is not a session of its own ({0}); its lanes \
         are session-level locks, which a transaction-mode pooler (PgBouncer \
         pool_mode=transaction, ProxySQL multiplexing) hands to other clients: give the \
         relay a pool that connects to the database directly or through a session-mode pool"
    )]
    SharedSession(String),
    /// The database server cannot run the relay as configured; the message
    /// says what to change (e.g. MySQL's statement-based binary log, which
    /// refuses the relay's `READ COMMITTED` writes).
    #[error("the outbox relay cannot run on this database server: {0}")]
    UnsupportedDatabase(String),
    /// The relay membership table (migration 0006) does not exist.
    #[error(
        "the relay membership table outbox_relay_member is missing: apply the outbox \
         migrations (`outbox migrate` or txoutbox_runtime::migrations::run)"
    )]
    NotMigrated,
    /// The relay panicked outside any delivery (a bug, or a panicking
    /// metrics recorder); its unmarked rows are published again later.
    #[error(
        "the relay panicked: {0}; nothing is lost (its unmarked rows are published \
         again by the next relay that owns their lanes): restart the service, and \
         report the panic if it comes back"
    )]
    Panicked(String),
}
