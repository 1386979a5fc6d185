//! Dedup mode: `processed_event` row and handler effects in one transaction.
//!
//! A batch first runs optimistically in a single transaction (one dedup insert
//! for all its event ids, then each new event's handler, one commit). If any
//! handler fails, that transaction rolls back as a whole and a careful pass
//! runs the batch again in one transaction with a savepoint per event: a
//! failing event's dedup row and effects are undone, the events after it in
//! its partition wait, every other event is committed. The failing event is
//! then retried on its own, in place (its partition waits, in offset order),
//! with its retry budget, and dead-lettered when that is spent; then the
//! events that waited behind it go on. So a failing event never takes its
//! neighbours' effects with it, and costs its batch one more pass, not a
//! transaction per event.

use std::collections::HashSet;
use std::sync::Arc;

use rdkafka::message::OwnedMessage;
use uuid::Uuid;

use super::handler::{Decoded, ErasedHandler};
use super::message::{DeadLetterReason, Envelope};
use super::route::{Routed, route};
use super::shared::{Aside, Shared};

struct Work {
    index: usize,
    envelope: Envelope,
    handler: Arc<dyn ErasedHandler>,
    decoded: Option<Decoded>,
}

impl Work {
    fn event(&mut self) -> Decoded {
        match self.decoded.take() {
            Some(event) => event,
            // Decoding is deterministic and succeeded when the batch was classified.
            None => self
                .handler
                .decode(&self.envelope.payload)
                .expect("payload decoded before"),
        }
    }
}

enum Fast {
    Committed,
    HandlerFailed,
    Interrupted,
}

enum One {
    Done,
    DeadLetter(String),
    Interrupted,
}

/// Handles a batch; returns which messages are finished (their offsets may be stored).
pub(crate) async fn handle_batch(ctx: &Shared, batch: &[OwnedMessage]) -> Vec<bool> {
    let mut done = vec![false; batch.len()];
    let mut work = Vec::new();
    let mut aside = Vec::new();
    for (index, message) in batch.iter().enumerate() {
        match route(message, &ctx.dispatch, &ctx.settings) {
            Routed::Handle {
                envelope,
                handler,
                event,
            } => work.push(Work {
                index,
                envelope,
                handler,
                decoded: Some(event),
            }),
            Routed::Skip(event_type) => aside.push((index, Aside::Skip(event_type))),
            Routed::DeadLetter(reason, error) => aside.push((index, Aside::Dead(reason, error))),
            Routed::Store(_) => unreachable!("only inbox mode stores"),
        }
    }
    if !work.is_empty() {
        match fast_path(ctx, &mut work).await {
            Fast::Committed => work.iter().for_each(|w| done[w.index] = true),
            Fast::Interrupted => return done,
            Fast::HandlerFailed => {
                let mut pending: Vec<usize> = (0..work.len()).collect();
                while !pending.is_empty() {
                    let Careful { finished, failed } = match careful(ctx, &mut work, &pending).await
                    {
                        Some(pass) => pass,
                        None => return done,
                    };
                    let mut resolved: HashSet<usize> = finished.iter().copied().collect();
                    finished.iter().for_each(|&i| done[work[i].index] = true);
                    for (i, error) in failed {
                        let w = &mut work[i];
                        match handle_one(ctx, w, 1, error).await {
                            One::Done => done[w.index] = true,
                            One::DeadLetter(error) => aside.push((
                                w.index,
                                Aside::Dead(DeadLetterReason::HandlerFailed, error),
                            )),
                            One::Interrupted => return done,
                        }
                        resolved.insert(i);
                    }
                    pending.retain(|i| !resolved.contains(i));
                }
            }
        }
    }
    ctx.set_aside(batch, aside, &mut done).await;
    done
}

