//! Decoding: what a record's bytes say, from any bytes in any field,
//! without a panic and without building a JSON tree.
//!
//! The value is read in one pass that keeps nothing of it but the
//! `event_id` and `event_type` fields and whether a string holds a NUL
//! character (see [`scan`]); the handler's event type is deserialized from
//! the same bytes later. A 1 MiB array of small numbers would be about
//! 16 MiB as a `serde_json::Value`; here it costs its bytes. Headers are
//! read as bytes ([`super::raw_headers`]); only UTF-8 ones count as text.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use txoutbox_core::wire;
use uuid::Uuid;

use super::dead_letter::DeadLetterReason;
use super::raw_headers::RawHeader;

/// The record's headers whose name and value are both UTF-8 text, in order
/// (the others stay on the wire, for the dead-letter copy only).
pub(crate) fn text_headers(headers: &[RawHeader<'_>]) -> Vec<(String, String)> {
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
pub(crate) fn header<'a>(headers: &[RawHeader<'a>], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .filter(|h| h.name == name.as_bytes())
        .find_map(|h| std::str::from_utf8(h.value?).ok())
}

/// `object` (JSON object text) with `"event_id": id` as its first field;
/// `replace_null`: the object has `"event_id": null`, which goes (rare, so
/// through a JSON tree).
pub(crate) fn with_event_id(object: &str, id: Uuid, replace_null: bool) -> String {
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
pub(crate) fn shorten(text: &str) -> String {
    match text.char_indices().nth(64) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_owned(),
    }
}

/// What one pass over a record's value found.
#[derive(Debug)]
pub(crate) struct Scanned<'a> {
    /// The value as text (a JSON object): the record's own bytes, or what a
    /// JSON string value held (see [`scan`]).
    pub(crate) text: Cow<'a, str>,
    /// The payload's `event_id`: `None` if absent or null.
    pub(crate) event_id: Option<Result<Uuid, String>>,
    /// Whether the payload has `"event_id": null`.
    pub(crate) null_event_id: bool,
    /// The payload's `event_type`, if it is a string.
    pub(crate) event_type: Option<String>,
    /// Whether a string or a key anywhere in it holds a NUL character.
    pub(crate) nul: bool,
}

/// Reads `value` once: checks that it is one JSON object and nothing else,
/// and picks out what [`Scanned`] holds. serde_json's recursion limit
/// bounds the nesting, so no input can exhaust the stack.
///
/// A value that is a JSON string holding a JSON object is read as that
/// object: Debezium's outbox event router, with Kafka Connect's
/// `JsonConverter` and its default `table.expand.json.payload=false`, sends
/// the payload column that way. One level only: a string in a string is not
/// an event.
pub(crate) fn scan(value: &[u8]) -> Result<Scanned<'_>, (DeadLetterReason, String)> {
    if value.trim_ascii_start().first() != Some(&b'"') {
        return scan_object(value);
    }
    let inner: String = serde_json::from_slice(value).map_err(|error| {
        (
            DeadLetterReason::NotJson,
            format!("payload is not JSON: {error}"),
        )
    })?;
    if inner.trim_start().starts_with('"') {
        return Err((
            DeadLetterReason::NotJson,
            "payload is a JSON string holding a JSON string, not an object".into(),
        ));
    }
    let found = scan_object(inner.as_bytes()).map_err(|(reason, error)| {
        (
            reason,
            format!("{error} (in the JSON string the value holds)"),
        )
    })?;
    Ok(Scanned {
        text: Cow::Owned(found.text.into_owned()),
        event_id: found.event_id,
        null_event_id: found.null_event_id,
        event_type: found.event_type,
        nul: found.nul,
    })
}

/// [`scan`] of JSON text the consumer made (a structured CloudEvent's
/// `data`): must be one JSON object.
pub(crate) fn scan_text(text: String) -> Result<Scanned<'static>, (DeadLetterReason, String)> {
    let (event_id, null_event_id, event_type, nul) = {
        let found = scan_object(text.as_bytes())?;
        (
            found.event_id,
            found.null_event_id,
            found.event_type,
            found.nul,
        )
    };
    Ok(Scanned {
        text: Cow::Owned(text),
        event_id,
        null_event_id,
        event_type,
        nul,
    })
}

/// [`scan`] of a value that must be a JSON object itself.
fn scan_object(value: &[u8]) -> Result<Scanned<'_>, (DeadLetterReason, String)> {
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
        text: Cow::Borrowed(text),
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
            "\"[1]\"",
            "\"\\\"{}\\\"\"",
            "\"{\\\"a\\\": 1} trailing\"",
            "\"{\" ",
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

    /// Debezium's outbox router with `JsonConverter` sends the payload
    /// column as a JSON string: the object it holds is the event.
    #[test]
    fn a_json_string_holding_an_object_is_read_as_that_object() {
        let id = Uuid::new_v4();
        let object = format!(r#"{{"event_id": "{id}", "event_type": "Paid", "n": "a\u0000"}}"#);
        let value = serde_json::to_string(&object).unwrap();
        assert!(value.starts_with('"'));
        let found = scan(value.as_bytes()).unwrap();
        assert_eq!(found.text, object);
        assert_eq!(found.event_id, Some(Ok(id)));
        assert_eq!(found.event_type.as_deref(), Some("Paid"));
        assert!(found.nul);
        // The router's documented example: no event id in the payload.
        let found = scan(br#" "{\"id\": 1, \"lineItems\": []}" "#).unwrap();
        assert_eq!(found.text, r#"{"id": 1, "lineItems": []}"#);
        assert_eq!(found.event_id, None);
        // Bad JSON inside the string says where it was.
        let (reason, error) = scan(br#""{\"a\": }""#).unwrap_err();
        assert_eq!(reason, DeadLetterReason::NotJson);
        assert!(error.contains("in the JSON string"), "{error}");
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
