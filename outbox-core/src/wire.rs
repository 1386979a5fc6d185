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

/// Most headers of the user's own on one event (static ones of the event
/// type and dynamic ones given when it is recorded, together): 16.
pub const MAX_USER_HEADERS: usize = 16;
/// Longest name of a user header, in bytes: 128.
pub const MAX_USER_HEADER_NAME_BYTES: usize = 128;
/// Longest value of a user header, in bytes of UTF-8: 1,024.
pub const MAX_USER_HEADER_VALUE_BYTES: usize = 1024;
/// Most bytes of names and values of one event's user headers together: 8 KiB.
pub const MAX_USER_HEADERS_BYTES: usize = 8 * 1024;

/// Header names a user header cannot have, compared without regard to
/// case: the framework's own (including the names Debezium's outbox router
/// uses, which `txoutbox_runtime::relay::HeaderNames::debezium` gives the
/// relay, and `tracestate`, W3C's companion of `traceparent`).
pub const RESERVED_HEADER_NAMES: &[&str] = &[
    HEADER_EVENT_ID,
    HEADER_EVENT_TYPE,
    HEADER_AGGREGATE_TYPE,
    HEADER_AGGREGATE_ID,
    HEADER_CONTENT_TYPE,
    HEADER_TRACEPARENT,
    "tracestate",
    HEADER_REPLAY,
    HEADER_ID,
    "eventType",
];
/// Prefixes a user header name cannot start with, compared without regard
/// to case: `ce_` (CloudEvents attributes in the Kafka binding) and `dlq_`
/// (dead-letter bookkeeping).
pub const RESERVED_HEADER_PREFIXES: &[&str] = &["ce_", "dlq_"];

/// Why `name` cannot be the name of a user header, if it cannot: it must be
/// 1 to [`MAX_USER_HEADER_NAME_BYTES`] bytes of ASCII letters, digits, `-`,
/// `_` and `.`, and not one of [`RESERVED_HEADER_NAMES`] nor start with one
/// of [`RESERVED_HEADER_PREFIXES`]. `#[derive(DomainEvent)]` applies the same
/// rule to `#[event(headers(...))]` at compile time.
///
/// ```
/// use txoutbox_core::wire::user_header_name_problem;
///
/// assert_eq!(user_header_name_problem("tenant"), None);
/// assert!(user_header_name_problem("event_type").is_some());
/// assert!(user_header_name_problem("x tenant").is_some());
/// ```
pub fn user_header_name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("a header name cannot be empty".into());
    }
    if name.len() > MAX_USER_HEADER_NAME_BYTES {
        return Some(format!(
            "a header name is at most {MAX_USER_HEADER_NAME_BYTES} bytes, this one has {}",
            name.len()
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Some(format!(
            "a header name is made of ASCII letters, digits, `-`, `_` and `.`; {bad:?} is not allowed"
        ));
    }
    if let Some(taken) = RESERVED_HEADER_NAMES
        .iter()
        .find(|reserved| reserved.eq_ignore_ascii_case(name))
    {
        return Some(format!("`{taken}` is a header the framework sets itself"));
    }
    if let Some(prefix) = RESERVED_HEADER_PREFIXES.iter().find(|prefix| {
        name.len() >= prefix.len() && name[..prefix.len()].eq_ignore_ascii_case(prefix)
    }) {
        return Some(format!(
            "names starting with `{prefix}` are the framework's (CloudEvents attributes, dead-letter bookkeeping)"
        ));
    }
    None
}

/// Why `headers` (name, value) cannot be one event's user headers, if they
/// cannot: a name [`user_header_name_problem`] refuses, a name given twice,
/// a value longer than [`MAX_USER_HEADER_VALUE_BYTES`] or holding a NUL
/// character (PostgreSQL cannot store it), more than [`MAX_USER_HEADERS`]
/// headers, or more than [`MAX_USER_HEADERS_BYTES`] in all.
pub fn user_headers_problem<'a>(
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Option<String> {
    let mut seen: Vec<&str> = Vec::new();
    let mut bytes = 0;
    for (name, value) in headers {
        if let Some(problem) = user_header_name_problem(name) {
            return Some(format!("header {name:?}: {problem}"));
        }
        if seen.contains(&name) {
            return Some(format!("header `{name}` is given twice"));
        }
        seen.push(name);
        if value.len() > MAX_USER_HEADER_VALUE_BYTES {
            return Some(format!(
                "header `{name}`: a value is at most {MAX_USER_HEADER_VALUE_BYTES} bytes, this one has {}",
                value.len()
            ));
        }
        if value.contains('\0') {
            return Some(format!(
                "header `{name}`: a value cannot hold a NUL character (PostgreSQL cannot store it)"
            ));
        }
        bytes += name.len() + value.len();
    }
    if seen.len() > MAX_USER_HEADERS {
        return Some(format!(
            "an event has at most {MAX_USER_HEADERS} headers of its own, this one has {}",
            seen.len()
        ));
    }
    if bytes > MAX_USER_HEADERS_BYTES {
        return Some(format!(
            "an event's own headers are at most {MAX_USER_HEADERS_BYTES} bytes in all, these have {bytes}"
        ));
    }
    None
}
