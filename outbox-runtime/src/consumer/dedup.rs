//! Dedup mode: `processed_event` row and handler effects in one transaction.
//!
//! A batch first runs optimistically in a single transaction (one dedup insert
//! for all its event ids, then each new event's handler, a check that the
//! transaction can still commit, one commit). If any handler fails, that
//! transaction rolls back as a whole and a careful pass runs the batch again
//! in one transaction with a savepoint per event: a failing event's dedup row
//! and effects are undone, the events after it in its partition wait, every
//! other event is committed. The careful pass also finds the handler that
//! returned `Ok` on a transaction it left aborted (a swallowed database
//! error): releasing its savepoint fails, and that handler alone is charged.
//!
//! The failing event is not retried here: [`take`] hands it back as a
//! [`Retry`], and the receive loop runs its next attempts with [`attempt`]
//! beside the batches of the other partitions, after its backoff, while its
//! own partition waits (paused). So a failing event never takes its
//! neighbours' effects with it, costs its batch one more pass, not a
//! transaction per event, and delays only its own partition.
//!
//! A transient failure (a deadlock, a lock wait timeout, a serialization
//! failure, or on MySQL the transaction rolled back under a handler that
//! swallowed a deadlock) is no event's fault: the pass or the attempt runs
//! again after a short backoff, uncounted, up to [`TRANSIENT_TRIES`] times in
//! a row, after which it counts as the handler's failure (a handler that
//! deadlocks every time must not hold its partition for ever).
//!
//! The statements are the database's ([`super::database`]): this module is
//! the same on PostgreSQL and MySQL.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use rdkafka::message::OwnedMessage;
use txoutbox_core::AfterCommit;
use uuid::Uuid;

use super::database::TxFailure;
use super::handler::{Decoded, ErasedHandler, HandlerError};
use super::message::Envelope;
use super::progress::Taken;
use super::route::{Admit, Routed, route};
use super::shared::Shared;
use super::work::{Retry, Work};
use crate::probe::{self, Stage};
use crate::wire::dead_letter::DeadLetterReason;

/// Dedup mode's [`Admit`]: a known event is decoded for its handler now
/// (a payload that does not fit the handler's type is a dead letter).
pub(crate) struct ToHandler;

impl Admit for ToHandler {
    type Taken = (Envelope, Arc<dyn ErasedHandler>, Decoded);

    fn known(&self, envelope: Envelope, handler: &Arc<dyn ErasedHandler>) -> Routed<Self::Taken> {
        match handler.decode(&envelope.payload) {
            Ok(event) => Routed::Take((envelope, Arc::clone(handler), event)),
            Err(error) => Routed::DeadLetter(
                DeadLetterReason::PayloadMismatch,
                format!(
                    "payload does not match `{}`: {error}",
                    envelope.meta.event_type
                ),
            ),
        }
    }

    /// Dedup mode has nowhere to keep an event without a handler (building
    /// a dedup consumer with [`UnknownEventPolicy::Keep`] fails), so such an
    /// event could only be a dead letter.
    ///
    /// [`UnknownEventPolicy::Keep`]: super::UnknownEventPolicy::Keep
    fn kept(&self, envelope: Envelope) -> Routed<Self::Taken> {
        Routed::DeadLetter(
            DeadLetterReason::UnknownEventType,
            format!("no handler for event type `{}`", envelope.meta.event_type),
        )
    }
}

/// Transient failures in a row after which one counts as the handler's.
const TRANSIENT_TRIES: u32 = 10;

enum Fast {
    Committed,
    /// A handler failed; those abandoned at the timeout are named (by index
    /// into the work), so that the careful pass does not wait for them again.
    HandlerFailed {
        timed_out: Vec<(usize, String)>,
    },
    Interrupted,
}

