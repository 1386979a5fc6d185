//! The derive's pipeline on token input: which mistakes it reports, what it
//! generates.

use super::*;

/// The messages (first line) of every error the derive reports for `input`,
/// and the expansion.
fn run(input: TokenStream) -> (Vec<String>, String) {
    run_as(Kind::Event, input)
}

fn run_as(kind: Kind, input: TokenStream) -> (Vec<String>, String) {
    let input: syn::DeriveInput = syn::parse2(input).unwrap();
    let mut errors = Errors::new();
    let parsed = ast::Input::from_syn(&input, kind, &mut errors);
    let event = validate::event(&parsed, &mut errors);
    // The expansion as if complete: what a fixed item would get.
    let expansion = expand::event(&parsed, &event, true).to_string();
    (errors.into_first_lines(), expansion)
}

#[test]
fn valid_event_has_no_errors_and_registers() {
    let (errors, expansion) = run(quote::quote! {
        #[event(topic = "t", aggregate = "A")]
        struct E { event_id: Uuid, #[partition_key] k: String }
    });
    assert!(errors.is_empty(), "{errors:?}");
    assert!(
        expansion.contains("const TOPIC : & 'static str = \"t\""),
        "{expansion}"
    );
    assert!(
        expansion.contains("const EVENT_TYPE : & 'static str = \"E\""),
        "{expansion}"
    );
    assert!(expansion.contains("inventory :: submit !"), "{expansion}");
}

#[test]
fn reports_every_mistake_of_an_item() {
    let (errors, _) = run(quote::quote! {
        #[event(topic = "a b", event_type = "", aggregate = "")]
        #[event(topic = "again", colour = "red")]
        struct E {
            #[event_id] #[event_id] id: Uuid,
            #[event_id] other: Uuid,
            #[aggregate_id] a: u8,
            #[aggregate_id] b: u8,
            #[partition_key = 1] c: u8,
        }
    });
    let expected = [
        "duplicate `topic` in `#[event(...)]`",
        "unknown key `colour` in `#[event(...)]`; valid keys are `topic`, `event_type`, `aggregate`, `headers`, `crate`",
        "duplicate `#[event_id]` on this field",
        "`#[partition_key]` takes no value",
        "invalid character ' ' at position 2 of topic \"a b\"",
        "`event_type` must not be empty",
        "`aggregate` must not be empty",
        "more than one `#[event_id]` field (the first is `id`)",
        "more than one `#[aggregate_id]` field (the first is `a`)",
    ];
    assert_eq!(errors, expected);
}

#[test]
fn a_misspelt_key_is_neither_missing_nor_a_duplicate() {
    let (errors, _) = run(quote::quote! {
        #[event(topc = "t", topic = "t", aggregat = "A")]
        struct E { event_id: Uuid, #[partition_key] k: String }
    });
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(errors[0].starts_with("unknown key `topc`"));
    assert!(errors[1].starts_with("unknown key `aggregat`"));
}

#[test]
fn serde_names_decide_the_key_field_and_the_event_id_clash() {
    let (errors, expansion) = run(quote::quote! {
        #[serde(rename_all = "SCREAMING-KEBAB-CASE")]
        #[event(topic = "t", aggregate = "A")]
        struct E {
            #[event_id] id: Uuid,
            #[serde(skip)] event_id: u8,
            #[partition_key] order_id: String,
        }
    });
    assert!(errors.is_empty(), "{errors:?}");
    assert!(expansion.contains("PARTITION_KEY_FIELD : & 'static str = \"ORDER-ID\""));

    let (errors, _) = run(quote::quote! {
        #[event(topic = "t", aggregate = "A")]
        struct E {
            #[event_id] id: Uuid,
            #[serde(rename = "event_id")] legacy: u8,
            #[partition_key] k: String,
        }
    });
    assert_eq!(errors.len(), 1);
    assert!(errors[0].starts_with("this field is serialized as `event_id`"));
}

#[test]
fn generic_items_get_no_placeholder_impl() {
    let (errors, expansion) = run(quote::quote! {
        #[event(topic = "t", aggregate = "A")]
        struct E<T> { event_id: Uuid, #[partition_key] k: T }
    });
    assert_eq!(errors.len(), 1);
    assert!(expansion.is_empty(), "{expansion}");
}

#[test]
fn a_command_is_a_domain_event_registered_as_a_command() {
    let (errors, expansion) = run_as(
        Kind::Command,
        quote::quote! {
            #[command(topic = "inventory.commands", aggregate = "Stock")]
            struct ReserveStock { event_id: Uuid, #[partition_key] sku: String }
        },
    );
    assert!(errors.is_empty(), "{errors:?}");
    assert!(
        expansion.contains("impl :: txoutbox_core :: DomainEvent for ReserveStock"),
        "{expansion}"
    );
    assert!(
        expansion.contains("const EVENT_TYPE : & 'static str = \"ReserveStock\""),
        "{expansion}"
    );
    assert!(
        expansion.contains("kind : :: txoutbox_core :: schema :: MessageKind :: Command"),
        "{expansion}"
    );

    let (errors, expansion) = run_as(
        Kind::Command,
        quote::quote! {
            #[command(topic = "t", aggregate = "A", command_type = "stock.reserve")]
            struct ReserveStock { event_id: Uuid, #[partition_key] sku: String }
        },
    );
    assert!(errors.is_empty(), "{errors:?}");
    assert!(expansion.contains("const EVENT_TYPE : & 'static str = \"stock.reserve\""));
    let (_, event) = run(quote::quote! {
        #[event(topic = "t", aggregate = "A")]
        struct E { event_id: Uuid, #[partition_key] k: String }
    });
    assert!(event.contains("MessageKind :: Event"), "{event}");
}

#[test]
fn the_other_derives_attribute_is_reported_once_with_a_hint() {
    let (errors, _) = run_as(
        Kind::Command,
        quote::quote! {
            #[event(topic = "inventory.commands", aggregate = "Stock")]
            struct ReserveStock { event_id: Uuid, #[partition_key] sku: String }
        },
    );
    assert_eq!(
        errors,
        ["`#[derive(Command)]` is configured with `#[command(...)]`, not `#[event(...)]`"]
    );
    let (errors, _) = run(quote::quote! {
        #[command(topic = "t", aggregate = "A")]
        struct E { event_id: Uuid, #[partition_key] k: String }
    });
    assert_eq!(
        errors,
        ["`#[derive(DomainEvent)]` is configured with `#[event(...)]`, not `#[command(...)]`"]
    );
}

#[test]
fn command_messages_use_the_command_vocabulary() {
    let (errors, _) = run_as(
        Kind::Command,
        quote::quote! {
            #[command(topic = "t", aggregate = "A", event_type = "X", command_type = "")]
            struct C { event_id: Uuid, #[partition_key] k: String }
        },
    );
    assert_eq!(
        errors,
        [
            "unknown key `event_type` in `#[command(...)]`; valid keys are `topic`, \
             `command_type`, `aggregate`, `headers`, `crate`",
            "`command_type` must not be empty",
        ]
    );
    let (errors, _) = run_as(
        Kind::Command,
        quote::quote! { struct C<'a> { event_id: Uuid, #[partition_key] k: &'a str } },
    );
    assert_eq!(
        errors,
        [
            "commands cannot borrow data: `DomainEvent` requires `'static`",
            "missing `#[command(topic = \"...\", aggregate = \"...\")]` on the command struct",
        ]
    );
}
