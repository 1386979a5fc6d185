//! Parsing of the impl block `#[saga]` is placed on: its handlers and their
//! shapes.
//!
//! Purely syntactic, and it never stops at the first mistake: a handler of the
//! wrong shape is reported and left out of the model. Whether the handlers
//! match the attribute's lists is checked in [`super::validate`].

use proc_macro2::Span;
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::parse::ParseStream;
use syn::spanned::Spanned;
use syn::{FnArg, ImplItem, ImplItemFn, ReturnType, Token, Type};

use crate::kernel::Errors;

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
    /// The function's visibility, which its generated `<fn>_handler()` has too.
    pub vis: syn::Visibility,
    pub kind: HandlerKind,
    /// The message parameter's type, if the signature has a usable one.
    pub message: Option<Type>,
    /// Whether it takes `ctx: &mut SagaContext<'_>` after the message.
    pub with_ctx: bool,
    /// The database its context names (`SagaContext<'_, MySql>`), with the
    /// context type's span; `None` for `SagaContext<'_>` (PostgreSQL, the
    /// default) or no context.
    pub ctx_database: Option<(String, Span)>,
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
        let mut ctx_database = None;
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
                    if let Type::Reference(reference) = crate::kernel::types::ungrouped(ctx)
                        && reference.mutability.is_some()
                    {
                        with_ctx = true;
                        ctx_database = crate::kernel::types::database_argument(&reference.elem)
                            .map(|database| (database, ctx.span()));
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
            vis: function.vis.clone(),
            kind,
            message,
            with_ctx,
            ctx_database,
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
