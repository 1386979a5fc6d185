//! Code generation for `#[saga]`: per handler, a hidden unit struct
//! implementing `EventHandler` (loads the saga, runs the handler, saves), and
//! the `Saga` impl that registers them all with a consumer.
//!
//! Hygiene: every path is absolute (`::core`, `::std`, the `txoutbox_runtime`
//! path, overridable with `crate = "..."`), and the saga type is always named
//! as `<Type>`.

use proc_macro2::TokenStream;
use quote::{format_ident, quote, quote_spanned};
use syn::ext::IdentExt;

use super::ast::HandlerKind;
use super::validate::{Checked, Saga};

/// The impl block as written (minus `#[correlate]`), the handlers and the
/// `Saga` impl.
pub(crate) fn saga(item: &syn::ItemImpl, saga: &Saga<'_>) -> TokenStream {
    let runtime = &saga.runtime;
    let self_ty = saga.self_ty;
    let name = &saga.name;
    let handlers: Vec<_> = saga.handlers.iter().map(|h| handler(saga, h)).collect();
    let accessors = saga.handlers.iter().map(|h| accessor(saga, h));
    let structs = saga.handlers.iter().map(|h| struct_ident(saga, h));
    let database = database(saga);
    quote! {
        #item

        #(#handlers)*

        impl #self_ty {
            #(#accessors)*
        }

        #[automatically_derived]
        impl #runtime::saga::Saga for #self_ty {
            const NAME: &'static str = #name;

            type Database = #database;

            fn register(
                consumer: #runtime::consumer::ConsumerBuilder<#database>,
            ) -> #runtime::consumer::ConsumerBuilder<#database> {
                consumer #(.handler(#structs))*
            }
        }
    }
}

/// The saga's database type, as the runtime re-exports it.
fn database(saga: &Saga<'_>) -> TokenStream {
    let runtime = &saga.runtime;
    if saga.mysql {
        quote!(#runtime::__private::MySql)
    } else {
        quote!(#runtime::__private::Postgres)
    }
}

fn struct_ident(saga: &Saga<'_>, checked: &Checked<'_>) -> syn::Ident {
    format_ident!(
        "__saga_{}_{}",
        saga.ident.unraw(),
        checked.handler.ident.unraw()
    )
}

/// `<fn>_handler()`: the documented handle on the hidden struct (for
/// tests and benchmarks that run one message through a step), with the
/// handler function's visibility.
fn accessor(saga: &Saga<'_>, checked: &Checked<'_>) -> TokenStream {
    let runtime = &saga.runtime;
    let function = &checked.handler.ident;
    let vis = &checked.handler.vis;
    let message = checked.message;
    let struct_ident = struct_ident(saga, checked);
    let database = database(saga);
    let ident = format_ident!("{}_handler", function.unraw(), span = function.span());
    let doc = format!(
        " The consumer handler that `#[saga]` generated for `{function}`: one message \
         through this step of the saga (load and lock the saga's row, run `{function}`, \
         save), as the consumer runs it. For tests: pass it to \
         the runtime's `testing::handle`, or call its `EventHandler::handle`.",
        function = function.unraw(),
    );
    quote! {
        #[doc = #doc]
        #[allow(dead_code)]
        #vis fn #ident() -> impl #runtime::consumer::EventHandler<#database, Event = #message> {
            #struct_ident
        }
    }
}

fn handler(saga: &Saga<'_>, checked: &Checked<'_>) -> TokenStream {
    let runtime = &saga.runtime;
    let private = quote!(#runtime::__private);
    let self_ty = saga.self_ty;
    let id = saga.id;
    let message = checked.message;
    let function = &checked.handler.ident;
    let struct_ident = struct_ident(saga, checked);
    let handler_name = format!("{}::{}", saga.ident.unraw(), function.unraw());

    // The correlation, spanned on the field the user named (in `#[saga(correlate
    // = ..)]` or `#[correlate(..)]`): a message without that field fails with
    // rustc's "no field `order_id` on type `X`" there, and a field of another
    // type with "mismatched types, expected `&Uuid`" there, the `id = Uuid`
    // type being the "expected due to this".
    let field = checked.correlate;
    // The `&` of the type on the id type's span, so that "expected due to
    // this" underlines just `Uuid`.
    let id_ref = quote_spanned!(syn::spanned::Spanned::span(id)=> &#id);
    let value = quote_spanned!(field.span()=> &event.#field);
    let correlation = quote! {
        let __saga_id: #id_ref = #value;
    };

    // Spanned on the handler's return type, so an error type without
    // `Display` is reported there, once (as `#[event_handler]` does).
    let output_span = checked.handler.output_span;
    let call_private = crate::kernel::respan::respanned(private.clone(), output_span);
    let map_err = |call: TokenStream| {
        quote_spanned! {output_span=>
            ::core::result::Result::map_err(#call.await, #call_private::handler_error)?
        }
    };
    let run = match (checked.handler.kind, checked.handler.with_ctx) {
        (HandlerKind::Start, with_ctx) => {
            let (condition, call) = if with_ctx {
                (
                    quote!(let ::core::option::Option::Some(__ctx) = __step.starting()),
                    map_err(quote!(<#self_ty>::#function(event, __ctx))),
                )
            } else {
                (
                    quote!(__step.starting().is_some()),
                    map_err(quote!(<#self_ty>::#function(event))),
                )
            };
            quote! {
                if #condition {
                    let __state: #self_ty = #call;
                    __step.started(__state);
                }
            }
        }
        (HandlerKind::Step, with_ctx) => {
            let (binding, call) = if with_ctx {
                (
                    quote!((__state, __ctx)),
                    map_err(quote!(<#self_ty>::#function(__state, event, __ctx))),
                )
            } else {
                (
                    quote!((__state, _)),
                    map_err(quote!(<#self_ty>::#function(__state, event))),
                )
            };
            quote! {
                if let ::core::option::Option::Some(#binding) = __step.running() {
                    #call;
                }
            }
        }
    };

    crate::consumer_handler::ConsumerHandler {
        runtime,
        // Sagas keep their state (`saga_state`) in their consumer's database.
        database: database(saga),
        attrs: quote!(#[doc(hidden)]),
        vis: TokenStream::new(),
        ident: &struct_ident,
        event: message,
        name: &handler_name,
        before: TokenStream::new(),
        body: quote! {
            #correlation
            let __saga_id = #private::correlation(__saga_id);
            let mut __step =
                #runtime::saga::Step::<#self_ty>::load(tx, events, meta, __saga_id).await?;
            #run
            __step.save().await
        },
    }
    .expand()
}
