//! What the inbox's parts and its databases' statements share: the rows a
//! claim reads and what they ask for, what a unit of work settles, the
//! store's partition locks, and the sizes and shapes rows are stored in. A
//! leaf: it depends on no other part of the inbox.

use std::sync::Arc;

use uuid::Uuid;

use crate::consumer::handler::{ErasedHandler, EventMeta};
use crate::consumer::message::Envelope;
use crate::wire::dead_letter::DeadLetterReason;

/// What orders inbox rows: their topic and partition key (rows without a key
/// have no order).
pub(crate) type OrderKey = (String, String);

/// An inbox row as a claim reads it, from either database.
#[derive(sqlx::FromRow)]
pub(crate) struct InboxRow {
    pub(crate) seq: i64,
    pub(crate) event_id: Uuid,
    /// The payload's JSON text.
    pub(crate) payload: String,
    pub(crate) event_type: Option<String>,
    pub(crate) topic: Option<String>,
    pub(crate) partition_key: Option<String>,
    /// The headers as a JSON object of text values.
    pub(crate) headers: Option<serde_json::Value>,
    pub(crate) attempts: i32,
}

/// What a store's first statement found, after trying its partitions'
/// locks.
pub(crate) enum LockedStore {
    /// Another transaction holds one of the locks: nothing read or inserted.
    Blocked,
    /// The locks are held, and these (topic, key) pairs of the batch have
    /// pending rows (perhaps none); nothing inserted.
    Pending(Vec<OrderKey>),
    /// The locks are held, no key of the batch has pending rows, and the
    /// rows to handle on receipt were inserted, processed: these ids (the
    /// others were in the inbox already).
    Inserted(Vec<Uuid>),
}

/// How many due keys a claim looks at: room for the batch even when the
/// processors running alongside (in this process and others) hold a batch of
/// keys each, which the claim skips.
pub(crate) fn candidate_window(batch: usize) -> i64 {
    i64::try_from(batch.saturating_mul(8).max(1_000)).unwrap_or(i64::MAX)
}

/// A claimed row, ready to be handled (or set aside).
pub(crate) struct Claim {
    /// Its arrival sequence (MySQL moves its key's head from it).
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub seq: i64,
    pub event_id: Uuid,
    pub key: Option<OrderKey>,
    pub attempts: i32,
    pub payload: String,
    pub what: What,
}

/// What a claimed row asks for.
pub(crate) enum What {
    Handle(Arc<dyn ErasedHandler>, EventMeta),
    /// No handler here for its event type: left pending (with the rest of
    /// its key) for a processor that has one, e.g. a newer version of this
    /// service during a rolling deploy.
    NotMine,
    /// Cannot be handled by anyone: parked with this reason.
    Park(DeadLetterReason, String),
}

/// One failed attempt as recorded: `delay_ms` until the next, or `None`
/// (parked).
pub(crate) struct FailedRow<'a> {
    pub(crate) event_id: Uuid,
    pub(crate) error: &'a str,
    pub(crate) delay_ms: Option<i64>,
}

/// What a unit of work settled, written at the end of its transaction (the
/// rows stay locked until then): the statements' input.
pub(crate) struct Settled<'a> {
    pub(crate) processed: &'a [Uuid],
    /// Failed attempts and parked rows.
    pub(crate) failed: Vec<FailedRow<'a>>,
    /// Every row the unit claimed (MySQL moves their keys' heads).
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) claims: &'a [Claim],
}

/// One partition's store lock: its topic and partition (of this group).
pub(crate) type PartitionLock = (String, i32);

/// About what a row takes in an insert statement: its text columns, its
/// headers as JSON, and room for the rest.
pub(crate) fn row_bytes(envelope: &Envelope) -> usize {
    let meta = &envelope.meta;
    // JSON text: an escaped character takes up to six bytes.
    let headers: usize = meta
        .headers
        .iter()
        .map(|(k, v)| (k.len() + v.len()) * 6 + 8)
        .sum();
    envelope.payload.len()
        + meta.event_type.len()
        + meta.topic.len()
        + meta.key.as_ref().map_or(0, String::len)
        + headers
        + 256
}

/// A row's headers as the inbox keeps them: one JSON object of text values.
pub(crate) fn headers_object(headers: &[(String, String)]) -> serde_json::Value {
    serde_json::Value::Object(
        headers
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect(),
    )
}
