//! The dead-letter record: the original record's key, value and headers
//! (names and values as the bytes the producer sent) plus the headers below,
//! which say why and where from (`docs/wire-format.md`, "Dead letters").

use std::fmt;

use rdkafka::Message;
use rdkafka::message::{Header, OwnedHeaders, OwnedMessage};

use txoutbox_core::wire::{
    HEADER_DLQ_ERROR, HEADER_DLQ_GROUP, HEADER_DLQ_OFFSET, HEADER_DLQ_PARTITION, HEADER_DLQ_REASON,
    HEADER_DLQ_TOPIC, HEADER_DLQ_VALUE_DROPPED,
};

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
    /// The record names no event type (no `event_type` header of UTF-8 text
    /// or payload field, or an empty one) and its topic has several handlers, so nobody could route it: malformed, whatever
    /// the [`UnknownEventPolicy`](crate::consumer::UnknownEventPolicy).
    MissingEventType,
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
    /// Decoding or routing the record panicked: a bug of the framework or of
    /// a `Deserialize` implementation, caught so that the record is set
    /// aside rather than stopping every consumer that takes its partition.
    Panicked,
}

impl DeadLetterReason {
    /// The header value, e.g. `not_json`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotJson => "not_json",
            Self::MissingEventId => "missing_event_id",
            Self::InvalidEventId => "invalid_event_id",
            Self::MissingEventType => "missing_event_type",
            Self::UnknownEventType => "unknown_event_type",
            Self::PayloadMismatch => "payload_mismatch",
            Self::Oversized => "oversized",
            Self::HandlerFailed => "handler_failed",
            Self::Unstorable => "unstorable",
            Self::Panicked => "panicked",
        }
    }
}

impl fmt::Display for DeadLetterReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a dead letter's own headers say.
pub(crate) struct DeadLetterHeaders<'a> {
    pub(crate) reason: DeadLetterReason,
    pub(crate) error: &'a str,
    /// The consumer group that gave up on the message.
    pub(crate) group: &'a str,
    /// The value was too large even for the dead-letter topic and is left out.
    pub(crate) value_dropped: bool,
}

/// The headers of `message`'s dead-letter copy: its own, then the
/// dead-letter headers.
pub(crate) fn dead_letter_headers(
    message: &OwnedMessage,
    why: &DeadLetterHeaders<'_>,
) -> OwnedHeaders {
    // A copy of the original list, made by librdkafka: its names may be
    // any bytes, which rdkafka's `Headers::iter` would panic on.
    let mut headers = message.headers().cloned().unwrap_or_default();
    let partition = message.partition().to_string();
    let offset = message.offset().to_string();
    let extra: [(&str, &str); 6] = [
        (HEADER_DLQ_REASON, why.reason.as_str()),
        (HEADER_DLQ_ERROR, why.error),
        (HEADER_DLQ_TOPIC, message.topic()),
        (HEADER_DLQ_PARTITION, &partition),
        (HEADER_DLQ_OFFSET, &offset),
        (HEADER_DLQ_GROUP, why.group),
    ];
    for (key, value) in extra {
        headers = headers.insert(Header {
            key,
            value: Some(value),
        });
    }
    if why.value_dropped {
        headers = headers.insert(Header {
            key: HEADER_DLQ_VALUE_DROPPED,
            value: Some("true"),
        });
    }
    headers
}
