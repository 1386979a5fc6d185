//! Checks the handler's signature and finds its transaction and collector
//! parameters. Every mistake is reported, each on its own tokens.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::spanned::Spanned;
use syn::{FnArg, Ident, ItemFn, Pat, Type, TypePath};

use crate::kernel::Errors;

/// What a parameter of the user's function is, in order.
pub(crate) enum Param {
    /// `&self` / `&mut self`.
    Receiver { mutable: bool },
    /// The transaction.
    Transaction(TxKind),
    /// The event collector, `&mut Events`.
    Events,
    /// Anything else: an argument the caller passes through.
    Forwarded { name: Ident, ty: Box<Type> },
}

/// Which transaction a handler takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TxKind {
    /// `&mut Transaction<'_, Postgres>` (`PgTransaction`).
    Sqlx,
    /// `&mut PgConnection`, the transaction's connection.
    Connection,
    /// SeaORM's `&DatabaseTransaction` (feature `sea-orm`).
    SeaOrm,
    /// `&mut Transaction<'_, MySql>` (`MySqlTransaction`, feature `mysql`).
    MySql,
    /// `&mut MySqlConnection` (feature `mysql`).
    MySqlConnection,
}

impl TxKind {
    /// The backend's name, for messages.
    fn backend(self) -> &'static str {
        match self {
            Self::Sqlx | Self::Connection => "PostgreSQL (sqlx)",
            Self::SeaOrm => "SeaORM",
            Self::MySql | Self::MySqlConnection => "MySQL (sqlx)",
        }
    }
}

/// A handler whose signature passed the checks.
pub(crate) struct Handler {
    /// The user's function, minus our `#[tx]` / `#[events]` parameter markers.
    pub item: ItemFn,
    pub params: Vec<Param>,
}

/// Validates `item`, recording every mistake; with mistakes, `Handler::item`
/// (markers removed) can still be emitted as written.
pub(crate) fn handler(mut item: ItemFn, errors: &mut Errors) -> Handler {
    if item.sig.asyncness.is_none() {
        errors.at(
            item.sig.fn_token.span,
            "#[outbox_handler] needs an `async fn`: the handler awaits its database statements inside the transaction; write `async fn`",
        );
    }
    let mut params = Vec::new();
    // The first parameter of each role, for "the first one is here".
    let (mut tx_seen, mut events_seen) = (None::<TokenStream>, None::<TokenStream>);
    for (index, input) in item.sig.inputs.iter_mut().enumerate() {
        match input {
            FnArg::Receiver(receiver) => {
                if receiver.reference.is_none() || receiver.colon_token.is_some() {
                    errors.spanned(
                        &*receiver,
                        "#[outbox_handler] methods take `&self` or `&mut self`: the handler runs inside a unit of work that borrows its receiver (and may run it again on retry), so `self` by value or a typed receiver is not supported",
                    );
                    continue;
                }
                params.push(Param::Receiver {
                    mutable: receiver.mutability.is_some(),
                });
            }
            FnArg::Typed(typed) => {
                let marker = take_marker(&mut typed.attrs);
                let whole = &*typed;
                let role = match marker {
                    Some(Marker::Tx) => Some(Role::Tx(tx_kind(&typed.ty))),
                    Some(Marker::Events) => Some(Role::Events),
                    None => role_by_type(&typed.ty),
                };
                match role {
                    Some(Role::Tx(kind)) => {
                        if let Some(first) = &tx_seen {
                            let first_kind = params.iter().find_map(|p| match p {
                                Param::Transaction(kind) => Some(*kind),
                                _ => None,
                            });
                            match first_kind {
                                Some(first_kind) if first_kind.backend() != kind.backend() => {
                                    errors.push(two_backends(whole, first, kind, first_kind));
                                }
                                _ => {
                                    errors.push(more_than_one(whole, first, "transaction", "#[tx]"))
                                }
                            }
                        }
                        tx_seen.get_or_insert_with(|| whole.to_token_stream());
                        check_tx_type(&typed.ty, kind, errors);
                        params.push(Param::Transaction(kind));
                    }
                    Some(Role::Events) => {
                        if let Some(first) = &events_seen {
                            errors.push(more_than_one(
                                whole,
                                first,
                                "event collector",
                                "#[events]",
                            ));
                        }
                        events_seen.get_or_insert_with(|| whole.to_token_stream());
                        if !is_mut_reference(&typed.ty) {
                            errors.spanned(
                                &typed.ty,
                                "the event collector parameter must be a mutable reference: `events: &mut Events`",
                            );
                        }
                        params.push(Param::Events);
                    }
                    None => {
                        if let Some(producer) = producer_in(&typed.ty) {
                            errors.at(
                                producer.span(),
                                format!(
                                    "a command handler must not get a Kafka producer (`{}`): sending inside a handler is refused: an event sent before the commit is lost or wrong when the transaction rolls back; record it with `events.record(...)` instead, the relay publishes it from the outbox after the commit",
                                    producer.ident
                                ),
                            );
                        }
                        params.push(Param::Forwarded {
                            name: forwarded_name(&typed.pat, index),
                            ty: typed.ty.clone(),
                        });
                    }
                }
            }
        }
    }
    let signature = item.sig.paren_token.span.join();
    if tx_seen.is_none() {
        errors.at(
            signature,
            "#[outbox_handler] needs a transaction parameter: add `tx: &mut Transaction<'_, Postgres>` (sqlx) or `tx: &DatabaseTransaction` (SeaORM, feature `sea-orm`); the handler's statements run on it (mark a parameter of an aliased type with `#[tx]`)",
        );
    }
    if events_seen.is_none() {
        errors.at(
            signature,
            "#[outbox_handler] needs an event collector parameter: add `events: &mut Events` (txoutbox_core::Events) and call `events.record(...)` (mark a parameter of an aliased type with `#[events]`)",
        );
    }
    Handler { item, params }
}

