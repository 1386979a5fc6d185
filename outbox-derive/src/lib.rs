//! Procedural macros of the outbox framework. Use them through `txoutbox_core`
//! and `txoutbox_runtime` (which re-export them); this crate holds only the
//! thin entry points, the work happens in one module per macro (parse,
//! validate, expand) on a shared kernel (`kernel`: the error context, the
//! entry shape, `crate = ".."`, suggestions, case conversion, respanning).

use proc_macro::TokenStream;

mod consumer_handler;
mod domain_event;
mod event_handler;
mod kernel;
mod outbox_handler;
mod saga;

use kernel::entry;

/// Derives `txoutbox_core::DomainEvent` for a struct with named fields.
///
/// ```
/// use txoutbox_core::DomainEvent;
/// use schemars::JsonSchema;
/// use serde::Serialize;
/// use uuid::Uuid;
///
/// #[derive(DomainEvent, Serialize, JsonSchema)]
/// #[event(topic = "order.events", event_type = "OrderCreated", aggregate = "Order")]
/// pub struct OrderCreated {
///     #[event_id] pub event_id: Uuid,
///     #[partition_key] #[aggregate_id] pub order_id: Uuid,
/// }
///
/// assert_eq!(<OrderCreated as DomainEvent>::TOPIC, "order.events");
/// ```
///
/// Every attribute, its default and the errors it can produce are listed in
/// `docs/attributes.md`.
///
/// (`command` is accepted as a helper attribute only to report it: it belongs
/// to `#[derive(Command)]`.)
#[proc_macro_derive(
    DomainEvent,
    attributes(event, command, event_id, partition_key, aggregate_id)
)]
pub fn derive_domain_event(input: TokenStream) -> TokenStream {
    entry::derive(domain_event::Kind::Event, input.into()).into()
}

/// Derives `txoutbox_core::DomainEvent` for a command: a message addressed to
/// one service, on the topic that service consumes (e.g. `inventory.commands`).
///
/// Declared like an event, with `#[command(...)]` instead of `#[event(...)]`
/// and `command_type` (default: the struct name) instead of `event_type`; the
/// field markers and their defaults are the same. A command is recorded with
/// `Events::record` and dispatched to handlers exactly like an event
/// (`EVENT_TYPE` is the command type); the schema export lists it as a command
/// (`x-kind: command`).
///
/// ```
/// use txoutbox_core::{Command, DomainEvent};
/// use schemars::JsonSchema;
/// use serde::Serialize;
/// use uuid::Uuid;
///
/// #[derive(Command, Serialize, JsonSchema)]
/// #[command(topic = "inventory.commands", aggregate = "Stock")]
/// pub struct ReserveStock {
///     #[event_id] pub command_id: Uuid,
///     #[partition_key] pub sku: String,
///     pub quantity: u32,
/// }
///
/// assert_eq!(<ReserveStock as DomainEvent>::TOPIC, "inventory.commands");
/// assert_eq!(<ReserveStock as DomainEvent>::EVENT_TYPE, "ReserveStock");
/// ```
///
/// (`event` is accepted as a helper attribute only to report it.) The
/// attributes and errors are listed in `docs/attributes.md`.
#[proc_macro_derive(
    Command,
    attributes(command, event, event_id, partition_key, aggregate_id)
)]
pub fn derive_command(input: TokenStream) -> TokenStream {
    entry::derive(domain_event::Kind::Command, input.into()).into()
}

