//! `#[event_handler]`: an async fn becomes a consumer-side handler value.
//!
//! [`attr`] reads the attribute (only `crate = ".."`), [`validate`] checks the
//! function's shape (collecting every mistake with a hint), [`expand`]
//! generates the unit struct and its `EventHandler` impl.

mod attr;
mod expand;
mod validate;

use proc_macro2::TokenStream;
use quote::ToTokens;

use crate::kernel::Errors;
use crate::kernel::entry::AttributeMacro;

/// `#[event_handler]`, run by [`crate::kernel::entry::attribute`].
pub(crate) struct EventHandler;

impl AttributeMacro for EventHandler {
    type Args = attr::Args;
    type Item = syn::ItemFn;

    fn goes_on(&self) -> &'static str {
        "#[event_handler] goes on an async fn: \
         `async fn on_x(tx: &mut Transaction<'_, Postgres>, event: X) -> Result<(), E>`"
    }

    fn parse_args(&self, args: TokenStream, errors: &mut Errors) -> attr::Args {
        attr::Args::parse(args, errors)
    }

    fn expand(&self, args: attr::Args, item: syn::ItemFn, errors: &mut Errors) -> TokenStream {
        match validate::handler(&item, errors) {
            Some(handler) => expand::handler(&handler, &args),
            // Keep the function so its body still type-checks and the user sees
            // only the errors that matter.
            None => item.into_token_stream(),
        }
    }
}
