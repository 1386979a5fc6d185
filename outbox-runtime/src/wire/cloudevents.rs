//! CloudEvents on the wire (the Kafka protocol binding of CloudEvents 1.0):
//! the headers of binary content mode that the relay and `outbox replay`
//! add to a record ([`CloudEvents`]), and the reading of a structured-mode
//! record's value ([`structured`]). `docs/wire-format.md`, "CloudEvents",
//! is the normative description.

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::value::RawValue;

use super::dead_letter::DeadLetterReason;

/// `ce_specversion`.
pub(crate) const SPEC_VERSION: &str = "1.0";
/// `content-type` of a structured-mode record (its parameters, such as
/// `; charset=utf-8`, are allowed).
pub(crate) const STRUCTURED_CONTENT_TYPE: &str = "application/cloudevents+json";
/// Binary mode's `id` attribute.
pub(crate) const HEADER_ID: &str = "ce_id";
/// Binary mode's `type` attribute.
pub(crate) const HEADER_TYPE: &str = "ce_type";
/// The distributed tracing extension.
pub(crate) const HEADER_TRACEPARENT: &str = "ce_traceparent";

/// Publishing every record as a CloudEvent in **binary content mode** as
/// well: the value stays the event's JSON object (so readers of the value
/// alone see no change), `content-type` is its `datacontenttype`, and the
/// attributes travel as `ce_` headers. A relay setting
/// ([`RelayBuilder::cloudevents`](crate::relay::RelayBuilder::cloudevents))
/// and a replay one ([`Replay::cloudevents`](crate::ops::replay::Replay::cloudevents)).
///
/// | header | value |
/// | --- | --- |
/// | `ce_specversion` | `1.0` |
/// | `ce_id` | the event id |
/// | `ce_source` | [`source`](Self::source); default `/txoutbox/<database name>` |
/// | `ce_type` | the event type |
/// | `ce_subject` | the aggregate id |
/// | `ce_time` | when the event was recorded (`created_at`, RFC 3339, UTC) |
/// | `ce_dataschema` | with [`dataschema_base`](Self::dataschema_base): the base followed by the schema's `$id` (`<topic>/<event_type>.json`) |
/// | `ce_partitionkey` | the record key (partitioning extension) |
/// | `ce_traceparent` | the W3C trace context, when the record has one (distributed tracing extension) |
///
/// The framework's own headers stay next to them unless
/// [`without_framework_headers`](Self::without_framework_headers): this
/// framework's consumers read the id and the type from the `ce_` headers
/// (and the value) just as well.
///
/// ```
/// use txoutbox_runtime::relay::CloudEvents;
///
/// let binary = CloudEvents::binary()
///     .source("https://orders.example.com")
///     .dataschema_base("https://schemas.example.com/");
/// assert_eq!(binary.problem(), None);
/// assert!(CloudEvents::binary().source("").problem().is_some());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudEvents {
    source: Option<String>,
    dataschema_base: Option<String>,
    framework_headers: bool,
}

impl CloudEvents {
    /// Binary content mode, next to the framework's headers, with the
    /// default source.
    pub fn binary() -> Self {
        Self {
            source: None,
            dataschema_base: None,
            framework_headers: true,
        }
    }

