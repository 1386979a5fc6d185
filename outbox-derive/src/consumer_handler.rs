//! What `#[event_handler]` and `#[saga]` both generate for one consumer-side
//! handler: a unit struct, its registration in the linked-handler registry (`topics::Registered`), and
//! its `EventHandler` impl. Each macro supplies only the struct's attributes
//! and the body of `handle`.

use proc_macro2::TokenStream;
use quote::quote;

/// One consumer handler to generate.
pub(crate) struct ConsumerHandler<'a> {
    /// Where `txoutbox_runtime` is (`::txoutbox_runtime` or `crate = ".."`).
    pub runtime: &'a TokenStream,
    /// The database of the handler's transaction (`__private::Postgres` or
    /// `__private::MySql`).
    pub database: TokenStream,
    /// Attributes of the unit struct (docs, `#[doc(hidden)]`).
    pub attrs: TokenStream,
    /// Visibility of the unit struct.
    pub vis: TokenStream,
    pub ident: &'a syn::Ident,
    /// The event type it handles.
    pub event: &'a syn::Type,
    /// `EventHandler::NAME`.
    pub name: &'a str,
    /// The statements of `handle` before the returned future; they see
    /// `tx`, `event`, `meta` and `events`.
    pub before: TokenStream,
    /// The future's body, evaluating to `Result<(), HandlerError>`.
    pub body: TokenStream,
}

impl ConsumerHandler<'_> {
    pub(crate) fn expand(&self) -> TokenStream {
        let Self {
            runtime,
            database,
            attrs,
            vis,
            ident,
            event,
            name,
            before,
            body,
        } = self;
        let private = quote!(#runtime::__private);
        quote! {
            #attrs
            #[allow(non_camel_case_types)]
            #[derive(Debug, Clone, Copy, Default)]
            #vis struct #ident;

            #private::inventory::submit! {
                #private::handler_descriptor(
                    <#event as #private::DomainEvent>::TOPIC,
                    <#event as #private::DomainEvent>::EVENT_TYPE,
                    #name,
                )
            }

            #[automatically_derived]
            impl #runtime::consumer::EventHandler<#database> for #ident {
                type Event = #event;
                const NAME: &'static str = #name;

                fn handle<'__outbox>(
                    &'__outbox self,
                    tx: &'__outbox mut #private::Transaction<'static, #database>,
                    event: #event,
                    meta: &'__outbox #runtime::consumer::EventMeta,
                    events: &'__outbox mut #private::Events,
                ) -> #private::BoxFuture<
                    '__outbox,
                    ::core::result::Result<(), #runtime::consumer::HandlerError>,
                > {
                    #before
                    ::std::boxed::Box::pin(async move { #body })
                }
            }
        }
    }
}
