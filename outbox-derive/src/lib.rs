//! Procedural macros of the outbox framework. Use them through `outbox_core`
//! (which re-exports them); this crate holds only the thin entry points.

use proc_macro::TokenStream;

mod event_handler;

/// Derives `outbox_core::DomainEvent`. See the attribute reference in `docs/attributes.md`.
#[proc_macro_derive(DomainEvent, attributes(event, event_id, partition_key, aggregate_id))]
pub fn derive_domain_event(input: TokenStream) -> TokenStream {
    let _ = input;
    TokenStream::new()
}

/// Turns an async fn into a consumer-side event handler. See `docs/consumer.md`
/// and `outbox_runtime::consumer`.
#[proc_macro_attribute]
pub fn event_handler(args: TokenStream, item: TokenStream) -> TokenStream {
    event_handler::event_handler(args.into(), item.into()).into()
}
