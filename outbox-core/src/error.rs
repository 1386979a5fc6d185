/// Errors of the outbox write path.
///
/// Your handler's error type needs `From<outbox_core::Error>` so that `?` works
/// on framework calls.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An event could not be turned into its JSON payload.
    #[error("event `{event_type}` could not be serialized to JSON: {source}")]
    Serialize {
        /// The event type that failed.
        event_type: &'static str,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
    /// An event serialized to something other than a JSON object.
    #[error("event `{event_type}` must serialize to a JSON object, got {found}")]
    PayloadNotObject {
        /// The event type that failed.
        event_type: &'static str,
        /// What it serialized to instead.
        found: &'static str,
    },
    /// An event's partition key is longer than
    /// [`MAX_PARTITION_KEY_BYTES`](crate::MAX_PARTITION_KEY_BYTES) bytes (UTF-8):
    /// the outbox refuses it when the event is recorded, before anything is
    /// written, because PostgreSQL cannot index such a key (see
    /// `docs/wire-format.md`).
    #[error(
        "event `{event_type}` has a partition key of {len} bytes; the outbox accepts at most {max} \
         (outbox_core::MAX_PARTITION_KEY_BYTES): use a shorter key, e.g. an id or a hash of it"
    )]
    PartitionKeyTooLong {
        /// The event type that failed.
        event_type: &'static str,
        /// The key's length in bytes.
        len: usize,
        /// The limit, [`MAX_PARTITION_KEY_BYTES`](crate::MAX_PARTITION_KEY_BYTES).
        max: usize,
    },
    /// A database error (connecting, running the handler's transaction, inserting the outbox rows, committing).
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}
