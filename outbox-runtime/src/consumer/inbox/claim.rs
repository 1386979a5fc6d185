//! A processor's unit of work: claim due keys, handle their rows in order,
//! record what happened, all in one transaction.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Postgres, Row, Transaction};
use uuid::Uuid;

use super::super::handler::{ErasedHandler, EventMeta};
use super::super::message::DeadLetterReason;
use super::super::shared::Shared;
use super::super::telemetry as m;

pub(super) enum Claimed {
    /// Rows were claimed; there may be more.
    Handled,
    /// Nothing was due.
    Drained,
}

/// What orders inbox rows: their topic and partition key (rows without a key
/// have no order).
type OrderKey = (String, String);

const COLUMNS: &str = "seq, event_id, payload, event_type, topic, partition_key, headers, attempts";

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
async fn claim(ctx: &Shared, conn: &mut PgConnection) -> Result<Vec<PgRow>, sqlx::Error> {
    let (topics, types) = ctx.dispatch.routes();
    claim_rows(
        conn,
        &ctx.settings.group_id,
        &topics,
        &types,
        ctx.settings.processor_batch_size,
    )
    .await
}

/// The claim statement (see [`claim`]) with its parameters spelled out.
pub(crate) async fn claim_rows(
    conn: &mut PgConnection,
    group: &str,
    topics: &[&str],
    types: &[&str],
    batch: usize,
) -> Result<Vec<PgRow>, sqlx::Error> {
    let limit = batch as i64;
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
                AND (k.topic, k.head_event_type) IN (SELECT topic, event_type FROM handled)
              ORDER BY k.not_before LIMIT $5)),
         owned AS (
             SELECT i.seq, i.topic, i.partition_key FROM inbox_event i
             WHERE i.seq = ANY(ARRAY(SELECT head_seq FROM candidates))
               AND NOT i.processed AND i.parked_at IS NULL
               AND (i.next_attempt_at IS NULL OR i.next_attempt_at <= now())
             ORDER BY i.seq LIMIT $4
             FOR UPDATE OF i SKIP LOCKED),
         runs AS (
             SELECT seq, 0::int8 AS rank FROM owned
             UNION ALL
             SELECT r.seq, r.rank FROM owned h CROSS JOIN LATERAL (
                 SELECT i.seq, row_number() OVER (ORDER BY i.seq) AS rank FROM inbox_event i
                 WHERE i.consumer_group = $1 AND i.topic = h.topic
                   AND i.partition_key = h.partition_key
                   AND NOT i.processed AND i.parked_at IS NULL AND i.seq > h.seq
                 ORDER BY i.seq LIMIT (SELECT ($4 - count(*)) / count(*) FROM owned)) r
             WHERE h.partition_key IS NOT NULL),
         picked AS (SELECT seq FROM runs ORDER BY rank, seq LIMIT $4)
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
    .fetch_all(conn)
    .await
}

/// A claimed row, ready to be handled (or set aside).
struct Claim {
    event_id: Uuid,
    key: Option<OrderKey>,
    attempts: i32,
    payload: serde_json::Value,
    what: What,
}

enum What {
    Handle(Arc<dyn ErasedHandler>, EventMeta),
    /// No handler here for its event type: left pending (with the rest of
    /// its key) for a processor that has one, e.g. a newer version of this
    /// service during a rolling deploy.
    NotMine,
    /// Cannot be handled by anyone: parked with this reason.
    Park(DeadLetterReason, String),
}

fn read(ctx: &Shared, row: &PgRow) -> Result<Claim, sqlx::Error> {
    let event_id: Uuid = row.try_get("event_id")?;
    let payload: serde_json::Value = row.try_get("payload")?;
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
    };
    Ok(claim(What::Handle(handler.clone(), meta)))
}

