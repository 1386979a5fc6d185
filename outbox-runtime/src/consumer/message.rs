//! Turning a Kafka record into something a handler can take, or a reason it
//! cannot: the record's bytes are decoded by [`crate::wire::decode`], the
//! event type is resolved against this consumer's handlers here.

use rdkafka::Message;
use rdkafka::message::OwnedMessage;
use txoutbox_core::wire;
use uuid::Uuid;

use super::handler::{Dispatch, EventMeta};
use crate::wire::cloudevents;
use crate::wire::dead_letter::DeadLetterReason;
use crate::wire::decode::{header, scan, scan_text, shorten, text_headers, with_event_id};
use crate::wire::raw_headers::raw_headers;

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

/// Checks a record's size and envelope and resolves its event type: the
/// first of `type_headers` (the consumer's
/// [`event_type_header`](super::ConsumerBuilder::event_type_header)s) and
/// then `event_type` that the record has as a header, else the payload's
/// `event_type` field, else the topic's only handler (so producers without
/// headers still work). The event id is the payload's `event_id`, else the
/// `event_id` header, else the `id` header (Debezium's).
pub(crate) fn classify(
    message: &OwnedMessage,
    dispatch: &Dispatch,
    max_bytes: usize,
    type_headers: &[String],
) -> Classified {
    let value = message.payload().unwrap_or_default();
    let size = value.len() + message.key().map_or(0, <[u8]>::len);
    if size > max_bytes {
        return Classified::Bad(
            DeadLetterReason::Oversized,
            format!("message of {size} bytes exceeds the limit of {max_bytes} bytes"),
        );
    }
    let headers = message.headers().map(raw_headers).unwrap_or_default();
    // A structured CloudEvent carries the event under `data`, its id, type
    // and trace context as attributes next to it.
    let structured =
        header(&headers, wire::HEADER_CONTENT_TYPE).is_some_and(cloudevents::is_structured);
    let (scanned, attributes) = if structured {
        match cloudevents::structured(value).and_then(|mut event| {
            let data = std::mem::take(&mut event.data);
            Ok((scan_text(data)?, Some(event)))
        }) {
            Ok(found) => found,
            Err(bad) => return Classified::Bad(bad.0, bad.1),
        }
    } else {
        match scan(value) {
            Ok(scanned) => (scanned, None),
            Err(bad) => return Classified::Bad(bad.0, bad.1),
        }
    };
    let attribute = |pick: fn(&cloudevents::Structured) -> Option<&String>| {
        attributes.as_ref().and_then(pick).map(String::as_str)
    };
    let (event_id, payload) = match scanned.event_id {
        Some(Ok(id)) => (id, scanned.text.into_owned()),
        Some(Err(error)) => return Classified::Bad(DeadLetterReason::InvalidEventId, error),
        None => {
            let found = [
                wire::HEADER_EVENT_ID,
                cloudevents::HEADER_ID,
                wire::HEADER_ID,
            ]
            .into_iter()
            .find_map(|name| Some((name, header(&headers, name)?)))
            .or_else(|| Some(("CloudEvent `id`", attribute(|e| e.id.as_ref())?)));
            match found {
                Some((name, text)) => match Uuid::parse_str(text) {
                    Ok(id) => (id, with_event_id(&scanned.text, id, scanned.null_event_id)),
                    Err(e) => {
                        return Classified::Bad(
                            DeadLetterReason::InvalidEventId,
                            format!(
                                "payload has no `event_id` and the `{name}` header {:?} is not a UUID: {e}",
                                shorten(text)
                            ),
                        );
                    }
                },
                None => {
                    return Classified::Bad(
                        DeadLetterReason::MissingEventId,
                        "payload has no `event_id` and the record no `event_id` (or `ce_id`, \
                         `id`) header"
                            .into(),
                    );
                }
            }
        }
    };
    let topic = message.topic();
    let named = type_headers
        .iter()
        .map(String::as_str)
        .chain([wire::HEADER_EVENT_TYPE, cloudevents::HEADER_TYPE])
        .find_map(|name| header(&headers, name))
        .or_else(|| attribute(|e| e.event_type.as_ref()))
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
    let traceparent = header(&headers, wire::HEADER_TRACEPARENT)
        .or_else(|| attribute(|e| e.traceparent.as_ref()))
        .or_else(|| header(&headers, cloudevents::HEADER_TRACEPARENT))
        .map(str::to_owned);
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
