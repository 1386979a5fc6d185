//! Inbox mode: store received messages in `inbox_event`, then processors run
//! the handlers from there.
//!
//! Storing is one multi-row `INSERT .. ON CONFLICT (event_id) DO NOTHING` per
//! batch; offsets are stored only after it commits. A processor claims due rows
//! `FOR UPDATE SKIP LOCKED` (so several run side by side without waiting on each
//! other), oldest first and only the oldest pending row of each key (per-key
//! order holds across processors), runs their handlers and marks them
//! processed in one transaction. If a
//! handler fails, that transaction rolls back and the claimed rows are handled
//! one per transaction, so only the failing row records the failure: its
//! `attempts` grows, `next_attempt_at` backs off, and after the last attempt it
//! is parked (`parked_at`) for an operator to look at and retry.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use rdkafka::message::OwnedMessage;
use sqlx::Row;
use sqlx::postgres::PgRow;
use uuid::Uuid;

use super::handler::{Decoded, ErasedHandler, EventMeta};
use super::message::{Classified, DeadLetterReason, classify, nul_character};
use super::metric_names as m;
use super::run::{Aside, Ctx};

/// Stores a batch in the inbox; returns which messages are finished.
pub(crate) async fn store_batch(ctx: &Ctx, batch: &[OwnedMessage]) -> Vec<bool> {
    let mut done = vec![false; batch.len()];
    let mut stored = Vec::new();
    let mut aside = Vec::new();
    let (mut ids, mut payloads, mut types, mut topics, mut keys, mut headers) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for (index, message) in batch.iter().enumerate() {
        match classify(message, &ctx.dispatch, ctx.settings.max_message_bytes) {
            Classified::Known(envelope) => {
                if let Some(place) = nul_character(&envelope) {
                    let error = format!(
                        "{place} contains a NUL character, which PostgreSQL cannot store in the inbox"
                    );
                    aside.push((index, Aside::Dead(DeadLetterReason::Unstorable, error)));
                    continue;
                }
                let meta = envelope.meta;
                stored.push(index);
                ids.push(meta.event_id);
                payloads.push(envelope.payload);
                types.push(meta.event_type);
                topics.push(meta.topic);
                keys.push(meta.key);
                let map: serde_json::Map<_, _> = meta
                    .headers
                    .into_iter()
                    .map(|(k, v)| (k, serde_json::Value::String(v)))
                    .collect();
                headers.push(serde_json::Value::Object(map));
            }
            Classified::Unknown(envelope) => {
                aside.push((index, Aside::Unknown(envelope.meta.event_type)))
            }
            Classified::Bad(reason, error) => aside.push((index, Aside::Dead(reason, error))),
        }
    }
    if !ids.is_empty() {
        let mut db_retry = 0;
        let inserted = loop {
            let result = sqlx::query(
                "INSERT INTO inbox_event (event_id, payload, event_type, topic, partition_key, headers)
                 SELECT * FROM UNNEST($1::uuid[], $2::jsonb[], $3::text[], $4::text[], $5::text[], $6::jsonb[])
                 ON CONFLICT (event_id) DO NOTHING",
            )
            .bind(&ids)
            .bind(&payloads)
            .bind(&types)
            .bind(&topics)
            .bind(&keys)
            .bind(&headers)
            .execute(&ctx.pool)
            .await;
            match result {
                Ok(result) => break result.rows_affected(),
                Err(error) => {
                    if !ctx.db_failed(&error, &mut db_retry).await {
                        return done;
                    }
                }
            }
        };
        let group = ctx.group();
        metrics::counter!(m::INBOX_STORED, "group" => group.clone()).increment(inserted);
        metrics::counter!(m::DUPLICATES, "group" => group).increment(ids.len() as u64 - inserted);
        ctx.stored.notify_waiters();
        stored.into_iter().for_each(|i| done[i] = true);
    }
    ctx.set_aside(batch, aside, &mut done).await;
    done
}

const DUE_ROWS: &str = "NOT processed AND parked_at IS NULL
    AND (next_attempt_at IS NULL OR next_attempt_at <= now())";
const COLUMNS: &str = "event_id, payload, event_type, topic, partition_key, headers, attempts";

