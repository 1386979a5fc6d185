//! A processor's unit of work: claim due keys, handle their rows in order,
//! record what happened, all in one transaction. The same on every
//! database: the statements are `postgres.rs`' and `mysql.rs`'.

use std::collections::{HashMap, HashSet};

use txoutbox_core::AfterCommit;
use uuid::Uuid;

use super::claim::{claim, read};
use super::rows::{Claim, FailedRow, OrderKey, Settled, What};
use crate::consumer::call::HandlerFailure;
use crate::consumer::database::{Tx, TxFailure};
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

/// The savepoint taken after the claim: the careful pass starts from it.
const BATCH_SAVEPOINT: &str = "outbox_inbox_batch";
/// The savepoint of one row in the careful pass.
const ROW_SAVEPOINT: &str = "outbox_inbox_row";

/// Transient failures of one row in a row after which the next one counts
/// as its handler's failure (a handler that deadlocks every time must not
/// hold its key for ever); as in dedup mode.
const TRANSIENT_TRIES: u32 = 10;

/// What a processor carries from one unit of work to the next when a unit
/// had to end early: a handler's transient failure or a transaction lost
/// under a handler (MySQL rolls the whole transaction back on a deadlock,
/// claim and all), after which the claimed rows are claimed again.
#[derive(Default)]
pub(super) struct Recovery {
    /// The next unit skips the fast pass: the last one's transaction was
    /// lost before its careful pass could run.
    careful_next: bool,
    /// Transient failures in a row, by event.
    transient: HashMap<Uuid, u32>,
    /// Rows whose next call is not made but recorded as failed with this
    /// error: abandoned at the handler timeout, failing transiently too
    /// often, or failing in a transaction that was lost with it.
    charged: HashMap<Uuid, String>,
}

/// What a pass over the claimed rows decided.
#[derive(Default)]
struct Outcomes {
    processed: Vec<Uuid>,
    by_type: HashMap<String, u64>,
    /// Failed attempts: (event id, error, retry delay; `None` parks the row).
    failed: Vec<(Uuid, String, Option<std::time::Duration>)>,
    /// Rows no handler can take: (event id, reason, error).
    parked: Vec<(Uuid, DeadLetterReason, String)>,
    /// What the processed rows' calls leave to do after the commit.
    after_commit: AfterCommit,
}

