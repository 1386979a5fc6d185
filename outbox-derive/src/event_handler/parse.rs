//! Validation of the function `#[event_handler]` is placed on.

use proc_macro2::TokenStream;
use syn::spanned::Spanned;
use syn::{FnArg, ItemFn, ReturnType, Type};

/// A function that passed every check.
pub(crate) struct HandlerFn {
    pub(crate) function: ItemFn,
    pub(crate) event_type: Type,
    /// The optional parameters after the event, in the user's order.
    pub(crate) extras: Vec<Extra>,
    /// `crate = "path"`: where `txoutbox_runtime` is (default `::txoutbox_runtime`).
    pub(crate) krate: Option<syn::Path>,
}

/// Parses the attribute's arguments: only `crate = "path::to::txoutbox_runtime"`.
fn args(tokens: TokenStream, errors: &mut Errors) -> Option<syn::Path> {
    use syn::parse::Parser;
    let mut krate = None;
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("crate") {
            let value: syn::LitStr = meta.value()?.parse()?;
            match value.parse::<syn::Path>() {
                Ok(path) if krate.is_none() => krate = Some(path),
                Ok(_) => return Err(meta.error("duplicate argument; give it once")),
                Err(_) => {
                    return Err(syn::Error::new(
                        value.span(),
                        "`crate` must be a path to the crate that re-exports `txoutbox_runtime`, e.g. `crate = \"my_app::outbox\"`",
                    ));
                }
            }
            Ok(())
        } else {
            Err(meta.error(
                "#[event_handler] takes only `crate = \"path::to::txoutbox_runtime\"`: the topic and event type come from the event's `DomainEvent` impl",
            ))
        }
    });
    if let Err(error) = parser.parse2(tokens) {
        match &mut errors.0 {
            Some(all) => all.combine(error),
            None => errors.0 = Some(error),
        }
    }
    krate
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

struct Errors(Option<syn::Error>);

impl Errors {
    /// Records an error spanning all of `tokens` (a plain `Span` would cover
    /// only their first token on stable Rust).
    fn push(&mut self, tokens: impl quote::ToTokens, message: impl std::fmt::Display) {
        let error = syn::Error::new_spanned(tokens, message);
        match &mut self.0 {
            Some(all) => all.combine(error),
            None => self.0 = Some(error),
        }
    }
}

fn is_mut_ref(ty: &Type) -> bool {
    matches!(ty, Type::Reference(r) if r.mutability.is_some())
}

fn is_shared_ref(ty: &Type) -> bool {
    matches!(ty, Type::Reference(r) if r.mutability.is_none())
}

impl HandlerFn {
    pub(crate) fn from_item(arguments: TokenStream, function: ItemFn) -> syn::Result<Self> {
        let mut errors = Errors(None);
        let krate = args(arguments, &mut errors);
        let sig = &function.sig;
        if sig.asyncness.is_none() {
            errors.push(
                sig.fn_token,
                format!(
                    "an event handler must be an `async fn`\nhint: write `async fn {}(..)`",
                    sig.ident
                ),
            );
        }
        if let Some(constness) = &sig.constness {
            errors.push(constness, "an event handler cannot be a `const fn`");
        }
        if let Some(unsafety) = &sig.unsafety {
            errors.push(unsafety, "an event handler cannot be `unsafe`");
        }
        if let Some(abi) = &sig.abi {
            errors.push(abi, "an event handler cannot have an `extern` ABI");
        }
        if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
            errors.push(
                &sig.generics,
                "an event handler cannot be generic: it handles exactly one concrete event type",
            );
        }
        if let Some(variadic) = &sig.variadic {
            errors.push(variadic, "an event handler cannot be variadic");
        }
        if let ReturnType::Default = sig.output {
            errors.push(
                syn::Ident::new("_", sig.paren_token.span.close()),
                "an event handler must return `Result<(), E>` where `E: Display`\nhint: add `-> Result<(), sqlx::Error>` (or your error type) and return `Ok(())`",
            );
        }

        let mut types = Vec::new();
        for input in &sig.inputs {
            match input {
                FnArg::Receiver(receiver) => errors.push(
                    receiver,
                    "an event handler is a free function and takes no `self`\nhint: move it out of the `impl` block",
                ),
                FnArg::Typed(typed) => types.push(&*typed.ty),
            }
        }
        let mut event_type = None;
        let mut extras = Vec::new();
        let has_receiver = sig.inputs.iter().any(|i| matches!(i, FnArg::Receiver(_)));
        match types.as_slice() {
            [] | [_] if !has_receiver => errors.push(
                &sig.ident,
                format!("an event handler takes the transaction and the event\n{SHAPE}"),
            ),
            [tx, event, rest @ ..] if rest.len() <= 2 => {
                if !is_mut_ref(tx) {
                    let hint = if is_mut_ref(event) {
                        "the transaction comes first: swap the two parameters"
                    } else {
                        "write `tx: &mut Transaction<'_, Postgres>`"
                    };
                    errors.push(
                        tx,
                        format!("the first parameter must be the transaction, `&mut Transaction<'_, Postgres>`\nhint: {hint}"),
                    );
                }
                match event {
                    Type::Path(_) | Type::Group(_) | Type::Paren(_) => {
                        event_type = Some((*event).clone());
                    }
                    Type::Reference(_) if is_mut_ref(tx) => errors.push(
                        event,
                        "the event is taken by value, not by reference\nhint: write `event: MyEvent`",
                    ),
                    Type::Reference(_) => {}
                    other => errors.push(
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
                        errors.push(
                            extra,
                            "an optional parameter must be `meta: &EventMeta` or `events: &mut Events`\nhint: take it by reference",
                        );
                        continue;
                    };
                    if extras.contains(&kind) {
                        errors.push(
                            extra,
                            "this optional parameter is already taken\nhint: take at most one `&EventMeta` and one `&mut Events`",
                        );
                    }
                    extras.push(kind);
                }
            }
            [_, _, _, _, extra, ..] => errors.push(extra, format!("too many parameters\n{SHAPE}")),
            _ => {}
        }
        match (errors.0, event_type) {
            (Some(error), _) => Err(error),
            (None, Some(event_type)) => Ok(Self {
                extras,
                function,
                event_type,
                krate,
            }),
            (None, None) => Err(syn::Error::new(sig.span(), SHAPE)),
        }
    }
}