/// What a pass over the claimed rows decided, written at the end of the
/// transaction (the rows stay locked until then).
#[derive(Default)]
struct Outcomes {
    processed: Vec<Uuid>,
    by_type: HashMap<String, u64>,
    /// Failed attempts: (event id, error, retry delay; `None` parks the row).
    failed: Vec<(Uuid, String, Option<std::time::Duration>)>,
    /// Rows no handler can take: (event id, reason, error).
    parked: Vec<(Uuid, DeadLetterReason, String)>,
}

/// Why a pass stopped early.
enum Stop {
    /// Fast pass: a handler failed; everything is rolled back to the batch's
    /// savepoint and the rows are handled again one savepoint each.
    HandlerFailed,
    /// The database is unreachable: abandon the transaction without
    /// counting anybody's attempt.
    Outage(sqlx::Error),
}

impl From<sqlx::Error> for Stop {
    fn from(error: sqlx::Error) -> Self {
        Stop::Outage(error)
    }
}

/// Claims a batch and handles it.
///
/// The fast pass runs every handler in the claim's transaction. If one fails,
/// the transaction rolls back to the savepoint taken after the claim (the row
/// locks stay) and a careful pass runs each handler under a savepoint of its
/// own: a failing row's effects are undone, its failed attempt is recorded
/// (backing off, or parked at `max_attempts`) and the rest of its key waits,
/// while every other row is handled. A handler panic is a failure like any
/// other. So a failing event costs its batch one more pass, never a
/// transaction per row, and never holds back another key.
pub(super) async fn claim_and_handle(ctx: &Shared) -> Result<Claimed, sqlx::Error> {
    let mut tx = ctx.pool.begin().await?;
    let rows = claim(ctx, &mut tx).await?;
    if rows.is_empty() {
        return Ok(Claimed::Drained);
    }
    let claims = rows
        .iter()
        .map(|row| read(ctx, row))
        .collect::<Result<Vec<_>, _>>()?;
    sqlx::query("SAVEPOINT outbox_inbox_batch")
        .execute(&mut *tx)
        .await?;
    let outcomes = match handle(ctx, &mut tx, &claims, false).await {
        Ok(outcomes) => outcomes,
        Err(Stop::Outage(error)) => return Err(error),
        Err(Stop::HandlerFailed) => {
            sqlx::query("ROLLBACK TO SAVEPOINT outbox_inbox_batch")
                .execute(&mut *tx)
                .await?;
            match handle(ctx, &mut tx, &claims, true).await {
                Ok(outcomes) => outcomes,
                Err(Stop::Outage(error)) => return Err(error),
                Err(Stop::HandlerFailed) => unreachable!("the careful pass records failures"),
            }
        }
    };
    record(ctx, &mut tx, &outcomes).await?;
    tx.commit().await?;
    ctx.committed();
    for (event_type, count) in outcomes.by_type {
        metrics::counter!(m::HANDLED, "group" => ctx.group(), "event_type" => event_type)
            .increment(count);
    }
    for (event_id, reason, error) in &outcomes.parked {
        metrics::counter!(m::INBOX_PARKED, "group" => ctx.group(), "reason" => reason.as_str())
            .increment(1);
        tracing::warn!(%event_id, %reason, error, "inbox row parked");
    }
    Ok(Claimed::Handled)
}

