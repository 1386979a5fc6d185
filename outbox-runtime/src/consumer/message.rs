//! Turning a Kafka record into something a handler can take, or a reason it
//! cannot: from any bytes in any field, without a panic and without building
//! a JSON tree.
//!
//! The value is read in one pass that keeps nothing of it but the
//! `event_id` and `event_type` fields and whether a string holds a NUL
//! character (see [`scan`]); the handler's event type is deserialized from
//! the same bytes later. A 1 MiB array of small numbers would be about
//! 16 MiB as a `serde_json::Value`; here it costs its bytes.

use std::fmt;

use rdkafka::Message;
use rdkafka::message::OwnedMessage;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use txoutbox_core::wire;
use uuid::Uuid;

use super::handler::{Dispatch, EventMeta};
use super::raw_headers::{RawHeader, raw_headers};

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
    /// the [`UnknownEventPolicy`](super::UnknownEventPolicy).
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

/// Where in `envelope` a NUL character is, if anywhere: PostgreSQL cannot
/// store it in `text` or `jsonb`, so the inbox must set such a message aside
/// instead of failing (and retrying) the whole batch insert.
pub(crate) fn nul_character(envelope: &Envelope) -> Option<&'static str> {
    envelope.nul
}

/// A record whose envelope is valid: a JSON object payload with a UUID
/// `event_id`.
pub(crate) struct Envelope {
    /// The record's value as JSON text (an object). When only the
    /// `event_id` header carried the id, it is added as the object's first
    /// field, so that handlers and the inbox see it where they look.
    pub(crate) payload: String,
    pub(crate) meta: EventMeta,
    /// Where a NUL character is (see [`nul_character`]).
    nul: Option<&'static str>,
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

/// The record's headers whose name and value are both UTF-8 text, in order
/// (the others stay on the wire, for the dead-letter copy only).
fn text_headers(headers: &[RawHeader<'_>]) -> Vec<(String, String)> {
    headers
        .iter()
        .filter_map(|h| {
            let name = std::str::from_utf8(h.name).ok()?;
            let value = std::str::from_utf8(h.value?).ok()?;
            Some((name.to_owned(), value.to_owned()))
        })
        .collect()
}

/// The value of the first header `name` that is UTF-8 text: the wire
/// format's headers are text, so one that is not (or null) is not read as
/// the header at all.
fn header<'a>(headers: &[RawHeader<'a>], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .filter(|h| h.name == name.as_bytes())
        .find_map(|h| std::str::from_utf8(h.value?).ok())
}

/// Checks a record's size and envelope and resolves its event type:
/// the `event_type` header, else the payload's `event_type` field, else the
/// topic's only handler (so producers without headers still work). The
/// event id is the payload's `event_id`, else the `event_id` header.
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
    let scanned = match scan(value) {
        Ok(scanned) => scanned,
        Err(bad) => return Classified::Bad(bad.0, bad.1),
    };
    let headers = message.headers().map(raw_headers).unwrap_or_default();
    let (event_id, payload) = match scanned.event_id {
        Some(Ok(id)) => (id, scanned.text.to_owned()),
        Some(Err(error)) => return Classified::Bad(DeadLetterReason::InvalidEventId, error),
        None => match header(&headers, wire::HEADER_EVENT_ID) {
            Some(text) => match Uuid::parse_str(text) {
                Ok(id) => (id, with_event_id(scanned.text, id, scanned.null_event_id)),
                Err(e) => {
                    return Classified::Bad(
                        DeadLetterReason::InvalidEventId,
                        format!(
                            "payload has no `event_id` and the `event_id` header {:?} is not a UUID: {e}",
                            shorten(text)
                        ),
                    );
                }
            },
            None => {
                return Classified::Bad(
                    DeadLetterReason::MissingEventId,
                    "payload has no `event_id` and the record no `event_id` header".into(),
                );
            }
        },
    };
    let topic = message.topic();
    let named = header(&headers, wire::HEADER_EVENT_TYPE)
        .map(str::to_owned)
        .or(scanned.event_type)
        .filter(|name| !name.is_empty());
    let event_type = match named.or_else(|| dispatch.sole_event_type(topic).map(str::to_owned)) {
        Some(event_type) => event_type,
        None => {
            return Classified::Bad(
                DeadLetterReason::MissingEventType,
                format!(
                    "the record names no event type (no `event_type` header or payload field) and \
                     topic `{topic}` has several handlers, so it cannot be routed"
                ),
            );
        }
    };
    let known = dispatch.handler(topic, &event_type).is_some();
    let key = message
        .key()
        .map(|k| String::from_utf8_lossy(k).into_owned());
    let text_headers = text_headers(&headers);
    let nul = if key.as_deref().is_some_and(|key| key.contains('\0')) {
        Some("the key")
    } else if text_headers
        .iter()
        .any(|(k, v)| k.contains('\0') || v.contains('\0'))
    {
        Some("a header")
    } else if event_type.contains('\0') {
        Some("the event type")
    } else if scanned.nul {
        Some("the JSON payload")
    } else {
        None
    };
    let traceparent = header(&headers, wire::HEADER_TRACEPARENT).map(str::to_owned);
    let meta = EventMeta {
        event_id,
        event_type,
        topic: topic.to_owned(),
        partition: Some(message.partition()),
        offset: Some(message.offset()),
        key,
        traceparent,
        headers: text_headers,
        // The route sets the consumer's bound.
        attempt: 1,
        max_attempts: 1,
    };
    let envelope = Envelope { payload, meta, nul };
    if known {
        Classified::Known(envelope)
    } else {
        Classified::Unknown(envelope)
    }
}

