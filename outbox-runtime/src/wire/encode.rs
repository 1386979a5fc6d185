//! Encoding: the headers of an outbox row's record, as
//! `docs/wire-format.md` specifies them. The relay and `outbox replay` send
//! the same record through here.

use std::borrow::Cow;

use rdkafka::message::{Header, OwnedHeaders};
use txoutbox_core::wire;

use super::cloudevents::CloudEvents;

/// The value of a row's record: its stored payload (`jsonb::text`), naming
/// its event type under `event_type`. Rows written by
/// `OutboxRecord::from_event` have it already and go out as stored (one
/// substring search); rows written before the framework added it, or by
/// another writer, get it from the row's `event_type` column as their first
/// field. A payload that is not an object, or that holds the text
/// `"event_type"` anywhere (as a key of a nested object, say), goes out as
/// stored. The relay and `outbox replay` send values through here; the
/// stored row is not changed. (In SQL, a `CASE` over the jsonb cost the
/// claim a fifth of its throughput.)
pub(crate) fn value_naming_type<'a>(payload: &'a str, event_type: &str) -> Cow<'a, str> {
    let quoted_key = concat!('"', "event_type", '"');
    debug_assert_eq!(
        &quoted_key[1..quoted_key.len() - 1],
        wire::PAYLOAD_EVENT_TYPE
    );
    let body = payload.trim_start();
    if !body.starts_with('{') || payload.contains(quoted_key) {
        return Cow::Borrowed(payload);
    }
    let rest = body[1..].trim_start();
    let separator = if rest.starts_with('}') { "" } else { ", " };
    let name = serde_json::Value::from(event_type);
    Cow::Owned(format!("{{{quoted_key}: {name}{separator}{rest}"))
}

/// The names of the headers the relay (and `outbox replay`) put on every
/// record, for consumers that expect other names: a service moving from
/// Debezium's outbox event router to this relay keeps its consumers
/// unchanged with [`HeaderNames::debezium`]. Default: the wire format's
/// names (`event_id`, `event_type`, `aggregate_type`, `aggregate_id`, see
/// `docs/wire-format.md`). `content-type` and `traceparent` keep their
/// names.
///
/// Renaming costs this framework's consumers nothing: they read the event
/// id and type from the value first (the framework puts both there), and
/// can be told a header name with
/// [`ConsumerBuilder::event_type_header`](crate::consumer::ConsumerBuilder::event_type_header).
///
/// ```
/// use txoutbox_runtime::relay::HeaderNames;
///
/// let names = HeaderNames::default().event_type("eventType").event_id("id");
/// assert_eq!(names, HeaderNames::debezium());
/// assert_eq!(names.event_id_name(), "id");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderNames {
    event_id: String,
    event_type: String,
    aggregate_type: String,
    aggregate_id: String,
}

impl Default for HeaderNames {
    fn default() -> Self {
        Self {
            event_id: wire::HEADER_EVENT_ID.to_owned(),
            event_type: wire::HEADER_EVENT_TYPE.to_owned(),
            aggregate_type: wire::HEADER_AGGREGATE_TYPE.to_owned(),
            aggregate_id: wire::HEADER_AGGREGATE_ID.to_owned(),
        }
    }
}

impl HeaderNames {
    /// The names Debezium's outbox event router gives by default and with
    /// the usual `table.fields.additional.placement=type:header:eventType`:
    /// the event id in `id`, the event type in `eventType`; the aggregate's
    /// headers keep their names (the router sends none by default, so its
    /// consumers do not read them).
    pub fn debezium() -> Self {
        Self::default()
            .event_id(wire::HEADER_ID)
            .event_type("eventType")
    }

    /// The header carrying the event id. Default `event_id`.
    pub fn event_id(mut self, name: impl Into<String>) -> Self {
        self.event_id = name.into();
        self
    }

    /// The header carrying the event type. Default `event_type`.
    pub fn event_type(mut self, name: impl Into<String>) -> Self {
        self.event_type = name.into();
        self
    }