/// Handles a batch; says which messages are finished, which to dead-letter,
/// and which events to retry (see [`Taken`]).
pub(crate) async fn take(ctx: &Shared, batch: &[OwnedMessage]) -> Taken {
    let mut taken = Taken::default();
    let mut work = Vec::new();
    for (index, message) in batch.iter().enumerate() {
        match route(message, &ctx.dispatch, &ctx.settings, &ToHandler) {
            Routed::Take((envelope, handler, event)) => work.push(Work {
                index,
                envelope,
                handler,
                decoded: Some(event),
            }),
            Routed::Skip(event_type) => {
                ctx.counts.skipped(&envelope_topic(message), &event_type);
                taken.done.push(index);
            }
            Routed::DeadLetter(reason, error) => taken.dead.push((index, reason, error)),
        }
    }
    if work.is_empty() {
        return taken;
    }
    let timed_out = match fast_path(ctx, &mut work).await {
        Fast::Committed => {
            taken.done.extend(work.iter().map(|w| w.index));
            return taken;
        }
        Fast::Interrupted => return Taken::interrupted(),
        Fast::HandlerFailed { timed_out } => timed_out,
    };
    // Each event abandoned at the timeout has had its first attempt; the
    // careful pass goes on without it (and its partition's later events).
    let mut blocked: HashMap<(String, i32), usize> = HashMap::new();
    let mut failed: Vec<(usize, String)> = Vec::new();
    for (i, error) in timed_out {
        blocked.entry(work[i].partition()).or_insert(i);
        failed.push((i, error));
    }
    let Some(pass) = careful(ctx, &mut work, blocked).await else {
        return Taken::interrupted();
    };
    taken
        .done
        .extend(pass.finished.iter().map(|&i| work[i].index));
    failed.extend(pass.failed);
    failed.sort_by_key(|(i, _)| *i);
    // The first failure of each partition is retried; what follows it in
    // its partition (events, a later failure, dead letters) waits behind it.
    let mut first_failure: HashMap<(String, i32), (usize, String)> = HashMap::new();
    for (i, error) in failed {
        first_failure
            .entry(work[i].partition())
            .or_insert((i, error));
    }
    taken.dead.retain(|(index, ..)| {
        let partition = partition_of(&batch[*index]);
        first_failure
            .get(&partition)
            .is_none_or(|(first, _)| work[*first].index > *index)
    });
    let mut work: Vec<Option<Work>> = work.into_iter().map(Some).collect();
    for (i, last_error) in first_failure.into_values() {
        let work = work[i].take().expect("one first failure per partition");
        taken.retry.push((
            work.index,
            Retry {
                attempts: 1,
                last_error,
                work,
            },
        ));
    }
    taken.retry.sort_by_key(|(index, _)| *index);
    taken
}

fn partition_of(message: &OwnedMessage) -> (String, i32) {
    use rdkafka::Message;
    (message.topic().to_owned(), message.partition())
}

fn envelope_topic(message: &OwnedMessage) -> String {
    use rdkafka::Message;
    message.topic().to_owned()
}

async fn fast_path(ctx: &Shared, work: &mut [Work]) -> Fast {
    let ids: Vec<Uuid> = work.iter().map(|w| w.envelope.meta.event_id).collect();
    let mut db_retry = 0;
    loop {
        let attempt = async {
            let mut tx = ctx.db.begin().await?;
            let mut fresh: HashSet<Uuid> =
                tx.mark_processed_all(&ctx.settings.group_id, &ids).await?;
            let mut handled = 0u64;
            let mut after_commit = AfterCommit::default();
            for (i, w) in work.iter_mut().enumerate() {
                // `remove`: an id twice in one batch runs its handler once.
                if !fresh.remove(&w.envelope.meta.event_id) {
                    continue;
                }
                // On MySQL a handler that swallowed a deadlock leaves the
                // session outside any transaction, where the next handler's
                // writes would commit on their own: check before each
                // handler after the first (no statement on PostgreSQL,
                // where such writes fail instead).
                if handled > 0 {
                    match tx.check_still_open().await {
                        Ok(()) => {}
                        Err(txoutbox_core::Error::Database(error)) => return Err(error),
                        Err(_) => {
                            return Ok(Fast::HandlerFailed {
                                timed_out: Vec::new(),
                            });
                        }
                    }
                }
                let event = w.event();
                match ctx
                    .calls
                    .call(&*w.handler, tx.lend(), event, &w.envelope.meta)
                    .await
                {
                    Ok(after) => after_commit = after_commit.and(after),
                    Err(failure) => {
                        let timed_out = if failure.timed_out {
                            vec![(i, failure.error.to_string())]
                        } else {
                            Vec::new()
                        };
                        return Ok::<_, sqlx::Error>(Fast::HandlerFailed { timed_out });
                    }
                }
                handled += 1;
            }
            // A handler that swallowed a database error returned `Ok` on an
            // aborted transaction, whose COMMIT would be a silent rollback of
            // the whole batch; the careful pass finds which one it was.
            // Checked with the commit, in one round trip.
            if handled > 0 {
                match tx.commit_checked().await {
                    Ok(()) => {}
                    Err(txoutbox_core::Error::Database(error)) => return Err(error),
                    Err(_) => {
                        return Ok(Fast::HandlerFailed {
                            timed_out: Vec::new(),
                        });
                    }
                }
            } else {
                tx.commit().await?;
            }
            ctx.calls.committed(after_commit);
            probe::mark_each(
                Stage::Committed,
                work.iter().map(|w| w.envelope.meta.event_id),
            );
            ctx.counts.handled(handled, work.len() as u64 - handled);
            Ok(Fast::Committed)
        }
        .await;
        match attempt {
            Ok(outcome) => return outcome,
            Err(error) => {
                if !ctx.db.failed(&error, &mut db_retry).await {
                    return Fast::Interrupted;
                }
            }
        }
    }
}

