//! Sagas: long-running processes across services, whose every step is one
//! consumer transaction.
//!
//! A saga type is a serde struct (its state) with an `impl` block under
//! [`#[saga]`](saga): one async handler per message it reacts to. A handler
//! changes the state and, through its [`SagaContext`], sends commands and
//! events (through the outbox), schedules messages for later (timeouts),
//! registers the compensation of a step that succeeded, and ends the saga as
//! completed or compensated.
//!
//! Register the saga on a consumer with
//! [`ConsumerBuilder::saga`](crate::consumer::ConsumerBuilder::saga). Each
//! incoming message is then one **step**, in one transaction: the message's
//! dedup (or inbox) bookkeeping, loading and locking the saga's row in
//! `saga_state` (`SELECT ... FOR UPDATE`), the handler, the new state and
//! version, and the outgoing messages in `outbox_event`. A redelivered
//! message changes nothing and sends nothing; two messages of one saga
//! handled at once (two partitions, two processes) are applied one after the
//! other, each to the version the other left.
//!
//! ```ignore
//! use txoutbox_runtime::saga::{saga, SagaContext};
//!
//! #[saga(id = Uuid, correlate = order_id, starts_with(OrderCreated), handles(StockReserved, PaymentFailed))]
//! impl OrderFulfilment {
//!     async fn on_created(event: OrderCreated, ctx: &mut SagaContext<'_>) -> Result<Self, Error> {
//!         ctx.send(ReserveStock { .. });
//!         Ok(Self { order_id: event.order_id, stage: Stage::Reserving })
//!     }
//!     async fn on_reserved(&mut self, event: StockReserved, ctx: &mut SagaContext<'_>) -> Result<(), Error> {
//!         ctx.on_compensate(ReleaseStock { .. });
//!         ctx.send(ChargePayment { .. });
//!         Ok(())
//!     }
//!     async fn on_failed(&mut self, _: PaymentFailed, ctx: &mut SagaContext<'_>) -> Result<(), Error> {
//!         ctx.compensate(); // ReleaseStock goes out, the saga ends compensated
//!         Ok(())
//!     }
//! }
//! ```
//!
//! `docs/saga.md` has the model, the guarantees, the compile-time checks and
//! how to operate sagas; [`crate::ops::sagas`] lists and inspects them.

mod context;
#[cfg(feature = "mysql")]
mod mysql;
mod postgres;
mod step;
mod store;
pub mod telemetry;

pub use context::SagaContext;
pub use step::Step;
pub use store::SagaDatabase;
pub use txoutbox_derive::saga;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::consumer::ConsumerBuilder;

impl<DB: SagaDatabase> ConsumerBuilder<DB> {
    /// Registers a saga: one handler per message type it handles (see
    /// [`crate::saga`]). Each message is then one saga step in the
    /// consumer's transaction, in dedup or inbox mode alike. The consumer
    /// also refreshes the saga's gauges (`outbox_sagas_open`,
    /// `outbox_saga_oldest_open_seconds`) every backlog interval. The saga
    /// runs on the consumer's database: a saga of `SagaContext<'_, MySql>`
    /// handlers registers on a consumer of a `MySqlPool` (another is a
    /// compile error).
    ///
    /// ```ignore
    /// Consumer::builder(pool, kafka, "orders").saga::<OrderFulfilment>().build()?;
    /// ```
    pub fn saga<S: Saga<Database = DB>>(self) -> Self {
        let gauges = |pool: crate::consumer::database::Pool| -> futures::future::BoxFuture<'static, sqlx::Result<()>> {
            Box::pin(async move { telemetry::refresh(&pool, &[S::NAME]).await })
        };
        S::register(self.periodic(S::NAME, gauges))
    }
}

/// A saga type. Implemented by [`#[saga]`](saga) on the type's `impl` block;
/// not meant to be implemented by hand.
pub trait Saga: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The saga type's name: `saga_state.saga_type`, metric labels, the CLI.
    const NAME: &'static str;

    /// The database the saga keeps its state in (that of its consumer).
    type Database: SagaDatabase;

    /// Adds one consumer handler per message type the saga handles.
    fn register(consumer: ConsumerBuilder<Self::Database>) -> ConsumerBuilder<Self::Database>;
}

/// Where a saga is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SagaStatus {
    /// Started and not finished: it waits for its next message.
    Running,
    /// Ended by [`SagaContext::complete`].
    Completed,
    /// Ended by [`SagaContext::compensate`]: the compensations of every step
    /// done were sent.
    Compensated,
}

impl SagaStatus {
    /// The `saga_state.status` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Completed => "completed",
            Self::Compensated => "compensated",
        }
    }

    /// Parses a `saga_state.status` value.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "running" => Some(Self::Running),
            "completed" => Some(Self::Completed),
            "compensated" => Some(Self::Compensated),
            _ => None,
        }
    }

    /// Whether the saga has ended (completed or compensated).
    pub fn is_finished(self) -> bool {
        self != Self::Running
    }
}

impl std::fmt::Display for SagaStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
