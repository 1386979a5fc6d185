use proc_macro2::TokenStream;
use quote::quote;

use super::*;

/// The first line of every error `#[saga(args)]` reports on `item`, and the
/// expansion if there were none.
fn run(args: TokenStream, item: TokenStream) -> (Vec<String>, String) {
    let mut errors = Errors::new();
    let args = attr::Args::parse(args, &mut errors);
    let block = ast::Block::parse(syn::parse2(item).unwrap(), &mut errors);
    let saga = validate::saga(&args, &block, &mut errors);
    let expansion = match saga {
        Some(saga) if errors.is_empty() => expand::saga(&block.item, &saga).to_string(),
        _ => String::new(),
    };
    (errors.into_first_lines(), expansion)
}

fn valid_args() -> TokenStream {
    quote!(
        id = Uuid,
        correlate = order_id,
        starts_with(OrderCreated),
        handles(Paid, TimedOut)
    )
}

fn valid_impl() -> TokenStream {
    quote! {
        impl OrderFulfilment {
            async fn on_created(event: OrderCreated, ctx: &mut SagaContext<'_>) -> Result<Self, E> { todo!() }
            async fn on_paid(&mut self, event: Paid) -> Result<(), E> { Ok(()) }
            #[correlate(saga_id)]
            async fn on_timeout(&mut self, event: TimedOut, ctx: &mut SagaContext<'_>) -> Result<(), E> { Ok(()) }
            fn total(&self) -> i64 { 0 }
        }
    }
}

#[test]
fn a_valid_saga_expands_to_handlers_and_the_saga_impl() {
    let (errors, expansion) = run(valid_args(), valid_impl());
    assert!(errors.is_empty(), "{errors:?}");
    for expected in [
        "struct __saga_OrderFulfilment_on_created ;",
        "impl :: txoutbox_runtime :: consumer :: EventHandler < :: txoutbox_runtime :: __private :: Postgres > for __saga_OrderFulfilment_on_paid",
        "type Event = TimedOut ;",
        "const NAME : & 'static str = \"OrderFulfilment::on_timeout\" ;",
        ":: txoutbox_runtime :: __private :: handler_descriptor (< OrderCreated as :: txoutbox_runtime :: __private :: DomainEvent > :: TOPIC",
        // Correlation: saga-level field by default, the handler's override where given.
        "let __saga_id : & Uuid = & event . order_id ;",
        "let __saga_id : & Uuid = & event . saga_id ;",
        "let __saga_id = :: txoutbox_runtime :: __private :: correlation (__saga_id) ;",
        ":: txoutbox_runtime :: saga :: Step :: < OrderFulfilment > :: load (tx , events , meta , __saga_id) . await ?",
        // Start handler with ctx; step handlers with and without it.
        "if let :: core :: option :: Option :: Some (__ctx) = __step . starting ()",
        "< OrderFulfilment > :: on_created (event , __ctx) . await",
        "__step . started (__state) ;",
        "if let :: core :: option :: Option :: Some ((__state , _)) = __step . running ()",
        "< OrderFulfilment > :: on_paid (__state , event) . await",
        "< OrderFulfilment > :: on_timeout (__state , event , __ctx) . await",
        "__step . save () . await",
        "impl :: txoutbox_runtime :: saga :: Saga for OrderFulfilment",
        "const NAME : & 'static str = \"order_fulfilment\" ;",
        "consumer . handler (__saga_OrderFulfilment_on_created) . handler (__saga_OrderFulfilment_on_paid) . handler (__saga_OrderFulfilment_on_timeout)",
        // The documented handles on the hidden structs, with the functions' visibility.
        "fn on_created_handler () -> impl :: txoutbox_runtime :: consumer :: EventHandler < :: txoutbox_runtime :: __private :: Postgres , Event = OrderCreated > { __saga_OrderFulfilment_on_created }",
        "fn on_timeout_handler () -> impl :: txoutbox_runtime :: consumer :: EventHandler < :: txoutbox_runtime :: __private :: Postgres , Event = TimedOut > { __saga_OrderFulfilment_on_timeout }",
        "type Database = :: txoutbox_runtime :: __private :: Postgres ;",
    ] {
        assert!(
            expansion.contains(expected),
            "missing {expected}\nin {expansion}"
        );
    }
    // The impl block stays, without `#[correlate]`; helpers are untouched.
    assert!(!expansion.contains("# [correlate"), "{expansion}");
    assert!(
        expansion.contains("fn total (& self) -> i64 { 0 }"),
        "{expansion}"
    );
    assert_eq!(
        expansion
            .matches("EventHandler < :: txoutbox_runtime :: __private :: Postgres > for")
            .count(),
        3
    );
}

#[test]
fn name_and_crate_are_configurable() {
    let (errors, expansion) = run(
        quote!(
            name = "orders.fulfil-v2",
            crate = "my_app::rt",
            id = String,
            correlate = key,
            starts_with(A)
        ),
        quote!(impl S { async fn on_a(event: A) -> Result<Self, E> { todo!() } }),
    );
    assert!(errors.is_empty(), "{errors:?}");
    assert!(expansion.contains("const NAME : & 'static str = \"orders.fulfil-v2\""));
    assert!(expansion.contains("impl my_app :: rt :: saga :: Saga for S"));
    assert!(expansion.contains("my_app :: rt :: __private :: handler_error"));
    assert!(
        expansion.contains("if __step . starting () . is_some ()"),
        "{expansion}"
    );
    assert!(
        expansion.contains("< S > :: on_a (event) . await"),
        "{expansion}"
    );
    assert!(!expansion.contains("txoutbox_runtime"), "{expansion}");
}

#[test]
fn attribute_mistakes_are_all_reported() {
    let (errors, _) = run(
        quote!(
            nam = "x",
            name = "Order Saga",
            colour = 1,
            correlate = order_id,
            starts_with(A),
            crate = "not a path"
        ),
        quote!(impl S { async fn on_a(event: A) -> Result<Self, E> { todo!() } }),
    );
    assert_eq!(
        errors,
        [
            "unknown key `nam` in `#[saga(...)]`; valid keys are `name`, `id`, `correlate`, `starts_with`, `handles`, `database`, `crate`",
            "unknown key `colour` in `#[saga(...)]`; valid keys are `name`, `id`, `correlate`, `starts_with`, `handles`, `database`, `crate`",
            "`crate` must be a path to the crate that re-exports `txoutbox_runtime`, e.g. `crate = \"my_app::outbox\"`",
            // Checked after parsing, with the type's name at hand.
            "invalid character 'O' at position 1 of saga name \"Order Saga\"",
            "missing `id` in `#[saga(...)]`: the type of the saga id, which the messages' correlation fields hold",
        ]
    );
    let (errors, _) = run(
        quote!(
            id = Uuid,
            id = u64,
            name = "",
            correlate = 5,
            starts_with(A)
        ),
        quote!(impl S { async fn on_a(event: A) -> Result<Self, E> { todo!() } }),
    );
    assert_eq!(
        errors,
        [
            "duplicate `id` in `#[saga(...)]`",
            "expected the name of a field of the messages, e.g. `correlate = order_id`",
            "the saga name must not be empty",
        ]
    );
}

#[test]
fn handler_and_list_mismatches_are_all_reported() {
    let (errors, _) = run(
        quote!(id = Uuid, correlate = order_id, handles(B, C, B, D)),
        quote! {
            impl S {
                async fn on_a(event: A) -> Result<Self, E> { todo!() }
                async fn on_b(&mut self, event: B) -> Result<(), E> { Ok(()) }
                async fn on_b_again(&mut self, event: B) -> Result<(), E> { Ok(()) }
                async fn on_c(event: C) -> Result<Self, E> { todo!() }
                fn on_d(&mut self, event: D) -> Result<(), E> { Ok(()) }
            }
        },
    );
    assert_eq!(
        errors,
        [
            "missing `starts_with(...)` in `#[saga(...)]`: a saga needs at least one message that starts it",
            "`B` is declared twice, the first time in `handles(...)`",
            "`A` is not declared in `#[saga(starts_with(...), handles(...))]`",
            "`B` already has a handler, `on_b`",
            "`on_c` has no `self`, so it starts a saga, but `C` is declared in `handles(...)`",
            // Not also "no handler for `D`": `on_d` is its handler, missing `async`.
            "saga handlers are `async fn`s: `on_d` takes a message of the saga but is not async",
        ]
    );

    let (errors, _) = run(
        quote!(id = Uuid, starts_with(A, B)),
        quote! {
            impl S {
                async fn on_a(&mut self, event: A) -> Result<(), E> { Ok(()) }
                #[correlate(key)]
                async fn on_b(event: B) -> Result<Self, E> { todo!() }
            }
        },
    );
    assert_eq!(
        errors,
        [
            "`on_a` takes `self`, so it moves a running saga on, but `A` is declared in `starts_with(...)`",
            "no correlation field for `on_a`: which field of `A` holds the saga id?",
        ]
    );
}

#[test]
fn an_empty_or_unreadable_list_is_reported_once() {
    let start = quote!(impl S { async fn on_a(event: A) -> Result<Self, E> { todo!() } });
    let (errors, _) = run(
        quote!(id = Uuid, correlate = k, starts_with()),
        start.clone(),
    );
    assert_eq!(
        errors,
        [
            "missing `starts_with(...)` in `#[saga(...)]`: a saga needs at least one message that starts it",
            "`A` is not declared in `#[saga(starts_with(...), handles(...))]`",
        ]
    );
    let (errors, _) = run(
        quote!(id = Uuid, correlate = k, starts_with = A),
        start.clone(),
    );
    assert_eq!(
        errors,
        [
            "expected parentheses",
            "`A` is not declared in `#[saga(starts_with(...), handles(...))]`",
        ]
    );
    // A misspelt key counts as written: no "missing `id`" on top, nor "no
    // correlation field" for `correlation`.
    let (errors, _) = run(
        quote!(id = Uuid, correlation = k, starts_with(A)),
        quote!(impl S { async fn on_a(event: A) -> Result<Self, E> { todo!() } }),
    );
    assert_eq!(errors.len(), 1, "{errors:?}");
    let (errors, _) = run(quote!(i = Uuid, correlate = k, starts_with(A)), start);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].starts_with("unknown key `i`"), "{errors:?}");
}

