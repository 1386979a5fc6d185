//! A processor's claim: the heads of due keys and the pending rows behind
//! them, read into what each row asks for (handle, leave, park).

use super::rows::{Claim, InboxRow, What};
use crate::consumer::database::{Pool, Tx};
use crate::consumer::handler::EventMeta;
use crate::consumer::shared::Shared;
use crate::wire::dead_letter::DeadLetterReason;

/// Claims up to a batch of rows: the heads of due keys and the pending rows
/// behind each head (its run).
///
/// Due keys come from `inbox_key`, oldest head first: keys that are not
/// waiting for a retry, then those whose wait is over, and only keys whose
/// head is of an event type this consumer handles. So a key that cannot go
/// (backing off, or waiting for a processor that knows its event type) is
/// never read, however many rows it holds, and never hides another key.
///
/// Only a key's head is claimable, `FOR UPDATE SKIP LOCKED`: a processor
/// that holds it (and thus the whole key) is skipped, and a later row of a
/// key never runs before an earlier one. Having locked a head, the processor
/// also takes the key's next pending rows and handles them in order in the
/// same transaction: nobody else can take them, since claiming a key starts
/// with its head. The batch is filled by rank within the key (every head,
/// then every second row, ...), each run at most `(batch - heads) / heads`
/// rows behind its head, so a long run never crowds other keys' heads out of
/// the batch, and a batch full of heads looks up no run at all; past the
/// first row, at most `batch_max_bytes` of payload.
///
/// Rows are looked up by their arrival sequence, which is unique across
/// groups; the group is implied by the keys they were found through.
/// PostgreSQL does all of it in one statement, MySQL in up to four of one
/// transaction (`postgres.rs`, `mysql.rs`).
pub(super) async fn claim(ctx: &Shared, tx: &mut Tx) -> Result<Vec<InboxRow>, sqlx::Error> {
    let (topics, types) = ctx.dispatch.routes();
    let group = &ctx.settings.group_id;
    let batch = ctx.settings.processor_batch_size;
    let max_bytes = ctx.settings.batch_max_bytes;
    match tx {
        Tx::Postgres(tx) => {
            super::postgres::claim_rows(tx, group, &topics, &types, batch, max_bytes).await
        }
        #[cfg(feature = "mysql")]
        Tx::MySql(tx) => {
            super::mysql::claim_rows(tx, group, &topics, &types, batch, max_bytes).await
        }
    }
}

/// Whether a claim can find anything: `false` only when no key of the
/// group is due (see `postgres::any_key_due`), so that a processor polling
/// an empty inbox does not pay for a claim. Asked only on the poll timer's
/// claims: rows just stored, or a full batch just handled, make work
/// likely. On MySQL, whose claim starts with the same cheap read of due
/// keys, always `true`.
pub(super) async fn anything_due(ctx: &Shared) -> Result<bool, sqlx::Error> {
    match ctx.db.pool() {
        Pool::Postgres(pool) => super::postgres::any_key_due(pool, &ctx.settings.group_id).await,
        #[cfg(feature = "mysql")]
        Pool::MySql(_) => Ok(true),
    }
}

/// Reads a claimed row.
pub(super) fn read(ctx: &Shared, row: InboxRow) -> Claim {
    let InboxRow {
        seq,
        event_id,
        payload,
        event_type,
        topic,
        partition_key: key,
        headers,
        attempts,
    } = row;
    let headers: Vec<(String, String)> = headers
        .as_ref()
        .and_then(serde_json::Value::as_object)
        .map(|map| {
            map.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default();
    let order_key = topic.clone().zip(key.clone());
    let claim = |what| Claim {
        seq,
        event_id,
        key: order_key,
        attempts,
        payload,
        what,
    };
    let (Some(event_type), Some(topic)) = (event_type, topic) else {
        return claim(What::Park(
            DeadLetterReason::UnknownEventType,
            "row has no event_type or topic (not written by an outbox consumer?)".into(),
        ));
    };
    let Some(handler) = ctx.dispatch.handler(&topic, &event_type) else {
        return claim(What::NotMine);
    };
    let traceparent = headers
        .iter()
        .find(|(k, _)| k == txoutbox_core::wire::HEADER_TRACEPARENT)
        .map(|(_, v)| v.clone());
    let handler = handler.clone();
    let meta = EventMeta {
        event_id,
        event_type,
        topic,
        partition: None,
        offset: None,
        key,
        headers,
        traceparent,
        attempt: u32::try_from(attempts).unwrap_or(0).saturating_add(1),
        max_attempts: ctx.settings.max_attempts,
    };
    claim(What::Handle(handler, meta))
}
