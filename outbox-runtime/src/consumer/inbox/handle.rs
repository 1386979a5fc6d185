//! A processor's unit of work: claim due keys, handle their rows in order,
//! record what happened, all in one transaction.

use std::collections::{HashMap, HashSet};

use sqlx::{PgConnection, Postgres, Transaction};
use uuid::Uuid;

use super::claim::{Claim, OrderKey, What, claim, read};
use crate::consumer::call::HandlerFailure;
use crate::consumer::database::TxRef;
use crate::consumer::handler::HandlerError;
use crate::consumer::shared::Shared;
use crate::consumer::summary::Totals;
use crate::consumer::telemetry as m;
use crate::wire::dead_letter::DeadLetterReason;

/// How a unit of work ended.
pub(super) enum Claimed {
    /// Rows were claimed; there may be more.
    Handled,
    /// Nothing was due.
    Drained,
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
    /// savepoint and the rows are handled again one savepoint each. A call
    /// abandoned at the handler timeout is named (the row and the error), so
    /// that the careful pass records its failure without waiting again.
    HandlerFailed(Option<(Uuid, String)>),
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
    let mut tx = ctx.db.begin_postgres().await?;
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
    let fast = match handle(ctx, &mut tx, &claims, None).await {
        // A handler that swallowed a database error returned `Ok` on an
        // aborted transaction: the careful pass finds which one.
        Ok(outcomes) if outcomes.processed.is_empty() => Ok(outcomes),
        Ok(outcomes) => match txoutbox_core::check_committable(&mut tx).await {
            Ok(()) => Ok(outcomes),
            Err(txoutbox_core::Error::Database(error)) => return Err(error),
            Err(_) => Err(Stop::HandlerFailed(None)),
        },
        Err(stop) => Err(stop),
    };
    let outcomes = match fast {
        Ok(outcomes) => outcomes,
        Err(Stop::Outage(error)) => return Err(error),
        Err(Stop::HandlerFailed(timed_out)) => {
            sqlx::query("ROLLBACK TO SAVEPOINT outbox_inbox_batch")
                .execute(&mut *tx)
                .await?;
            match handle(ctx, &mut tx, &claims, Some(timed_out.as_ref())).await {
                Ok(outcomes) => outcomes,
                Err(Stop::Outage(error)) => return Err(error),
                Err(Stop::HandlerFailed(_)) => unreachable!("the careful pass records failures"),
            }
        }
    };
    record(ctx, &mut tx, &outcomes).await?;
    tx.commit().await?;
    ctx.calls.committed();
    crate::probe::mark_each(
        crate::probe::Stage::Committed,
        outcomes.processed.iter().copied(),
    );
    ctx.counts.handled_by_type(outcomes.by_type);
    Totals::add(&ctx.counts.totals.parked, outcomes.parked.len() as u64);
    for (event_id, reason, error) in &outcomes.parked {
        metrics::counter!(m::INBOX_PARKED, "group" => ctx.group(), "reason" => reason.as_str())
            .increment(1);
        tracing::warn!(%event_id, %reason, error, "inbox row parked");
    }
    Ok(Claimed::Handled)
}

/// One pass over the claimed rows, in arrival order: the fast pass
/// (`careful: None`), or the careful one, which knows the row whose call the
/// fast pass abandoned at the timeout, if any.
async fn handle(
    ctx: &Shared,
    tx: &mut Transaction<'static, Postgres>,
    claims: &[Claim],
    careful: Option<Option<&(Uuid, String)>>,
) -> Result<Outcomes, Stop> {
    let timed_out = careful.flatten();
    let careful = careful.is_some();
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
        let call = async {
            match timed_out {
                Some((id, error)) if *id == claim.event_id => Err(HandlerFailure {
                    error: HandlerError::new(error.clone()),
                    timed_out: true,
                }),
                _ => {
                    ctx.calls
                        .call(&**handler, TxRef::Postgres(tx), event, meta)
                        .await
                }
            }
        };
        let called = match call.await {
            Ok(()) if careful => {
                // Refused when the handler left the transaction aborted.
                match sqlx::query("RELEASE SAVEPOINT outbox_inbox_row")
                    .execute(&mut **tx)
                    .await
                {
                    Ok(_) => Ok(()),
                    Err(error) => match txoutbox_core::not_committable(&error) {
                        Some(unusable) => Err(ctx.calls.left_unusable(&**handler, meta, &unusable)),
                        None => return Err(Stop::Outage(error)),
                    },
                }
            }
            Ok(()) => Ok(()),
            Err(failure) if !careful => {
                let timed_out = failure
                    .timed_out
                    .then(|| (claim.event_id, failure.error.to_string()));
                return Err(Stop::HandlerFailed(timed_out));
            }
            Err(failure) => Err(failure.error),
        };
        match called {
            Ok(()) => {
                outcomes.processed.push(claim.event_id);
                *outcomes.by_type.entry(meta.event_type.clone()).or_default() += 1;
            }
            Err(_) if !careful => unreachable!("the fast pass returned above"),
            Err(error) => {
                let undone = sqlx::query("ROLLBACK TO SAVEPOINT outbox_inbox_row")
                    .execute(&mut **tx)
                    .await;
                if let Err(error) = undone {
                    return Err(Stop::Outage(error));
                }
                if !ctx.db.reachable().await {
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
                        Some(ctx.settings.backoff.delay(attempt)),
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
