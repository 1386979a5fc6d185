//! Running one message through a handler in a test, as the consumer runs
//! it, without Kafka: an [`#[event_handler]`](crate::consumer::event_handler)
//! (its unit struct, named like the function) or one step of a
//! [`#[saga]`](crate::saga::saga) (the handler `<fn>_handler()` returns, for
//! each handler function `<fn>` of the saga's impl block).
//!
//! [`handle`] runs the message in a transaction of its own and commits, as
//! the consumer commits one step; [`handle_in`] runs it in a transaction the
//! test holds open (to commit later, or to race another step against it).
//! Neither does the consumer's dedup or inbox bookkeeping: a message run
//! twice is handled twice. [`meta_of`] is the [`EventMeta`] both pass (the
//! first of the consumer's default number of attempts). To drive a saga
//! step's load, handler and save by hand, see [`Step`](crate::saga::Step).
//!
//! ```no_run
//! use serde::{Deserialize, Serialize};
//! use sqlx::{PgPool, Postgres, Transaction};
//! use txoutbox_runtime::consumer::{HandlerError, event_handler};
//! use txoutbox_runtime::saga::saga;
//! use uuid::Uuid;
//! # #[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema, txoutbox_core::DomainEvent)]
//! # #[event(topic = "orders", aggregate = "Order")]
//! # struct OrderPlaced { event_id: Uuid, #[partition_key] order_id: Uuid }
//!
//! #[event_handler]
//! async fn on_placed(tx: &mut Transaction<'_, Postgres>, event: OrderPlaced) -> Result<(), sqlx::Error> {
//!     sqlx::query("INSERT INTO orders (id) VALUES ($1)")
//!         .bind(event.order_id)
//!         .execute(&mut **tx)
//!         .await?;
//!     Ok(())
//! }
//!
//! #[derive(Serialize, Deserialize)]
//! struct Fulfil {
//!     order_id: Uuid,
//! }
//!
//! #[saga(id = Uuid, correlate = order_id, starts_with(OrderPlaced))]
//! impl Fulfil {
//!     async fn on_placed(event: OrderPlaced) -> Result<Self, HandlerError> {
//!         Ok(Self { order_id: event.order_id })
//!     }
//! }
//!
//! # async fn test(pool: PgPool) -> Result<(), HandlerError> {
//! let placed = OrderPlaced { event_id: Uuid::now_v7(), order_id: Uuid::now_v7() };
//! // The `#[event_handler]`: its unit struct.
//! txoutbox_runtime::testing::handle(&pool, on_placed, placed.clone()).await?;
//! // The saga's start: `saga_state` now has the saga's row.
//! txoutbox_runtime::testing::handle(&pool, Fulfil::on_placed_handler(), placed).await?;
//! # Ok(()) }
//! ```

use sqlx::{PgPool, Postgres, Transaction};
use txoutbox_core::{AfterCommit, DomainEvent, Events};

use crate::consumer::{EventHandler, EventMeta, HandlerError};

/// The [`EventMeta`] the consumer passes with `event` on its first attempt
/// (its event id, event type and topic).
pub fn meta_of<E: DomainEvent>(event: &E) -> EventMeta {
    EventMeta::new(event.event_id(), E::EVENT_TYPE, E::TOPIC)
}

/// Runs `event` through `handler` in a transaction of its own, as the
/// consumer runs one message: begins it at `READ COMMITTED` (as the
/// consumer's own transactions are), calls
/// [`EventHandler::handle`] with [`meta_of`]`(&event)`, inserts the events
/// and commands the handler recorded into `outbox_event`, commits, and wakes
/// the relay. On the handler's error the transaction rolls back and the
/// error is returned; so is a database error of the begin, insert or commit.
///
/// See the [module documentation](self) for an example.
pub async fn handle<H: EventHandler>(
    pool: &PgPool,
    handler: H,
    event: H::Event,
) -> Result<(), HandlerError> {
    let mut tx = crate::txn::begin(pool).await?;
    let after_commit = handle_in(&mut tx, handler, event).await?;
    tx.commit().await?;
    after_commit.committed_on(pool);
    Ok(())
}

/// Runs `event` through `handler` in `tx`, which the caller holds open:
/// calls [`EventHandler::handle`] with [`meta_of`]`(&event)`, then inserts
/// the events and commands the handler recorded into `outbox_event`, in
/// `tx`. Call [`AfterCommit::committed_on`] on the result with the pool
/// once `tx` has committed, to wake the relay. Open `tx` at `READ COMMITTED` to run as
/// the consumer does (`pool.begin_with("BEGIN ISOLATION LEVEL READ
/// COMMITTED")`).
pub async fn handle_in<H: EventHandler>(
    tx: &mut Transaction<'static, Postgres>,
    handler: H,
    event: H::Event,
) -> Result<AfterCommit, HandlerError> {
    let meta = meta_of(&event);
    let mut events = Events::new();
    handler.handle(tx, event, &meta, &mut events).await?;
    events.write(tx).await.map_err(HandlerError::new)
}
