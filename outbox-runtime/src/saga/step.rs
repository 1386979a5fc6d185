//! One saga step: load and lock the saga's row, run its handler, write it back.

use std::marker::PhantomData;

use sqlx::Transaction;
use txoutbox_core::{Events, MAX_PARTITION_KEY_BYTES};

use super::context::SagaContext;
use super::store::{self, Loaded, SagaDatabase};
use super::telemetry;
use super::{Saga, SagaStatus};
use crate::consumer::{EventMeta, HandlerError};

/// What the step found and did.
enum Phase<S> {
    /// No row: only a start handler may run.
    Absent,
    /// A running saga, before its handler ran.
    Running(S),
    /// A finished saga: the message is ignored.
    Finished(SagaStatus),
    /// A start handler created the saga.
    Started(S),
    /// A handler ran on the running saga.
    Applied(S),
    /// No row for a message that is not a start, on an attempt that is not
    /// the last: the attempt fails, to be retried (the start may not have
    /// committed yet).
    NotYet,
    /// Nothing to do, for this reason (a metric label).
    Ignored(&'static str),
}

/// One incoming message applied to one saga instance, inside the consumer's
/// transaction: what each handler `#[saga]` generates runs (load, then
/// [`starting`](Self::starting) or [`running`](Self::running), the
/// handler, [`save`](Self::save)). Public so that a test can drive a step by
/// hand: hold a step's transaction open and race another against it, or
/// load under a saga id the message type cannot carry. To run a whole
/// message through a step, use the saga's `<fn>_handler()` with
/// [`testing::handle`](crate::testing::handle).
///
/// ```no_run
/// # use serde::{Deserialize, Serialize};
/// # use txoutbox_runtime::consumer::HandlerError;
/// # use txoutbox_runtime::saga::{saga, Step};
/// # use uuid::Uuid;
/// # #[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema, txoutbox_core::DomainEvent)]
/// # #[event(topic = "orders", aggregate = "Order")]
/// # struct OrderPlaced { event_id: Uuid, #[partition_key] order_id: Uuid }
/// # #[derive(Serialize, Deserialize)]
/// # struct Fulfil { order_id: Uuid }
/// # #[saga(id = Uuid, correlate = order_id, starts_with(OrderPlaced))]
/// # impl Fulfil {
/// #     async fn on_placed(event: OrderPlaced) -> Result<Self, HandlerError> {
/// #         Ok(Self { order_id: event.order_id })
/// #     }
/// # }
/// # async fn test(pool: sqlx::PgPool, placed: OrderPlaced) -> Result<(), HandlerError> {
/// let meta = txoutbox_runtime::testing::meta_of(&placed);
/// let mut tx = pool.begin_with("BEGIN ISOLATION LEVEL READ COMMITTED").await?;
/// let mut events = txoutbox_core::Events::new();
/// // The saga id as `saga_state` stores it: the correlation's `to_string()`.
/// let mut step = Step::<Fulfil>::load(&mut tx, &mut events, &meta, placed.order_id.to_string()).await?;
/// if step.starting().is_some() {
///     step.started(Fulfil { order_id: placed.order_id });
/// }
/// step.save().await?; // the row is written, locked until `tx` ends
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub struct Step<'a, S: Saga> {
    ctx: SagaContext<'a, S::Database>,
    phase: Phase<S>,
    _saga: PhantomData<fn() -> S>,
}

impl<S: Saga> std::fmt::Debug for Step<'_, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Step")
            .field("ctx", &self.ctx)
            .finish_non_exhaustive()
    }
}

impl<'a, S: Saga> Step<'a, S> {
    /// Loads the saga's row, locking it until the transaction ends (so a
    /// concurrent step of the same saga waits, then sees this one's result).
    /// `saga_id` is the id as `saga_state.saga_id` stores it (the
    /// correlation field's `to_string()`); one longer than
    /// [`MAX_PARTITION_KEY_BYTES`] is refused.
    pub async fn load(
        tx: &'a mut Transaction<'static, S::Database>,
        events: &'a mut Events,
        meta: &'a EventMeta,
        saga_id: String,
    ) -> Result<Self, HandlerError> {
        if saga_id.len() > MAX_PARTITION_KEY_BYTES {
            // `saga_state`'s primary key could not index it.
            return Err(HandlerError::new(format!(
                "the saga id of this {} message is {} bytes, longer than the {MAX_PARTITION_KEY_BYTES} \
                 bytes `saga_state` can store (txoutbox_core::MAX_PARTITION_KEY_BYTES): correlate \
                 the saga by a shorter id",
                S::NAME,
                saga_id.len()
            )));
        }
        let loaded = S::Database::load(tx, S::NAME, &saga_id).await?;
        let (phase, version, compensations) = match loaded {
            None => (Phase::Absent, 0, Vec::new()),
            Some(Loaded {
                status,
                state,
                version,
                compensations,
            }) => {
                let phase = match status {
                    SagaStatus::Running => {
                        let state: S = serde_json::from_value(state).map_err(|error| {
                            HandlerError::new(format!(
                                "the stored state of saga {} `{saga_id}` does not match its type: {error} \
                                 (the state type changed under running sagas: give new fields \
                                 `#[serde(default)]`, or migrate the rows of `saga_state`)",
                                S::NAME
                            ))
                        })?;
                        Phase::Running(state)
                    }
                    finished => Phase::Finished(finished),
                };
                (phase, version, compensations)
            }
        };
        let status = match &phase {
            Phase::Finished(status) => *status,
            _ => SagaStatus::Running,
        };
        Ok(Self {
            ctx: SagaContext {
                tx,
                events,
                meta,
                saga_type: S::NAME,
                saga_id,
                status,
                version,
                compensations,
                compensations_sent: 0,
                failure: None,
            },
            phase,
            _saga: PhantomData,
        })
    }

