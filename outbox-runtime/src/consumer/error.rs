//! Why a consumer could not be built, or stopped.

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
    CreateDeadLetterTopics(#[from] crate::topic_admin::TopicsError),
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
