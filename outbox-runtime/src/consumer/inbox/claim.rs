//! A processor's claim: the heads of due keys and the pending rows behind
//! them, read into what each row asks for (handle, leave, park).

use std::sync::Arc;

use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use crate::consumer::handler::{ErasedHandler, EventMeta};
use crate::consumer::shared::Shared;
use crate::wire::dead_letter::DeadLetterReason;

/// What orders inbox rows: their topic and partition key (rows without a key
/// have no order).
pub(super) type OrderKey = (String, String);

/// The payload is read as JSON text, which the handler's type is decoded
/// from: never as a `serde_json::Value`, about 16 times the size of an array
/// of small numbers.
const COLUMNS: &str =
    "seq, event_id, payload::text AS payload, event_type, topic, partition_key, headers, attempts";

/// How many due keys a claim looks at: room for the batch even when the
/// processors running alongside (in this process and others) hold a batch of
/// keys each, which the claim skips.
fn candidate_window(batch: usize) -> i64 {
    i64::try_from(batch.saturating_mul(8).max(1_000)).unwrap_or(i64::MAX)
}

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
/// the batch, and a batch full of heads looks up no run at all.
///
/// Rows are looked up by their arrival sequence, which is unique across
/// groups; the group is implied by the keys they were found through.
///
/// `k.topic || ''` in the backing-off branch keeps PostgreSQL from reaching
/// those keys through `ux_inbox_key` (every key of the topic) instead of the
/// partial index of waiting keys: without statistics (a queue table that
/// just filled, before `ANALYZE`) it chose that plan, which reads every key
/// on every claim (44 ms instead of 8 ms per claim at 80,000 pending keys;
/// a drain of 100,000 pending rows slowed to under 100 rows/s).
pub(super) async fn claim(
    ctx: &Shared,
    conn: &mut PgConnection,
) -> Result<Vec<PgRow>, sqlx::Error> {
    let (topics, types) = ctx.dispatch.routes();
    claim_rows(
        conn,
        &ctx.settings.group_id,
        &topics,
        &types,
        ctx.settings.processor_batch_size,
        ctx.settings.batch_max_bytes,
    )
    .await
}