    /// The `source` attribute of every event (a URI reference naming the
    /// producing service, e.g. `/orders` or `https://orders.example.com`).
    /// Default `/txoutbox/<database name>`: each service owns its database,
    /// so the name tells the services apart.
    pub fn source(mut self, source: impl Into<String>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// Sends `ce_dataschema`: this absolute URI followed by the schema's
    /// `$id` (`<topic>/<event_type>.json`, as in `schemas/`), e.g.
    /// `https://schemas.example.com/` where `schemas/` is served. Default:
    /// no `ce_dataschema` (CloudEvents requires an absolute URI, which only
    /// you know).
    pub fn dataschema_base(mut self, base: impl Into<String>) -> Self {
        self.dataschema_base = Some(base.into());
        self
    }

    /// Sends the `ce_` headers instead of the framework's `event_id`,
    /// `event_type`, `aggregate_type` and `aggregate_id` (`content-type`,
    /// `traceparent` and headers of your own stay).
    pub fn without_framework_headers(mut self) -> Self {
        self.framework_headers = false;
        self
    }

    /// Why this setting cannot be used, if it cannot: an empty source or
    /// data schema base.
    pub fn problem(&self) -> Option<String> {
        if self.source.as_deref().is_some_and(str::is_empty) {
            return Some("the CloudEvents source is empty".into());
        }
        if self.dataschema_base.as_deref().is_some_and(str::is_empty) {
            return Some("the CloudEvents data schema base is empty".into());
        }
        None
    }

    /// Whether the framework's own headers go next to the `ce_` ones.
    pub(crate) fn framework_headers(&self) -> bool {
        self.framework_headers
    }

    /// This setting with its default source filled in from `database`.
    pub(crate) fn resolved(mut self, database: Option<&str>) -> Self {
        if self.source.is_none() {
            self.source = Some(format!("/txoutbox/{}", database.unwrap_or("outbox")));
        }
        self
    }

    /// The binary-mode headers of one record, as (name, value).
    pub(crate) fn headers(&self, event: &Attributes<'_>) -> Vec<(&'static str, String)> {
        let mut headers = vec![
            ("ce_specversion", SPEC_VERSION.to_owned()),
            (HEADER_ID, event.id.to_owned()),
            (
                "ce_source",
                self.source.clone().unwrap_or_else(|| "/txoutbox".into()),
            ),
            (HEADER_TYPE, event.event_type.to_owned()),
            ("ce_subject", event.subject.to_owned()),
        ];
        if let Some(time) = event.time {
            headers.push(("ce_time", time.to_rfc3339_opts(SecondsFormat::Micros, true)));
        }
        if let Some(base) = &self.dataschema_base {
            headers.push((
                "ce_dataschema",
                format!("{base}{}/{}.json", event.topic, event.event_type),
            ));
        }
        headers.push(("ce_partitionkey", event.partition_key.to_owned()));
        if let Some(traceparent) = event.traceparent {
            headers.push((HEADER_TRACEPARENT, traceparent.to_owned()));
        }
        headers
    }
}

/// What the `ce_` headers of one record are made of.
pub(crate) struct Attributes<'a> {
    pub(crate) id: &'a str,
    pub(crate) event_type: &'a str,
    pub(crate) subject: &'a str,
    pub(crate) time: Option<DateTime<Utc>>,
    pub(crate) topic: &'a str,
    pub(crate) partition_key: &'a str,
    pub(crate) traceparent: Option<&'a str>,
}

/// Whether `content_type` (a record's `content-type` header) names
/// CloudEvents' structured mode in JSON.
pub(crate) fn is_structured(content_type: &str) -> bool {
    let media_type = content_type.split(';').next().unwrap_or_default().trim();
    media_type.eq_ignore_ascii_case(STRUCTURED_CONTENT_TYPE)
}

/// A structured-mode record's value, read: the event's data (a JSON object,
/// as text) and the attributes a consumer uses.
#[derive(Debug, PartialEq)]
pub(crate) struct Structured {
    /// `data`, as JSON text: the payload handlers see.
    pub(crate) data: String,
    pub(crate) id: Option<String>,
    pub(crate) event_type: Option<String>,
    pub(crate) traceparent: Option<String>,
}

/// The attributes of a structured-mode value that a consumer reads, each
/// kept as the raw JSON it is (no tree is built: the value is foreign
/// input, and `data` can be as large as a record); other attributes are
/// skipped unread.
#[derive(serde::Deserialize)]
struct StructuredValue<'a> {
    #[serde(borrow)]
    specversion: Option<&'a RawValue>,
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    #[serde(borrow, rename = "type")]
    event_type: Option<&'a RawValue>,
    #[serde(borrow)]
    traceparent: Option<&'a RawValue>,
    #[serde(borrow)]
    datacontenttype: Option<&'a RawValue>,
    #[serde(borrow)]
    data: Option<&'a RawValue>,
    #[serde(borrow)]
    data_base64: Option<&'a RawValue>,
}

/// A raw attribute's text, if it is a JSON string.
fn text(raw: Option<&RawValue>) -> Option<String> {
    serde_json::from_str(raw?.get()).ok()
}

