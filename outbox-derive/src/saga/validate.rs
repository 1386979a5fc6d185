//! Checks across `#[saga(...)]` and the handlers, producing the [`Saga`] model
//! that [`super::expand`] turns into code. Every check records its error and
//! carries on, so one compile reports every mistake.

use std::collections::HashMap;

use proc_macro2::Span;
use quote::ToTokens;
use syn::Type;

use super::ast::{Block, Handler, HandlerKind, START_SHAPE, STEP_SHAPE};
use super::attr::{Args, Declared, EXAMPLE, type_key};
use crate::kernel::Errors;
use crate::kernel::case::snake_case;
use crate::kernel::crate_path::FrameworkCrate;

/// A handler that passed every check, with its correlation field settled.
pub(crate) struct Checked<'a> {
    pub handler: &'a Handler,
    pub message: &'a Type,
    /// The field of the message holding the saga id (the handler's
    /// `#[correlate(..)]`, else the saga's `correlate = ..`), spanned where
    /// it was declared.
    pub correlate: &'a syn::Ident,
}

/// What the expansion needs; only built when there were no errors.
pub(crate) struct Saga<'a> {
    pub self_ty: &'a Type,
    pub ident: &'a syn::Ident,
    pub name: String,
    pub id: &'a Type,
    pub runtime: proc_macro2::TokenStream,
    pub handlers: Vec<Checked<'a>>,
    /// The saga runs on MySQL (its handlers' contexts are
    /// `SagaContext<'_, MySql>`, or `database = MySql`).
    pub mysql: bool,
}

