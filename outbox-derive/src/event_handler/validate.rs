//! Validation of the function `#[event_handler]` is placed on: its shape,
//! collecting every mistake with a hint.

use syn::spanned::Spanned;
use syn::{FnArg, ItemFn, ReturnType, Type};

use crate::kernel::Errors;

/// A function that passed every check.
pub(crate) struct HandlerFn<'a> {
    pub(crate) function: &'a ItemFn,
    pub(crate) event_type: &'a Type,
    /// The transaction is taken as SeaORM's `&SeaConnection<'_>` (feature
    /// `sea-orm`), not as sqlx's `&mut Transaction<'_, Postgres>`.
    pub(crate) sea_orm: bool,
    /// The transaction is sqlx's `&mut Transaction<'_, MySql>` (feature
    /// `mysql`): the handler is one of a consumer on a `MySqlPool`.
    pub(crate) mysql: bool,
    /// The optional parameters after the event, in the user's order.
    pub(crate) extras: Vec<Extra>,
}

/// An optional parameter after the event, told apart by its reference kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Extra {
    /// `meta: &EventMeta`.
    Meta,
    /// `events: &mut Events`: events recorded here go to the outbox in the
    /// consumer's transaction.
    Events,
}

const SHAPE: &str = "expected `async fn name(tx: &mut Transaction<'_, Postgres>, event: EventType) -> Result<(), E>` \
                     (optionally followed by `meta: &EventMeta` and/or `events: &mut Events`)";

fn is_mut_ref(ty: &Type) -> bool {
    matches!(ty, Type::Reference(r) if r.mutability.is_some())
}

fn is_shared_ref(ty: &Type) -> bool {
    matches!(ty, Type::Reference(r) if r.mutability.is_none())
}

/// The last path segment of the type `ty` refers to, if it is a shared
/// reference to a path type.
fn shared_ref_name(ty: &Type) -> Option<String> {
    let Type::Reference(reference) = ty else {
        return None;
    };
    if reference.mutability.is_some() {
        return None;
    }
    match &*reference.elem {
        Type::Path(path) => path.path.segments.last().map(|s| s.ident.to_string()),
        _ => None,
    }
}

/// Checks a SeaORM transaction parameter; whether it is `&SeaConnection`.
fn sea_orm_tx(tx: &Type, errors: &mut Errors) -> bool {
    match shared_ref_name(tx).as_deref() {
        Some("SeaConnection") => {
            if !cfg!(feature = "sea-orm") {
                errors.spanned(
                    tx,
                    "a handler on `SeaConnection` needs the `sea-orm` feature: turn on `features = [\"sea-orm\"]` of txoutbox-runtime in Cargo.toml",
                );
            }
            true
        }
        Some("DatabaseTransaction") => {
            errors.spanned(
                tx,
                "a consumer handler cannot take SeaORM's `DatabaseTransaction`: the consumer runs the handler in its own transaction (the dedup row or the inbox mark commits with your writes), which SeaORM cannot wrap\nhint: take `tx: &SeaConnection<'_>` (txoutbox_runtime::sea_orm::SeaConnection, feature `sea-orm`): it implements SeaORM's `ConnectionTrait` on that transaction, so entities and active models work on it",
            );
            true
        }
        _ => false,
    }
}

/// Whether `tx` is a MySQL transaction (`&mut Transaction<'_, MySql>` or
/// `&mut MySqlTransaction<'_>`); a `&mut MySqlConnection` is refused with a
/// hint, as the consumer lends its transaction, not a connection.
fn mysql_tx(tx: &Type, errors: &mut Errors) -> bool {
    let Type::Reference(reference) = tx else {
        return false;
    };
    let Type::Path(path) = &*reference.elem else {
        return false;
    };
    let mysql = match path
        .path
        .segments
        .last()
        .map(|s| s.ident.to_string())
        .as_deref()
    {
        Some("MySqlTransaction") => true,
        Some("Transaction") => {
            crate::kernel::types::database_argument(&reference.elem).as_deref() == Some("MySql")
        }
        Some("MySqlConnection") => {
            errors.spanned(
                tx,
                "a consumer handler takes the consumer's transaction, not a connection\nhint: write `tx: &mut Transaction<'_, MySql>`",
            );
            return true;
        }
        _ => false,
    };
    if mysql && !cfg!(feature = "mysql") {
        errors.spanned(
            tx,
            "a handler on a MySQL transaction needs the `mysql` feature: turn on `features = [\"mysql\"]` of txoutbox-runtime in Cargo.toml",
        );
    }
    mysql
}

