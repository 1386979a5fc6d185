//! Parsing of `#[saga(...)]` and of the impl block it is placed on.
//!
//! Purely syntactic, and it never stops at the first mistake: a key whose
//! value cannot be read is reported and skipped up to the next comma, a
//! handler of the wrong shape is reported and left out of the model. The
//! checks across the arguments and the handlers live in [`super::validate`].

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{FnArg, ImplItem, ImplItemFn, LitStr, ReturnType, Token, Type};

use crate::domain_event::Errors;

/// Keys accepted in `#[saga(...)]`, in the order the docs list them.
pub(crate) const KEYS: &[&str] = &["name", "id", "correlate", "starts_with", "handles", "crate"];

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
            let mut message = format!(
                "unknown key `{name}` in `#[saga(...)]`; valid keys are {}",
                KEYS.iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            // Also a longer slip with the same start (`correlation`).
            let close = crate::domain_event::closest(&name, KEYS).or_else(|| {
                KEYS.iter()
                    .copied()
                    .find(|k| k.len() >= 6 && name.get(..6) == k.get(..6))
            });
            if let Some(close) = close {
                message.push_str(&format!("\nhelp: did you mean `{close}`?"));
                self.unreadable.push(close);
            }
            errors.spanned(&key, message);
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
                match lit.parse::<syn::Path>() {
                    Ok(path) => self.krate = Some(path),
                    Err(_) => errors.spanned(
                        &lit,
                        "`crate` must be a path to the crate that re-exports `txoutbox_runtime`, \
                         e.g. `crate = \"my_app::outbox\"`",
                    ),
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

fn skip_to_comma(input: ParseStream<'_>) {
    while !input.is_empty() && !input.peek(Token![,]) {
        if input.parse::<TokenTree>().is_err() {
            break;
        }
    }
}

/// How two mentions of a message type are recognized as the same: their tokens.
pub(crate) fn type_key(ty: &Type) -> String {
    ty.to_token_stream().to_string()
}

/// Whether a handler creates the saga or moves a running one on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HandlerKind {
    /// `async fn on_x(event: M, ...) -> Result<Self, E>`, no `self`.
    Start,
    /// `async fn on_x(&mut self, event: M, ...) -> Result<(), E>`.
    Step,
}

pub(crate) const START_SHAPE: &str = "expected a start handler \
    `async fn on_x(event: Message, ctx: &mut SagaContext<'_>) -> Result<Self, E>` \
    (no `self`; `ctx` is optional)";

pub(crate) const STEP_SHAPE: &str = "expected a step handler \
    `async fn on_x(&mut self, event: Message, ctx: &mut SagaContext<'_>) -> Result<(), E>` \
    (`ctx` is optional)";

/// One async fn of the impl block.
pub(crate) struct Handler {
    pub ident: syn::Ident,
    pub kind: HandlerKind,
    /// The message parameter's type, if the signature has a usable one.
    pub message: Option<Type>,
    /// Whether it takes `ctx: &mut SagaContext<'_>` after the message.
    pub with_ctx: bool,
    /// `#[correlate(field)]` on the handler.
    pub correlate: Option<syn::Ident>,
    /// Where errors about the handler's result (e.g. `E` without `Display`) go.
    pub output_span: Span,
}

/// The impl block: its handlers, and the block itself without the
/// `#[correlate]` attributes (which are not real attributes).
pub(crate) struct Block {
    pub item: syn::ItemImpl,
    /// The saga type's name (last segment of the self type).
    pub ident: Option<syn::Ident>,
    pub handlers: Vec<Handler>,
    /// Non-async fns that take a declared message: probably handlers missing
    /// `async` (reported by [`super::validate`] once the lists are known).
    pub sync_fns: Vec<(syn::Ident, Vec<Type>, Span)>,
}

impl Block {
    pub(crate) fn parse(mut item: syn::ItemImpl, errors: &mut Errors) -> Self {
        const WHERE: &str = "`#[saga]` goes on an inherent impl block of the saga's state type: \
                             `impl OrderFulfilment { ... }`";
        if let Some((_, path, _)) = &item.trait_ {
            errors.spanned(
                path,
                format!("`#[saga]` cannot be put on a trait impl\nhelp: {WHERE}"),
            );
        }
        if !item.generics.params.is_empty() || item.generics.where_clause.is_some() {
            errors.spanned(
                &item.generics,
                format!(
                    "a saga's state type cannot be generic: its handlers are registered once, \
                     for one concrete type\nhelp: {WHERE}"
                ),
            );
        }
        let ident = match &*item.self_ty {
            Type::Path(path) if path.qself.is_none() => {
                path.path.segments.last().map(|s| s.ident.clone())
            }
            other => {
                errors.spanned(
                    other,
                    format!("a saga's state type must be a named type\nhelp: {WHERE}"),
                );
                None
            }
        };
        let mut handlers = Vec::new();
        let mut sync_fns = Vec::new();
        for impl_item in &mut item.items {
            let ImplItem::Fn(function) = impl_item else {
                continue;
            };
            let correlate = take_correlate(function, errors);
            if function.sig.asyncness.is_some() {
                handlers.push(Handler::parse(function, correlate, errors));
            } else {
                let params = function
                    .sig
                    .inputs
                    .iter()
                    .filter_map(|input| match input {
                        FnArg::Typed(typed) => Some((*typed.ty).clone()),
                        FnArg::Receiver(_) => None,
                    })
                    .collect();
                if let Some(correlate) = &correlate {
                    errors.spanned(
                        correlate,
                        "`#[correlate(...)]` goes on a saga handler, an `async fn`\n\
                         help: make this function `async`, or remove the attribute",
                    );
                }
                sync_fns.push((
                    function.sig.ident.clone(),
                    params,
                    function.sig.fn_token.span,
                ));
            }
        }
        Self {
            item,
            ident,
            handlers,
            sync_fns,
        }
    }
}

/// Removes the `#[correlate(...)]` attributes from `function`, returning the
/// field the first one names.
fn take_correlate(function: &mut ImplItemFn, errors: &mut Errors) -> Option<syn::Ident> {
    let mut field = None;
    let mut first = true;
    function.attrs.retain(|attr| {
        if !attr.path().is_ident("correlate") {
            return true;
        }
        if !first {
            errors.spanned(
                attr,
                "duplicate `#[correlate(...)]` on this handler\nhelp: keep one",
            );
            return false;
        }
        first = false;
        match attr.parse_args_with(|input: ParseStream<'_>| {
            let ident = input.call(syn::Ident::parse_any)?;
            input.parse::<Option<Token![,]>>()?;
            Ok(ident)
        }) {
            Ok(ident) => field = Some(ident),
            Err(_) => errors.spanned(
                attr,
                "expected `#[correlate(field)]`: the field of this handler's message that holds \
                 the saga id\nhelp: e.g. `#[correlate(saga_id)]`",
            ),
        }
        false
    });
    field
}

