//! `#[outbox_handler]`: parse the attribute and the function, validate, expand.

mod expand;
mod parse;
mod validate;

use proc_macro2::TokenStream;

pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let _ = args;
    item
}
