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

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use rdkafka::message::OwnedMessage;
use uuid::Uuid;

use super::handler::{Decoded, ErasedHandler};
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
            let mut fresh: HashSet<Uuid> = sqlx::query_scalar(
                "INSERT INTO processed_event (consumer_group, event_id)
                 SELECT $1, id FROM UNNEST($2::uuid[]) AS t(id)
                 ON CONFLICT DO NOTHING
                 RETURNING event_id",
            )
            .bind(&ctx.settings.group_id)
            .bind(&ids)
            .fetch_all(&mut *tx)
            .await?
            .into_iter()
            .collect();
            let mut handled = 0u64;
            for (i, w) in work.iter_mut().enumerate() {
                // `remove`: an id twice in one batch runs its handler once.
                if !fresh.remove(&w.envelope.meta.event_id) {
                    continue;
                }
                let event = w.event();
                if let Err(failure) = ctx
                    .calls
                    .call(&*w.handler, &mut tx, event, &w.envelope.meta)
                    .await
                {
                    let timed_out = if failure.timed_out {
                        vec![(i, failure.error.to_string())]
                    } else {
                        Vec::new()
                    };
                    return Ok::<_, sqlx::Error>(Fast::HandlerFailed { timed_out });
                }
                handled += 1;
            }
            // A handler that swallowed a database error returned `Ok` on an
            // aborted transaction, whose COMMIT would be a silent rollback of
            // the whole batch; the careful pass finds which one it was.
            if handled > 0 {
                match txoutbox_core::check_committable(&mut tx).await {
                    Ok(()) => {}
                    Err(txoutbox_core::Error::Database(error)) => return Err(error),
                    Err(_) => {
                        return Ok(Fast::HandlerFailed {
                            timed_out: Vec::new(),
                        });
                    }
                }
            }
            tx.commit().await?;
            ctx.calls.committed();
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
    let mut db_retry = 0;
    loop {
        let attempt = async {
            let mut tx = ctx.db.begin().await?;
            let mut pass = Careful {
                finished: Vec::new(),
                failed: Vec::new(),
            };
            let mut blocked = blocked.clone();
            let mut handled = 0u64;
            for (i, w) in work.iter_mut().enumerate() {
                let partition = w.partition();
                if blocked.get(&partition).is_some_and(|&first| first <= i) {
                    continue; // a failed event of its partition, or behind one
                }
                sqlx::query("SAVEPOINT outbox_dedup_event")
                    .execute(&mut *tx)
                    .await?;
                if !mark_processed(&mut tx, ctx, w.envelope.meta.event_id).await? {
                    pass.finished.push(i); // a duplicate
                    continue;
                }
                let event = w.event();
                let called = ctx
                    .calls
                    .call(&*w.handler, &mut tx, event, &w.envelope.meta)
                    .await;
                let failure = match called {
                    Ok(()) => match sqlx::query("RELEASE SAVEPOINT outbox_dedup_event")
                        .execute(&mut *tx)
                        .await
                    {
                        Ok(_) => {
                            pass.finished.push(i);
                            handled += 1;
                            continue;
                        }
                        // Refused: the handler left the transaction aborted.
                        Err(error) => match txoutbox_core::not_committable(&error) {
                            Some(unusable) => ctx
                                .calls
                                .left_unusable(&*w.handler, &w.envelope.meta, &unusable)
                                .to_string(),
                            None => return Err(error),
                        },
                    },
                    Err(failure) => failure.error.to_string(),
                };
                // Undoes the dedup row too: the event is not processed.
                sqlx::query("ROLLBACK TO SAVEPOINT outbox_dedup_event")
                    .execute(&mut *tx)
                    .await?;
                if !ctx.db.reachable().await {
                    // An outage, not the event's fault.
                    return Err(sqlx::Error::PoolTimedOut);
                }
                let first = blocked.entry(partition).or_insert(i);
                *first = (*first).min(i);
                pass.failed.push((i, failure));
            }
            tx.commit().await?;
            ctx.calls.committed();
            ctx.counts
                .handled(handled, pass.finished.len() as u64 - handled);
            Ok::<_, sqlx::Error>(pass)
        }
        .await;
        match attempt {
            Ok(pass) => return Some(pass),
            Err(error) => {
                if !ctx.db.failed(&error, &mut db_retry).await {
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
        Handler(String),
    }
    let attempt = retry.attempts + 1;
    let w = &mut retry.work;
    w.envelope.meta.attempt = attempt;
    let mut db_retry = 0;
    loop {
        let outcome = async {
            let mut tx = ctx.db.begin().await.map_err(Step::Db)?;
            if !mark_processed(&mut tx, &ctx, w.envelope.meta.event_id)
                .await
                .map_err(Step::Db)?
            {
                return Ok(false);
            }
            let event = w.event();
            ctx.calls
                .call(&*w.handler, &mut tx, event, &w.envelope.meta)
                .await
                .map_err(|failure| Step::Handler(failure.error.to_string()))?;
            if let Err(unusable) = txoutbox_core::check_committable(&mut tx).await {
                return Err(match unusable {
                    txoutbox_core::Error::Database(error) => Step::Db(error),
                    unusable => Step::Handler(
                        ctx.calls
                            .left_unusable(&*w.handler, &w.envelope.meta, &unusable)
                            .to_string(),
                    ),
                });
            }
            tx.commit().await.map_err(Step::Db)?;
            ctx.calls.committed();
            Ok(true)
        }
        .await;
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
            Err(Step::Handler(error)) => {
                if ctx.db.reachable().await {
                    return Attempted::Failed(error);
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

/// Inserts the event's dedup row; `false` if the group had processed it
/// already (a duplicate).
async fn mark_processed(
    conn: &mut sqlx::PgConnection,
    ctx: &Shared,
    event_id: Uuid,
) -> sqlx::Result<bool> {
    let inserted = sqlx::query(
        "INSERT INTO processed_event (consumer_group, event_id) VALUES ($1, $2)
         ON CONFLICT DO NOTHING",
    )
    .bind(&ctx.settings.group_id)
    .bind(event_id)
    .execute(conn)
    .await?
    .rows_affected();
    Ok(inserted == 1)
}