    /// The header carrying the aggregate type. Default `aggregate_type`.
    pub fn aggregate_type(mut self, name: impl Into<String>) -> Self {
        self.aggregate_type = name.into();
        self
    }

    /// The header carrying the aggregate id. Default `aggregate_id`.
    pub fn aggregate_id(mut self, name: impl Into<String>) -> Self {
        self.aggregate_id = name.into();
        self
    }

    /// The event id header's name.
    pub fn event_id_name(&self) -> &str {
        &self.event_id
    }

    /// The event type header's name.
    pub fn event_type_name(&self) -> &str {
        &self.event_type
    }

    /// Why these names cannot be used, if they cannot: a name is empty,
    /// two are the same, or one is a header the framework sets itself
    /// (`content-type`, `traceparent`, `replay`).
    pub fn problem(&self) -> Option<String> {
        let names = self.names();
        for (i, (what, name)) in names.iter().enumerate() {
            if name.is_empty() {
                return Some(format!("the {what} header name is empty"));
            }
            if [
                wire::HEADER_CONTENT_TYPE,
                wire::HEADER_TRACEPARENT,
                wire::HEADER_REPLAY,
            ]
            .contains(name)
            {
                return Some(format!(
                    "the {what} header cannot be named `{name}`: the framework sets that header itself"
                ));
            }
            if let Some((other, _)) = names[..i].iter().find(|(_, n)| n == name) {
                return Some(format!(
                    "the {other} and {what} headers are both named `{name}`"
                ));
            }
        }
        None
    }