/// `object` (JSON object text) with `"event_id": id` as its first field;
/// `replace_null`: the object has `"event_id": null`, which goes (rare, so
/// through a JSON tree).
fn with_event_id(object: &str, id: Uuid, replace_null: bool) -> String {
    if replace_null && let Ok(serde_json::Value::Object(mut map)) = serde_json::from_str(object) {
        map.insert(wire::PAYLOAD_EVENT_ID.to_owned(), id.to_string().into());
        return serde_json::Value::Object(map).to_string();
    }
    let body = object.trim_start();
    let rest = body[1..].trim_start(); // after the `{`
    let separator = if rest.starts_with('}') { "" } else { "," };
    format!("{{\"{}\":\"{id}\"{separator}{rest}", wire::PAYLOAD_EVENT_ID)
}

/// At most 64 characters of `text`, for error messages about foreign input.
fn shorten(text: &str) -> String {
    match text.char_indices().nth(64) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_owned(),
    }
}

/// What one pass over a record's value found.
#[derive(Debug)]
struct Scanned<'a> {
    /// The value as text (a JSON object).
    text: &'a str,
    /// The payload's `event_id`: `None` if absent or null.
    event_id: Option<Result<Uuid, String>>,
    /// Whether the payload has `"event_id": null`.
    null_event_id: bool,
    /// The payload's `event_type`, if it is a string.
    event_type: Option<String>,
    /// Whether a string or a key anywhere in it holds a NUL character.
    nul: bool,
}

/// Reads `value` once: checks that it is one JSON object and nothing else,
/// and picks out what [`Scanned`] holds. serde_json's recursion limit
/// bounds the nesting, so no input can exhaust the stack.
fn scan(value: &[u8]) -> Result<Scanned<'_>, (DeadLetterReason, String)> {
    let not_json = |error: serde_json::Error| {
        let what = if error.is_data() {
            "payload is not a JSON object"
        } else {
            "payload is not JSON"
        };
        (DeadLetterReason::NotJson, format!("{what}: {error}"))
    };
    let mut deserializer = serde_json::Deserializer::from_slice(value);
    let top = deserializer.deserialize_any(TopLevel).map_err(not_json)?;
    deserializer.end().map_err(not_json)?;
    // Outside its strings, whose UTF-8 the parser checked, valid JSON is ASCII.
    let text = std::str::from_utf8(value).map_err(|error| {
        (
            DeadLetterReason::NotJson,
            format!("payload is not UTF-8: {error}"),
        )
    })?;
    if top.duplicate_event_id {
        return Err((
            DeadLetterReason::InvalidEventId,
            "the payload has more than one `event_id` field".into(),
        ));
    }
    Ok(Scanned {
        text,
        event_id: top.event_id,
        null_event_id: top.null_event_id,
        event_type: top.event_type,
        nul: top.nul,
    })
}

/// The top level of the value: an object.
struct TopLevel;

#[derive(Default)]
struct Top {
    event_id: Option<Result<Uuid, String>>,
    null_event_id: bool,
    duplicate_event_id: bool,
    event_type: Option<String>,
    nul: bool,
}

