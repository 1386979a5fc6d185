//! `#[outbox_handler]`: [`attr`] reads the attribute, [`validate`] checks the
//! function's signature and finds its transaction and collector, [`expand`]
//! generates the wrapper that runs the unit of work.

mod attr;
mod expand;
mod validate;

use proc_macro2::TokenStream;
use quote::ToTokens;

use crate::kernel::Errors;
use crate::kernel::entry::AttributeMacro;

/// `#[outbox_handler(...)]`, run by [`crate::kernel::entry::attribute`].
pub(crate) struct OutboxHandler;

impl AttributeMacro for OutboxHandler {
    type Args = attr::Args;
    type Item = syn::ItemFn;

    fn goes_on(&self) -> &'static str {
        "#[outbox_handler] applies to an `async fn` (a free function or a method in an `impl` block)"
    }

    fn parse_args(&self, args: TokenStream, errors: &mut Errors) -> attr::Args {
        attr::Args::parse(args, errors)
    }

    fn expand(&self, args: attr::Args, item: syn::ItemFn, errors: &mut Errors) -> TokenStream {
        let handler = validate::handler(item, errors);
        if let Some((_, span)) = args.retries {
            validate::with_retries(&handler, span, errors);
        }
        if errors.is_empty() {
            expand::handler(handler, &args)
        } else {
            // The function as written (markers removed): its body still
            // type-checks, and no error comes from code generated around a
            // signature the macro could not use.
            handler.item.into_token_stream()
        }
    }
}