impl Handler {
    fn parse(function: &ImplItemFn, correlate: Option<syn::Ident>, errors: &mut Errors) -> Self {
        let sig = &function.sig;
        let receiver = sig.inputs.iter().find_map(|input| match input {
            FnArg::Receiver(receiver) => Some(receiver),
            FnArg::Typed(_) => None,
        });
        let kind = if receiver.is_some() {
            HandlerKind::Step
        } else {
            HandlerKind::Start
        };
        let shape = match kind {
            HandlerKind::Start => START_SHAPE,
            HandlerKind::Step => STEP_SHAPE,
        };
        if let Some(receiver) = receiver {
            let by_mut_ref = receiver.reference.is_some() && receiver.mutability.is_some();
            if !by_mut_ref || receiver.colon_token.is_some() {
                errors.spanned(
                    receiver,
                    format!(
                        "a step handler takes the saga's state as `&mut self`\n\
                         help: write `&mut self` ({STEP_SHAPE}); without `self` it would be a \
                         start handler"
                    ),
                );
            }
        }
        for (present, what) in [
            (sig.constness.as_ref().map(Spanned::span), "`const`"),
            (sig.unsafety.as_ref().map(Spanned::span), "`unsafe`"),
            (sig.abi.as_ref().map(Spanned::span), "an `extern` ABI"),
            (sig.variadic.as_ref().map(Spanned::span), "variadic"),
        ] {
            if let Some(span) = present {
                errors.at(
                    span,
                    format!("a saga handler cannot be {what}\nhelp: {shape}"),
                );
            }
        }
        if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
            errors.spanned(
                &sig.generics,
                format!(
                    "a saga handler cannot be generic: it handles one concrete message type\n\
                     help: {shape}"
                ),
            );
        }