impl<'de> Visitor<'de> for TopLevel {
    type Value = Top;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Top, A::Error> {
        let mut top = Top::default();
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::EventId => {
                    let id = map.next_value::<EventIdValue>()?.0;
                    top.null_event_id |= id.is_none();
                    if top.event_id.is_some() && id.is_some() {
                        top.duplicate_event_id = true;
                    }
                    top.event_id = top.event_id.or(id);
                }
                Key::EventType => {
                    let value = map.next_value::<EventTypeValue>()?;
                    top.nul |= value.nul;
                    top.event_type = top.event_type.or(value.name);
                }
                Key::Other { nul } => {
                    top.nul |= nul;
                    top.nul |= map.next_value::<NulScan>()?.0;
                }
            }
        }
        Ok(top)
    }
}

/// A key of the top-level object, read without allocating.
enum Key {
    EventId,
    EventType,
    Other { nul: bool },
}

impl<'de> de::Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, key: &str) -> Result<Key, E> {
                Ok(match key {
                    wire::PAYLOAD_EVENT_ID => Key::EventId,
                    wire::PAYLOAD_EVENT_TYPE => Key::EventType,
                    other => Key::Other {
                        nul: other.contains('\0'),
                    },
                })
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// The payload's `event_id`: `None` for null, else a UUID or why not.
struct EventIdValue(Option<Result<Uuid, String>>);

