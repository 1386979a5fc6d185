//! `#[outbox_handler]`: parse the attribute and the function, validate, expand.

mod expand;
mod parse;
mod validate;

use proc_macro2::TokenStream;
use quote::ToTokens;

pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let (args, mut errors) = parse::args(args);
    let item: syn::ItemFn = match syn::parse2(item) {
        Ok(item) => item,
        Err(error) => {
            let mut error = syn::Error::new(
                error.span(),
                "#[outbox_handler] applies to an `async fn` (a free function or a method in an `impl` block)",
            );
            errors.drain(..).for_each(|e| error.combine(e));
            return error.to_compile_error();
        }
    };
    let handler = match validate::handler(item) {
        Ok(handler) => handler,
        Err((item, handler_errors)) => {
            return with_errors(
                item.into_token_stream(),
                errors.into_iter().chain(handler_errors),
            );
        }
    };
    if let Some((_, span)) = args.retries {
        errors.extend(validate::with_retries(&handler, span));
    }
    if !errors.is_empty() {
        return with_errors(handler.item.into_token_stream(), errors);
    }
    expand::handler(handler, &args)
}

/// The user's function as written plus every error: its body still type-checks,
/// and callers are not buried under follow-on errors about a missing function.
fn with_errors(item: TokenStream, errors: impl IntoIterator<Item = syn::Error>) -> TokenStream {
    let errors = errors.into_iter().map(|error| error.to_compile_error());
    quote::quote!(#item #(#errors)*)
}
