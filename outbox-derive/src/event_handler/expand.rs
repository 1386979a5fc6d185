//! Code generation for `#[event_handler]`.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;

use super::parse::{Extra, HandlerFn};

pub(crate) fn expand(handler: &HandlerFn) -> TokenStream {
    let mut function = handler.function.clone();
    let name = function.sig.ident.clone();
    let vis = std::mem::replace(&mut function.vis, syn::Visibility::Inherited);
    let docs: Vec<_> = function
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("doc"))
        .cloned()
        .collect();
    let event = &handler.event_type;
    let name_str = name.to_string();
    let extra_args = handler.extras.iter().map(|extra| match extra {
        Extra::Meta => quote!(meta),
        Extra::Events => quote!(events),
    });
    let output_span = function.sig.output.span();
    let runtime = match &handler.krate {
        Some(path) => quote!(#path),
        None => quote!(::txoutbox_runtime),
    };
    let private = quote!(#runtime::consumer::__private);
    // Spanned on the return type, so an error type without `Display` is
    // reported there, once.
    let call_private = crate::respanned(private.clone(), output_span);
    let call = quote_spanned! {output_span=>
        ::core::result::Result::map_err(
            #name(tx, event #(, #extra_args)*).await,
            #call_private::handler_error,
        )
    };
    quote! {
        #(#docs)*
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, Default)]
        #vis struct #name;

        #private::inventory::submit! {
            #runtime::consumer::HandlerDescriptor::__new(
                <#event as #runtime::__private_core::DomainEvent>::TOPIC,
                <#event as #runtime::__private_core::DomainEvent>::EVENT_TYPE,
                #name_str,
            )
        }

        #[automatically_derived]
        impl #runtime::consumer::EventHandler for #name {
            type Event = #event;
            const NAME: &'static str = #name_str;

            fn handle<'__outbox>(
                &'__outbox self,
                tx: &'__outbox mut #private::Transaction<'static, #private::Postgres>,
                event: #event,
                meta: &'__outbox #runtime::consumer::EventMeta,
                events: &'__outbox mut #private::Events,
            ) -> #private::BoxFuture<
                '__outbox,
                ::core::result::Result<(), #runtime::consumer::HandlerError>,
            > {
                // The user's function, shadowing the struct's value name in here.
                #function
                let _ = (&meta, &events);
                ::std::boxed::Box::pin(async move { #call })
            }
        }
    }
}
