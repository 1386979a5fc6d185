//! Parsing of the attributes the derive reads: `#[event(...)]` on the struct,
//! the `#[event_id]`, `#[partition_key]`, `#[aggregate_id]` markers on fields,
//! and the parts of `#[serde(...)]` that change a field's serialized name.
//!
//! Parsing is purely syntactic and never stops at the first mistake; semantic
//! checks (required keys, topic syntax, counts) live in [`super::validate`].

use proc_macro2::Span;
use quote::quote;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Attribute, Expr, Lit, LitStr, Meta, Token};

use super::Kind;
use crate::kernel::Errors;
use crate::kernel::case::RenameRule;
use crate::kernel::crate_path::FrameworkCrate;
use crate::kernel::suggest;

/// Field marker attributes, for messages.
const FIELD_MARKERS: &str = "`#[event_id]`, `#[partition_key]` or `#[aggregate_id]`";

/// A key of `#[event(...)]`: `present` is where it was written (even if its
/// value was malformed, so that a bad value does not also count as missing).
pub(crate) struct Key<T> {
    pub present: Option<Span>,
    pub value: Option<T>,
}

impl<T> Default for Key<T> {
    fn default() -> Self {
        Self {
            present: None,
            value: None,
        }
    }
}

/// What the struct-level attributes say.
pub(crate) struct Container<'a> {
    /// Which derive reads them.
    pub kind: Kind,
    /// The first `#[event(...)]` (`#[command(...)]`) attribute, for "missing key" messages.
    pub event_attr: Option<&'a Attribute>,
    pub topic: Key<LitStr>,
    /// `event_type` (`command_type` for a command).
    pub event_type: Key<LitStr>,
    pub aggregate: Key<LitStr>,
    pub krate: Key<syn::Path>,
    /// `#[serde(rename_all = "...")]` (or its `serialize = ...` form).
    pub rename_all: Option<RenameRule>,
    /// `headers("name" = "value", ...)`, every pair of every such key, in order.
    pub headers: Vec<(LitStr, LitStr)>,
    /// Where `#[serde(deny_unknown_fields)]` was written, if it was.
    pub deny_unknown_fields: Option<Span>,
    /// An `#[event]` attribute could not be parsed at all; "missing key"
    /// errors would only repeat that error.
    pub malformed: bool,
    /// Keys suggested for unknown ones ("did you mean `topic`?"): a misspelt
    /// key is not reported as missing too.
    pub misspelt: Vec<&'static str>,
}

impl<'a> Container<'a> {
    pub(crate) fn from_attrs(attrs: &'a [Attribute], kind: Kind, errors: &mut Errors) -> Self {
        let mut container = Container {
            kind,
            event_attr: None,
            topic: Key::default(),
            event_type: Key::default(),
            aggregate: Key::default(),
            krate: Key::default(),
            rename_all: None,
            deny_unknown_fields: None,
            headers: Vec::new(),
            malformed: false,
            misspelt: Vec::new(),
        };
        for attr in attrs {
            if attr.path().is_ident(kind.attr()) {
                container.event_attr.get_or_insert(attr);
                container.parse_event(attr, errors);
            } else if attr.path().is_ident(kind.other().attr()) {
                // The other derive's attribute: say which one this derive reads,
                // and count it as that one so its keys are not also "missing".
                let (this, other) = (kind.attr(), kind.other().attr());
                errors.spanned(
                    attr.path(),
                    format!(
                        "`#[derive({})]` is configured with `#[{this}(...)]`, not `#[{other}(...)]`\n\
                         help: rename the attribute to `#[{this}(...)]`{}, or derive `{}` instead",
                        kind.derive(),
                        kind.rename_hint(),
                        kind.other().derive(),
                    ),
                );
                container.event_attr.get_or_insert(attr);
                container.malformed = true;
            } else if attr.path().is_ident("serde") {
                let serde = serde_container(attr);
                container.rename_all = serde.rename_all.or(container.rename_all);
                container.deny_unknown_fields =
                    serde.deny_unknown_fields.or(container.deny_unknown_fields);
            } else if let Some(marker) = field_marker(attr) {
                errors.spanned(
                    attr,
                    format!(
                        "`#[{marker}]` goes on a field, not on the struct\n\
                         help: put it on the field that holds the value"
                    ),
                );
            }
        }
        container
    }