#[test]
fn handler_shapes_are_checked() {
    let (errors, _) = run(
        quote!(
            id = Uuid,
            correlate = k,
            starts_with(A),
            handles(B, C, D, F, G)
        ),
        quote! {
            impl S {
                async fn on_a(event: A) -> Result<(), E> { Ok(()) }
                async fn on_b(self, event: B) -> Result<(), E> { Ok(()) }
                async fn on_c(&mut self, event: &C) -> Result<(), E> { Ok(()) }
                async fn on_d<T>(&mut self, event: D, ctx: &mut Ctx, extra: T) -> Result<Self, E> { todo!() }
                async fn on_nothing(&mut self) -> Result<(), E> { Ok(()) }
                async fn on_f(&mut self, event: F, ctx: Ctx) { }
                #[correlate]
                async fn on_g(&mut self, event: G) -> Result<(), E> { Ok(()) }
                #[correlate(k)]
                fn helper(&self) {}
            }
        },
    );
    assert_eq!(
        errors,
        [
            "a start handler (no `self`) returns the new saga's state: `Result<Self, E>`",
            "a step handler takes the saga's state as `&mut self`",
            "the message is taken by value",
            "a saga handler cannot be generic: it handles one concrete message type",
            "too many parameters: a saga handler takes the message and, optionally, `ctx`",
            "a step handler changes the state through `&mut self` and returns `Result<(), E>`",
            "`on_nothing` takes no message",
            "the parameter after the message must be `ctx: &mut SagaContext<'_>`",
            "a saga handler returns a `Result`",
            "expected `#[correlate(field)]`: the field of this handler's message that holds the saga id",
            "`#[correlate(...)]` goes on a saga handler, an `async fn`",
            "no handler for `C`, declared in `handles(...)`",
        ]
    );
}

#[test]
fn only_inherent_impls_of_named_types() {
    let (errors, _) = run(
        valid_args(),
        quote!(
            impl<T> Trait for Vec<T> {
                async fn on_created(event: OrderCreated) -> Result<Self, E> {
                    todo!()
                }
            }
        ),
    );
    assert_eq!(errors[0], "`#[saga]` cannot be put on a trait impl");
    assert_eq!(
        errors[1],
        "a saga's state type cannot be generic: its handlers are registered once, for one concrete type"
    );
    let (errors, _) = run(
        valid_args(),
        quote!(
            impl (u8, u8) {}
        ),
    );
    assert_eq!(errors[0], "a saga's state type must be a named type");
}

#[test]
fn a_default_name_that_is_not_usable_asks_for_one() {
    let (errors, _) = run(
        quote!(id = Uuid, correlate = k, starts_with(A)),
        quote!(impl Über { async fn on_a(event: A) -> Result<Self, E> { todo!() } }),
    );
    assert_eq!(
        errors,
        [
            "the default saga name `über` (the type's name in snake case) is not usable: invalid character 'ü' at position 1 of saga name \"über\""
        ]
    );
}
