//! Validation of the function `#[event_handler]` is placed on.

use proc_macro2::TokenStream;
use syn::spanned::Spanned;
use syn::{FnArg, ItemFn, ReturnType, Type};

/// A function that passed every check.
pub(crate) struct HandlerFn {
    pub(crate) function: ItemFn,
    pub(crate) event_type: Type,
    pub(crate) takes_meta: bool,
}

const SHAPE: &str = "expected `async fn name(tx: &mut Transaction<'_, Postgres>, event: EventType) -> Result<(), E>` \
                     (optionally a third parameter `meta: &EventMeta`)";

struct Errors(Option<syn::Error>);

impl Errors {
    fn push(&mut self, span: proc_macro2::Span, message: impl std::fmt::Display) {
        let error = syn::Error::new(span, message);
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
    pub(crate) fn from_item(args: TokenStream, function: ItemFn) -> syn::Result<Self> {
        let mut errors = Errors(None);
        if !args.is_empty() {
            errors.push(
                args.span(),
                "#[event_handler] takes no arguments: the topic and event type come from the event's `DomainEvent` impl",
            );
        }
        let sig = &function.sig;
        if sig.asyncness.is_none() {
            errors.push(
                sig.fn_token.span,
                format!(
                    "an event handler must be an `async fn`\nhint: write `async fn {}(..)`",
                    sig.ident
                ),
            );
        }
        if let Some(constness) = &sig.constness {
            errors.push(constness.span, "an event handler cannot be a `const fn`");
        }
        if let Some(unsafety) = &sig.unsafety {
            errors.push(unsafety.span, "an event handler cannot be `unsafe`");
        }
        if let Some(abi) = &sig.abi {
            errors.push(abi.span(), "an event handler cannot have an `extern` ABI");
        }
        if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
            errors.push(
                sig.generics.span(),
                "an event handler cannot be generic: it handles exactly one concrete event type",
            );
        }
        if let Some(variadic) = &sig.variadic {
            errors.push(variadic.span(), "an event handler cannot be variadic");
        }
        if let ReturnType::Default = sig.output {
            errors.push(
                sig.paren_token.span.close(),
                "an event handler must return `Result<(), E>` where `E: Display`\nhint: add `-> Result<(), sqlx::Error>` (or your error type) and return `Ok(())`",
            );
        }

        let mut types = Vec::new();
        for input in &sig.inputs {
            match input {
                FnArg::Receiver(receiver) => errors.push(
                    receiver.span(),
                    "an event handler is a free function and takes no `self`\nhint: move it out of the `impl` block",
                ),
                FnArg::Typed(typed) => types.push(&*typed.ty),
            }
        }
        let mut event_type = None;
        let has_receiver = sig.inputs.iter().any(|i| matches!(i, FnArg::Receiver(_)));
        match types.as_slice() {
            [] | [_] if !has_receiver => errors.push(
                sig.inputs
                    .span()
                    .join(sig.paren_token.span.join())
                    .unwrap_or(sig.ident.span()),
                format!("an event handler takes the transaction and the event\n{SHAPE}"),
            ),
            [tx, event, rest @ ..] if rest.len() <= 1 => {
                if !is_mut_ref(tx) {
                    let hint = if is_mut_ref(event) {
                        "the transaction comes first: swap the two parameters"
                    } else {
                        "write `tx: &mut Transaction<'_, Postgres>`"
                    };
                    errors.push(
                        tx.span(),
                        format!("the first parameter must be the transaction, `&mut Transaction<'_, Postgres>`\nhint: {hint}"),
                    );
                }
                match event {
                    Type::Path(_) | Type::Group(_) | Type::Paren(_) => {
                        event_type = Some((*event).clone());
                    }
                    Type::Reference(_) if is_mut_ref(tx) => errors.push(
                        event.span(),
                        "the event is taken by value, not by reference\nhint: write `event: MyEvent`",
                    ),
                    Type::Reference(_) => {}
                    other => errors.push(
                        other.span(),
                        "the second parameter must be the event, a type implementing `DomainEvent` and `Deserialize`, taken by value",
                    ),
                }
                if let [meta] = rest
                    && !is_shared_ref(meta)
                {
                    errors.push(
                        meta.span(),
                        "the optional third parameter must be `&EventMeta`\nhint: write `meta: &outbox_runtime::consumer::EventMeta`",
                    );
                }
            }
            [_, _, _, extra, ..] => {
                errors.push(extra.span(), format!("too many parameters\n{SHAPE}"))
            }
            _ => {}
        }
        match (errors.0, event_type) {
            (Some(error), _) => Err(error),
            (None, Some(event_type)) => Ok(Self {
                takes_meta: types.len() == 3,
                function,
                event_type,
            }),
            (None, None) => Err(syn::Error::new(sig.span(), SHAPE)),
        }
    }
}
