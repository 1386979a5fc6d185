//! `#[derive(DomainEvent)]` and `#[derive(Command)]`: parse ([`ast`], [`attr`])
//! → check ([`valid`]) → generate ([`expand`]).
//!
//! A command is declared with the same vocabulary as an event (only the
//! attribute is `#[command(...)]` and `event_type` is `command_type`) and gets
//! the same `DomainEvent` impl; [`Kind`] carries the difference through the
//! pipeline: the words of the messages and the registry entry.
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

pub(crate) use attr::closest;

use proc_macro2::TokenStream;

/// Runs the derive on one item; always returns tokens (the impl, plus
/// `compile_error!`s if something was wrong).
pub(crate) fn derive(input: &syn::DeriveInput, kind: Kind) -> TokenStream {
    let mut errors = Errors::default();
    let parsed = ast::Input::from_syn(input, kind, &mut errors);
    let event = valid::check(&parsed, &mut errors);
    expand::expand(&parsed, &event, errors)
}

/// Which derive runs: they differ only in words and in the registry entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `#[derive(DomainEvent)]`, configured by `#[event(...)]`.
    Event,
    /// `#[derive(Command)]`, configured by `#[command(...)]`.
    Command,
}

impl Kind {
    pub(crate) fn other(self) -> Self {
        match self {
            Kind::Event => Kind::Command,
            Kind::Command => Kind::Event,
        }
    }

    /// The derive's name.
    pub(crate) fn derive(self) -> &'static str {
        match self {
            Kind::Event => "DomainEvent",
            Kind::Command => "Command",
        }
    }

    /// The struct-level attribute.
    pub(crate) fn attr(self) -> &'static str {
        match self {
            Kind::Event => "event",
            Kind::Command => "command",
        }
    }

    pub(crate) fn noun(self) -> &'static str {
        self.attr()
    }

    /// The noun with its article, "an event" / "a command".
    pub(crate) fn a_noun(self) -> &'static str {
        match self {
            Kind::Event => "an event",
            Kind::Command => "a command",
        }
    }

    /// The key naming the message type.
    pub(crate) fn type_key(self) -> &'static str {
        match self {
            Kind::Event => "event_type",
            Kind::Command => "command_type",
        }
    }

    /// Keys accepted in the struct-level attribute, in the order the docs list them.
    pub(crate) fn keys(self) -> &'static [&'static str] {
        match self {
            Kind::Event => &["topic", "event_type", "aggregate", "crate"],
            Kind::Command => &["topic", "command_type", "aggregate", "crate"],
        }
    }

    pub(crate) fn example_topic(self) -> &'static str {
        match self {
            Kind::Event => "order.events",
            Kind::Command => "inventory.commands",
        }
    }

    pub(crate) fn example_aggregate(self) -> &'static str {
        match self {
            Kind::Event => "Order",
            Kind::Command => "Stock",
        }
    }

    /// An example value for a key, for "expects a string" hints.
    pub(crate) fn example(self, key: &str) -> &'static str {
        match key {
            "topic" => self.example_topic(),
            "aggregate" => self.example_aggregate(),
            "crate" => "my_app::outbox",
            _ => match self {
                Kind::Event => "OrderCreated",
                Kind::Command => "ReserveStock",
            },
        }
    }

    /// What else changes when the attribute is renamed to this kind's.
    pub(crate) fn rename_hint(self) -> &'static str {
        match self {
            Kind::Event => " (with `event_type` instead of `command_type`)",
            Kind::Command => " (with `command_type` instead of `event_type`)",
        }
    }
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

    /// The errors so far (for tests that read their messages).
    #[cfg(test)]
    pub(crate) fn clone_inner(&self) -> Option<syn::Error> {
        self.0.clone()
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
        run_as(Kind::Event, input)
    }

    fn run_as(kind: Kind, input: TokenStream) -> (Vec<String>, String) {
        let input: syn::DeriveInput = syn::parse2(input).unwrap();
        let mut errors = Errors::default();
        let parsed = ast::Input::from_syn(&input, kind, &mut errors);
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

    #[test]
    fn a_command_is_a_domain_event_registered_as_a_command() {
        let (errors, expansion) = run_as(
            Kind::Command,
            quote::quote! {
                #[command(topic = "inventory.commands", aggregate = "Stock")]
                struct ReserveStock { event_id: Uuid, #[partition_key] sku: String }
            },
        );
        assert!(errors.is_empty(), "{errors:?}");
        assert!(
            expansion.contains("impl :: txoutbox_core :: DomainEvent for ReserveStock"),
            "{expansion}"
        );
        assert!(
            expansion.contains("const EVENT_TYPE : & 'static str = \"ReserveStock\""),
            "{expansion}"
        );
        assert!(
            expansion.contains("kind : :: txoutbox_core :: schema :: MessageKind :: Command"),
            "{expansion}"
        );

        let (errors, expansion) = run_as(
            Kind::Command,
            quote::quote! {
                #[command(topic = "t", aggregate = "A", command_type = "stock.reserve")]
                struct ReserveStock { event_id: Uuid, #[partition_key] sku: String }
            },
        );
        assert!(errors.is_empty(), "{errors:?}");
        assert!(expansion.contains("const EVENT_TYPE : & 'static str = \"stock.reserve\""));
        let (_, event) = run(quote::quote! {
            #[event(topic = "t", aggregate = "A")]
            struct E { event_id: Uuid, #[partition_key] k: String }
        });
        assert!(event.contains("MessageKind :: Event"), "{event}");
    }

    #[test]
    fn the_other_derives_attribute_is_reported_once_with_a_hint() {
        let (errors, _) = run_as(
            Kind::Command,
            quote::quote! {
                #[event(topic = "inventory.commands", aggregate = "Stock")]
                struct ReserveStock { event_id: Uuid, #[partition_key] sku: String }
            },
        );
        assert_eq!(
            errors,
            ["`#[derive(Command)]` is configured with `#[command(...)]`, not `#[event(...)]`"]
        );
        let (errors, _) = run(quote::quote! {
            #[command(topic = "t", aggregate = "A")]
            struct E { event_id: Uuid, #[partition_key] k: String }
        });
        assert_eq!(
            errors,
            ["`#[derive(DomainEvent)]` is configured with `#[event(...)]`, not `#[command(...)]`"]
        );
    }

    #[test]
    fn command_messages_use_the_command_vocabulary() {
        let (errors, _) = run_as(
            Kind::Command,
            quote::quote! {
                #[command(topic = "t", aggregate = "A", event_type = "X", command_type = "")]
                struct C { event_id: Uuid, #[partition_key] k: String }
            },
        );
        assert_eq!(
            errors,
            [
                "unknown key `event_type` in `#[command(...)]`; valid keys are `topic`, \
                 `command_type`, `aggregate`, `crate`",
                "`command_type` must not be empty",
            ]
        );
        let (errors, _) = run_as(
            Kind::Command,
            quote::quote! { struct C<'a> { event_id: Uuid, #[partition_key] k: &'a str } },
        );
        assert_eq!(
            errors,
            [
                "commands cannot borrow data: `DomainEvent` requires `'static`",
                "missing `#[command(topic = \"...\", aggregate = \"...\")]` on the command struct",
            ]
        );
    }
}
