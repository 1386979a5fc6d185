//! Receiving events: idempotent handlers in dedup or inbox mode.
//!
//! Write one `#[event_handler]` async function per event type, assemble a
//! [`Consumer`] from them and spawn it:
//!
//! ```no_run
//! use txoutbox_runtime::consumer::{event_handler, Consumer, Mode};
//! use sqlx::{Postgres, Transaction};
//! # #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, txoutbox_core::DomainEvent)]
//! # #[event(topic = "payments", aggregate = "Payment")]
//! # struct PaymentCompleted { event_id: uuid::Uuid, #[partition_key] order_id: uuid::Uuid }
//!
//! #[event_handler]
//! async fn on_payment_completed(
//!     tx: &mut Transaction<'_, Postgres>,
//!     event: PaymentCompleted,
//! ) -> Result<(), sqlx::Error> {
//!     sqlx::query("UPDATE orders SET paid = true WHERE id = $1")
//!         .bind(event.order_id)
//!         .execute(&mut **tx)
//!         .await?;
//!     Ok(())
//! }
//!
//! # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! let mut kafka_config = rdkafka::ClientConfig::new();
//! kafka_config.set("bootstrap.servers", "127.0.0.1:9092");
//! let running = Consumer::builder(pool, kafka_config, "orders-service")
//!     .handler(on_payment_completed)
//!     .mode(Mode::Dedup) // the default; Mode::Inbox for critical or bursty flows
//!     .build()?
//!     .spawn();
//! // ... on SIGTERM:
//! running.shutdown().await?;
//! # Ok(()) }
//! ```
//!
//! Delivery is at-least-once; the consumer makes the effect happen once per
//! event id and consumer group. An offset is stored only after its message was
//! handled, found to be a duplicate, written to the inbox, skipped by policy or
//! dead-lettered, and only after the database commit. `docs/consumer.md`
//! describes the failure semantics and metrics.

mod client_context;
mod config;
mod dedup;
mod dlq;
mod handler;
mod inbox;
mod message;
mod offsets;
mod receive;
mod route;
mod run;
mod shared;

pub use config::{ConsumerBuilder, Mode, UnknownEventPolicy};
pub use dlq::{
    HEADER_DLQ_ERROR, HEADER_DLQ_GROUP, HEADER_DLQ_OFFSET, HEADER_DLQ_PARTITION, HEADER_DLQ_REASON,
    HEADER_DLQ_TOPIC, HEADER_DLQ_VALUE_DROPPED,
};
pub use handler::{EventHandler, EventMeta, HandlerError};
#[cfg(feature = "test-hooks")]
#[doc(hidden)]
pub use inbox::claim_once_for_benchmark;
pub use message::DeadLetterReason;
#[doc(hidden)]
#[cfg(feature = "test-hooks")]
pub use route::Route;
pub use run::{Consumer, ConsumerHandle};
pub use txoutbox_derive::event_handler;

/// Names of the metrics the consumer records (through the `metrics` facade).
/// Every metric carries a `group` label; per-message counters also `topic`.
pub mod telemetry {
    /// Counter: messages received from Kafka.
    pub const CONSUMED: &str = "outbox_consumer_messages_total";
    /// Counter: events whose handler ran and committed (label `event_type`).
    pub const HANDLED: &str = "outbox_consumer_handled_total";
    /// Counter: events skipped because their id was already processed / stored.
    pub const DUPLICATES: &str = "outbox_consumer_duplicates_total";
    /// Counter: failed handler attempts (label `event_type`).
    pub const HANDLER_ERRORS: &str = "outbox_consumer_handler_errors_total";
    /// Counter: messages published to the dead-letter topic (label `reason`).
    pub const DEAD_LETTERED: &str = "outbox_consumer_dead_lettered_total";
    /// Counter: messages of event types without a handler, skipped by policy.
    pub const UNKNOWN_SKIPPED: &str = "outbox_consumer_unknown_skipped_total";
    /// Counter: database failures that made the consumer pause and retry.
    pub const DB_ERRORS: &str = "outbox_consumer_db_errors_total";
    /// Counter: rows written to `inbox_event`.
    pub const INBOX_STORED: &str = "outbox_inbox_stored_total";
    /// Counter: inbox rows parked after failing (label `reason`).
    pub const INBOX_PARKED: &str = "outbox_inbox_parked_total";
    /// Gauge: unprocessed, unparked rows in `inbox_event`.
    pub const INBOX_BACKLOG: &str = "outbox_inbox_backlog";
    /// Gauge: messages between the group's position and the end of a partition
    /// (labels `topic`, `partition`), from librdkafka's statistics.
    pub const LAG: &str = "outbox_consumer_lag";
    /// Gauge: parked rows in `inbox_event`.
    pub const INBOX_PARKED_ROWS: &str = "outbox_inbox_parked_rows";
    /// Gauge: inbox keys of the group whose oldest pending row is of an event
    /// type no running processor of the group handles (they wait for one; see
    /// `outbox status`). Refreshed every backlog interval.
    pub const INBOX_UNCLAIMED_KEYS: &str = "outbox_inbox_unclaimed_keys";
    /// Counter: times a partition's next message had a higher offset than the
    /// one after the previous message (labels `topic`, `partition`). A
    /// diagnostic, not an error: transaction markers, compaction and aborted
    /// records leave such gaps on Kafka; on a topic written only by
    /// idempotent producers it means the broker served records out of order.
    /// Each gap is also logged at debug level, target
    /// `txoutbox_runtime::consumer::offsets`.
    pub const OFFSET_GAPS: &str = "outbox_consumer_offset_gaps_total";
}

