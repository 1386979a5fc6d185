//! What goes on the wire: Kafka header names and the content type.
//! `docs/wire-format.md` is the normative description; these constants are
//! the single place the code takes the names from.

/// Header carrying the event id (UUID, hyphenated text).
pub const HEADER_EVENT_ID: &str = "event_id";
/// Header a consumer reads the event id from when the payload and the
/// `event_id` header have none: Debezium's outbox event router puts the
/// outbox row's `id` there by default.
pub const HEADER_ID: &str = "id";
/// Header carrying the event type, e.g. `OrderCreated`.
pub const HEADER_EVENT_TYPE: &str = "event_type";
/// Header carrying the aggregate type, e.g. `Order`.
pub const HEADER_AGGREGATE_TYPE: &str = "aggregate_type";
/// Header carrying the aggregate id.
pub const HEADER_AGGREGATE_ID: &str = "aggregate_id";
/// Header carrying the payload's media type.
pub const HEADER_CONTENT_TYPE: &str = "content-type";
/// W3C trace context header, present when the event was recorded inside a trace.
pub const HEADER_TRACEPARENT: &str = "traceparent";
/// Header present only on records re-sent by `outbox replay`; its value is
/// the id of the replay run (`outbox_replay_run.id`). The relay never sets it.
pub const HEADER_REPLAY: &str = "replay";
/// The payload's media type.
pub const CONTENT_TYPE_JSON: &str = "application/json";
/// Payload field carrying the event id (consumers without headers dedup on it).
pub const PAYLOAD_EVENT_ID: &str = "event_id";
/// Payload field consulted for the event type when the header is missing.
pub const PAYLOAD_EVENT_TYPE: &str = "event_type";
/// Dead letters (a consumer's): header with the reason code, e.g.
/// `not_json` (`txoutbox_runtime::consumer::DeadLetterReason`).
pub const HEADER_DLQ_REASON: &str = "dlq_reason";
/// Header with the human-readable error.
pub const HEADER_DLQ_ERROR: &str = "dlq_error";
/// Header with the topic the message was read from.
pub const HEADER_DLQ_TOPIC: &str = "dlq_original_topic";
/// Header with the partition the message was read from.
pub const HEADER_DLQ_PARTITION: &str = "dlq_original_partition";
/// Header with the offset the message had.
pub const HEADER_DLQ_OFFSET: &str = "dlq_original_offset";
/// Header with the consumer group that gave up on the message.
pub const HEADER_DLQ_GROUP: &str = "dlq_consumer_group";
/// Header set to `true` when the value was too large even for the dead-letter
/// topic and was left out (key and headers are kept).
pub const HEADER_DLQ_VALUE_DROPPED: &str = "dlq_value_dropped";
