//! `#[saga]` on an impl block: [`parse`] reads the attribute and the handlers,
//! [`validate`] checks them against each other, [`expand`] generates one
//! `EventHandler` per handler and the `Saga` impl.
//!
//! As in the other macros, every mistake of the item is reported in one
//! compile. With errors, the output is the `compile_error!`s plus the impl
//! block as written (without its `#[correlate]` attributes), so the handlers'
//! bodies are still type-checked and uses of the type elsewhere resolve.

mod expand;
mod parse;
mod validate;

use proc_macro2::TokenStream;

use crate::domain_event::Errors;

pub(crate) fn saga(args: TokenStream, item: TokenStream) -> TokenStream {
    let item: syn::ItemImpl = match syn::parse2(item.clone()) {
        Ok(item) => item,
        Err(error) => {
            let hint = syn::Error::new(
                error.span(),
                "#[saga(...)] goes on the impl block of the saga's state type: \
                 `#[saga(id = Uuid, correlate = order_id, starts_with(OrderCreated))] \
                 impl OrderFulfilment { ... }`",
            );
            let mut all = error;
            all.combine(hint);
            let errors = all.to_compile_error();
            return quote::quote! { #errors #item };
        }
    };
    let mut errors = Errors::default();
    let args = parse::Args::parse(args, &mut errors);
    let block = parse::Block::parse(item, &mut errors);
    match validate::check(&args, &block, &mut errors) {
        Some(saga) if errors.is_empty() => expand::expand(&block.item, &saga),
        _ => {
            let errors = errors.into_compile_errors();
            let item = &block.item;
            quote::quote! { #errors #item }
        }
    }
}

#[cfg(test)]
mod tests;
