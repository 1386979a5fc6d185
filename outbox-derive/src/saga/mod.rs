//! `#[saga]` on an impl block: [`attr`] reads the attribute, [`ast`] the
//! impl block and its handlers, [`validate`] checks them against each other,
//! [`expand`] generates one `EventHandler` per handler and the `Saga` impl.
//!
//! As in the other macros, every mistake of the item is reported in one
//! compile. With errors, the output is the impl block as written (without its
//! `#[correlate]` attributes) plus the `compile_error!`s, so the handlers'
//! bodies are still type-checked and uses of the type elsewhere resolve.

mod ast;
mod attr;
mod expand;
mod validate;

use proc_macro2::TokenStream;
use quote::ToTokens;

use crate::kernel::Errors;
use crate::kernel::entry::AttributeMacro;

/// `#[saga(...)]`, run by [`crate::kernel::entry::attribute`].
pub(crate) struct Saga;

impl AttributeMacro for Saga {
    type Args = attr::Args;
    type Item = syn::ItemImpl;

    fn goes_on(&self) -> &'static str {
        "#[saga(...)] goes on the impl block of the saga's state type: \
         `#[saga(id = Uuid, correlate = order_id, starts_with(OrderCreated))] \
         impl OrderFulfilment { ... }`"
    }

    fn parse_args(&self, args: TokenStream, errors: &mut Errors) -> attr::Args {
        attr::Args::parse(args, errors)
    }

    fn expand(&self, args: attr::Args, item: syn::ItemImpl, errors: &mut Errors) -> TokenStream {
        let block = ast::Block::parse(item, errors);
        match validate::saga(&args, &block, errors) {
            Some(saga) if errors.is_empty() => expand::saga(&block.item, &saga),
            _ => block.item.into_token_stream(),
        }
    }
}

#[cfg(test)]
mod tests;