/// Checks that need the attribute's arguments too: `retries` on a
/// `&mut self` method.
pub(crate) fn with_retries(handler: &Handler, retries_span: Span, errors: &mut Errors) {
    let mutable_receiver = handler
        .params
        .iter()
        .any(|param| matches!(param, Param::Receiver { mutable: true }));
    if mutable_receiver {
        errors.at(
            retries_span,
            "`retries` needs a `&self` method: each attempt re-runs the handler, which cannot hold `&mut self` across attempts; take `&self` or drop `retries`",
        );
    }
}

/// The reference a transaction of `kind` is taken by, and whether its
/// backend is compiled in.
fn check_tx_type(ty: &Type, kind: TxKind, errors: &mut Errors) {
    match kind {
        TxKind::SeaOrm => {
            if is_mut_reference(ty) {
                errors.spanned(
                    ty,
                    "SeaORM's transaction is taken by shared reference, as SeaORM's own methods take it: `tx: &DatabaseTransaction`",
                );
            } else if !matches!(ty, Type::Reference(_)) {
                errors.spanned(
                    ty,
                    "the transaction parameter must be a reference: `tx: &DatabaseTransaction`",
                );
            }
            if !cfg!(feature = "sea-orm") {
                errors.spanned(
                    ty,
                    "a handler on SeaORM's `DatabaseTransaction` needs the `sea-orm` feature: turn on `features = [\"sea-orm\"]` of txoutbox-core (or txoutbox-runtime) in Cargo.toml",
                );
            }
        }
        TxKind::MySql | TxKind::MySqlConnection => {
            if !is_mut_reference(ty) {
                errors.spanned(
                    ty,
                    "the transaction parameter must be a mutable reference: `tx: &mut Transaction<'_, MySql>`",
                );
            }
            if !cfg!(feature = "mysql") {
                errors.spanned(
                    ty,
                    "a handler on a MySQL transaction needs the `mysql` feature: turn on `features = [\"mysql\"]` of txoutbox-core (or txoutbox-runtime) in Cargo.toml",
                );
            }
        }
        TxKind::Sqlx | TxKind::Connection => {
            if !is_mut_reference(ty) {
                errors.spanned(
                    ty,
                    "the transaction parameter must be a mutable reference: `tx: &mut Transaction<'_, Postgres>`",
                );
            }
        }
    }
}

enum Marker {
    Tx,
    Events,
}

enum Role {
    Tx(TxKind),
    Events,
}

/// Removes our `#[tx]` / `#[events]` markers (rustc would reject them on the emitted fn).
fn take_marker(attrs: &mut Vec<syn::Attribute>) -> Option<Marker> {
    let mut marker = None;
    attrs.retain(|attr| {
        if attr.path().is_ident("tx") {
            marker = Some(Marker::Tx);
            false
        } else if attr.path().is_ident("events") {
            marker = Some(Marker::Events);
            false
        } else {
            true
        }
    });
    marker
}

fn role_by_type(ty: &Type) -> Option<Role> {
    let Type::Reference(reference) = ty else {
        // `events: Events` by value: recognized, then rejected as not `&mut`.
        return match last_segment(ty)?.as_str() {
            "Events" => Some(Role::Events),
            "Transaction"
            | "PgTransaction"
            | "PgConnection"
            | "DatabaseTransaction"
            | "MySqlTransaction"
            | "MySqlConnection" => Some(Role::Tx(tx_kind(ty))),
            _ => None,
        };
    };
    match last_segment(&reference.elem)?.as_str() {
        "Events" => Some(Role::Events),
        "Transaction"
        | "PgTransaction"
        | "PgConnection"
        | "DatabaseTransaction"
        | "MySqlTransaction"
        | "MySqlConnection" => Some(Role::Tx(tx_kind(ty))),
        _ => None,
    }
}