pub(crate) fn saga<'a>(args: &'a Args, block: &'a Block, errors: &mut Errors) -> Option<Saga<'a>> {
    let ident = block.ident.as_ref();
    let name = check_name(args, ident, errors);
    if args.id.is_none() && !args.unreadable.contains(&"id") {
        errors.at(
            Span::call_site(),
            format!(
                "missing `id` in `#[saga(...)]`: the type of the saga id, which the messages' \
                 correlation fields hold\nhelp: add e.g. `id = Uuid`: {EXAMPLE}"
            ),
        );
    }
    if args.starts_with.is_empty() && !args.unreadable.contains(&"starts_with") {
        let example = block
            .handlers
            .iter()
            .find(|h| h.kind == HandlerKind::Start)
            .and_then(|h| h.message.as_ref())
            .map_or_else(
                || "OrderCreated".to_owned(),
                |m| m.to_token_stream().to_string(),
            );
        errors.at(
            Span::call_site(),
            format!(
                "missing `starts_with(...)` in `#[saga(...)]`: a saga needs at least one message \
                 that starts it\nhelp: add `starts_with({example})` and a start handler for it, \
                 {START_SHAPE}"
            ),
        );
    }

    // Each message type declared once, in one list.
    let mut declared: HashMap<&str, (HandlerKind, &Declared)> = HashMap::new();
    for (kind, list) in [
        (HandlerKind::Start, &args.starts_with),
        (HandlerKind::Step, &args.handles),
    ] {
        for message in list {
            match declared.get(message.key.as_str()) {
                Some((first, _)) => errors.spanned(
                    &message.ty,
                    format!(
                        "`{}` is declared twice, the first time in `{}(...)`\nhelp: list each \
                         message once: in `starts_with(...)` if it starts a saga, else in \
                         `handles(...)`",
                        message.key,
                        list_name(*first)
                    ),
                ),
                None => {
                    declared.insert(&message.key, (kind, message));
                }
            }
        }
    }

    let mut by_message: HashMap<String, &Handler> = HashMap::new();
    let mut checked = Vec::new();
    for handler in &block.handlers {
        let Some(message) = &handler.message else {
            continue;
        };
        let key = type_key(message);
        if let Some(first) = by_message.get(&key) {
            errors.spanned(
                message,
                format!(
                    "`{key}` already has a handler, `{}`\nhelp: a saga handles each message type \
                     in one function: merge the two, or remove this one",
                    first.ident
                ),
            );
            continue;
        }
        by_message.insert(key.clone(), handler);
        let mut ok = true;
        match declared.get(key.as_str()) {
            None => {
                ok = false;
                let (list, shape) = match handler.kind {
                    HandlerKind::Start => ("starts_with", "it starts a saga (no `self`)"),
                    HandlerKind::Step => ("handles", "it moves a running saga on (`&mut self`)"),
                };
                errors.spanned(
                    message,
                    format!(
                        "`{key}` is not declared in `#[saga(starts_with(...), handles(...))]`\n\
                         help: add it to `{list}(...)`: {shape}"
                    ),
                );
            }
            Some((kind, _)) if *kind != handler.kind => {
                ok = false;
                let (what, fix) = match handler.kind {
                    HandlerKind::Start => (
                        format!(
                            "`{}` has no `self`, so it starts a saga, but `{key}` is declared in \
                             `handles(...)`",
                            handler.ident
                        ),
                        format!(
                            "take `&mut self` to move a running saga on ({STEP_SHAPE}), or move \
                             `{key}` to `starts_with(...)`"
                        ),
                    ),
                    HandlerKind::Step => (
                        format!(
                            "`{}` takes `self`, so it moves a running saga on, but `{key}` is \
                             declared in `starts_with(...)`",
                            handler.ident
                        ),
                        format!(
                            "remove `&mut self` and return `Result<Self, E>` to start a saga \
                             ({START_SHAPE}), or move `{key}` to `handles(...)`"
                        ),
                    ),
                };
                errors.spanned(&handler.ident, format!("{what}\nhelp: {fix}"));
            }
            Some(_) => {}
        }
        let correlate = handler.correlate.as_ref().or(args.correlate.as_ref());
        if correlate.is_none() && !args.unreadable.contains(&"correlate") {
            ok = false;
            errors.spanned(
                &handler.ident,
                format!(
                    "no correlation field for `{}`: which field of `{key}` holds the saga id?\n\
                     help: add `correlate = field` to `#[saga(...)]` (for every handler), or \
                     `#[correlate(field)]` on this handler",
                    handler.ident
                ),
            );
        }
        if let (true, Some(correlate)) = (ok, correlate) {
            checked.push(Checked {
                handler,
                message,
                correlate,
            });
        }
    }

    // A non-async fn taking a declared message was meant as a handler: say
    // so, and count the message as handled (not also "no handler").
    let mut meant_as_handlers = std::collections::HashSet::new();
    for (fn_ident, params, fn_span) in &block.sync_fns {
        if let Some((key, (kind, _))) = params.iter().find_map(|param| {
            let key = type_key(param);
            declared.get(key.as_str()).map(|found| (key.clone(), found))
        }) {
            errors.at(
                *fn_span,
                format!(
                    "saga handlers are `async fn`s: `{fn_ident}` takes a message of the saga but \
                     is not async\nhelp: write `async fn {fn_ident}(..)`; {}",
                    signature(*kind, &key)
                ),
            );
            meant_as_handlers.insert(key);
        }
    }

    // Declared messages nobody handles.
    for (kind, list) in [
        (HandlerKind::Start, &args.starts_with),
        (HandlerKind::Step, &args.handles),
    ] {
        for message in list {
            if by_message.contains_key(&message.key) || meant_as_handlers.contains(&message.key) {
                continue;
            }
            errors.spanned(
                &message.ty,
                format!(
                    "no handler for `{}`, declared in `{}(...)`\nhelp: add {}; or remove it \
                     from the list",
                    message.key,
                    list_name(kind),
                    signature(kind, &message.key)
                ),
            );
        }
    }

    let (Some(ident), Some(id), Some(name)) = (ident, args.id.as_ref(), name) else {
        return None;
    };
    if !errors.is_empty() {
        return None;
    }
    let mysql = check_database(args, &checked, errors);
    if !errors.is_empty() {
        return None;
    }
    let runtime = FrameworkCrate::Runtime.tokens(args.krate.as_ref());
    Some(Saga {
        self_ty: &block.item.self_ty,
        ident,
        name,
        id,
        runtime,
        handlers: checked,
        mysql,
    })
}