    fn names(&self) -> [(&'static str, &str); 4] {
        [
            ("event id", &self.event_id),
            ("event type", &self.event_type),
            ("aggregate type", &self.aggregate_type),
            ("aggregate id", &self.aggregate_id),
        ]
    }
}

/// What the wire-format headers of an outbox row are made of.
pub(crate) struct WireRow<'a> {
    pub(crate) event_id: &'a str,
    pub(crate) event_type: &'a str,
    pub(crate) aggregate_type: &'a str,
    pub(crate) aggregate_id: &'a str,
    pub(crate) traceparent: Option<&'a str>,
    /// The row's `headers` column as JSON text (see [`user_headers`]).
    pub(crate) user_headers: Option<&'a str>,
    /// For the CloudEvents headers: the record's topic and key, and when
    /// the event was recorded.
    pub(crate) topic: &'a str,
    pub(crate) partition_key: &'a str,
    pub(crate) created_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// The headers `docs/wire-format.md` specifies for an outbox row, under
/// `names`, with CloudEvents' binary-mode headers when `cloudevents` is
/// given. The one place they are built: the relay and `outbox replay` send
/// the same record.
pub(crate) fn record_headers(
    row: &WireRow<'_>,
    names: &HeaderNames,
    cloudevents: Option<&CloudEvents>,
) -> OwnedHeaders {
    let mut headers = OwnedHeaders::new_with_capacity(16);
    if cloudevents.is_none_or(CloudEvents::framework_headers) {
        for (key, value) in [
            (names.event_id.as_str(), row.event_id),
            (names.event_type.as_str(), row.event_type),
            (names.aggregate_type.as_str(), row.aggregate_type),
            (names.aggregate_id.as_str(), row.aggregate_id),
        ] {
            headers = headers.insert(Header {
                key,
                value: Some(value),
            });
        }
    }
    headers = headers.insert(Header {
        key: wire::HEADER_CONTENT_TYPE,
        value: Some(wire::CONTENT_TYPE_JSON),
    });
    if let Some(cloudevents) = cloudevents {
        let attributes = super::cloudevents::Attributes {
            id: row.event_id,
            event_type: row.event_type,
            subject: row.aggregate_id,
            time: row.created_at,
            topic: row.topic,
            partition_key: row.partition_key,
            traceparent: row.traceparent,
        };
        for (key, value) in cloudevents.headers(&attributes) {
            headers = headers.insert(Header {
                key,
                value: Some(&value),
            });
        }
    }
    if let Some(traceparent) = row.traceparent {
        headers = headers.insert(Header {
            key: wire::HEADER_TRACEPARENT,
            value: Some(traceparent),
        });
    }
    for (key, value) in user_headers(row.user_headers) {
        headers = headers.insert(Header {
            key: &key,
            value: Some(&value),
        });
    }
    headers
}

/// The user's headers of a row, from its `headers` column (JSON text, NULL
/// for none), in name order. Rows written through the framework hold
/// an object of strings; a value of another JSON type (another writer's) is
/// sent as its JSON text, and a column that is not an object is not sent at
/// all (logged): the record still goes out, with the framework's headers.
pub(crate) fn user_headers(stored: Option<&str>) -> Vec<(String, String)> {
    let Some(stored) = stored else {
        return Vec::new();
    };
    match serde_json::from_str::<serde_json::Value>(stored) {
        Ok(serde_json::Value::Object(map)) => {
            let mut headers: Vec<(String, String)> = map
                .into_iter()
                .map(|(name, value)| match value {
                    serde_json::Value::String(text) => (name, text),
                    other => (name, other.to_string()),
                })
                .collect();
            // One order whatever serde_json's map keeps: by name.
            headers.sort();
            headers
        }
        _ => {
            tracing::warn!(
                headers = %super::decode::shorten(stored),
                "an outbox row's `headers` column is not a JSON object; the record is sent without them"
            );
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{HeaderNames, user_headers, value_naming_type};

    #[test]
    fn a_value_names_its_event_type() {
        // Written by the framework: as stored.
        let stored = r#"{"amount": 1, "event_id": "x", "event_type": "Paid"}"#;
        assert!(matches!(
            value_naming_type(stored, "Paid"),
            std::borrow::Cow::Borrowed(_)
        ));
        // Stored without it: added as the first field.
        let added = value_naming_type(r#"{"amount": 1}"#, "Paid");
        assert_eq!(added, r#"{"event_type": "Paid", "amount": 1}"#);
        assert_eq!(value_naming_type("{}", "Paid"), r#"{"event_type": "Paid"}"#);
        let escaped = value_naming_type(r#" {"a": 1}"#, "we\"ird");
        let parsed: serde_json::Value = serde_json::from_str(&escaped).unwrap();
        assert_eq!(parsed["event_type"], "we\"ird");
        // Not an object: as stored.
        assert_eq!(value_naming_type("[1, 2]", "Paid"), "[1, 2]");
    }

    #[test]
    fn stored_user_headers_are_read_leniently() {
        assert!(user_headers(None).is_empty());
        assert_eq!(
            user_headers(Some(r#"{"tenant": "acme", "v": 2, "flag": null}"#)),
            [
                ("flag".to_owned(), "null".to_owned()),
                ("tenant".to_owned(), "acme".to_owned()),
                ("v".to_owned(), "2".to_owned()),
            ]
        );
        assert!(user_headers(Some(r#"["not", "an", "object"]"#)).is_empty());
        assert!(user_headers(Some("not json")).is_empty());
    }

    #[test]
    fn header_names_must_be_distinct_non_empty_and_not_the_frameworks_own() {
        assert_eq!(HeaderNames::default().problem(), None);
        assert_eq!(HeaderNames::debezium().problem(), None);
        let problem = |names: HeaderNames| names.problem().unwrap_or_default();
        assert!(
            problem(HeaderNames::default().event_id("")).contains("event id header name is empty")
        );
        assert!(
            problem(HeaderNames::default().aggregate_id("event_type"))
                .contains("event type and aggregate id headers are both named `event_type`")
        );
        for taken in ["content-type", "traceparent", "replay"] {
            assert!(
                problem(HeaderNames::default().event_type(taken))
                    .contains("sets that header itself"),
                "{taken}"
            );
        }
    }
}