/// The claim statement (see [`claim`]) with its parameters spelled out:
/// at most `batch` rows and, past the first, `max_bytes` of payload.
pub(crate) async fn claim_rows(
    conn: &mut PgConnection,
    group: &str,
    topics: &[&str],
    types: &[&str],
    batch: usize,
    max_bytes: usize,
) -> Result<Vec<PgRow>, sqlx::Error> {
    let limit = batch as i64;
    let max_bytes = i64::try_from(max_bytes).unwrap_or(i64::MAX);
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "WITH handled AS (
             SELECT * FROM unnest($2::text[], $3::text[]) AS h(topic, event_type)),
         candidates AS (
             (SELECT k.head_seq FROM inbox_key k
              WHERE k.consumer_group = $1 AND k.not_before IS NULL
                AND (k.topic, k.head_event_type) IN (SELECT topic, event_type FROM handled)
              ORDER BY k.head_seq LIMIT $5)
             UNION ALL
             (SELECT k.head_seq FROM inbox_key k
              WHERE k.consumer_group = $1 AND k.not_before IS NOT NULL AND k.not_before <= now()
                AND (k.topic || '', k.head_event_type) IN (SELECT topic, event_type FROM handled)
              ORDER BY k.not_before LIMIT $5)),
         owned AS (
             SELECT i.seq, i.topic, i.partition_key,
                    coalesce(i.payload_bytes, pg_column_size(i.payload)) AS bytes
             FROM inbox_event i
             WHERE i.seq = ANY(ARRAY(SELECT head_seq FROM candidates))
               AND NOT i.processed AND i.parked_at IS NULL
               AND (i.next_attempt_at IS NULL OR i.next_attempt_at <= now())
             ORDER BY i.seq LIMIT $4
             FOR UPDATE OF i SKIP LOCKED),
         runs AS (
             SELECT seq, 0::int8 AS rank, bytes FROM owned
             UNION ALL
             SELECT r.seq, r.rank, r.bytes FROM owned h CROSS JOIN LATERAL (
                 SELECT i.seq, row_number() OVER (ORDER BY i.seq) AS rank,
                        coalesce(i.payload_bytes, pg_column_size(i.payload)) AS bytes
                 FROM inbox_event i
                 WHERE i.consumer_group = $1 AND i.topic = h.topic
                   AND i.partition_key = h.partition_key
                   AND NOT i.processed AND i.parked_at IS NULL AND i.seq > h.seq
                 ORDER BY i.seq LIMIT (SELECT ($4 - count(*)) / count(*) FROM owned)) r
             WHERE h.partition_key IS NOT NULL),
         ranked AS (SELECT seq, rank, bytes FROM runs ORDER BY rank, seq LIMIT $4),
         -- The byte budget cuts the same order (so each key keeps a prefix
         -- of its run): a row is taken if the rows before it hold less than
         -- the budget, so the first always is.
         sized AS (
             SELECT seq, bytes, sum(bytes) OVER (ORDER BY rank, seq) AS upto FROM ranked),
         picked AS (SELECT seq FROM sized WHERE upto - bytes < $6)
         SELECT {COLUMNS} FROM inbox_event i
         WHERE i.seq = ANY(ARRAY(SELECT seq FROM picked))
           AND NOT i.processed AND i.parked_at IS NULL
         ORDER BY i.seq
         FOR UPDATE OF i"
    )))
    .bind(group)
    .bind(topics)
    .bind(types)
    .bind(limit)
    .bind(candidate_window(batch))
    .bind(max_bytes)
    // Planned afresh each time, never as a cached generic plan: a plan made
    // while the inbox was nearly empty (the first claims of a burst) chose
    // an index scan that reads the whole key index once the inbox had filled
    // (2.5 s per claim at 20,000 pending rows, 2.2 million buffer hits).
    // Planning costs about 2 ms per claim of up to a batch of rows.
    .persistent(false)
    .fetch_all(conn)
    .await
}

/// A claimed row, ready to be handled (or set aside).
pub(super) struct Claim {
    pub event_id: Uuid,
    pub key: Option<OrderKey>,
    pub attempts: i32,
    pub payload: String,
    pub what: What,
}

/// What a claimed row asks for.
pub(super) enum What {
    Handle(Arc<dyn ErasedHandler>, EventMeta),
    /// No handler here for its event type: left pending (with the rest of
    /// its key) for a processor that has one, e.g. a newer version of this
    /// service during a rolling deploy.
    NotMine,
    /// Cannot be handled by anyone: parked with this reason.
    Park(DeadLetterReason, String),
}

/// Reads a claimed row.
pub(super) fn read(ctx: &Shared, row: &PgRow) -> Result<Claim, sqlx::Error> {
    let event_id: Uuid = row.try_get("event_id")?;
    let payload: String = row.try_get("payload")?;
    let event_type: Option<String> = row.try_get("event_type")?;
    let topic: Option<String> = row.try_get("topic")?;
    let key: Option<String> = row.try_get("partition_key")?;
    let attempts: i32 = row.try_get("attempts")?;
    let headers: Option<serde_json::Value> = row.try_get("headers")?;
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
        event_id,
        key: order_key.clone(),
        attempts,
        payload: payload.clone(),
        what,
    };
    let (Some(event_type), Some(topic)) = (event_type, topic) else {
        return Ok(claim(What::Park(
            DeadLetterReason::UnknownEventType,
            "row has no event_type or topic (not written by an outbox consumer?)".into(),
        )));
    };
    let Some(handler) = ctx.dispatch.handler(&topic, &event_type) else {
        return Ok(claim(What::NotMine));
    };
    let traceparent = headers
        .iter()
        .find(|(k, _)| k == txoutbox_core::wire::HEADER_TRACEPARENT)
        .map(|(_, v)| v.clone());
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
    Ok(claim(What::Handle(handler.clone(), meta)))
}