/// One processor: claims and handles due rows until the consumer shuts down.
pub(crate) async fn process(ctx: Arc<Ctx>, index: usize) {
    let mut db_retry = 0;
    let mut backlog_at = Instant::now();
    while !ctx.token.is_cancelled() {
        if index == 0 && backlog_at <= Instant::now() {
            report_backlog(&ctx).await;
            backlog_at = Instant::now() + ctx.settings.backlog_interval;
        }
        // Registered before claiming, so rows stored meanwhile wake us.
        let stored = ctx.stored.notified();
        tokio::pin!(stored);
        stored.as_mut().enable();
        match claim_batch(&ctx).await {
            Ok(Claimed::Handled) => db_retry = 0,
            Ok(Claimed::Drained) => {
                db_retry = 0;
                tokio::select! {
                    () = ctx.token.cancelled() => {}
                    () = &mut stored => {}
                    () = tokio::time::sleep(ctx.settings.processor_poll_interval) => {}
                }
            }
            Ok(Claimed::HandlerFailed(rows)) => {
                // One by one, in order. Once a row of a key was not handled
                // here (it failed and backs off, or another processor has
                // it), the key's later rows wait for the next claim.
                let mut held_keys: HashSet<OrderKey> = HashSet::new();
                for (id, key) in rows {
                    if ctx.token.is_cancelled() {
                        break;
                    }
                    if key.as_ref().is_some_and(|key| held_keys.contains(key)) {
                        continue;
                    }
                    match process_one(&ctx, id).await {
                        Ok(One::Handled | One::Parked) => {}
                        Ok(One::Failed | One::Gone) => held_keys.extend(key),
                        Err(error) => {
                            ctx.db_failed(&error, &mut db_retry).await;
                            break;
                        }
                    }
                }
            }
            Err(error) => {
                ctx.db_failed(&error, &mut db_retry).await;
            }
        }
    }
}

enum Claimed {
    /// Rows were handled; there may be more.
    Handled,
    /// Nothing was due.
    Drained,
    /// A handler failed; these rows (in claim order, with their ordering
    /// key) must be retried one by one.
    HandlerFailed(Vec<(Uuid, Option<OrderKey>)>),
}

/// What orders inbox rows: their topic and partition key (rows without a key
/// have no order).
type OrderKey = (String, String);

/// What became of a row handled on its own.
enum One {
    Handled,
    Parked,
    /// The handler failed; the row backs off (or was parked at the bound).
    Failed,
    /// Not due any more: handled, parked or claimed by another processor.
    Gone,
}

enum Prepared {
    Ready(Arc<dyn ErasedHandler>, Decoded, EventMeta),
    Park(&'static str, String),
}

fn prepare(ctx: &Ctx, row: &PgRow) -> Result<Prepared, sqlx::Error> {
    let event_id: Uuid = row.try_get("event_id")?;
    let payload: serde_json::Value = row.try_get("payload")?;
    let event_type: Option<String> = row.try_get("event_type")?;
    let topic: Option<String> = row.try_get("topic")?;
    let key: Option<String> = row.try_get("partition_key")?;
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
    let (Some(event_type), Some(topic)) = (event_type, topic) else {
        return Ok(Prepared::Park(
            "unknown_event_type",
            "row has no event_type or topic (not written by this consumer?)".into(),
        ));
    };
    let Some(handler) = ctx.dispatch.handler(&topic, &event_type) else {
        return Ok(Prepared::Park(
            "unknown_event_type",
            format!("no handler for `{event_type}` on topic `{topic}`"),
        ));
    };
    let event = match handler.decode(&payload) {
        Ok(event) => event,
        Err(error) => {
            return Ok(Prepared::Park(
                "payload_mismatch",
                format!("payload does not match `{event_type}`: {error}"),
            ));
        }
    };
    let traceparent = headers
        .iter()
        .find(|(k, _)| k == outbox_core::wire::HEADER_TRACEPARENT)
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
    };
    Ok(Prepared::Ready(handler.clone(), event, meta))
}

async fn park(
    ctx: &Ctx,
    tx: &mut sqlx::PgConnection,
    id: Uuid,
    reason: &'static str,
    error: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE inbox_event SET attempts = attempts + 1, last_error = $2, parked_at = now()
         WHERE event_id = $1",
    )
    .bind(id)
    .bind(error)
    .execute(tx)
    .await?;
    metrics::counter!(m::INBOX_PARKED, "group" => ctx.group(), "reason" => reason).increment(1);
    tracing::warn!(event_id = %id, reason, error, "inbox row parked");
    Ok(())
}

