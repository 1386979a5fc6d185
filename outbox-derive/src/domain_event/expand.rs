//! Code generation: the `DomainEvent` impl and the schema registration.
//!
//! Hygiene: every path is absolute (`::core::...` or the `txoutbox_core` path,
//! overridable with `#[event(crate = "...")]`), so the user's imports and
//! local types named `String`, `Result`, `Uuid`, ... cannot change the meaning
//! of the generated code.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;

use super::Kind;
use super::ast::{Field, Input};
use super::validate::Event;

/// The `DomainEvent` impl, and its registration if the item was `complete`
/// (without a mistake); with mistakes, a placeholder impl (see below).
pub(crate) fn event(input: &Input<'_>, event: &Event<'_>, complete: bool) -> TokenStream {
    if !input.can_impl() {
        // Generic items and unions get no placeholder (see `Input::can_impl`).
        return TokenStream::new();
    }
    let krate = &event.krate;
    let ident = input.ident;

    // With errors, missing parts get placeholders: the impl still exists, so
    // uses of the type elsewhere type-check, and the field types that were
    // given are still checked (their errors belong to the same compile).
    let topic = event.topic.as_deref().unwrap_or("");
    let event_type = &event.event_type;
    let aggregate = event.aggregate.as_deref().unwrap_or("");
    let key_field = event
        .partition_key
        .as_ref()
        .map_or("", |(_, name)| name.as_str());
    let unreachable = quote! {
        ::core::unreachable!("`#[derive(DomainEvent)]` reported an error for this type")
    };

    let event_id = match event.event_id {
        Some(field) => field_call(field, quote!(#krate::__private::EventIdField), "event_id"),
        None => unreachable.clone(),
    };
    let partition_key = match &event.partition_key {
        Some((field, _)) => field_call(field, quote!(#krate::PartitionKey), "to_partition_key"),
        None => unreachable,
    };
    let aggregate_id = match event.aggregate_id {
        Some(field) => field_call(field, quote!(#krate::PartitionKey), "to_partition_key"),
        // Not re-checking the key's type here keeps a bad key type to one error.
        None => quote!(<Self as #krate::DomainEvent>::partition_key(self)),
    };

    let header_names = event.headers.iter().map(|(name, _)| name);
    let header_values = event.headers.iter().map(|(_, value)| value);

    let registration = if complete {
        register(ident, krate, event.kind)
    } else {
        TokenStream::new()
    };

    quote! {
        #[automatically_derived]
        impl #krate::DomainEvent for #ident {
            const TOPIC: &'static str = #topic;
            const EVENT_TYPE: &'static str = #event_type;
            const AGGREGATE_TYPE: &'static str = #aggregate;
            const PARTITION_KEY_FIELD: &'static str = #key_field;
            const HEADERS: &'static [(&'static str, &'static str)] = &[#((#header_names, #header_values)),*];

            #[inline]
            fn event_id(&self) -> #krate::__private::uuid::Uuid {
                #event_id
            }

            #[inline]
            fn aggregate_id(&self) -> #krate::__private::String {
                #aggregate_id
            }

            #[inline]
            fn partition_key(&self) -> #krate::__private::String {
                #partition_key
            }
        }

        #registration
    }
}

/// `<FieldType as Trait>::method(&self.field)`, with the qualified path spanned
/// on the field's type: if the type does not implement the trait, the error
/// (and the trait's `#[diagnostic::on_unimplemented]` message) points at the
/// type the user wrote, not at the derive.
fn field_call(field: &Field<'_>, trait_path: TokenStream, method: &str) -> TokenStream {
    let ty = field.ty;
    let member = field.ident;
    let method = syn::Ident::new(method, ty.span());
    let call = quote_spanned!(ty.span()=> <#ty as #trait_path>::#method);
    quote!(#call(&self.#member))
}

/// Registers the event (or command) for the schema export
/// (`txoutbox_core::schema::registered_events`).
fn register(ident: &syn::Ident, krate: &syn::Path, kind: Kind) -> TokenStream {
    let name = ident.unraw().to_string();
    let kind = match kind {
        Kind::Event => quote!(#krate::schema::MessageKind::Event),
        Kind::Command => quote!(#krate::schema::MessageKind::Command),
    };
    quote! {
        const _: () = {
            fn schema() -> #krate::__private::schemars::Schema {
                <#ident as #krate::__private::EventSchema>::event_schema()
            }
            #krate::__private::inventory::submit! {
                #krate::schema::EventDescriptor {
                    topic: <#ident as #krate::DomainEvent>::TOPIC,
                    event_type: <#ident as #krate::DomainEvent>::EVENT_TYPE,
                    aggregate_type: <#ident as #krate::DomainEvent>::AGGREGATE_TYPE,
                    partition_key_field: <#ident as #krate::DomainEvent>::PARTITION_KEY_FIELD,
                    rust_type: ::core::concat!(::core::module_path!(), "::", #name),
                    kind: #kind,
                    headers: <#ident as #krate::DomainEvent>::HEADERS,
                    schema,
                }
            }
        };
    }
}