/// The kind of a transaction parameter: by its type's name, else (an alias
/// marked `#[tx]`) by its reference: shared is SeaORM's, `&mut` sqlx's.
fn tx_kind(ty: &Type) -> TxKind {
    let (inner, shared) = match ty {
        Type::Reference(reference) => (&*reference.elem, reference.mutability.is_none()),
        other => (other, false),
    };
    match last_segment(inner).as_deref() {
        Some("PgConnection") => TxKind::Connection,
        Some("DatabaseTransaction") => TxKind::SeaOrm,
        Some("MySqlConnection") => TxKind::MySqlConnection,
        Some("MySqlTransaction") => TxKind::MySql,
        Some("Transaction")
            if crate::kernel::types::database_argument(inner).as_deref() == Some("MySql") =>
        {
            TxKind::MySql
        }
        Some("Transaction" | "PgTransaction") => TxKind::Sqlx,
        _ if shared => TxKind::SeaOrm,
        _ => TxKind::Sqlx,
    }
}

fn is_mut_reference(ty: &Type) -> bool {
    matches!(ty, Type::Reference(reference) if reference.mutability.is_some())
}

fn last_segment(ty: &Type) -> Option<String> {
    match ty {
        Type::Path(TypePath { path, .. }) => path.segments.last().map(|s| s.ident.to_string()),
        Type::Paren(paren) => last_segment(&paren.elem),
        Type::Group(group) => last_segment(&group.elem),
        _ => None,
    }
}

/// A second transaction of another backend than the first.
fn two_backends(
    param: &syn::PatType,
    first: &TokenStream,
    kind: TxKind,
    first_kind: TxKind,
) -> syn::Error {
    let mut error = syn::Error::new_spanned(
        param,
        format!(
            "a handler runs in one transaction of one database, but this parameter is a {} transaction and the first one a {} transaction; the outbox rows commit with the handler's writes only on the same connection: take one transaction, and write to the other database from another handler",
            kind.backend(),
            first_kind.backend()
        ),
    );
    error.combine(syn::Error::new_spanned(
        first,
        "the first transaction parameter is here",
    ));
    error
}

fn more_than_one(
    param: &syn::PatType,
    first: &TokenStream,
    what: &str,
    marker: &str,
) -> syn::Error {
    let mut error = syn::Error::new_spanned(
        param,
        format!(
            "more than one {what} parameter; a handler gets exactly one (if this one is not meant as the {what}, give it a different type, or mark the intended one with `{marker}`)"
        ),
    );
    error.combine(syn::Error::new_spanned(
        first,
        format!("the first {what} parameter is here"),
    ));
    error
}

/// The first path segment anywhere in `ty` naming a producer (`*Producer`).
fn producer_in(ty: &Type) -> Option<&syn::PathSegment> {
    match ty {
        Type::Path(TypePath { qself, path }) => {
            if let Some(qself) = qself
                && let Some(found) = producer_in(&qself.ty)
            {
                return Some(found);
            }
            producer_in_path(path)
        }
        Type::Reference(reference) => producer_in(&reference.elem),
        Type::Ptr(ptr) => producer_in(&ptr.elem),
        Type::Paren(paren) => producer_in(&paren.elem),
        Type::Group(group) => producer_in(&group.elem),
        Type::Slice(slice) => producer_in(&slice.elem),
        Type::Array(array) => producer_in(&array.elem),
        Type::Tuple(tuple) => tuple.elems.iter().find_map(producer_in),
        Type::ImplTrait(bounds) => bounds.bounds.iter().find_map(producer_in_bound),
        Type::TraitObject(bounds) => bounds.bounds.iter().find_map(producer_in_bound),
        _ => None,
    }
}

fn producer_in_bound(bound: &syn::TypeParamBound) -> Option<&syn::PathSegment> {
    match bound {
        syn::TypeParamBound::Trait(trait_bound) => producer_in_path(&trait_bound.path),
        _ => None,
    }
}

fn producer_in_path(path: &syn::Path) -> Option<&syn::PathSegment> {
    if let Some(last) = path.segments.last()
        && last.ident.to_string().ends_with("Producer")
    {
        return Some(last);
    }
    path.segments
        .iter()
        .find_map(|segment| match &segment.arguments {
            syn::PathArguments::AngleBracketed(args) => {
                args.args.iter().find_map(|arg| match arg {
                    syn::GenericArgument::Type(ty) => producer_in(ty),
                    _ => None,
                })
            }
            _ => None,
        })
}

/// The name the outer function gives a forwarded argument: the user's own when
/// the pattern is a plain binding (`cmd`, `mut cmd`), else a positional one.
fn forwarded_name(pat: &Pat, index: usize) -> Ident {
    match pat {
        Pat::Ident(binding) if binding.subpat.is_none() => {
            Ident::new(&binding.ident.to_string(), binding.ident.span())
        }
        // Generated names are hygienic: they cannot clash with the user's.
        _ => Ident::new(&format!("arg{index}"), Span::mixed_site()),
    }
}