async fn fast_path(ctx: &Shared, work: &mut [Work]) -> Fast {
    let ids: Vec<Uuid> = work.iter().map(|w| w.envelope.meta.event_id).collect();
    let mut db_retry = 0;
    loop {
        let attempt = async {
            let mut tx = ctx.pool.begin().await?;
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
            for w in work.iter_mut() {
                // `remove`: an id twice in one batch runs its handler once.
                if !fresh.remove(&w.envelope.meta.event_id) {
                    continue;
                }
                let event = w.event();
                if ctx
                    .call(&*w.handler, &mut tx, event, &w.envelope.meta)
                    .await
                    .is_err()
                {
                    return Ok::<_, sqlx::Error>(None);
                }
                handled += 1;
            }
            tx.commit().await?;
            ctx.committed();
            Ok(Some(handled))
        }
        .await;
        match attempt {
            Ok(Some(handled)) => {
                ctx.count_handled(handled, work.len() as u64 - handled);
                return Fast::Committed;
            }
            Ok(None) => return Fast::HandlerFailed,
            Err(error) => {
                if !ctx.db_failed(&error, &mut db_retry).await {
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

/// Runs the `pending` work (indices into `work`, in offset order) in one
/// transaction, each event under a savepoint. `None` when shutting down.
async fn careful(ctx: &Shared, work: &mut [Work], pending: &[usize]) -> Option<Careful> {
    let mut db_retry = 0;
    loop {
        let attempt = async {
            let mut tx = ctx.pool.begin().await?;
            let mut pass = Careful {
                finished: Vec::new(),
                failed: Vec::new(),
            };
            let mut blocked: HashSet<(String, i32)> = HashSet::new();
            let mut handled = 0u64;
            for &i in pending {
                let w = &mut work[i];
                let partition = (
                    w.envelope.meta.topic.clone(),
                    w.envelope.meta.partition.unwrap_or_default(),
                );
                if blocked.contains(&partition) {
                    continue; // behind a failed event of its partition
                }
                sqlx::query("SAVEPOINT outbox_dedup_event")
                    .execute(&mut *tx)
                    .await?;
                if !mark_processed(&mut tx, ctx, w.envelope.meta.event_id).await? {
                    pass.finished.push(i); // a duplicate
                    continue;
                }
                let event = w.event();
                match ctx
                    .call(&*w.handler, &mut tx, event, &w.envelope.meta)
                    .await
                {
                    Ok(()) => {
                        sqlx::query("RELEASE SAVEPOINT outbox_dedup_event")
                            .execute(&mut *tx)
                            .await?;
                        pass.finished.push(i);
                        handled += 1;
                    }
                    Err(error) => {
                        // Undoes the dedup row too: the event is not processed.
                        sqlx::query("ROLLBACK TO SAVEPOINT outbox_dedup_event")
                            .execute(&mut *tx)
                            .await?;
                        if !ctx.db_reachable().await {
                            // An outage, not the event's fault.
                            return Err(sqlx::Error::PoolTimedOut);
                        }
                        blocked.insert(partition);
                        pass.failed.push((i, error.to_string()));
                    }
                }
            }
            tx.commit().await?;
            ctx.committed();
            ctx.count_handled(handled, pass.finished.len() as u64 - handled);
            Ok::<_, sqlx::Error>(pass)
        }
        .await;
        match attempt {
            Ok(pass) => return Some(pass),
            Err(error) => {
                if !ctx.db_failed(&error, &mut db_retry).await {
                    return None;
                }
            }
        }
    }
}

enum Step {
    Db(sqlx::Error),
    Handler(String),
}

/// Retries one event in place until it is handled, found to be a duplicate
/// or out of attempts (`failed_before` attempts already failed, the last
/// with `last_error`).
async fn handle_one(ctx: &Shared, w: &mut Work, failed_before: u32, last_error: String) -> One {
    let mut attempts = failed_before;
    if let Some(give_up) = out_of_attempts(ctx, w, attempts, &last_error) {
        return give_up;
    }
    if !ctx.pause(ctx.settings.backoff(attempts)).await {
        return One::Interrupted;
    }
    let mut db_retry = 0;
    loop {
        let attempt = async {
            let mut tx = ctx.pool.begin().await.map_err(Step::Db)?;
            if !mark_processed(&mut tx, ctx, w.envelope.meta.event_id)
                .await
                .map_err(Step::Db)?
            {
                return Ok(false);
            }
            let event = w.event();
            w.envelope.meta.attempt = attempts + 1;
            ctx.call(&*w.handler, &mut tx, event, &w.envelope.meta)
                .await
                .map_err(|e| Step::Handler(e.to_string()))?;
            tx.commit().await.map_err(Step::Db)?;
            ctx.committed();
            Ok(true)
        }
        .await;
        match attempt {
            Ok(handled) => {
                ctx.count_handled(u64::from(handled), u64::from(!handled));
                return One::Done;
            }
            Err(Step::Db(error)) => {
                if !ctx.db_failed(&error, &mut db_retry).await {
                    return One::Interrupted;
                }
            }
            Err(Step::Handler(error)) => {
                if !ctx.db_reachable().await {
                    let outage = sqlx::Error::PoolTimedOut;
                    if !ctx.db_failed(&outage, &mut db_retry).await {
                        return One::Interrupted;
                    }
                    continue;
                }
                attempts += 1;
                if let Some(give_up) = out_of_attempts(ctx, w, attempts, &error) {
                    return give_up;
                }
                if !ctx.pause(ctx.settings.backoff(attempts)).await {
                    return One::Interrupted;
                }
            }
        }
    }
}

/// The dead-letter verdict once `attempts` failed attempts reached the bound.
fn out_of_attempts(ctx: &Shared, w: &Work, attempts: u32, last_error: &str) -> Option<One> {
    (attempts >= ctx.settings.max_attempts).then(|| {
        One::DeadLetter(format!(
            "handler `{}` failed {attempts} times; last error: {last_error}",
            w.handler.name()
        ))
    })
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
