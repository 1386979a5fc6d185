//! The error context of one macro invocation.

use proc_macro2::{Span, TokenStream};

/// Collects the errors of one macro invocation, so that one compile reports
/// every mistake of the item rather than the first.
///
/// Every stage records what it could not accept and goes on with what it
/// could. The context must end in [`Errors::into_compile_errors`] (the entry
/// in [`super::entry`] does that); dropped unconsumed it panics, as
/// serde_derive's `Ctxt` does, so a code path that loses its errors fails
/// every test that takes it instead of accepting a mistake silently.
pub(crate) struct Errors {
    /// `None` once consumed.
    errors: Option<Vec<syn::Error>>,
}

impl Errors {
    pub(crate) fn new() -> Self {
        Self {
            errors: Some(Vec::new()),
        }
    }

    /// Records an error spanned on all of `tokens` (a plain `Span` covers only
    /// the first token of several on stable Rust).
    pub(crate) fn spanned(
        &mut self,
        tokens: impl quote::ToTokens,
        message: impl std::fmt::Display,
    ) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    /// Records an error at `span`.
    pub(crate) fn at(&mut self, span: Span, message: impl std::fmt::Display) {
        self.push(syn::Error::new(span, message));
    }

    /// Records an already built error (from a `syn` parser, or one combining
    /// several spans).
    pub(crate) fn push(&mut self, error: syn::Error) {
        self.live().push(error);
    }

    /// Whether nothing has been recorded so far.
    pub(crate) fn is_empty(&self) -> bool {
        self.errors.as_ref().is_none_or(Vec::is_empty)
    }

    /// Consumes the context: one `compile_error!` per recorded message (none
    /// if there was no mistake).
    pub(crate) fn into_compile_errors(mut self) -> TokenStream {
        self.take()
            .into_iter()
            .map(|error| error.to_compile_error())
            .collect()
    }

    /// Consumes the context: the first line of every recorded message, in
    /// order (for tests that read them).
    #[cfg(test)]
    pub(crate) fn into_first_lines(mut self) -> Vec<String> {
        self.take()
            .into_iter()
            .flat_map(IntoIterator::into_iter)
            .map(|error| error.to_string().lines().next().unwrap_or("").to_owned())
            .collect()
    }

    fn take(&mut self) -> Vec<syn::Error> {
        self.errors.take().expect("`Errors` consumed twice")
    }

    fn live(&mut self) -> &mut Vec<syn::Error> {
        self.errors
            .as_mut()
            .expect("`Errors` used after being consumed")
    }
}

impl Drop for Errors {
    fn drop(&mut self) {
        // Not while unwinding: a panic of its own would abort and hide the first.
        if self.errors.is_some() && !std::thread::panicking() {
            panic!("`Errors` dropped without `into_compile_errors`: its errors would be lost");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_every_error_in_order() {
        let mut errors = Errors::new();
        assert!(errors.is_empty());
        errors.at(Span::call_site(), "first\nhelp: more");
        errors.spanned(quote::quote!(a b), "second");
        assert!(!errors.is_empty());
        assert_eq!(errors.into_first_lines(), ["first", "second"]);
    }

    #[test]
    fn no_errors_expand_to_nothing() {
        assert!(Errors::new().into_compile_errors().is_empty());
    }

    #[test]
    #[should_panic(expected = "dropped without `into_compile_errors`")]
    fn dropping_it_unchecked_panics() {
        let mut errors = Errors::new();
        errors.at(Span::call_site(), "lost");
    }
}