    fn parse_event(&mut self, attr: &Attribute, errors: &mut Errors) {
        let list = match &attr.meta {
            Meta::List(list) => list,
            other => {
                errors.spanned(
                    other,
                    format!(
                        "expected `#[{}(topic = \"...\", aggregate = \"...\")]`",
                        self.kind.attr()
                    ),
                );
                self.malformed = true;
                return;
            }
        };
        let items = match list.parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated) {
            Ok(items) => items,
            Err(error) => {
                errors.at(
                    error.span(),
                    format!(
                        "{error}\nhelp: write `#[{attr}(key = \"value\", ...)]`, e.g. \
                         `#[{attr}(topic = \"{topic}\", aggregate = \"{aggregate}\")]`",
                        attr = self.kind.attr(),
                        topic = self.kind.example_topic(),
                        aggregate = self.kind.example_aggregate(),
                    ),
                );
                self.malformed = true;
                return;
            }
        };
        for item in items {
            self.parse_key(&item, errors);
        }
    }

    fn parse_key(&mut self, item: &Meta, errors: &mut Errors) {
        let path = item.path();
        let name = path
            .get_ident()
            .map(ToString::to_string)
            .unwrap_or_else(|| quote!(#path).to_string().replace(' ', ""));
        let kind = self.kind;
        match name.as_str() {
            "topic" => set_key(&mut self.topic, item, &name, kind, errors),
            key if key == kind.type_key() => {
                set_key(&mut self.event_type, item, &name, kind, errors);
            }
            "aggregate" => set_key(&mut self.aggregate, item, &name, kind, errors),
            "headers" => self.parse_headers(item, errors),
            "crate" => {
                // The value is a path inside a string (serde's convention), so
                // it goes through a string slot first.
                let mut lit = Key {
                    present: self.krate.present,
                    value: None,
                };
                set_key(&mut lit, item, &name, kind, errors);
                self.krate.present = lit.present;
                if let Some(lit) = lit.value {
                    match FrameworkCrate::Core.parse_path(&lit) {
                        Ok(parsed) => self.krate.value = Some(parsed),
                        Err(error) => errors.push(error),
                    }
                }
            }
            _ => {
                let keys = kind.keys();
                let close = if name == kind.other().type_key() {
                    Some(kind.type_key())
                } else {
                    suggest::closest(&name, keys)
                };
                if let Some(close) = close {
                    self.misspelt.push(close);
                }
                errors.spanned(path, suggest::unknown_key(&name, kind.attr(), keys, close));
            }
        }
    }
}

impl Container<'_> {
    /// `headers("name" = "value", ...)`: string pairs, checked later.
    fn parse_headers(&mut self, item: &Meta, errors: &mut Errors) {
        let help = format!(
            "help: write `#[{}(headers(\"schema-version\" = \"2\", \"team\" = \"billing\"))]`",
            self.kind.attr()
        );
        let Meta::List(list) = item else {
            errors.spanned(
                item,
                format!("`headers` takes a list of `\"name\" = \"value\"` pairs\n{help}"),
            );
            return;
        };
        let pair = |input: syn::parse::ParseStream<'_>| -> syn::Result<(LitStr, LitStr)> {
            let name: LitStr = input.parse()?;
            input.parse::<Token![=]>()?;
            let value: LitStr = input.parse()?;
            Ok((name, value))
        };
        let parser = |input: syn::parse::ParseStream<'_>| {
            Punctuated::<(LitStr, LitStr), Token![,]>::parse_terminated_with(input, pair)
        };
        match syn::parse::Parser::parse2(parser, list.tokens.clone()) {
            Ok(pairs) => self.headers.extend(pairs),
            Err(error) => errors.at(error.span(), format!("{error}\n{help}")),
        }
    }
}

/// Stores the string value of `key = "..."` into `slot`, reporting duplicates
/// and values of the wrong form (`topic`, `topic(...)`, `topic = 5`).
fn set_key(slot: &mut Key<LitStr>, item: &Meta, name: &str, kind: Kind, errors: &mut Errors) {
    let example = kind.example(name);
    if slot.present.is_some() {
        errors.spanned(
            item.path(),
            format!(
                "duplicate `{name}` in `#[{}(...)]`\nhelp: keep only one `{name} = \"...\"`",
                kind.attr()
            ),
        );
        return;
    }
    slot.present = Some(item.path().span());
    let hint = format!("`{name}` expects a string: `{name} = \"{example}\"`");
    match item {
        Meta::NameValue(nv) => match unwrap_groups(&nv.value) {
            Expr::Lit(expr) => match &expr.lit {
                Lit::Str(lit) => slot.value = Some(lit.clone()),
                other => errors.spanned(other, format!("expected a string literal\nhelp: {hint}")),
            },
            other => errors.spanned(other, format!("expected a string literal\nhelp: {hint}")),
        },
        other => errors.spanned(other, format!("expected `{name} = \"...\"`\nhelp: {hint}")),
    }
}

/// `expr` without the invisible groups around it: a `macro_rules!` fragment
/// (`$topic:literal`, `$t:expr`) reaches the derive wrapped in one.
fn unwrap_groups(mut expr: &Expr) -> &Expr {
    while let Expr::Group(group) = expr {
        expr = &group.expr;
    }
    expr
}

/// The name of a field marker attribute (`event_id`, ...), if `attr` is one.
fn field_marker(attr: &Attribute) -> Option<&'static str> {
    ["event_id", "partition_key", "aggregate_id"]
        .into_iter()
        .find(|m| attr.path().is_ident(m))
}

