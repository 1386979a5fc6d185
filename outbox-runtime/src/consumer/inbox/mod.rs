//! Inbox mode: store received messages in `inbox_event`, then processors run
//! the handlers from there.
//!
//! Storing is one multi-row `INSERT .. ON CONFLICT DO NOTHING` per batch, in
//! the consumer group's inbox; offsets are stored only after it commits.
//! Processors claim due keys (see [`claim`]), handle each key's rows in
//! arrival order and mark them processed in one transaction; a failing row
//! backs off (or is parked at the attempt bound) and holds back only its own
//! key. The `inbox_key` table, kept by triggers on `inbox_event`, says which
//! keys have pending rows, where their head is and until when it waits, so a
//! claim never reads the rows of keys that cannot go.

mod claim;
mod group;
mod handle;

use std::sync::Arc;
use std::time::Instant;

use rdkafka::message::OwnedMessage;

use super::route::{Routed, route};
use super::shared::{Aside, Shared};
use super::telemetry as m;

pub(crate) use group::Membership;

/// Benchmarks only: one inbox claim of up to `batch` rows of `group`, for
/// processors handling the (topic, event type) pairs `handled`, in a
/// transaction that is rolled back; returns how many rows it claimed. Not a
/// public API.
#[cfg(feature = "test-hooks")]
pub async fn claim_once_for_benchmark(
    pool: &sqlx::PgPool,
    group: &str,
    handled: &[(&str, &str)],
    batch: usize,
) -> Result<usize, sqlx::Error> {
    let (topics, types): (Vec<&str>, Vec<&str>) = handled.iter().copied().unzip();
    let mut tx = pool.begin().await?;
    let rows = claim::claim_rows(&mut tx, group, &topics, &types, batch).await?;
    tx.rollback().await?;
    Ok(rows.len())
}

/// Stores a batch in the inbox; returns which messages are finished.
pub(crate) async fn store_batch(ctx: &Shared, batch: &[OwnedMessage]) -> Vec<bool> {
    let mut done = vec![false; batch.len()];
    let mut stored = Vec::new();
    let mut aside = Vec::new();
    let (mut ids, mut payloads, mut types, mut topics, mut keys, mut headers) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for (index, message) in batch.iter().enumerate() {
        match route(message, &ctx.dispatch, &ctx.settings) {
            Routed::Store(envelope) => {
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
            Routed::Skip(event_type) => aside.push((index, Aside::Skip(event_type))),
            Routed::DeadLetter(reason, error) => aside.push((index, Aside::Dead(reason, error))),
            Routed::Handle { .. } => unreachable!("inbox mode stores, processors handle"),
        }
    }
    if !ids.is_empty() {
        let mut db_retry = 0;
        let inserted = loop {
            // The insert trigger gives new keys their `inbox_key` entry.
            let result = sqlx::query(
                "INSERT INTO inbox_event
                     (consumer_group, event_id, payload, event_type, topic, partition_key, headers)
                 SELECT $1, * FROM UNNEST($2::uuid[], $3::jsonb[], $4::text[], $5::text[], $6::text[], $7::jsonb[])
                 ON CONFLICT (consumer_group, event_id) DO NOTHING",
            )
            .bind(&ctx.settings.group_id)
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

/// One processor: claims and handles due rows until the consumer shuts down.
/// Processor 0 also keeps the group's membership and gauges up to date.
pub(crate) async fn process(ctx: Arc<Shared>, index: usize) {
    let mut db_retry = 0;
    let mut membership = (index == 0).then(Membership::new);
    let mut heartbeat_at = Instant::now();
    while !ctx.token.is_cancelled() {
        if let Some(membership) = membership.as_mut()
            && heartbeat_at <= Instant::now()
        {
            membership.heartbeat(&ctx).await;
            heartbeat_at = Instant::now() + ctx.settings.backlog_interval;
        }
        // Registered before claiming, so rows stored meanwhile wake us.
        let stored = ctx.stored.notified();
        tokio::pin!(stored);
        stored.as_mut().enable();
        match handle::claim_and_handle(&ctx).await {
            // Fewer rows than a batch does not mean nothing else is due: the
            // other keys' heads may have been locked by another processor a
            // moment ago. Only an empty claim waits.
            Ok(handle::Claimed::Handled) => db_retry = 0,
            Ok(handle::Claimed::Drained) => {
                db_retry = 0;
                tokio::select! {
                    () = ctx.token.cancelled() => {}
                    () = &mut stored => {}
                    () = tokio::time::sleep(ctx.settings.processor_poll_interval) => {}
                }
            }
            Err(error) => {
                ctx.db_failed(&error, &mut db_retry).await;
            }
        }
    }
    if let Some(membership) = membership {
        membership.leave(&ctx).await;
    }
}