/// Checks `function`'s signature; the handler if it passed, with every
/// mistake recorded otherwise.
pub(crate) fn handler<'a>(function: &'a ItemFn, errors: &mut Errors) -> Option<HandlerFn<'a>> {
    let sig = &function.sig;
    if sig.asyncness.is_none() {
        errors.spanned(
            sig.fn_token,
            format!(
                "an event handler must be an `async fn`\nhint: write `async fn {}(..)`",
                sig.ident
            ),
        );
    }
    if let Some(constness) = &sig.constness {
        errors.spanned(constness, "an event handler cannot be a `const fn`");
    }
    if let Some(unsafety) = &sig.unsafety {
        errors.spanned(unsafety, "an event handler cannot be `unsafe`");
    }
    if let Some(abi) = &sig.abi {
        errors.spanned(abi, "an event handler cannot have an `extern` ABI");
    }
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        errors.spanned(
            &sig.generics,
            "an event handler cannot be generic: it handles exactly one concrete event type",
        );
    }
    if let Some(variadic) = &sig.variadic {
        errors.spanned(variadic, "an event handler cannot be variadic");
    }
    if let ReturnType::Default = sig.output {
        errors.spanned(
            syn::Ident::new("_", sig.paren_token.span.close()),
            "an event handler must return `Result<(), E>` where `E: Display`\nhint: add `-> Result<(), sqlx::Error>` (or your error type) and return `Ok(())`",
        );
    }

    let mut types = Vec::new();
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(receiver) => errors.spanned(
                receiver,
                "an event handler is a free function and takes no `self`\nhint: move it out of the `impl` block",
            ),
            FnArg::Typed(typed) => types.push(&*typed.ty),
        }
    }
    let mut event_type = None;
    let mut sea_orm = false;
    let mut mysql = false;
    let mut extras = Vec::new();
    let has_receiver = sig.inputs.iter().any(|i| matches!(i, FnArg::Receiver(_)));
    match types.as_slice() {
        [] | [_] if !has_receiver => errors.spanned(
            &sig.ident,
            format!("an event handler takes the transaction and the event\n{SHAPE}"),
        ),
        [tx, event, rest @ ..] if rest.len() <= 2 => {
            sea_orm = sea_orm_tx(tx, errors);
            mysql = mysql_tx(tx, errors);
            if !is_mut_ref(tx) && !sea_orm {
                let hint = if is_mut_ref(event) {
                    "the transaction comes first: swap the two parameters"
                } else {
                    "write `tx: &mut Transaction<'_, Postgres>` (or `tx: &SeaConnection<'_>` for SeaORM, feature `sea-orm`)"
                };
                errors.spanned(
                    tx,
                    format!("the first parameter must be the transaction, `&mut Transaction<'_, Postgres>`\nhint: {hint}"),
                );
            }
            match event {
                Type::Path(_) | Type::Group(_) | Type::Paren(_) => {
                    event_type = Some(*event);
                }
                Type::Reference(_) if is_mut_ref(tx) || sea_orm => errors.spanned(
                    event,
                    "the event is taken by value, not by reference\nhint: write `event: MyEvent`",
                ),
                Type::Reference(_) => {}
                other => errors.spanned(
                    other,
                    "the second parameter must be the event, a type implementing `DomainEvent` and `Deserialize`, taken by value",
                ),
            }
            for extra in rest {
                let kind = if is_shared_ref(extra) {
                    Extra::Meta
                } else if is_mut_ref(extra) {
                    Extra::Events
                } else {
                    errors.spanned(
                        extra,
                        "an optional parameter must be `meta: &EventMeta` or `events: &mut Events`\nhint: take it by reference",
                    );
                    continue;
                };
                if extras.contains(&kind) {
                    errors.spanned(
                        extra,
                        "this optional parameter is already taken\nhint: take at most one `&EventMeta` and one `&mut Events`",
                    );
                }
                extras.push(kind);
            }
        }
        [_, _, _, _, extra, ..] => errors.spanned(extra, format!("too many parameters\n{SHAPE}")),
        _ => {}
    }
    match event_type {
        Some(event_type) if errors.is_empty() => Some(HandlerFn {
            function,
            event_type,
            sea_orm,
            mysql,
            extras,
        }),
        Some(_) => None,
        None => {
            if errors.is_empty() {
                errors.at(sig.span(), SHAPE);
            }
            None
        }
    }
}