/// An `#[event_handler]` linked into this binary: which (topic, event type)
/// it handles. Every `#[event_handler]` registers one; see
/// [`registered_handlers`].
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct HandlerDescriptor {
    /// The topic of its event.
    pub topic: &'static str,
    /// Its event type.
    pub event_type: &'static str,
    /// The handler's name.
    pub name: &'static str,
}

impl HandlerDescriptor {
    /// For code `#[event_handler]` generates. Not a public API.
    #[doc(hidden)]
    pub const fn __new(topic: &'static str, event_type: &'static str, name: &'static str) -> Self {
        Self {
            topic,
            event_type,
            name,
        }
    }
}

txoutbox_core::__private::inventory::collect!(HandlerDescriptor);

/// Every `#[event_handler]` linked into this binary, sorted by topic, event
/// type and name: what `txoutbox_runtime::topics` derives the dead-letter
/// topics a service needs from.
pub fn registered_handlers() -> Vec<&'static HandlerDescriptor> {
    let mut handlers: Vec<_> = txoutbox_core::__private::inventory::iter::<HandlerDescriptor>
        .into_iter()
        .collect();
    handlers.sort_by_key(|h| (h.topic, h.event_type, h.name));
    handlers
}

/// A consumer could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// No handler was registered, so there is nothing to subscribe to.
    #[error("the consumer has no handlers: register at least one with .handler(..)")]
    NoHandlers,
    /// Two handlers claim the same (topic, event type).
    #[error("duplicate handlers: {duplicates}")]
    DuplicateHandlers {
        /// Each clash, described.
        duplicates: String,
    },
    /// Settings that do not go together.
    #[error("invalid consumer configuration: {0}")]
    InvalidConfig(&'static str),
    /// The Kafka consumer or dead-letter producer could not be created.
    #[error("kafka client could not be created: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
}

/// A running consumer stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumerError {
    /// Subscribing to the handlers' topics failed.
    #[error("subscribing to {topics:?} failed: {source}")]
    Subscribe {
        /// The topics.
        topics: Vec<String>,
        /// The Kafka error.
        #[source]
        source: rdkafka::error::KafkaError,
    },
    /// The dead-letter topics of some subscribed topics do not exist.
    #[error(
        "dead-letter topic(s) {} do not exist: create them with `outbox topics apply` \
         (or, in development, ConsumerBuilder::create_missing_dlq_topics(true))",
        topics.iter().map(|t| format!("`{t}`")).collect::<Vec<_>>().join(", ")
    )]
    MissingDeadLetterTopics {
        /// The missing topics.
        topics: Vec<String>,
    },
    /// Creating the missing dead-letter topics failed.
    #[error("could not create the dead-letter topics: {0}")]
    CreateDeadLetterTopics(#[from] crate::topics::TopicsError),
    /// An inbox processor ended on its own (a panic outside a handler, or
    /// any end that was not a shutdown); the consumer stopped with it.
    #[error("{0}")]
    Processor(String),
    /// The consumer panicked outside a handler (handler panics are caught
    /// and count as failed attempts).
    #[error("the consumer panicked: {0}")]
    Panicked(String),
    /// A consumer task panicked or was aborted.
    #[error("consumer task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Re-exports used by code that `#[event_handler]` generates. Not a public API.
#[doc(hidden)]
pub mod __private {
    pub use futures::future::BoxFuture;
    pub use sqlx::{Postgres, Transaction};
    pub use txoutbox_core::__private::inventory;
    pub use txoutbox_core::Events;

    /// Turns a handler's error into a [`super::HandlerError`] (a `sqlx::Error`
    /// without the server source line; see [`super::HandlerError::new`]).
    pub fn handler_error<E: std::fmt::Display + 'static>(error: E) -> super::HandlerError {
        super::HandlerError::new(error)
    }
}
