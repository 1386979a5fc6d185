//! Parsing of the attribute, `#[saga(...)]`.
//!
//! Purely syntactic, and it never stops at the first mistake: a key whose
//! value cannot be read is reported and skipped up to the next comma. The
//! checks across the arguments and the handlers live in [`super::validate`].

use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::{LitStr, Token, Type};

use crate::kernel::Errors;
use crate::kernel::args::skip_to_comma;
use crate::kernel::crate_path::FrameworkCrate;
use crate::kernel::suggest;

/// Keys accepted in `#[saga(...)]`, in the order the docs list them.
pub(crate) const KEYS: &[&str] = &[
    "name",
    "id",
    "correlate",
    "starts_with",
    "handles",
    "database",
    "crate",
];

/// Example of a complete attribute, for hints.
pub(crate) const EXAMPLE: &str = "#[saga(id = Uuid, correlate = order_id, \
                                  starts_with(OrderCreated), handles(PaymentCompleted))]";

/// A message type listed in `starts_with(...)` or `handles(...)`.
pub(crate) struct Declared {
    pub ty: Type,
    /// The type as tokens, what handlers are matched by.
    pub key: String,
}

/// What `#[saga(...)]` says.
#[derive(Default)]
pub(crate) struct Args {
    pub name: Option<LitStr>,
    pub id: Option<Type>,
    /// The default correlation field; its span is what correlation errors point at.
    pub correlate: Option<syn::Ident>,
    pub starts_with: Vec<Declared>,
    pub handles: Vec<Declared>,
    /// `database = Postgres | MySql`: where the saga keeps its state (else
    /// read from its handlers' contexts).
    pub database: Option<syn::Ident>,
    /// `crate = "..."`: the path of `txoutbox_runtime` in generated code.
    pub krate: Option<syn::Path>,
    /// Keys written with an unreadable value, or suggested for a misspelt
    /// key: not also reported as missing.
    pub unreadable: Vec<&'static str>,
}

impl Args {
    pub(crate) fn parse(tokens: TokenStream, errors: &mut Errors) -> Self {
        let mut args = Args::default();
        let parser = |input: ParseStream<'_>| {
            args.parse_all(input, errors);
            Ok(())
        };
        // `parse_all` consumes everything and reports its own errors.
        let _ = parser.parse2(tokens);
        args
    }

    fn parse_all(&mut self, input: ParseStream<'_>, errors: &mut Errors) {
        while !input.is_empty() {
            if let Err(error) = self.parse_key(input, errors) {
                errors.push(error);
                skip_to_comma(input);
            }
            if input.is_empty() {
                break;
            }
            match input.parse::<Token![,]>() {
                Ok(_) => {}
                Err(_) => {
                    errors.at(
                        input.span(),
                        format!("expected `,` between the keys of `#[saga(...)]`\nhelp: {EXAMPLE}"),
                    );
                    skip_to_comma(input);
                    let _ = input.parse::<Option<Token![,]>>();
                }
            }
        }
    }

    fn parse_key(&mut self, input: ParseStream<'_>, errors: &mut Errors) -> syn::Result<()> {
        let key = input.call(syn::Ident::parse_any).map_err(|error| {
            syn::Error::new(
                error.span(),
                format!("expected a key of `#[saga(...)]`\nhelp: {EXAMPLE}"),
            )
        })?;
        let name = key.to_string();
        let Some(known) = KEYS.iter().copied().find(|k| *k == name) else {
            // Also a longer slip with the same start (`correlation`).
            let close = suggest::closest(&name, KEYS).or_else(|| {
                KEYS.iter()
                    .copied()
                    .find(|k| k.len() >= 6 && name.get(..6) == k.get(..6))
            });
            if let Some(close) = close {
                self.unreadable.push(close);
            }
            errors.spanned(&key, suggest::unknown_key(&name, "saga", KEYS, close));
            skip_to_comma(input);
            return Ok(());
        };
        if self.is_set(known) {
            errors.spanned(
                &key,
                format!("duplicate `{known}` in `#[saga(...)]`\nhelp: give it once"),
            );
            skip_to_comma(input);
            return Ok(());
        }
        // Until its value has been read.
        self.unreadable.push(known);
        match known {
            "name" => self.name = Some(string_value(input, known, "\"order_fulfilment\"")?),
            "crate" => {
                let lit = string_value(input, known, "\"my_app::outbox\"")?;
                match FrameworkCrate::Runtime.parse_path(&lit) {
                    Ok(path) => self.krate = Some(path),
                    Err(error) => errors.push(error),
                }
            }
            "id" => {
                equals(input, known, "Uuid")?;
                self.id = Some(input.parse::<Type>().map_err(|error| {
                    syn::Error::new(
                        error.span(),
                        "expected the saga id's type, e.g. `id = Uuid`\n\
                         help: any type that implements `ToString` (e.g. `Display`) and that the \
                         correlation fields of the messages hold",
                    )
                })?);
            }
            "database" => {
                equals(input, known, "MySql")?;
                let database = input.call(syn::Ident::parse_any).map_err(|error| {
                    syn::Error::new(
                        error.span(),
                        "expected the saga's database, `Postgres` or `MySql`",
                    )
                })?;
                if database == "Postgres" || database == "MySql" {
                    self.database = Some(database);
                } else {
                    errors.spanned(
                        &database,
                        format!(
                            "unknown database `{database}`\nhelp: write `database = Postgres` \
                             (the default) or `database = MySql`"
                        ),
                    );
                }
            }
            "correlate" => {
                equals(input, known, "order_id")?;
                self.correlate = Some(input.call(syn::Ident::parse_any).map_err(|error| {
                    syn::Error::new(
                        error.span(),
                        "expected the name of a field of the messages, e.g. `correlate = order_id`",
                    )
                })?);
            }
            _ => {
                let content;
                syn::parenthesized!(content in input);
                let list = Punctuated::<Type, Token![,]>::parse_terminated(&content)?;
                let declared = list.into_iter().map(|ty| Declared {
                    key: type_key(&ty),
                    ty,
                });
                if known == "starts_with" {
                    self.starts_with.extend(declared);
                } else {
                    self.handles.extend(declared);
                }
            }
        }
        self.unreadable.pop();
        Ok(())
    }

    fn is_set(&self, key: &str) -> bool {
        match key {
            "name" => self.name.is_some(),
            "id" => self.id.is_some(),
            "correlate" => self.correlate.is_some(),
            "database" => self.database.is_some(),
            "crate" => self.krate.is_some(),
            // The lists may be split: `handles(A), handles(B)` is `handles(A, B)`.
            _ => false,
        }
    }
}

/// `= "..."`, with a hint naming the key.
fn string_value(input: ParseStream<'_>, key: &str, example: &str) -> syn::Result<LitStr> {
    equals(input, key, example)?;
    input.parse::<LitStr>().map_err(|error| {
        syn::Error::new(
            error.span(),
            format!("expected a string literal\nhelp: write `{key} = {example}`"),
        )
    })
}

fn equals(input: ParseStream<'_>, key: &str, example: &str) -> syn::Result<()> {
    input.parse::<Token![=]>().map(drop).map_err(|error| {
        syn::Error::new(
            error.span(),
            format!("expected `{key} = ...`\nhelp: write `{key} = {example}`"),
        )
    })
}

/// How two mentions of a message type are recognized as the same: their tokens.
pub(crate) fn type_key(ty: &Type) -> String {
    ty.to_token_stream().to_string()
}