/// What a field's attributes say.
#[derive(Default)]
pub(crate) struct FieldAttrs {
    pub event_id: Option<Span>,
    pub partition_key: Option<Span>,
    pub aggregate_id: Option<Span>,
    /// `#[serde(rename = "...")]` (or `rename(serialize = "...")`).
    pub serde_rename: Option<String>,
    /// A serde attribute that keeps the field out of the payload under its
    /// name: `skip`, `skip_serializing` or `flatten`, with its span.
    pub serde_hidden: Option<(Span, String)>,
}

impl FieldAttrs {
    pub(crate) fn from_attrs(attrs: &[Attribute], kind: Kind, errors: &mut Errors) -> Self {
        let mut field = FieldAttrs::default();
        for attr in attrs {
            if let Some(marker) = field_marker(attr) {
                let slot = match marker {
                    "event_id" => &mut field.event_id,
                    "partition_key" => &mut field.partition_key,
                    _ => &mut field.aggregate_id,
                };
                parse_marker(attr, marker, slot, errors);
            } else if let Some(container) = [kind.attr(), kind.other().attr()]
                .into_iter()
                .find(|name| attr.path().is_ident(name))
            {
                errors.spanned(
                    attr,
                    format!(
                        "`#[{container}(...)]` goes on the struct, not on a field\n\
                         help: on fields use {FIELD_MARKERS}"
                    ),
                );
            } else if attr.path().is_ident("serde") {
                field.parse_serde(attr);
            }
        }
        field
    }

    /// Reads the serde field attributes that matter here and ignores the rest
    /// (including malformed ones: serde itself reports those).
    fn parse_serde(&mut self, attr: &Attribute) {
        let _ = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("rename") {
                if let Some(name) = serialize_name(&meta)? {
                    self.serde_rename = Some(name);
                }
            } else if let Some(key) = ["skip", "skip_serializing", "flatten"]
                .into_iter()
                .find(|k| meta.path.is_ident(k))
            {
                self.serde_hidden = Some((meta.path.span(), key.to_owned()));
            } else {
                skip_value(&meta)?;
            }
            Ok(())
        });
    }
}

/// `#[partition_key]` and friends take no arguments.
/// A malformed marker still marks the field: its intent is clear, and "no
/// `#[partition_key]` field" on top of "takes no arguments" would be noise.
fn parse_marker(attr: &Attribute, marker: &str, slot: &mut Option<Span>, errors: &mut Errors) {
    if slot.is_some() {
        errors.spanned(attr, format!("duplicate `#[{marker}]` on this field"));
        return;
    }
    *slot = Some(attr.path().span());
    match &attr.meta {
        Meta::Path(_) => {}
        Meta::List(list) => errors.at(
            list.delimiter.span().join(),
            format!("`#[{marker}]` takes no arguments\nhelp: write `#[{marker}]`"),
        ),
        Meta::NameValue(nv) => {
            let (eq, value) = (&nv.eq_token, &nv.value);
            errors.spanned(
                quote!(#eq #value),
                format!("`#[{marker}]` takes no value\nhelp: write `#[{marker}]`"),
            );
        }
    }
}

/// The container-level serde attributes that matter here.
#[derive(Default)]
struct SerdeContainer {
    rename_all: Option<RenameRule>,
    deny_unknown_fields: Option<Span>,
}

/// Reads `rename_all` (a rule we understand) and `deny_unknown_fields` from a
/// container's `#[serde(...)]`; the rest, malformed parts included, is
/// serde's to report.
fn serde_container(attr: &Attribute) -> SerdeContainer {
    let mut found = SerdeContainer::default();
    let _ = attr.parse_nested_meta(|meta| {
        if meta.path.is_ident("rename_all") {
            if let Some(name) = serialize_name(&meta)? {
                found.rename_all = RenameRule::from_name(&name);
            }
        } else if meta.path.is_ident("deny_unknown_fields") {
            found.deny_unknown_fields = Some(meta.path.span());
        } else {
            skip_value(&meta)?;
        }
        Ok(())
    });
    found
}

/// The serialize-side value of `key = "..."` or `key(serialize = "...", ...)`.
fn serialize_name(meta: &syn::meta::ParseNestedMeta<'_>) -> syn::Result<Option<String>> {
    if meta.input.peek(Token![=]) {
        return Ok(Some(meta.value()?.parse::<LitStr>()?.value()));
    }
    let mut name = None;
    meta.parse_nested_meta(|inner| {
        if inner.path.is_ident("serialize") {
            name = Some(inner.value()?.parse::<LitStr>()?.value());
        } else {
            skip_value(&inner)?;
        }
        Ok(())
    })?;
    Ok(name)
}

/// Consumes the value of a serde key we do not care about (`= expr` or `(...)`).
fn skip_value(meta: &syn::meta::ParseNestedMeta<'_>) -> syn::Result<()> {
    if meta.input.peek(Token![=]) {
        meta.value()?.parse::<Expr>()?;
    } else if meta.input.peek(syn::token::Paren) {
        meta.input.parse::<proc_macro2::Group>()?;
    }
    Ok(())
}
