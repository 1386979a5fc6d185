//! `#[event_handler]`: an async fn becomes a consumer-side handler value.
//!
//! `parse` checks the function's shape (collecting every mistake with a hint),
//! `expand` generates the unit struct and its `EventHandler` impl.

mod expand;
mod parse;

use proc_macro2::TokenStream;

pub(crate) fn event_handler(args: TokenStream, item: TokenStream) -> TokenStream {
    let function: syn::ItemFn = match syn::parse2(item.clone()) {
        Ok(function) => function,
        Err(error) => {
            let hint = syn::Error::new(
                error.span(),
                "#[event_handler] goes on an async fn: `async fn on_x(tx: &mut Transaction<'_, Postgres>, event: X) -> Result<(), E>`",
            );
            let mut all = error;
            all.combine(hint);
            let errors = all.to_compile_error();
            return quote::quote! { #errors #item };
        }
    };
    match parse::HandlerFn::from_item(args, function.clone()) {
        Ok(handler) => expand::expand(&handler),
        Err(error) => {
            // Keep the function so its body still type-checks and the user sees
            // only the errors that matter.
            let errors = error.to_compile_error();
            quote::quote! { #errors #function }
        }
    }
}
