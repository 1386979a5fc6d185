//! `#[derive(DomainEvent)]` and `#[derive(Command)]`: parse ([`ast`], [`attr`])
//! → validate ([`validate`]) → expand ([`expand`]).
//!
//! A command is declared with the same vocabulary as an event (only the
//! attribute is `#[command(...)]` and `event_type` is `command_type`) and gets
//! the same `DomainEvent` impl; [`Kind`] carries the difference through the
//! pipeline: the words of the messages and the registry entry.
//!
//! Errors never stop the pipeline: every stage records what it could not accept
//! in the [`Errors`] context and goes on with what it could, so one compile
//! reports every mistake of the item, and [`expand`] still emits an
//! implementation built from the valid parts so the user's other code does not
//! drown in follow-on errors.

mod ast;
mod attr;
mod expand;
mod validate;

use proc_macro2::TokenStream;

use crate::kernel::Errors;
use crate::kernel::entry::DeriveMacro;

/// Runs the derive of this kind on one item (through
/// [`crate::kernel::entry::derive`]).
impl DeriveMacro for Kind {
    fn expand(&self, input: &syn::DeriveInput, errors: &mut Errors) -> TokenStream {
        let parsed = ast::Input::from_syn(input, *self, errors);
        let event = validate::event(&parsed, errors);
        expand::event(&parsed, &event, errors.is_empty())
    }
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
            Kind::Event => &["topic", "event_type", "aggregate", "headers", "crate"],
            Kind::Command => &["topic", "command_type", "aggregate", "headers", "crate"],
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

#[cfg(test)]
mod tests;