/// One pass over the claimed rows, in arrival order.
async fn handle(
    ctx: &Shared,
    tx: &mut Transaction<'static, Postgres>,
    claims: &[Claim],
    careful: bool,
) -> Result<Outcomes, Stop> {
    let mut outcomes = Outcomes::default();
    // Keys that may not go on in this batch: a row of theirs waits.
    let mut held: HashSet<&OrderKey> = HashSet::new();
    for claim in claims {
        if claim.key.as_ref().is_some_and(|key| held.contains(key)) {
            continue;
        }
        let (handler, meta) = match &claim.what {
            What::Handle(handler, meta) => (handler, meta),
            What::NotMine => {
                held.extend(claim.key.as_ref());
                continue;
            }
            What::Park(reason, error) => {
                // Parked rows hold back nothing: the key goes on.
                outcomes
                    .parked
                    .push((claim.event_id, *reason, error.clone()));
                continue;
            }
        };
        let event = match handler.decode(&claim.payload) {
            Ok(event) => event,
            Err(error) => {
                let error = format!("payload does not match `{}`: {error}", meta.event_type);
                outcomes
                    .parked
                    .push((claim.event_id, DeadLetterReason::PayloadMismatch, error));
                continue;
            }
        };
        if careful {
            sqlx::query("SAVEPOINT outbox_inbox_row")
                .execute(&mut **tx)
                .await?;
        }
        match ctx.call(&**handler, tx, event, meta).await {
            Ok(()) => {
                if careful {
                    sqlx::query("RELEASE SAVEPOINT outbox_inbox_row")
                        .execute(&mut **tx)
                        .await?;
                }
                outcomes.processed.push(claim.event_id);
                *outcomes.by_type.entry(meta.event_type.clone()).or_default() += 1;
            }
            Err(_) if !careful => return Err(Stop::HandlerFailed),
            Err(error) => {
                let undone = sqlx::query("ROLLBACK TO SAVEPOINT outbox_inbox_row")
                    .execute(&mut **tx)
                    .await;
                if let Err(error) = undone {
                    return Err(Stop::Outage(error));
                }
                if !ctx.db_reachable().await {
                    // An outage, not this event's fault: leave its attempts alone.
                    return Err(Stop::Outage(sqlx::Error::PoolTimedOut));
                }
                let attempt = u32::try_from(claim.attempts).unwrap_or(0) + 1;
                let message = format!("handler `{}` failed: {error}", handler.name());
                if attempt >= ctx.settings.max_attempts {
                    outcomes.parked.push((
                        claim.event_id,
                        DeadLetterReason::HandlerFailed,
                        message,
                    ));
                } else {
                    outcomes.failed.push((
                        claim.event_id,
                        message,
                        Some(ctx.settings.backoff(attempt)),
                    ));
                    held.extend(claim.key.as_ref());
                }
            }
        }
    }
    Ok(outcomes)
}

/// Writes a pass's outcomes: failed attempts, parked rows, processed rows.
/// The update trigger moves each touched key's head (and its wait) along.
async fn record(ctx: &Shared, tx: &mut PgConnection, outcomes: &Outcomes) -> sqlx::Result<()> {
    let group = &ctx.settings.group_id;
    let mut ids = Vec::new();
    let mut errors = Vec::new();
    let mut delays: Vec<Option<i64>> = Vec::new();
    for (id, error, delay) in &outcomes.failed {
        ids.push(*id);
        errors.push(error.as_str());
        delays.push(delay.map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)));
    }
    for (id, _, error) in &outcomes.parked {
        ids.push(*id);
        errors.push(error.as_str());
        delays.push(None);
    }
    if !ids.is_empty() {
        sqlx::query(
            "UPDATE inbox_event i
             SET attempts = i.attempts + 1, last_error = f.error,
                 next_attempt_at = now() + f.delay_ms * interval '1 millisecond',
                 parked_at = CASE WHEN f.delay_ms IS NULL THEN now() END
             FROM unnest($2::uuid[], $3::text[], $4::bigint[]) AS f(event_id, error, delay_ms)
             WHERE i.consumer_group = $1 AND i.event_id = f.event_id",
        )
        .bind(group)
        .bind(&ids)
        .bind(&errors)
        .bind(&delays)
        .execute(&mut *tx)
        .await?;
    }
    if !outcomes.processed.is_empty() {
        sqlx::query(
            "UPDATE inbox_event SET processed = true, processed_at = now()
             WHERE consumer_group = $1 AND event_id = ANY($2)",
        )
        .bind(group)
        .bind(&outcomes.processed)
        .execute(&mut *tx)
        .await?;
    }
    Ok(())
}