impl<'de> de::Deserialize<'de> for EventIdValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct IdVisitor;
        impl<'de> Visitor<'de> for IdVisitor {
            type Value = EventIdValue;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a UUID string")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<EventIdValue, E> {
                Ok(EventIdValue(Some(Uuid::parse_str(text).map_err(|e| {
                    format!("`event_id` {:?} is not a UUID: {e}", shorten(text))
                }))))
            }
            fn visit_unit<E: de::Error>(self) -> Result<EventIdValue, E> {
                Ok(EventIdValue(None))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<EventIdValue, E> {
                Ok(not_a_uuid_string(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<EventIdValue, E> {
                Ok(not_a_uuid_string(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<EventIdValue, E> {
                Ok(not_a_uuid_string(v))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<EventIdValue, E> {
                Ok(not_a_uuid_string(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<EventIdValue, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(not_a_uuid_string("an array"))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<EventIdValue, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(not_a_uuid_string("an object"))
            }
        }
        deserializer.deserialize_any(IdVisitor)
    }
}

fn not_a_uuid_string(found: impl fmt::Display) -> EventIdValue {
    EventIdValue(Some(Err(format!(
        "`event_id` {found} is not a UUID string"
    ))))
}

/// The payload's `event_type`: its name if it is a string (anything else is
/// ignored, as if absent).
struct EventTypeValue {
    name: Option<String>,
    nul: bool,
}

impl<'de> de::Deserialize<'de> for EventTypeValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TypeVisitor;
        impl<'de> Visitor<'de> for TypeVisitor {
            type Value = EventTypeValue;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_str<E: de::Error>(self, name: &str) -> Result<EventTypeValue, E> {
                Ok(EventTypeValue {
                    name: Some(name.to_owned()),
                    nul: name.contains('\0'),
                })
            }
            fn visit_unit<E: de::Error>(self) -> Result<EventTypeValue, E> {
                Ok(not_a_name(false))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<EventTypeValue, E> {
                Ok(not_a_name(false))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<EventTypeValue, E> {
                Ok(not_a_name(false))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<EventTypeValue, E> {
                Ok(not_a_name(false))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<EventTypeValue, E> {
                Ok(not_a_name(false))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<EventTypeValue, A::Error> {
                Ok(not_a_name(NulVisitor.visit_seq(seq)?.0))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<EventTypeValue, A::Error> {
                Ok(not_a_name(NulVisitor.visit_map(map)?.0))
            }
        }
        deserializer.deserialize_any(TypeVisitor)
    }
}

fn not_a_name(nul: bool) -> EventTypeValue {
    EventTypeValue { name: None, nul }
}

/// Any JSON value, read for one fact: whether a string or key in it holds a
/// NUL character (`\u0000`), which PostgreSQL's `jsonb` refuses.
struct NulScan(bool);

impl<'de> de::Deserialize<'de> for NulScan {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(NulVisitor)
    }
}

struct NulVisitor;

impl<'de> Visitor<'de> for NulVisitor {
    type Value = NulScan;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_str<E: de::Error>(self, text: &str) -> Result<NulScan, E> {
        Ok(NulScan(text.contains('\0')))
    }
    fn visit_unit<E: de::Error>(self) -> Result<NulScan, E> {
        Ok(NulScan(false))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<NulScan, E> {
        Ok(NulScan(false))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<NulScan, E> {
        Ok(NulScan(false))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<NulScan, E> {
        Ok(NulScan(false))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<NulScan, E> {
        Ok(NulScan(false))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<NulScan, A::Error> {
        let mut nul = false;
        while let Some(NulScan(found)) = seq.next_element()? {
            nul |= found;
        }
        Ok(NulScan(nul))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<NulScan, A::Error> {
        let mut nul = false;
        while let Some((NulScan(in_key), NulScan(in_value))) = map.next_entry()? {
            nul |= in_key | in_value;
        }
        Ok(NulScan(nul))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the scan found: the payload's event id, its event type, whether
    /// it holds a NUL.
    type Found = (Option<Result<Uuid, String>>, Option<String>, bool);

    fn scanned(value: &str) -> Result<Found, DeadLetterReason> {
        scan(value.as_bytes())
            .map(|s| (s.event_id, s.event_type, s.nul))
            .map_err(|(reason, _)| reason)
    }

    #[test]
    fn the_scan_finds_the_id_the_type_and_nul_characters() {
        let id = Uuid::new_v4();
        let (found, event_type, nul) = scanned(&format!(
            r#"{{"a": [1, {{"b": "x"}}], "event_type": "Paid", "event_id": "{id}"}}"#
        ))
        .unwrap();
        assert_eq!(found, Some(Ok(id)));
        assert_eq!(event_type.as_deref(), Some("Paid"));
        assert!(!nul);
        let (_, _, nul) = scanned(r#"{"deep": [[{"k": "a\u0000b"}]]}"#).unwrap();
        assert!(nul, "NUL in a nested string");
        let (_, _, nul) = scanned(r#"{"deep": {"a\u0000": 1}}"#).unwrap();
        assert!(nul, "NUL in a nested key");
        // An escaped backslash followed by `u0000` is not a NUL.
        let (_, _, nul) = scanned(r#"{"s": "\\u0000"}"#).unwrap();
        assert!(!nul);
    }

    #[test]
    fn the_scan_refuses_what_is_not_one_json_object() {
        for bad in [
            "[1, 2]",
            "\"text\"",
            "{\"a\": 1} trailing",
            "{",
            "",
            "nul\u{0}",
        ] {
            assert_eq!(
                scanned(bad).err(),
                Some(DeadLetterReason::NotJson),
                "{bad:?}"
            );
        }
        let deep = format!("{{\"a\": {}{}}}", "[".repeat(10_000), "]".repeat(10_000));
        assert_eq!(scanned(&deep).err(), Some(DeadLetterReason::NotJson));
        assert_eq!(
            scanned(r#"{"event_id": "6d1b4f3e-1d0e-4b1a-9a57-1c2d3e4f5a6b", "event_id": "6d1b4f3e-1d0e-4b1a-9a57-1c2d3e4f5a6c"}"#).err(),
            Some(DeadLetterReason::InvalidEventId)
        );
        let (id, ..) = scanned(r#"{"event_id": 17}"#).unwrap();
        assert!(matches!(id, Some(Err(_))));
        let (id, ..) = scanned(r#"{"event_id": null}"#).unwrap();
        assert!(id.is_none());
    }

    #[test]
    fn an_event_id_from_the_header_becomes_the_first_field() {
        let id = Uuid::nil();
        assert_eq!(
            with_event_id(" { \"a\": 1 }", id, false),
            format!("{{\"event_id\":\"{id}\",\"a\": 1 }}")
        );
        assert_eq!(
            with_event_id("{ }", id, false),
            format!("{{\"event_id\":\"{id}\"}}")
        );
        let parsed: serde_json::Value =
            serde_json::from_str(&with_event_id("{}", id, false)).unwrap();
        assert_eq!(parsed["event_id"], id.to_string());
        // A null id is replaced, not repeated.
        let replaced = with_event_id(r#"{"a": 1, "event_id": null}"#, id, true);
        assert_eq!(replaced.matches("event_id").count(), 1, "{replaced}");
        let parsed: serde_json::Value = serde_json::from_str(&replaced).unwrap();
        assert_eq!(parsed["event_id"], id.to_string());
    }
}
