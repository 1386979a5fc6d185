//! Reading an attribute's arguments without stopping at the first mistake.

use proc_macro2::{TokenStream, TokenTree};
use syn::Token;
use syn::meta::ParseNestedMeta;
use syn::parse::{ParseStream, Parser};

use super::Errors;

/// Parses `key = value, key(...), ...` (syn's nested-meta syntax), calling
/// `arg` for each key. An error of `arg` is recorded and its argument skipped
/// up to the next comma, so the following arguments are still checked and a
/// malformed value is not also reported as a missing comma.
pub(crate) fn parse_each(
    tokens: TokenStream,
    errors: &mut Errors,
    mut arg: impl FnMut(&ParseNestedMeta<'_>) -> syn::Result<()>,
) {
    let parser = syn::meta::parser(|meta| {
        if let Err(error) = arg(&meta) {
            errors.push(error);
            skip_to_comma(meta.input);
        }
        Ok(())
    });
    if let Err(error) = parser.parse2(tokens) {
        errors.push(error);
    }
}

/// Consumes tokens up to (not including) the next top-level `,`.
pub(crate) fn skip_to_comma(input: ParseStream<'_>) {
    while !input.is_empty() && !input.peek(Token![,]) {
        if input.parse::<TokenTree>().is_err() {
            break;
        }
    }
}

/// The error for a key given twice, or `Ok` the first time.
pub(crate) fn once(already_set: bool, meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
    if already_set {
        return Err(meta.error("duplicate argument; give it once"));
    }
    Ok(())
}