/// What a careful pass did: the work it finished (handled or found to be a
/// duplicate) and the first failing event of each partition, with its error.
struct Careful {
    finished: Vec<usize>,
    failed: Vec<(usize, String)>,
}

/// Runs the work (in offset order) in one transaction, each event under a
/// savepoint, up to the known failure of each partition in `blocked` (the
/// index of its failing work). `None` when shutting down.
async fn careful(
    ctx: &Shared,
    work: &mut [Work],
    blocked: HashMap<(String, i32), usize>,
) -> Option<Careful> {
    /// Why a pass stopped before its commit.
    enum Stop {
        Db(sqlx::Error),
        /// The transaction cannot go on past this event: its handler failed
        /// transiently (MySQL may have rolled everything back), or ended or
        /// lost the transaction. The pass runs again, after a pause if the
        /// failure was transient, else with the event charged.
        Restart(usize, HandlerError),
    }
    impl From<sqlx::Error> for Stop {
        fn from(error: sqlx::Error) -> Self {
            Self::Db(error)
        }
    }
    let mut db_retry = 0;
    let mut transient_retry = 0;
    // Transient failures charged as the handler's after TRANSIENT_TRIES.
    let mut charged: Vec<(usize, String)> = Vec::new();
    loop {
        let attempt = async {
            let mut tx = ctx.db.begin().await?;
            let mut pass = Careful {
                finished: Vec::new(),
                failed: charged.clone(),
            };
            let mut blocked = blocked.clone();
            for (i, _) in &charged {
                let first = blocked.entry(work[*i].partition()).or_insert(*i);
                *first = (*first).min(*i);
            }
            let mut handled = 0u64;
            let mut after_commit = AfterCommit::default();
            for (i, w) in work.iter_mut().enumerate() {
                let partition = w.partition();
                if blocked.get(&partition).is_some_and(|&first| first <= i) {
                    continue; // a failed event of its partition, or behind one
                }
                tx.savepoint().await?;
                if !tx
                    .mark_processed(&ctx.settings.group_id, w.envelope.meta.event_id)
                    .await?
                {
                    pass.finished.push(i); // a duplicate
                    continue;
                }
                let event = w.event();
                let called = ctx
                    .calls
                    .call(&*w.handler, tx.lend(), event, &w.envelope.meta)
                    .await;
                let failure = match called {
                    Ok(after) => match tx.release_savepoint().await {
                        Ok(()) => {
                            after_commit = after_commit.and(after);
                            pass.finished.push(i);
                            handled += 1;
                            continue;
                        }
                        // Refused: the handler left the transaction aborted,
                        // which its savepoint's rollback mends ...
                        Err(TxFailure::Unusable(
                            unusable @ txoutbox_core::Error::TransactionAborted,
                        )) => ctx
                            .calls
                            .left_unusable(&*w.handler, &w.envelope.meta, &unusable),
                        // ... or ended it (a COMMIT or ROLLBACK of its own) or,
                        // on MySQL, lost it: nothing of this pass is left.
                        Err(TxFailure::Unusable(gone)) => {
                            let failure =
                                ctx.calls
                                    .left_unusable(&*w.handler, &w.envelope.meta, &gone);
                            return Err(Stop::Restart(i, failure));
                        }
                        Err(TxFailure::Database(error)) => return Err(Stop::Db(error)),
                    },
                    Err(failure) => failure.error,
                };
                if failure.is_transient() {
                    // MySQL may have rolled the whole transaction back: the
                    // pass runs again rather than going on in it.
                    return Err(Stop::Restart(i, failure));
                }
                // Undoes the dedup row too: the event is not processed.
                tx.rollback_to_savepoint().await?;
                if !ctx.db.reachable().await {
                    // An outage, not the event's fault.
                    return Err(Stop::Db(sqlx::Error::PoolTimedOut));
                }
                let first = blocked.entry(partition).or_insert(i);
                *first = (*first).min(i);
                pass.failed.push((i, failure.to_string()));
            }
            tx.commit().await?;
            ctx.calls.committed(after_commit);
            ctx.counts
                .handled(handled, pass.finished.len() as u64 - handled);
            Ok::<_, Stop>(pass)
        }
        .await;
        match attempt {
            Ok(pass) => return Some(pass),
            Err(Stop::Db(error)) => {
                if !ctx.db.failed(&error, &mut db_retry).await {
                    return None;
                }
            }
            Err(Stop::Restart(i, error)) => {
                let transient = error.is_transient();
                let error = error.to_string();
                if !transient || transient_retry >= TRANSIENT_TRIES {
                    // Its own fault, or failing the same way every time.
                    transient_retry = 0;
                    charged.push((i, error));
                    continue;
                }
                if !ctx
                    .db
                    .transient(work[i].handler.name(), &error, &mut transient_retry)
                    .await
                {
                    return None;
                }
            }
        }
    }
}