        let typed: Vec<&Type> = sig
            .inputs
            .iter()
            .filter_map(|input| match input {
                FnArg::Typed(typed) => Some(&*typed.ty),
                FnArg::Receiver(_) => None,
            })
            .collect();
        let mut message = None;
        let mut with_ctx = false;
        match typed.as_slice() {
            [] => errors.spanned(
                &sig.ident,
                format!("`{}` takes no message\nhelp: {shape}", sig.ident),
            ),
            [first, rest @ ..] => {
                match first {
                    Type::Path(_) | Type::Group(_) | Type::Paren(_) => {
                        message = Some((*first).clone());
                    }
                    Type::Reference(reference) => {
                        let inner = &reference.elem;
                        let hint = if reference.mutability.is_some() && rest.is_empty() {
                            format!("the message comes first, then `ctx`\nhelp: {shape}")
                        } else {
                            format!(
                                "the message is taken by value\nhelp: write `event: {}`",
                                inner.to_token_stream()
                            )
                        };
                        errors.spanned(first, hint);
                    }
                    other => errors.spanned(
                        other,
                        format!(
                            "the first parameter must be the message, a type implementing \
                             `DomainEvent` and `Deserialize`, taken by value\nhelp: {shape}"
                        ),
                    ),
                }
                if let Some(ctx) = rest.first() {
                    if matches!(ctx, Type::Reference(r) if r.mutability.is_some()) {
                        with_ctx = true;
                    } else {
                        errors.spanned(
                            ctx,
                            format!(
                                "the parameter after the message must be \
                                 `ctx: &mut SagaContext<'_>`\nhelp: {shape}"
                            ),
                        );
                    }
                }
                if let Some(extra) = rest.get(1) {
                    errors.spanned(
                        extra,
                        format!(
                            "too many parameters: a saga handler takes the message and, \
                             optionally, `ctx`\nhelp: {shape}"
                        ),
                    );
                }
            }
        }

        check_output(sig, kind, shape, errors);
        Self {
            ident: sig.ident.clone(),
            kind,
            message,
            with_ctx,
            correlate,
            output_span: sig.output.span(),
        }
    }
}

/// The return type, as far as it can be told from the tokens: a missing one,
/// or a `Result<T, _>` whose `T` does not fit the handler's kind. Anything
/// else (an alias, say) is left to the type checker.
fn check_output(sig: &syn::Signature, kind: HandlerKind, shape: &str, errors: &mut Errors) {
    let ty = match &sig.output {
        ReturnType::Default => {
            errors.at(
                sig.paren_token.span.close(),
                format!("a saga handler returns a `Result`\nhelp: {shape}"),
            );
            return;
        }
        ReturnType::Type(_, ty) => ty,
    };
    let Type::Path(path) = &**ty else { return };
    let Some(last) = path.path.segments.last() else {
        return;
    };
    if last.ident != "Result" {
        return;
    }
    let syn::PathArguments::AngleBracketed(args) = &last.arguments else {
        return;
    };
    let Some(syn::GenericArgument::Type(ok)) = args.args.first() else {
        return;
    };
    let is_unit = matches!(ok, Type::Tuple(tuple) if tuple.elems.is_empty());
    match kind {
        HandlerKind::Step if !is_unit => errors.spanned(
            ok,
            format!(
                "a step handler changes the state through `&mut self` and returns \
                 `Result<(), E>`\nhelp: {STEP_SHAPE}"
            ),
        ),
        HandlerKind::Start if is_unit => errors.spanned(
            ok,
            format!(
                "a start handler (no `self`) returns the new saga's state: `Result<Self, E>`\n\
                 help: {START_SHAPE}; or, to move a running saga on, take `&mut self`"
            ),
        ),
        _ => {}
    }
}

/// `OrderFulfilment` → `order_fulfilment`, the default saga name.
pub(crate) fn snake_case(ident: &syn::Ident) -> String {
    let name = ident.unraw().to_string();
    let mut out = String::with_capacity(name.len() + 4);
    let chars: Vec<char> = name.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        if c.is_uppercase() {
            let prev = i.checked_sub(1).map(|p| chars[p]);
            let next = chars.get(i + 1);
            // A word starts at an upper-case letter after a lower-case one or
            // a digit, or at the last capital of an acronym (`HTTPRetry`).
            let boundary = match prev {
                Some(p) if p.is_lowercase() || p.is_ascii_digit() => true,
                Some(p) if p.is_uppercase() => next.is_some_and(|n| n.is_lowercase()),
                _ => false,
            };
            if boundary && !out.ends_with('_') {
                out.push('_');
            }
            out.extend(c.to_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_names_are_snake_case() {
        let cases = [
            ("OrderFulfilment", "order_fulfilment"),
            ("Saga", "saga"),
            ("HTTPRetry", "http_retry"),
            ("Order2Ship", "order2_ship"),
            ("r#Order", "order"),
            ("Already_Snake", "already_snake"),
        ];
        for (ident, expected) in cases {
            let ident: syn::Ident = syn::parse_str(ident).unwrap();
            assert_eq!(snake_case(&ident), expected);
        }
    }
}
