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

#[cfg(test)]
mod tests {
    use super::*;

    /// The messages (first line) of every error the derive reports for `input`,
    /// and the expansion.
    fn run(input: TokenStream) -> (Vec<String>, String) {
        let input: syn::DeriveInput = syn::parse2(input).unwrap();
        let mut errors = Errors::default();
        let parsed = ast::Input::from_syn(&input, &mut errors);
        let event = valid::check(&parsed, &mut errors);
        let messages = errors
            .0
            .iter()
            .flat_map(|e| e.clone().into_iter())
            .map(|e| e.to_string().lines().next().unwrap().to_owned())
            .collect();
        let expansion = expand::expand(&parsed, &event, Errors::default()).to_string();
        (messages, expansion)
    }

    #[test]
    fn valid_event_has_no_errors_and_registers() {
        let (errors, expansion) = run(quote::quote! {
            #[event(topic = "t", aggregate = "A")]
            struct E { event_id: Uuid, #[partition_key] k: String }
        });
        assert!(errors.is_empty(), "{errors:?}");
        assert!(
            expansion.contains("const TOPIC : & 'static str = \"t\""),
            "{expansion}"
        );
        assert!(
            expansion.contains("const EVENT_TYPE : & 'static str = \"E\""),
            "{expansion}"
        );
        assert!(expansion.contains("inventory :: submit !"), "{expansion}");
    }

    #[test]
    fn reports_every_mistake_of_an_item() {
        let (errors, _) = run(quote::quote! {
            #[event(topic = "a b", event_type = "", aggregate = "")]
            #[event(topic = "again", colour = "red")]
            struct E {
                #[event_id] #[event_id] id: Uuid,
                #[event_id] other: Uuid,
                #[aggregate_id] a: u8,
                #[aggregate_id] b: u8,
                #[partition_key = 1] c: u8,
            }
        });
        let expected = [
            "duplicate `topic` in `#[event(...)]`",
            "unknown key `colour` in `#[event(...)]`; valid keys are `topic`, `event_type`, `aggregate`, `crate`",
            "duplicate `#[event_id]` on this field",
            "`#[partition_key]` takes no value",
            "invalid character ' ' at position 2 of topic \"a b\"",
            "`event_type` must not be empty",
            "`aggregate` must not be empty",
            "more than one `#[event_id]` field (the first is `id`)",
            "more than one `#[aggregate_id]` field (the first is `a`)",
        ];
        assert_eq!(errors, expected);
    }

    #[test]
    fn a_misspelt_key_is_neither_missing_nor_a_duplicate() {
        let (errors, _) = run(quote::quote! {
            #[event(topc = "t", topic = "t", aggregat = "A")]
            struct E { event_id: Uuid, #[partition_key] k: String }
        });
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0].starts_with("unknown key `topc`"));
        assert!(errors[1].starts_with("unknown key `aggregat`"));
    }

    #[test]
    fn serde_names_decide_the_key_field_and_the_event_id_clash() {
        let (errors, expansion) = run(quote::quote! {
            #[serde(rename_all = "SCREAMING-KEBAB-CASE")]
            #[event(topic = "t", aggregate = "A")]
            struct E {
                #[event_id] id: Uuid,
                #[serde(skip)] event_id: u8,
                #[partition_key] order_id: String,
            }
        });
        assert!(errors.is_empty(), "{errors:?}");
        assert!(expansion.contains("PARTITION_KEY_FIELD : & 'static str = \"ORDER-ID\""));

        let (errors, _) = run(quote::quote! {
            #[event(topic = "t", aggregate = "A")]
            struct E {
                #[event_id] id: Uuid,
                #[serde(rename = "event_id")] legacy: u8,
                #[partition_key] k: String,
            }
        });
        assert_eq!(errors.len(), 1);
        assert!(errors[0].starts_with("this field is serialized as `event_id`"));
    }

    #[test]
    fn generic_items_get_no_placeholder_impl() {
        let (errors, expansion) = run(quote::quote! {
            #[event(topic = "t", aggregate = "A")]
            struct E<T> { event_id: Uuid, #[partition_key] k: T }
        });
        assert_eq!(errors.len(), 1);
        assert!(expansion.is_empty(), "{expansion}");
    }
}
