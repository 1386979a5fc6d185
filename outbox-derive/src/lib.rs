//! Procedural macros of the outbox framework. Use them through `outbox_core`
//! (which re-exports them); this crate holds only the thin entry points.

use proc_macro::TokenStream;

mod outbox_handler;

/// Derives `outbox_core::DomainEvent`. See the attribute reference in `docs/attributes.md`.
#[proc_macro_derive(DomainEvent, attributes(event, event_id, partition_key, aggregate_id))]
pub fn derive_domain_event(input: TokenStream) -> TokenStream {
    let _ = input;
    TokenStream::new()
}

/// Turns an async command handler into a unit of work: one transaction for
/// its writes and the events it records (R-DIST-OBX-1).
///
/// ```ignore
/// #[outbox_handler(isolation = "serializable", retries = 3)] // both optional
/// pub async fn create_order(
///     tx: &mut Transaction<'_, Postgres>,
///     events: &mut Events,
///     cmd: CreateOrder,
/// ) -> Result<Order, AppError> { /* ... */ }
///
/// let order = create_order(&pool, cmd).await?; // begin, run, insert events, commit
/// ```
///
/// Generates `create_order(db, cmd)` (runs the unit of work on a `&PgPool`,
/// `PgPool` or `&mut PgConnection`) and `create_order_in_tx(tx, events, cmd)`
/// (the function as written, for tests and composition). The reference,
/// including every compile-time check, is `docs/handler.md`.
#[proc_macro_attribute]
pub fn outbox_handler(args: TokenStream, item: TokenStream) -> TokenStream {
    outbox_handler::expand(args.into(), item.into()).into()
}