/// How many of the oldest pending rows a claim looks at for key heads: room
/// for the batch even when the processors running alongside hold a batch
/// each and a few keys hold many rows.
fn claim_window(batch: usize) -> i64 {
    i64::try_from(batch.saturating_mul(8).max(1_000)).unwrap_or(i64::MAX)
}

async fn claim_batch(ctx: &Ctx) -> Result<Claimed, sqlx::Error> {
    let limit = ctx.settings.processor_batch_size;
    let mut tx = ctx.pool.begin().await?;
    // Only the oldest pending row of each key is claimable: a later row of the
    // key waits until the earlier one is processed or parked (a row backing off
    // for a retry holds its key back), so processors running side by side
    // keep per-key order. Messages without a key have no order to keep.
    //
    // The heads are found among the oldest pending rows only (a window of a
    // few batches): a key's head is its oldest pending row, so any key with a
    // row in the window has its head there too, and each claim costs the
    // window, not the backlog. (A grouped pass over the whole backlog cost
    // 36 ms per claim at 100,000 pending rows; an anti-join per candidate
    // row 250 ms at 20,000 rows over 8 hot keys.)
    //
    // A processor that locks a key's head also takes the key's next pending
    // rows of the window (its run) and handles them in order in the same
    // transaction: nobody else can take them, since claiming a key starts
    // with its head. Heads alone would cap a claim at one row per key (a
    // handful of hot keys drained at a few rows per transaction).
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "WITH oldest AS (
             SELECT seq, topic, partition_key FROM inbox_event
             WHERE NOT processed AND parked_at IS NULL
             ORDER BY seq LIMIT $2),
         heads AS (
             SELECT min(seq) AS seq FROM oldest WHERE partition_key IS NOT NULL
             GROUP BY topic, partition_key
             UNION ALL
             SELECT seq FROM oldest WHERE partition_key IS NULL),
         owned AS (
             SELECT i.seq, i.topic, i.partition_key FROM inbox_event i
             WHERE i.seq = ANY(ARRAY(SELECT seq FROM heads)) AND {DUE_ROWS}
             ORDER BY i.seq LIMIT $1
             FOR UPDATE OF i SKIP LOCKED),
         runs AS (
             SELECT seq FROM owned
             UNION ALL
             SELECT o.seq FROM oldest o JOIN owned h
               ON o.topic = h.topic AND o.partition_key = h.partition_key AND o.seq > h.seq)
         SELECT {COLUMNS} FROM inbox_event i
         WHERE i.seq = ANY(ARRAY(SELECT seq FROM runs)) AND NOT processed AND parked_at IS NULL
         ORDER BY seq LIMIT $1
         FOR UPDATE OF i"
    )))
    .bind(limit as i64)
    .bind(claim_window(limit))
    .fetch_all(&mut *tx)
    .await?;
    if rows.is_empty() {
        return Ok(Claimed::Drained);
    }
    let mut processed = Vec::with_capacity(rows.len());
    let mut by_type: HashMap<String, u64> = HashMap::new();
    for row in &rows {
        let id: Uuid = row.try_get("event_id")?;
        match prepare(ctx, row)? {
            Prepared::Park(reason, error) => park(ctx, &mut tx, id, reason, &error).await?,
            Prepared::Ready(handler, event, meta) => {
                if ctx.call(&*handler, &mut tx, event, &meta).await.is_err() {
                    // Rolled back now, not when the pool gets to it: until
                    // then the rows stay locked and the row-by-row retry
                    // below would find them taken.
                    tx.rollback().await?;
                    let rows = rows
                        .iter()
                        .map(|r| Ok((r.try_get("event_id")?, order_key(r)?)))
                        .collect::<Result<_, sqlx::Error>>()?;
                    return Ok(Claimed::HandlerFailed(rows));
                }
                *by_type.entry(meta.event_type).or_default() += 1;
                processed.push(id);
            }
        }
    }
    sqlx::query(
        "UPDATE inbox_event SET processed = true, processed_at = now() WHERE event_id = ANY($1)",
    )
    .bind(&processed)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    ctx.committed();
    for (event_type, count) in by_type {
        metrics::counter!(m::HANDLED, "group" => ctx.group(), "event_type" => event_type)
            .increment(count);
    }
    // Fewer rows than a batch does not mean nothing else is due: the other
    // keys' heads may have been locked by another processor a moment ago.
    // Only an empty claim waits.
    Ok(Claimed::Handled)
}

