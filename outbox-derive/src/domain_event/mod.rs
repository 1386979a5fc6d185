//! `#[derive(DomainEvent)]`: parse ([`ast`], [`attr`]) → check ([`valid`]) →
//! generate ([`expand`]).
//!
//! Errors never stop the pipeline: every stage records what it could not accept
//! in [`Errors`] and goes on with what it could, so one compile reports every
//! mistake of the item, and [`expand`] still emits an implementation built from
//! the valid parts so the user's other code does not drown in follow-on errors.

mod ast;
mod attr;
mod case;
mod expand;
mod valid;

use proc_macro2::TokenStream;

/// Runs the derive on one item; always returns tokens (the impl, plus
/// `compile_error!`s if something was wrong).
pub(crate) fn derive(input: &syn::DeriveInput) -> TokenStream {
    let mut errors = Errors::default();
    let parsed = ast::Input::from_syn(input, &mut errors);
    let event = valid::check(&parsed, &mut errors);
    expand::expand(&parsed, &event, errors)
}

/// Accumulates the errors of one item.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    /// Records an error spanned on `tokens` (all of them, e.g. a whole attribute).
    pub(crate) fn spanned(
        &mut self,
        tokens: impl quote::ToTokens,
        message: impl std::fmt::Display,
    ) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    /// Records an error at `span`.
    pub(crate) fn at(&mut self, span: proc_macro2::Span, message: impl std::fmt::Display) {
        self.push(syn::Error::new(span, message));
    }

    /// Records an already built error (e.g. from a `syn` parser).
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(error),
            None => self.0 = Some(error),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    pub(crate) fn into_compile_errors(self) -> TokenStream {
        self.0.map(|e| e.to_compile_error()).unwrap_or_default()
    }
}
