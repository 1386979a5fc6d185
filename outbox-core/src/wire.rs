//! What goes on the wire: Kafka header names and the content type.
//! `docs/wire-format.md` is the normative description; these constants are
//! the single place the code takes the names from.

/// Header carrying the event id (UUID, hyphenated text).
pub const HEADER_EVENT_ID: &str = "event_id";
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
