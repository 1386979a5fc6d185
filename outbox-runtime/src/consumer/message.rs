//! Turning a Kafka record into something a handler can take, or a reason it cannot.

use rdkafka::Message;
use rdkafka::message::{Headers, OwnedMessage};
use txoutbox_core::wire;
use uuid::Uuid;

use super::handler::{Dispatch, EventMeta};

/// Why a message cannot be handled; sent as the `dlq_reason` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeadLetterReason {
    /// The value is not JSON (or not a JSON object).
    NotJson,
    /// The payload has no `event_id`.
    MissingEventId,
    /// `event_id` is not a UUID.
    InvalidEventId,
    /// No handler for the event type (and the policy is to dead-letter).
    UnknownEventType,
    /// The payload does not deserialize into the handler's event type.
    PayloadMismatch,
    /// The message is larger than the configured maximum.
    Oversized,
    /// The handler kept failing after all retries.
    HandlerFailed,
    /// Inbox mode: PostgreSQL cannot store the message in the inbox. It holds
    /// a NUL character (in its key, a header, or a JSON string), which `text`
    /// and `jsonb` cannot store, or its key is longer than
    /// [`MAX_PARTITION_KEY_BYTES`](txoutbox_core::MAX_PARTITION_KEY_BYTES),
    /// more than the inbox's indexes can hold. `dlq_error` says which.
    Unstorable,
}

impl DeadLetterReason {
    /// The header value, e.g. `not_json`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotJson => "not_json",
            Self::MissingEventId => "missing_event_id",
            Self::InvalidEventId => "invalid_event_id",
            Self::UnknownEventType => "unknown_event_type",
            Self::PayloadMismatch => "payload_mismatch",
            Self::Oversized => "oversized",
            Self::HandlerFailed => "handler_failed",
            Self::Unstorable => "unstorable",
        }
    }
}

impl std::fmt::Display for DeadLetterReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where in `envelope` a NUL character is, if anywhere: PostgreSQL cannot
/// store it in `text` or `jsonb`, so the inbox must set such a message aside
/// instead of failing (and retrying) the whole batch insert.
pub(crate) fn nul_character(envelope: &Envelope) -> Option<&'static str> {
    fn in_json(value: &serde_json::Value) -> bool {
        match value {
            serde_json::Value::String(s) => s.contains('\0'),
            serde_json::Value::Array(items) => items.iter().any(in_json),
            serde_json::Value::Object(map) => {
                map.iter().any(|(k, v)| k.contains('\0') || in_json(v))
            }
            _ => false,
        }
    }
    let meta = &envelope.meta;
    if meta.key.as_deref().is_some_and(|key| key.contains('\0')) {
        Some("the key")
    } else if meta
        .headers
        .iter()
        .any(|(k, v)| k.contains('\0') || v.contains('\0'))
    {
        Some("a header")
    } else if meta.event_type.contains('\0') {
        Some("the event type")
    } else if in_json(&envelope.payload) {
        Some("the JSON payload")
    } else {
        None
    }
}

/// A record whose envelope is valid: JSON object payload with a UUID `event_id`.
pub(crate) struct Envelope {
    pub(crate) payload: serde_json::Value,
    pub(crate) meta: EventMeta,
}

/// What a record turned out to be.
pub(crate) enum Classified {
    /// A valid envelope whose event type has a handler.
    Known(Envelope),
    /// A valid envelope whose event type has no handler here.
    Unknown(Envelope),
    /// Cannot be handled.
    Bad(DeadLetterReason, String),
}

/// The record's headers with UTF-8 values (others are kept on the wire for the DLQ only).
pub(crate) fn text_headers(message: &OwnedMessage) -> Vec<(String, String)> {
    let Some(headers) = message.headers() else {
        return Vec::new();
    };
    headers
        .iter()
        .filter_map(|h| {
            let value = std::str::from_utf8(h.value?).ok()?;
            Some((h.key.to_owned(), value.to_owned()))
        })
        .collect()
}

/// Checks a record's size and envelope and resolves its event type:
/// the `event_type` header, else the payload's `event_type` field, else the
/// topic's only handler (so producers without headers still work).
pub(crate) fn classify(
    message: &OwnedMessage,
    dispatch: &Dispatch,
    max_bytes: usize,
) -> Classified {
    let value = message.payload().unwrap_or_default();
    let size = value.len() + message.key().map_or(0, <[u8]>::len);
    if size > max_bytes {
        return Classified::Bad(
            DeadLetterReason::Oversized,
            format!("message of {size} bytes exceeds the limit of {max_bytes} bytes"),
        );
    }
    let payload: serde_json::Value = match serde_json::from_slice(value) {
        Ok(v @ serde_json::Value::Object(_)) => v,
        Ok(_) => {
            return Classified::Bad(
                DeadLetterReason::NotJson,
                "payload is not a JSON object".into(),
            );
        }
        Err(e) => {
            return Classified::Bad(
                DeadLetterReason::NotJson,
                format!("payload is not JSON: {e}"),
            );
        }
    };
    let event_id = match payload.get(wire::PAYLOAD_EVENT_ID) {
        None | Some(serde_json::Value::Null) => {
            return Classified::Bad(
                DeadLetterReason::MissingEventId,
                "payload has no `event_id`".into(),
            );
        }
        Some(serde_json::Value::String(s)) => match Uuid::parse_str(s) {
            Ok(id) => id,
            Err(e) => {
                return Classified::Bad(
                    DeadLetterReason::InvalidEventId,
                    format!("`event_id` {s:?} is not a UUID: {e}"),
                );
            }
        },
        Some(other) => {
            return Classified::Bad(
                DeadLetterReason::InvalidEventId,
                format!("`event_id` {other} is not a UUID string"),
            );
        }
    };
    let headers = text_headers(message);
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let topic = message.topic();
    let event_type = header(wire::HEADER_EVENT_TYPE)
        .or_else(|| {
            payload
                .get(wire::PAYLOAD_EVENT_TYPE)
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned)
        })
        .or_else(|| dispatch.sole_event_type(topic).map(str::to_owned));
    let known = event_type
        .as_deref()
        .is_some_and(|t| dispatch.handler(topic, t).is_some());
    let meta = EventMeta {
        event_id,
        event_type: event_type.unwrap_or_default(),
        topic: topic.to_owned(),
        partition: Some(message.partition()),
        offset: Some(message.offset()),
        key: message
            .key()
            .map(|k| String::from_utf8_lossy(k).into_owned()),
        traceparent: header(wire::HEADER_TRACEPARENT),
        headers,
        // The route sets the consumer's bound.
        attempt: 1,
        max_attempts: 1,
    };
    let envelope = Envelope { payload, meta };
    if known {
        Classified::Known(envelope)
    } else {
        Classified::Unknown(envelope)
    }
}
