//! Inbox mode: store received messages in `inbox_event`, then processors run
//! the handlers from there.
//!
//! Storing is one multi-row insert per batch (PostgreSQL's `ON CONFLICT DO
//! NOTHING`, MariaDB's `INSERT IGNORE`), in the consumer group's inbox;
//! offsets are stored only after it commits.
//! Processors claim due keys (see [`claim`]), handle each key's rows in
//! arrival order and mark them processed in one transaction; a failing row
//! backs off (or is parked at the attempt bound) and holds back only its own
//! key. The `inbox_key` table says which keys have pending rows, where their
//! head is and until when it waits, so a claim never reads the rows of keys
//! that cannot go: on PostgreSQL triggers on `inbox_event` keep it, on MySQL
//! the statements that store and settle rows do, in their transactions.
//!
//! The logic is the same on every database; the statements are each
//! database's own (`postgres.rs`, `mysql.rs`).

mod admit;
mod claim;
mod group;
mod handle;
#[cfg(feature = "mysql")]
pub(crate) mod mysql;
mod postgres;
mod receipt;
mod rows;
pub(crate) mod unclaimed;

use std::sync::Arc;
use std::time::Instant;

use rdkafka::Message;
use rdkafka::message::OwnedMessage;

use super::progress::Taken;
use super::route::{Routed, route};
use super::shared::Shared;
pub(crate) use admit::IntoInbox;

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
    let rows = postgres::claim_rows(&mut tx, group, &topics, &types, batch, usize::MAX).await?;
    tx.rollback().await?;
    Ok(rows.len())
}

/// Benchmarks only: [`claim_once_for_benchmark`] on MySQL / MariaDB. Not a
/// public API.
#[cfg(all(feature = "test-hooks", feature = "mysql"))]
pub async fn claim_once_for_benchmark_mysql(
    pool: &sqlx::MySqlPool,
    group: &str,
    handled: &[(&str, &str)],
    batch: usize,
) -> Result<usize, sqlx::Error> {
    let (topics, types): (Vec<&str>, Vec<&str>) = handled.iter().copied().unzip();
    let mut tx = pool
        .begin_with("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION")
        .await?;
    let rows = mysql::claim_rows(&mut tx, group, &topics, &types, batch, usize::MAX).await?;
    tx.rollback().await?;
    Ok(rows.len())
}

/// Tests only: stores `rows` pending in `conn`'s transaction as a store
/// does, without committing (see `Consumer::__store_pending`).
#[cfg(feature = "test-hooks")]
pub(crate) async fn store_pending(
    ctx: &Shared,
    conn: &mut sqlx::PgConnection,
    rows: &[super::message::Envelope],
) -> sqlx::Result<u64> {
    receipt::store_pending(ctx, conn, rows).await
}

/// Stores a batch in the inbox (handling on receipt what qualifies, see
/// [`receipt`]); says which messages are finished and which to dead-letter.
pub(crate) async fn take(ctx: &Shared, batch: &[OwnedMessage]) -> Taken {
    let mut taken = Taken::default();
    let mut stored = Vec::new();
    let mut rows = Vec::new();
    let Some(admit) = IntoInbox::for_consumer(ctx).await else {
        return Taken::interrupted();
    };
    for (index, message) in batch.iter().enumerate() {
        match route(message, &ctx.dispatch, &ctx.settings, &admit) {
            Routed::Take(envelope) => {
                stored.push(index);
                rows.push(envelope);
            }
            Routed::Skip(event_type) => {
                ctx.counts.skipped(message.topic(), &event_type);
                taken.done.push(index);
            }
            Routed::DeadLetter(reason, error) => taken.dead.push((index, reason, error)),
        }
    }
    if !rows.is_empty() {
        // With no processor here, rows are only stored (for processors elsewhere).
        let mut on_receipt = ctx.settings.handle_on_receipt && ctx.settings.processors > 0;
        let mut db_retry = 0;
        let outcome = loop {
            match receipt::store(ctx, &rows, on_receipt).await {
                Ok(outcome) => break outcome,
                // The processors call it again, and count and log its failure.
                Err(receipt::StoreFailed::HandlerFailed) => on_receipt = false,
                Err(receipt::StoreFailed::HandlingLost) => {
                    tracing::warn!(
                        group = %ctx.settings.group_id,
                        "a handler called on receipt lost or ended the store's transaction; \
                         storing the batch again, pending, for the processors"
                    );
                    on_receipt = false;
                }
                Err(receipt::StoreFailed::Database(error)) => {
                    if !ctx.db.failed(&error, &mut db_retry).await {
                        return Taken::interrupted();
                    }
                }
            }
        };
        ctx.counts
            .stored(outcome.inserted, rows.len() as u64 - outcome.inserted);
        if outcome.pending > 0 {
            ctx.stored.notify_waiters();
        }
        taken.done.extend(stored);
    }
    taken
}

/// One processor: claims and handles due rows until the consumer shuts down.
/// Processor 0 also keeps the group's membership and gauges up to date.
pub(crate) async fn process(ctx: Arc<Shared>, index: usize) {
    let mut db_retry = 0;
    let mut recovery = handle::Recovery::default();
    let mut membership = (index == 0).then(Membership::new);
    let mut heartbeat_at = Instant::now();
    // Whether this claim comes from the poll timer (or the start) rather
    // than from rows just stored or a full batch just handled: only then is
    // an empty inbox likely, and a cheap question first spares the claim.
    let mut polled = true;
    while !ctx.token.is_cancelled() {
        if let Some(membership) = membership.as_mut()
            && heartbeat_at <= Instant::now()
        {
            if let Err(stalled) = ctx.unless_stalled(membership.heartbeat(&ctx)).await {
                tracing::warn!(%stalled, "inbox heartbeat abandoned");
            }
            heartbeat_at = Instant::now() + ctx.settings.backlog_interval;
        }
        // Registered before claiming, so rows stored meanwhile wake us.
        let stored = ctx.stored.notified();
        tokio::pin!(stored);
        stored.as_mut().enable();
        // A connection that stops answering mid-claim is abandoned at the
        // stall limit, like a batch's (see `stall`): the claim's locks go
        // with its session and the rows are claimed again.
        let claimed = ctx
            .db_unless_stalled(async {
                let due = match polled {
                    true => claim::anything_due(&ctx).await?,
                    false => true,
                };
                match due {
                    true => handle::claim_and_handle(&ctx, &mut recovery).await,
                    false => Ok(handle::Claimed::Drained),
                }
            })
            .await;
        polled = false;
        match claimed {
            // Fewer rows than a batch does not mean nothing else is due: the
            // other keys' heads may have been locked by another processor a
            // moment ago. Only an empty claim waits.
            Ok(handle::Claimed::Handled) => db_retry = 0,
            Ok(handle::Claimed::Drained) => {
                db_retry = 0;
                tokio::select! {
                    () = ctx.token.cancelled() => {}
                    () = &mut stored => {}
                    () = tokio::time::sleep(ctx.settings.processor_poll_interval) => polled = true,
                }
            }
            Err(error) => {
                ctx.db.failed(&error, &mut db_retry).await;
            }
        }
    }
    if let Some(membership) = membership {
        membership.leave(&ctx).await;
    }
}