/// Whether the saga runs on MySQL: `database = MySql`, else what the
/// handlers' contexts say (`SagaContext<'_, MySql>`); every handler's
/// context must name the same database, the default `SagaContext<'_>`
/// being PostgreSQL's.
fn check_database(args: &Args, handlers: &[Checked<'_>], errors: &mut Errors) -> bool {
    let declared = args.database.as_ref().map(|ident| ident.to_string());
    let inferred = handlers
        .iter()
        .find_map(|h| h.handler.ctx_database.as_ref())
        .filter(|(database, _)| database == "MySql");
    let mysql = match (&declared, inferred) {
        (Some(database), _) => database == "MySql",
        (None, found) => found.is_some(),
    };
    let (want, other) = if mysql {
        ("MySql", "Postgres")
    } else {
        ("Postgres", "MySql")
    };
    let why = match (&declared, mysql) {
        (Some(_), _) => format!("`database = {want}` in `#[saga(...)]`"),
        (None, true) => "another handler's context is `SagaContext<'_, MySql>`".to_owned(),
        (None, false) => "PostgreSQL is the default".to_owned(),
    };
    for checked in handlers {
        let handler = checked.handler;
        if !handler.with_ctx {
            continue;
        }
        let named = handler.ctx_database.as_ref();
        let says = named.map_or("Postgres", |(database, _)| database.as_str());
        if says == want {
            continue;
        }
        let span = named.map_or_else(|| handler.ident.span(), |(_, span)| *span);
        let hint = if mysql {
            "write `ctx: &mut SagaContext<'_, MySql>`".to_owned()
        } else {
            format!(
                "write `ctx: &mut SagaContext<'_>`, or put the whole saga on {other}: every \
                 handler's context names one database (`database = {other}` in `#[saga(...)]`)"
            )
        };
        errors.at(
            span,
            format!(
                "`{}` takes a context of {says}, but this saga runs on {want} ({why}): a saga \
                 keeps its state in the database of its consumer, one for all its handlers\n\
                 help: {hint}",
                handler.ident
            ),
        );
    }
    if mysql && !cfg!(feature = "mysql") {
        errors.at(
            Span::call_site(),
            "a saga on MySQL needs the `mysql` feature: turn on `features = [\"mysql\"]` of \
             txoutbox-runtime in Cargo.toml",
        );
    }
    mysql
}

/// The expected signature of a handler of `message`.
fn signature(kind: HandlerKind, message: &str) -> String {
    match kind {
        HandlerKind::Start => format!(
            "a start handler `async fn on_x(event: {message}, ctx: &mut SagaContext<'_>) -> \
             Result<Self, E>` (no `self`; `ctx` is optional)"
        ),
        HandlerKind::Step => format!(
            "a step handler `async fn on_x(&mut self, event: {message}, ctx: &mut \
             SagaContext<'_>) -> Result<(), E>` (`ctx` is optional)"
        ),
    }
}

fn list_name(kind: HandlerKind) -> &'static str {
    match kind {
        HandlerKind::Start => "starts_with",
        HandlerKind::Step => "handles",
    }
}

/// The saga's name: `name = "..."`, else the type's name in snake case. It
/// keys the saga's rows and appears in handler names, so it is kept to
/// `[a-z0-9_.-]`.
fn check_name(args: &Args, ident: Option<&syn::Ident>, errors: &mut Errors) -> Option<String> {
    match &args.name {
        Some(lit) => {
            let name = lit.value();
            match name_problem(&name) {
                None => Some(name),
                Some(problem) => {
                    errors.spanned(
                        lit,
                        format!(
                            "{problem}\nhelp: a saga name uses lower-case ASCII letters, digits, \
                             `_`, `.` and `-`, e.g. `name = \"order_fulfilment\"`"
                        ),
                    );
                    None
                }
            }
        }
        None => {
            let ident = ident?;
            let name = snake_case(ident);
            match name_problem(&name) {
                None => Some(name),
                Some(problem) => {
                    errors.spanned(
                        ident,
                        format!(
                            "the default saga name `{name}` (the type's name in snake case) is \
                             not usable: {problem}\nhelp: give one with `name = \"...\"`, using \
                             lower-case ASCII letters, digits, `_`, `.` and `-`"
                        ),
                    );
                    None
                }
            }
        }
    }
}

/// The longest saga name: MySQL's `saga_state.saga_type` is
/// `VARBINARY(255)`.
const MAX_NAME_LEN: usize = 255;

pub(crate) fn name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("the saga name must not be empty".to_owned());
    }
    if name.len() > MAX_NAME_LEN {
        return Some(format!(
            "the saga name \"{name}\" is {} characters long, more than the {MAX_NAME_LEN} \
             `saga_state.saga_type` holds",
            name.len()
        ));
    }
    let (position, bad) = name.chars().enumerate().find(|(_, c)| {
        !(c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '.' | '-'))
    })?;
    Some(format!(
        "invalid character {bad:?} at position {} of saga name \"{name}\"",
        position + 1
    ))
}
