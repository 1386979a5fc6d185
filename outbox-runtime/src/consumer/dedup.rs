//! Dedup mode: `processed_event` row and handler effects in one transaction.
//!
//! A batch first runs optimistically in a single transaction (one dedup insert
//! for all its event ids, then each new event's handler, one commit). If any
//! handler fails, that transaction rolls back as a whole and the batch is
//! handled again one event per transaction, each with its own retry budget, so
//! a failing event never takes its neighbours' effects with it.

use std::collections::HashSet;
use std::sync::Arc;

use rdkafka::message::OwnedMessage;
use uuid::Uuid;

use super::handler::{Decoded, ErasedHandler};
use super::message::{DeadLetterReason, Envelope};
use super::metric_names as m;
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
                for w in &mut work {
                    match handle_one(ctx, w).await {
                        One::Done => done[w.index] = true,
                        One::DeadLetter(error) => aside
                            .push((w.index, Aside::Dead(DeadLetterReason::HandlerFailed, error))),
                        One::Interrupted => return done,
                    }
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
                let group = ctx.group();
                metrics::counter!(m::HANDLED, "group" => group.clone()).increment(handled);
                metrics::counter!(m::DUPLICATES, "group" => group)
                    .increment(work.len() as u64 - handled);
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

enum Step {
    Db(sqlx::Error),
    Handler(String),
}

async fn handle_one(ctx: &Shared, w: &mut Work) -> One {
    let mut attempts = 0;
    let mut db_retry = 0;
    loop {
        let attempt = async {
            let mut tx = ctx.pool.begin().await.map_err(Step::Db)?;
            let inserted = sqlx::query(
                "INSERT INTO processed_event (consumer_group, event_id) VALUES ($1, $2)
                 ON CONFLICT DO NOTHING",
            )
            .bind(&ctx.settings.group_id)
            .bind(w.envelope.meta.event_id)
            .execute(&mut *tx)
            .await
            .map_err(Step::Db)?
            .rows_affected();
            if inserted == 0 {
                return Ok(false);
            }
            let event = w.event();
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
                let name = if handled { m::HANDLED } else { m::DUPLICATES };
                metrics::counter!(name, "group" => ctx.group()).increment(1);
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
                if attempts >= ctx.settings.max_attempts {
                    return One::DeadLetter(format!(
                        "handler `{}` failed {attempts} times; last error: {error}",
                        w.handler.name()
                    ));
                }
                if !ctx.pause(ctx.settings.backoff(attempts)).await {
                    return One::Interrupted;
                }
            }
        }
    }
}
