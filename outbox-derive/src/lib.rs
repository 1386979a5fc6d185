//! Procedural macros of the outbox framework. Use them through `outbox_core`
//! (which re-exports them); this crate holds only the thin entry points, the
//! work happens in one module per macro (parse, validate, expand).

use proc_macro::TokenStream;

mod domain_event;
mod event_handler;
mod outbox_handler;

/// Derives `outbox_core::DomainEvent` for a struct with named fields.
///
/// ```ignore
/// #[derive(DomainEvent, Serialize, JsonSchema)]
/// #[event(topic = "order.events", event_type = "OrderCreated", aggregate = "Order")]
/// pub struct OrderCreated {
///     #[event_id] pub event_id: Uuid,
///     #[partition_key] #[aggregate_id] pub order_id: Uuid,
/// }
/// ```
///
/// Every attribute, its default and the errors it can produce are listed in
/// `docs/attributes.md`.
#[proc_macro_derive(DomainEvent, attributes(event, event_id, partition_key, aggregate_id))]
pub fn derive_domain_event(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    domain_event::derive(&input).into()
}

/// Turns an async command handler into a unit of work: one transaction for
/// its writes and the events it records. See `docs/handler.md`.
#[proc_macro_attribute]
pub fn outbox_handler(args: TokenStream, item: TokenStream) -> TokenStream {
    outbox_handler::expand(args.into(), item.into()).into()
}

/// Turns an async fn into a consumer-side event handler. See `docs/consumer.md`
/// and `outbox_runtime::consumer`.
#[proc_macro_attribute]
pub fn event_handler(args: TokenStream, item: TokenStream) -> TokenStream {
    event_handler::event_handler(args.into(), item.into()).into()
}
