//! Code generation for `#[event_handler]`.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;

use super::attr::Args;
use super::validate::{Extra, HandlerFn};
use crate::kernel::crate_path::FrameworkCrate;
use crate::kernel::respan::respanned;

/// The unit struct named like the function, its registration and its
/// `EventHandler` impl, which holds the function.
pub(crate) fn handler(handler: &HandlerFn<'_>, args: &Args) -> TokenStream {
    let mut function = handler.function.clone();
    let name = function.sig.ident.clone();
    let vis = std::mem::replace(&mut function.vis, syn::Visibility::Inherited);
    let docs: Vec<_> = function
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("doc"))
        .cloned()
        .collect();
    let event = handler.event_type;
    let name_str = name.to_string();
    let extra_args = handler.extras.iter().map(|extra| match extra {
        Extra::Meta => quote!(meta),
        Extra::Events => quote!(events),
    });
    let output_span = function.sig.output.span();
    let runtime = FrameworkCrate::Runtime.tokens(args.krate.as_ref());
    let private = quote!(#runtime::__private);
    // Spanned on the return type, so an error type without `Display` is
    // reported there, once.
    let call_private = respanned(private.clone(), output_span);
    let call = if handler.sea_orm {
        // SeaORM's view of the consumer's transaction, for this one call.
        quote_spanned! {output_span=>
            {
                let tx = #private::SeaConnection::new(&mut **tx);
                ::core::result::Result::map_err(
                    #name(&tx, event #(, #extra_args)*).await,
                    #call_private::handler_error,
                )
            }
        }
    } else {
        quote_spanned! {output_span=>
            ::core::result::Result::map_err(
                #name(tx, event #(, #extra_args)*).await,
                #call_private::handler_error,
            )
        }
    };
    let database = if handler.mysql {
        quote!(#private::MySql)
    } else {
        quote!(#private::Postgres)
    };
    crate::consumer_handler::ConsumerHandler {
        runtime: &runtime,
        database,
        attrs: quote!(#(#docs)*),
        vis: quote!(#vis),
        ident: &name,
        event,
        name: &name_str,
        // The user's function, shadowing the struct's value name in `handle`.
        before: quote! {
            #function
            let _ = (&meta, &events);
        },
        body: call,
    }
    .expand()
}