    /// For a start message: the context to create the saga in, if no saga
    /// with this id exists yet. `None` for a saga that exists (a second start
    /// message of one saga: ignored).
    pub fn starting(&mut self) -> Option<&mut SagaContext<'a, S::Database>> {
        match self.phase {
            Phase::Absent => Some(&mut self.ctx),
            Phase::Running(_) | Phase::Finished(_) => {
                self.phase = Phase::Ignored("already_started");
                None
            }
            _ => None,
        }
    }

    /// The state a start handler returned.
    pub fn started(&mut self, state: S) {
        self.phase = Phase::Started(state);
    }

    /// For any other message: the running saga's state and the context.
    /// `None` when the saga has finished (the message is ignored, logged and
    /// counted), or when there is no such saga: then the attempt fails and
    /// is retried with the consumer's backoff, as the start message may not
    /// have committed yet, and on the last attempt
    /// ([`EventMeta::is_last_attempt`]) the message is ignored as an
    /// unknown saga (never started, or removed by retention).
    pub fn running(&mut self) -> Option<(&mut S, &mut SagaContext<'a, S::Database>)> {
        let phase = std::mem::replace(&mut self.phase, Phase::Ignored("unknown_saga"));
        self.phase = match phase {
            Phase::Running(state) => Phase::Applied(state),
            Phase::Absent if !self.ctx.meta.is_last_attempt() => Phase::NotYet,
            Phase::Absent => Phase::Ignored("unknown_saga"),
            Phase::Finished(_) => Phase::Ignored("finished"),
            other => other,
        };
        match &mut self.phase {
            Phase::Applied(state) => Some((state, &mut self.ctx)),
            _ => None,
        }
    }

    /// Writes the saga's new state (and status, compensations, version) in
    /// the step's transaction. The consumer then inserts the messages the
    /// handler sent, and commits.
    pub async fn save(self) -> Result<(), HandlerError> {
        let Self { ctx, phase, .. } = self;
        if let Some(failure) = ctx.failure {
            return Err(HandlerError::new(format!(
                "a message of saga {} `{}` cannot be recorded: {failure}",
                ctx.saga_type, ctx.saga_id
            )));
        }
        let message_type = ctx.meta.event_type.as_str();
        let (state, created) = match phase {
            Phase::Started(state) => (state, true),
            Phase::Applied(state) => (state, false),
            Phase::Ignored(reason) => {
                ignored(&ctx, reason);
                return Ok(());
            }
            Phase::Finished(_) => {
                ignored(&ctx, "finished");
                return Ok(());
            }
            Phase::NotYet => {
                let meta = ctx.meta;
                return Err(HandlerError::new(format!(
                    "saga {} `{}` does not exist (yet): its start message may not have committed, \
                     so the `{}` is retried (attempt {} of {}); on the last attempt it is ignored \
                     as unknown_saga",
                    ctx.saga_type, ctx.saga_id, meta.event_type, meta.attempt, meta.max_attempts
                )));
            }
            Phase::Absent | Phase::Running(_) => {
                // The generated code always calls `starting` or `running`.
                ignored(&ctx, "not_handled");
                return Ok(());
            }
        };
        let state = serde_json::to_value(&state).map_err(|error| {
            HandlerError::new(format!(
                "the state of saga {} `{}` cannot be serialized: {error}",
                ctx.saga_type, ctx.saga_id
            ))
        })?;
        let write = store::Write {
            saga_type: ctx.saga_type,
            saga_id: &ctx.saga_id,
            status: ctx.status,
            state,
            compensations: store::records_to_json(&ctx.compensations),
            message_type,
            event_id: ctx.meta.event_id,
        };
        let written = if created {
            S::Database::insert(ctx.tx, &write).await?
        } else {
            S::Database::update(ctx.tx, &write, ctx.version).await?
        };
        if !written {
            // Another step created or changed this saga after we looked (a
            // start raced another start): this attempt rolls back and the
            // consumer retries it against what that step left.
            return Err(HandlerError::new(format!(
                "saga {} `{}` was changed by a concurrent step; the message is retried",
                ctx.saga_type, ctx.saga_id
            )));
        }
        telemetry::stepped(
            ctx.saga_type,
            message_type,
            created,
            ctx.status,
            ctx.compensations_sent,
        );
        Ok(())
    }
}

fn ignored<DB: SagaDatabase>(ctx: &SagaContext<'_, DB>, reason: &'static str) {
    tracing::debug!(
        saga = ctx.saga_type,
        saga_id = %ctx.saga_id,
        event_type = %ctx.meta.event_type,
        event_id = %ctx.meta.event_id,
        reason,
        "saga message ignored"
    );
    telemetry::ignored(ctx.saga_type, &ctx.meta.event_type, reason);
}