/// What one more attempt of a retried event did.
pub(crate) enum Attempted {
    /// Handled and committed, or found handled meanwhile (a duplicate).
    Handled,
    /// The handler failed again, with this error.
    Failed(String),
    /// The consumer is shutting down.
    Interrupted,
}

/// One more attempt of `retry`'s event in a transaction of its own. A
/// database outage meanwhile is waited out and does not count as an attempt.
pub(crate) async fn attempt(ctx: Arc<Shared>, retry: &mut Retry) -> Attempted {
    enum Step {
        Db(sqlx::Error),
        Handler(HandlerError),
    }
    let attempt = retry.attempts + 1;
    let w = &mut retry.work;
    w.envelope.meta.attempt = attempt;
    let mut db_retry = 0;
    let mut transient_retry = 0;
    loop {
        let outcome = ctx
            .unless_stalled(async {
                let mut tx = ctx.db.begin().await.map_err(Step::Db)?;
                if !tx
                    .mark_processed(&ctx.settings.group_id, w.envelope.meta.event_id)
                    .await
                    .map_err(Step::Db)?
                {
                    return Ok(false);
                }
                let event = w.event();
                let after_commit = ctx
                    .calls
                    .call(&*w.handler, tx.lend(), event, &w.envelope.meta)
                    .await
                    .map_err(|failure| Step::Handler(failure.error))?;
                if let Err(unusable) = tx.commit_checked().await {
                    return Err(match unusable {
                        txoutbox_core::Error::Database(error) => Step::Db(error),
                        unusable => Step::Handler(ctx.calls.left_unusable(
                            &*w.handler,
                            &w.envelope.meta,
                            &unusable,
                        )),
                    });
                }
                ctx.calls.committed(after_commit);
                Ok(true)
            })
            .await
            .unwrap_or_else(|stalled| Err(Step::Db(stalled.into_db_error())));
        match outcome {
            Ok(handled) => {
                ctx.counts.handled(u64::from(handled), u64::from(!handled));
                return Attempted::Handled;
            }
            Err(Step::Db(error)) => {
                if !ctx.db.failed(&error, &mut db_retry).await {
                    return Attempted::Interrupted;
                }
            }
            Err(Step::Handler(error))
                if error.is_transient() && transient_retry < TRANSIENT_TRIES =>
            {
                // A deadlock or the like: not this attempt's fault.
                if !ctx
                    .db
                    .transient(w.handler.name(), &error.to_string(), &mut transient_retry)
                    .await
                {
                    return Attempted::Interrupted;
                }
            }
            Err(Step::Handler(error)) => {
                if ctx.db.reachable().await {
                    return Attempted::Failed(error.to_string());
                }
                // An outage, not the event's fault.
                let outage = sqlx::Error::PoolTimedOut;
                if !ctx.db.failed(&outage, &mut db_retry).await {
                    return Attempted::Interrupted;
                }
            }
        }
    }
}
