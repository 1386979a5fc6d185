//! The one shape of every macro of the crate: parse, validate, expand, with
//! the errors of all three in one [`Errors`], and the user's item never lost.
//!
//! A macro says what it parses and how it expands ([`AttributeMacro`],
//! [`DeriveMacro`]); the functions here run it. The output is the macro's
//! tokens followed by one `compile_error!` per mistake. With mistakes, an
//! attribute macro's tokens are the item as the user wrote it (minus the
//! macro's helper attributes), never generated code around it: the item's
//! body still type-checks, so its own mistakes are reported in the same
//! build, and its uses elsewhere still resolve, so there is no follow-on
//! "no method named ..." or "cannot find ...". A derive never consumes its
//! item in the first place.

use proc_macro2::TokenStream;
use quote::quote;

use super::Errors;

/// An attribute macro: `#[name(args)] item`.
pub(crate) trait AttributeMacro {
    /// What the attribute's arguments are read into.
    type Args;
    /// The item the attribute goes on.
    type Item: syn::parse::Parse;

    /// Where the attribute goes, reported with the parse error when the item
    /// is something else.
    fn goes_on(&self) -> &'static str;

    /// Reads the arguments, recording their mistakes.
    fn parse_args(&self, args: TokenStream, errors: &mut Errors) -> Self::Args;

    /// Validates and expands. When `errors` holds anything on return, the
    /// result must be the item as written (without helper attributes rustc
    /// would reject), not generated code.
    fn expand(&self, args: Self::Args, item: Self::Item, errors: &mut Errors) -> TokenStream;
}

/// A derive macro: `#[derive(Name)] item`.
pub(crate) trait DeriveMacro {
    /// Validates and expands, recording every mistake; with mistakes the
    /// result is whatever still helps the rest of the user's code compile
    /// (e.g. a placeholder impl), or nothing.
    fn expand(&self, input: &syn::DeriveInput, errors: &mut Errors) -> TokenStream;
}

/// Runs an attribute macro. The arguments are read even when the item is
/// not of the right kind, so that both kinds of mistake show in one build.
pub(crate) fn attribute<M: AttributeMacro>(
    attribute: M,
    args: TokenStream,
    item: TokenStream,
) -> TokenStream {
    let mut errors = Errors::new();
    let args = attribute.parse_args(args, &mut errors);
    let output = match syn::parse2::<M::Item>(item.clone()) {
        Ok(parsed) => attribute.expand(args, parsed, &mut errors),
        Err(error) => {
            // syn's own words first ("expected `fn`"), then where it goes.
            let span = error.span();
            errors.push(error);
            errors.at(span, attribute.goes_on());
            item
        }
    };
    let errors = errors.into_compile_errors();
    quote!(#output #errors)
}

/// Runs a derive macro.
pub(crate) fn derive<M: DeriveMacro>(derive: M, input: TokenStream) -> TokenStream {
    let input = match syn::parse2::<syn::DeriveInput>(input) {
        Ok(input) => input,
        // rustc only passes structs, enums and unions: this is unreachable in
        // practice, and there is no item to keep.
        Err(error) => return error.to_compile_error(),
    };
    let mut errors = Errors::new();
    let output = derive.expand(&input, &mut errors);
    let errors = errors.into_compile_errors();
    quote!(#output #errors)
}