/// Turns an async command handler into a unit of work: one transaction for
/// its writes and the events it records.
///
/// ```no_run
/// use txoutbox_core::{Events, outbox_handler};
/// use sqlx::{PgPool, Postgres, Transaction};
///
/// #[derive(Clone)]
/// pub struct CreateOrder { pub amount: i64 }
///
/// #[outbox_handler(isolation = "serializable", retries = 3)] // both optional
/// pub async fn create_order(
///     tx: &mut Transaction<'_, Postgres>,
///     events: &mut Events,
///     cmd: CreateOrder,
/// ) -> Result<i64, txoutbox_core::Error> {
///     let id = sqlx::query_scalar("SELECT $1::int8")
///         .bind(cmd.amount)
///         .fetch_one(&mut **tx)
///         .await?;
///     Ok(id)
/// }
///
/// # async fn place(pool: PgPool) -> Result<(), txoutbox_core::Error> {
/// let id = create_order(&pool, CreateOrder { amount: 5 }).await?; // begin, run, insert events, commit
/// # Ok(()) }
/// ```
///
/// Generates `create_order(db, cmd)` (runs the unit of work on a `&PgPool`,
/// `PgPool` or `&mut PgConnection`) and `create_order_in_tx(tx, events, cmd)`
/// (the function as written, for tests and composition). The reference,
/// including every compile-time check, is `docs/handler.md`.
#[proc_macro_attribute]
pub fn outbox_handler(args: TokenStream, item: TokenStream) -> TokenStream {
    entry::attribute(outbox_handler::OutboxHandler, args.into(), item.into()).into()
}

/// Turns an async fn into a consumer-side event handler: a unit struct of the
/// same name implementing `txoutbox_runtime::consumer::EventHandler`, to pass to
/// `ConsumerBuilder::handler`. See `docs/consumer.md` and
/// `txoutbox_runtime::consumer`.
///
/// ```
/// use txoutbox_core::DomainEvent;
/// use txoutbox_runtime::consumer::{EventHandler, event_handler};
/// use sqlx::{Postgres, Transaction};
///
/// #[derive(DomainEvent, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
/// #[event(topic = "payment.events", event_type = "PaymentCompleted", aggregate = "Payment")]
/// pub struct PaymentCompleted {
///     #[event_id] pub event_id: uuid::Uuid,
///     #[partition_key] #[aggregate_id] pub order_id: uuid::Uuid,
/// }
///
/// #[event_handler]
/// async fn on_payment_completed(
///     tx: &mut Transaction<'_, Postgres>,
///     event: PaymentCompleted,
/// ) -> Result<(), sqlx::Error> {
///     sqlx::query("UPDATE orders SET paid = true WHERE id = $1")
///         .bind(event.order_id)
///         .execute(&mut **tx)
///         .await?;
///     Ok(())
/// }
///
/// assert_eq!(<on_payment_completed as EventHandler>::NAME, "on_payment_completed");
/// ```
#[proc_macro_attribute]
pub fn event_handler(args: TokenStream, item: TokenStream) -> TokenStream {
    entry::attribute(event_handler::EventHandler, args.into(), item.into()).into()
}

/// Turns the impl block of a saga's state type into a saga: one consumer-side
/// handler per `async fn` (loading the saga's state by the message's
/// correlation field, running the fn, saving the state in the consumer's
/// transaction) and an impl of `txoutbox_runtime::saga::Saga` that registers
/// them. Use it as `txoutbox_runtime::saga::saga`.
///
/// ```ignore
/// #[saga(
///     name = "order_fulfilment",         // optional; default: the type name in snake_case
///     id = Uuid,                         // the saga id's type (`ToString`)
///     correlate = order_id,              // the messages' field holding the saga id
///     starts_with(OrderCreated),         // messages that start a saga
///     handles(PaymentCompleted, PaymentTimedOut), // messages that move it on
/// )]
/// impl OrderFulfilment {
///     // A start handler: no `self`, returns the new state.
///     async fn on_order_created(event: OrderCreated, ctx: &mut SagaContext<'_>) -> Result<Self, MyError> { .. }
///     // A step handler: `&mut self`; `ctx` is optional.
///     async fn on_paid(&mut self, event: PaymentCompleted) -> Result<(), MyError> { .. }
///     // Correlated by another field than the saga's default.
///     #[correlate(saga_id)]
///     async fn on_timeout(&mut self, event: PaymentTimedOut, ctx: &mut SagaContext<'_>) -> Result<(), MyError> { .. }
///     // Non-async fns are left alone.
///     fn total(&self) -> i64 { 0 }
/// }
/// ```
///
/// Every mistake in the attribute and the handlers is reported in one compile
/// (see the section "Compile-time checks" of `docs/saga.md`).
#[proc_macro_attribute]
pub fn saga(args: TokenStream, item: TokenStream) -> TokenStream {
    entry::attribute(saga::Saga, args.into(), item.into()).into()
}