/// Why a pass stopped early.
enum Stop {
    /// Fast pass: a handler failed (or left the transaction unable to
    /// commit); the careful pass runs from the batch's savepoint. A call
    /// abandoned at the handler timeout is named (the row and the error),
    /// so that the careful pass records its failure without waiting again.
    HandlerFailed(Option<(Uuid, String)>),
    /// Careful pass: the transaction cannot go on past this row: its
    /// handler failed transiently (MySQL may have rolled everything back),
    /// or ended or lost the transaction. The unit ends and the rows are
    /// claimed again; the row's handler is called again if the failure was
    /// transient (up to [`TRANSIENT_TRIES`]), else the row is charged.
    Restart {
        event_id: Uuid,
        handler: String,
        error: HandlerError,
    },
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
///
/// A transient failure (a deadlock, a lock wait timeout, a serialization
/// failure, or on MySQL the transaction rolled back under a handler that
/// swallowed a deadlock) is no event's fault: the unit ends, the processor
/// pauses briefly and claims again, and the row is called again uncounted,
/// up to [`TRANSIENT_TRIES`] times in a row.
pub(super) async fn claim_and_handle(
    ctx: &Shared,
    recovery: &mut Recovery,
) -> Result<Claimed, sqlx::Error> {
    let mut tx = ctx.db.begin().await?;
    let rows = claim(ctx, &mut tx).await?;
    if rows.is_empty() {
        return Ok(Claimed::Drained);
    }
    let claims: Vec<Claim> = rows.into_iter().map(|row| read(ctx, row)).collect();
    let claimed: HashSet<Uuid> = claims.iter().map(|c| c.event_id).collect();
    // What the last units left for rows claimed elsewhere since is stale.
    recovery.charged.retain(|id, _| claimed.contains(id));
    recovery.transient.retain(|id, _| claimed.contains(id));
    tx.set_savepoint(BATCH_SAVEPOINT).await?;
    let careful_now = std::mem::take(&mut recovery.careful_next) || !recovery.charged.is_empty();
    let fast = if careful_now {
        None
    } else {
        match pass(ctx, &mut tx, &claims, None).await {
            // A handler that swallowed a database error returned `Ok` on an
            // aborted (or, on MySQL, lost) transaction: the careful pass
            // finds which one.
            Ok(outcomes) if outcomes.processed.is_empty() => Some(outcomes),
            Ok(outcomes) => match tx.check_committable().await {
                Ok(()) => Some(outcomes),
                Err(txoutbox_core::Error::Database(error)) => return Err(error),
                Err(_) => None,
            },
            Err(Stop::Outage(error)) => return Err(error),
            Err(Stop::HandlerFailed(timed_out)) => {
                recovery.charged.extend(timed_out);
                None
            }
            Err(Stop::Restart { .. }) => unreachable!("only the careful pass restarts"),
        }
    };
    let outcomes = match fast {
        Some(outcomes) => outcomes,
        None => {
            match tx.rollback_to(BATCH_SAVEPOINT).await {
                Ok(()) => {}
                // MySQL rolled the transaction back under a handler (a
                // deadlock): nothing is claimed any more. The next unit
                // claims again and goes straight to its careful pass.
                Err(TxFailure::Unusable(_)) => {
                    recovery.careful_next = true;
                    return Ok(Claimed::Handled);
                }
                Err(TxFailure::Database(error)) => return Err(error),
            }
            match pass(ctx, &mut tx, &claims, Some(&mut recovery.charged)).await {
                Ok(outcomes) => outcomes,
                Err(Stop::Outage(error)) => return Err(error),
                Err(Stop::Restart {
                    event_id,
                    handler,
                    error,
                }) => {
                    drop(tx);
                    restart(ctx, recovery, event_id, &handler, &error).await;
                    return Ok(Claimed::Handled);
                }
                Err(Stop::HandlerFailed(_)) => unreachable!("the careful pass records failures"),
            }
        }
    };
    let mut failed: Vec<FailedRow<'_>> = Vec::new();
    for (event_id, error, delay) in &outcomes.failed {
        failed.push(FailedRow {
            event_id: *event_id,
            error,
            delay_ms: delay.map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
        });
    }
    for (event_id, _, error) in &outcomes.parked {
        failed.push(FailedRow {
            event_id: *event_id,
            error,
            delay_ms: None,
        });
    }
    let settled = Settled {
        processed: &outcomes.processed,
        failed,
        claims: &claims,
    };
    record(ctx, &mut tx, &settled).await?;
    tx.commit().await?;
    ctx.calls.committed(outcomes.after_commit);
    recovery.charged.clear();
    for id in &outcomes.processed {
        recovery.transient.remove(id);
    }
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

/// After a careful pass stopped at `event_id`: a transient failure is
/// waited out (briefly, growing with the tries) and the row is called again
/// when claimed next, until [`TRANSIENT_TRIES`]; any other failure, or the
/// last transient one, charges the row, whose failure the next careful pass
/// records without calling it.
async fn restart(
    ctx: &Shared,
    recovery: &mut Recovery,
    event_id: Uuid,
    handler: &str,
    error: &HandlerError,
) {
    recovery.careful_next = true;
    let tries = recovery.transient.entry(event_id).or_default();
    if !error.is_transient() || *tries >= TRANSIENT_TRIES {
        recovery.transient.remove(&event_id);
        recovery.charged.insert(event_id, error.to_string());
        return;
    }
    ctx.db.transient(handler, &error.to_string(), tries).await;
}

/// One pass over the claimed rows, in arrival order: the fast pass
/// (`charged: None`), or the careful one, which records the failure of the
/// rows in `charged` without calling their handlers (the call the fast pass
/// abandoned at the timeout, say).
async fn pass(
    ctx: &Shared,
    tx: &mut Tx,
    claims: &[Claim],
    mut charged: Option<&mut HashMap<Uuid, String>>,
) -> Result<Outcomes, Stop> {
    let careful = charged.is_some();
    let mut outcomes = Outcomes::default();
    // Keys that may not go on in this batch: a row of theirs waits.
    let mut held: HashSet<&OrderKey> = HashSet::new();
    let mut called_before = false;
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
        let known_failure = charged
            .as_deref_mut()
            .and_then(|charged| charged.remove(&claim.event_id));
        if careful {
            tx.set_savepoint(ROW_SAVEPOINT).await?;
        } else if called_before {
            // On MySQL a handler that swallowed a deadlock leaves the
            // session outside any transaction, where the next handler's
            // writes would commit on their own (no statement on PostgreSQL).
            match tx.check_still_open().await {
                Ok(()) => {}
                Err(txoutbox_core::Error::Database(error)) => return Err(Stop::Outage(error)),
                Err(_) => return Err(Stop::HandlerFailed(None)),
            }
        }
        called_before = true;
        let called = match known_failure {
            Some(error) => Err(HandlerFailure {
                error: HandlerError::new(error),
                timed_out: false,
            }),
            None => ctx.calls.call(&**handler, tx.lend(), event, meta).await,
        };
        let restart = |error: HandlerError| Stop::Restart {
            event_id: claim.event_id,
            handler: handler.name().to_owned(),
            error,
        };
        let called = match called {
            Ok(after) if careful => match tx.release(ROW_SAVEPOINT).await {
                Ok(()) => Ok(after),
                // Refused: the handler left the transaction aborted, which
                // its savepoint's rollback mends ...
                Err(TxFailure::Unusable(unusable @ txoutbox_core::Error::TransactionAborted)) => {
                    Err(ctx.calls.left_unusable(&**handler, meta, &unusable))
                }
                // ... or ended it (a COMMIT or ROLLBACK of its own) or, on
                // MySQL, lost it: nothing of this pass is left.
                Err(TxFailure::Unusable(gone)) => {
                    return Err(restart(ctx.calls.left_unusable(&**handler, meta, &gone)));
                }
                Err(TxFailure::Database(error)) => return Err(Stop::Outage(error)),
            },
            Ok(after) => Ok(after),
            Err(failure) if !careful => {
                let timed_out = failure
                    .timed_out
                    .then(|| (claim.event_id, failure.error.to_string()));
                return Err(Stop::HandlerFailed(timed_out));
            }
            Err(failure) => Err(failure.error),
        };
        match called {
            Ok(after) => {
                outcomes.after_commit = outcomes.after_commit.and(after);
                outcomes.processed.push(claim.event_id);
                *outcomes.by_type.entry(meta.event_type.clone()).or_default() += 1;
            }
            Err(_) if !careful => unreachable!("the fast pass returned above"),
            Err(error) => {
                if error.is_transient() {
                    // MySQL may have rolled the whole transaction back: the
                    // unit ends rather than going on in it.
                    return Err(restart(error));
                }
                match tx.rollback_to(ROW_SAVEPOINT).await {
                    Ok(()) => {}
                    // The transaction went with the failure (MySQL): the
                    // row is charged when it is claimed next.
                    Err(TxFailure::Unusable(_)) => return Err(restart(error)),
                    Err(TxFailure::Database(error)) => return Err(Stop::Outage(error)),
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

/// Writes a unit's outcomes through the database's statements.
async fn record(ctx: &Shared, tx: &mut Tx, settled: &Settled<'_>) -> sqlx::Result<()> {
    let group = &ctx.settings.group_id;
    match tx {
        Tx::Postgres(tx) => super::postgres::record(tx, group, settled).await,
        #[cfg(feature = "mysql")]
        Tx::MySql(tx) => super::mysql::record(tx, group, settled).await,
    }
}