fn order_key(row: &PgRow) -> Result<Option<OrderKey>, sqlx::Error> {
    let topic: Option<String> = row.try_get("topic")?;
    let key: Option<String> = row.try_get("partition_key")?;
    Ok(topic.zip(key))
}

/// Handles one row in its own transaction; on handler failure records the
/// attempt (backing off or parking) in the same one.
async fn process_one(ctx: &Ctx, id: Uuid) -> Result<One, sqlx::Error> {
    let mut tx = ctx.pool.begin().await?;
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM inbox_event WHERE event_id = $1 AND {DUE_ROWS}
         FOR UPDATE SKIP LOCKED"
    )))
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?;
    // Gone meanwhile: handled, parked, or claimed by another processor.
    let Some(row) = row else {
        return Ok(One::Gone);
    };
    let attempts: i32 = row.try_get("attempts")?;
    let (handler, event, meta) = match prepare(ctx, &row)? {
        Prepared::Park(reason, error) => {
            park(ctx, &mut tx, id, reason, &error).await?;
            tx.commit().await?;
            return Ok(One::Parked);
        }
        Prepared::Ready(handler, event, meta) => (handler, event, meta),
    };
    // The handler runs under a savepoint so that, when it fails, its writes are
    // undone while this transaction keeps the row locked: the failed attempt is
    // recorded before any other processor can claim the row again (releasing
    // the lock first would let a second processor run the handler for the
    // same attempt).
    sqlx::query("SAVEPOINT outbox_inbox_handler")
        .execute(&mut *tx)
        .await?;
    match ctx.call(&*handler, &mut tx, event, &meta).await {
        Ok(()) => {
            sqlx::query(
                "UPDATE inbox_event SET processed = true, processed_at = now() WHERE event_id = $1",
            )
            .bind(id)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            ctx.committed();
            metrics::counter!(m::HANDLED, "group" => ctx.group(), "event_type" => meta.event_type)
                .increment(1);
            Ok(One::Handled)
        }
        Err(error) => {
            let undone = sqlx::query("ROLLBACK TO SAVEPOINT outbox_inbox_handler")
                .execute(&mut *tx)
                .await;
            if undone.is_err() || !ctx.db_reachable().await {
                // An outage, not this event's fault: leave its attempts alone.
                drop(tx);
                return Err(sqlx::Error::PoolTimedOut);
            }
            let attempt = u32::try_from(attempts).unwrap_or(0) + 1;
            let message = format!("handler `{}` failed: {error}", handler.name());
            if attempt >= ctx.settings.max_attempts {
                park(ctx, &mut tx, id, "handler_failed", &message).await?;
                tx.commit().await?;
                return Ok(One::Parked);
            }
            let delay = ctx.settings.backoff(attempt);
            sqlx::query(
                "UPDATE inbox_event SET attempts = attempts + 1, last_error = $2,
                     next_attempt_at = now() + $3::bigint * interval '1 millisecond'
                 WHERE event_id = $1",
            )
            .bind(id)
            .bind(&message)
            .bind(i64::try_from(delay.as_millis()).unwrap_or(i64::MAX))
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(One::Failed)
        }
    }
}

async fn report_backlog(ctx: &Ctx) {
    let counts: Result<(i64, i64), _> = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE parked_at IS NULL), count(*) FILTER (WHERE parked_at IS NOT NULL)
         FROM inbox_event WHERE NOT processed",
    )
    .fetch_one(&ctx.pool)
    .await;
    if let Ok((backlog, parked)) = counts {
        metrics::gauge!(m::INBOX_BACKLOG, "group" => ctx.group()).set(backlog as f64);
        metrics::gauge!(m::INBOX_PARKED_ROWS, "group" => ctx.group()).set(parked as f64);
    }
}
