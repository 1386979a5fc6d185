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
/// its writes and the events it records. See `docs/handler.md`.
#[proc_macro_attribute]
pub fn outbox_handler(args: TokenStream, item: TokenStream) -> TokenStream {
    outbox_handler::expand(args.into(), item.into()).into()
}
