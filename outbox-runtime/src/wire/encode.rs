//! Encoding: the headers of an outbox row's record, as
//! `docs/wire-format.md` specifies them. The relay and `outbox replay` send
//! the same record through here.

use rdkafka::message::{Header, OwnedHeaders};
use txoutbox_core::wire;

/// What the wire-format headers of an outbox row are made of.
pub(crate) struct WireRow<'a> {
    pub(crate) event_id: &'a str,
    pub(crate) event_type: &'a str,
    pub(crate) aggregate_type: &'a str,
    pub(crate) aggregate_id: &'a str,
    pub(crate) traceparent: Option<&'a str>,
}

/// The headers `docs/wire-format.md` specifies for an outbox row. The one
/// place they are built: the relay and `outbox replay` send the same record.
pub(crate) fn record_headers(row: &WireRow<'_>) -> OwnedHeaders {
    let mut headers = OwnedHeaders::new_with_capacity(7);
    for (key, value) in [
        (wire::HEADER_EVENT_ID, row.event_id),
        (wire::HEADER_EVENT_TYPE, row.event_type),
        (wire::HEADER_AGGREGATE_TYPE, row.aggregate_type),
        (wire::HEADER_AGGREGATE_ID, row.aggregate_id),
        (wire::HEADER_CONTENT_TYPE, wire::CONTENT_TYPE_JSON),
    ] {
        headers = headers.insert(Header {
            key,
            value: Some(value),
        });
    }
    if let Some(traceparent) = row.traceparent {
        headers = headers.insert(Header {
            key: wire::HEADER_TRACEPARENT,
            value: Some(traceparent),
        });
    }
    headers
}