/// Reads a structured-mode value: one JSON object with `specversion` and
/// the event's JSON object under `data` (its `datacontenttype`, if given,
/// JSON). `data_base64` or data of another kind is refused: handlers take
/// JSON objects. `data` is handed on as the record's own bytes.
pub(crate) fn structured(value: &[u8]) -> Result<Structured, (DeadLetterReason, String)> {
    let bad = |error: String| (DeadLetterReason::NotJson, error);
    // serde would also read a struct from an array of its fields in order.
    if value.trim_ascii_start().first() != Some(&b'{') {
        return Err(bad(
            "a structured CloudEvent (content-type application/cloudevents+json) must be one JSON object"
                .into(),
        ));
    }
    let event: StructuredValue<'_> = serde_json::from_slice(value).map_err(|error| {
        bad(format!(
            "a structured CloudEvent (content-type application/cloudevents+json) must be one \
             JSON object: {error}"
        ))
    })?;
    if text(event.specversion).is_none() {
        return Err(bad(
            "a structured CloudEvent has no `specversion` attribute".into(),
        ));
    }
    if let Some(content_type) = text(event.datacontenttype)
        && !is_json(&content_type)
    {
        return Err(bad(format!(
            "the CloudEvent's data is `{}`, not JSON",
            super::decode::shorten(&content_type)
        )));
    }
    let data = match event.data.map(RawValue::get) {
        Some(data) if data.trim_start().starts_with('{') => data.to_owned(),
        Some(_) => {
            return Err(bad("the CloudEvent's `data` is not a JSON object".into()));
        }
        None if event.data_base64.is_some() => {
            return Err(bad(
                "the CloudEvent carries `data_base64`; handlers take JSON objects".into(),
            ));
        }
        None => return Err(bad("the CloudEvent has no `data`".into())),
    };
    Ok(Structured {
        data,
        id: text(event.id),
        event_type: text(event.event_type),
        traceparent: text(event.traceparent),
    })
}

/// Whether a media type is JSON (`application/json`, `text/json`, `+json`).
fn is_json(media_type: &str) -> bool {
    let media_type = media_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    media_type == "application/json" || media_type == "text/json" || media_type.ends_with("+json")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_binary_headers_follow_the_kafka_binding() {
        let time = DateTime::parse_from_rfc3339("2026-12-02T10:00:00.123456Z")
            .unwrap()
            .with_timezone(&Utc);
        let event = Attributes {
            id: "6d1b4f3e-1d0e-4b1a-9a57-1c2d3e4f5a6b",
            event_type: "OrderCreated",
            subject: "order-1",
            time: Some(time),
            topic: "order.events",
            partition_key: "order-1",
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        };
        let headers = CloudEvents::binary()
            .dataschema_base("https://schemas.example.com/")
            .resolved(Some("orders"))
            .headers(&event);
        let get = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("ce_specversion"), Some("1.0"));
        assert_eq!(get("ce_source"), Some("/txoutbox/orders"));
        assert_eq!(get("ce_time"), Some("2026-12-02T10:00:00.123456Z"));
        assert_eq!(
            get("ce_dataschema"),
            Some("https://schemas.example.com/order.events/OrderCreated.json")
        );
        assert_eq!(get("ce_partitionkey"), Some("order-1"));
        assert!(get("ce_traceparent").is_some());
        let no_schema = CloudEvents::binary()
            .source("/orders")
            .headers(&Attributes {
                traceparent: None,
                time: None,
                ..event
            });
        assert!(
            !no_schema
                .iter()
                .any(|(n, _)| *n == "ce_dataschema" || *n == "ce_traceparent" || *n == "ce_time")
        );
        assert!(no_schema.contains(&("ce_source", "/orders".to_owned())));
    }

    #[test]
    fn a_structured_value_gives_its_data_and_attributes() {
        assert!(is_structured("application/cloudevents+json; charset=UTF-8"));
        assert!(!is_structured("application/json"));
        let read = structured(
            br#"{"specversion": "1.0", "id": "a", "type": "T", "source": "/s",
                 "traceparent": "00-x", "datacontenttype": "application/json", "data": {"n": 1}}"#,
        )
        .unwrap();
        assert_eq!(
            read,
            Structured {
                data: r#"{"n": 1}"#.into(),
                id: Some("a".into()),
                event_type: Some("T".into()),
                traceparent: Some("00-x".into()),
            }
        );
        for (bad, why) in [
            (&br#"[1]"#[..], "one JSON object"),
            (
                br#"["1.0", "a", "T", null, null, {"n": 1}, null]"#,
                "one JSON object",
            ),
            (
                br#"{"specversion": "1.0", "data": {}, "data": {}}"#,
                "duplicate field",
            ),
            (
                br#"{"specversion": "1.0", "data": {"a": [}}"#,
                "one JSON object",
            ),
            (br#"{"data": {}}"#, "specversion"),
            (
                br#"{"specversion": "1.0", "data_base64": "e30="}"#,
                "data_base64",
            ),
            (
                br#"{"specversion": "1.0", "data": "text"}"#,
                "not a JSON object",
            ),
            (br#"{"specversion": "1.0"}"#, "no `data`"),
            (
                br#"{"specversion": "1.0", "datacontenttype": "text/plain", "data": {}}"#,
                "not JSON",
            ),
        ] {
            let (reason, error) = structured(bad).unwrap_err();
            assert_eq!(reason, DeadLetterReason::NotJson);
            assert!(error.contains(why), "{error}");
        }
    }
}
