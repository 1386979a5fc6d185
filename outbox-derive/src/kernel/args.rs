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

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys `parse_each` read a value of, and the first line of each error.
    fn run(tokens: TokenStream) -> (Vec<String>, Vec<String>) {
        let mut errors = Errors::new();
        let mut read = Vec::new();
        parse_each(tokens, &mut errors, |meta| {
            let value: syn::LitInt = meta.value()?.parse()?;
            read.push(format!("{}={value}", meta.path.get_ident().unwrap()));
            Ok(())
        });
        (read, errors.into_first_lines())
    }

    #[test]
    fn a_malformed_value_is_one_error_and_the_next_arguments_are_read() {
        let (read, errors) = run(quote::quote!(a = "3", b = 1, c = x y z, d = 2));
        assert_eq!(read, ["b=1", "d=2"]);
        assert_eq!(
            errors,
            ["expected integer literal", "expected integer literal"]
        );
    }

    #[test]
    fn broken_syntax_is_reported_too() {
        let (read, errors) = run(quote::quote!(a = 1 ; b = 2));
        assert_eq!(read, ["a=1"]);
        assert_eq!(errors, ["expected `,`"]);
    }
}
