//! The derive input as the rest of the pipeline sees it: the item's shape and
//! its fields, with their attributes already parsed (see [`super::attr`]).

use proc_macro2::Span;
use syn::spanned::Spanned;

use super::Kind;
use super::attr::{Container, FieldAttrs};
use crate::kernel::Errors;

pub(crate) struct Input<'a> {
    pub ident: &'a syn::Ident,
    pub generics: &'a syn::Generics,
    pub attrs: Container<'a>,
    pub shape: Shape<'a>,
}

/// What kind of item the derive was put on. Only `Named` is supported; the
/// others keep the span the error message points at.
pub(crate) enum Shape<'a> {
    Named(Vec<Field<'a>>),
    Tuple(Span),
    Unit(Span),
    Enum(Span),
    Union(Span),
}

pub(crate) struct Field<'a> {
    pub ident: &'a syn::Ident,
    pub ty: &'a syn::Type,
    pub attrs: FieldAttrs,
}

impl<'a> Input<'a> {
    pub(crate) fn from_syn(input: &'a syn::DeriveInput, kind: Kind, errors: &mut Errors) -> Self {
        let attrs = Container::from_attrs(&input.attrs, kind, errors);
        let shape = match &input.data {
            syn::Data::Struct(data) => match &data.fields {
                syn::Fields::Named(named) => Shape::Named(
                    named
                        .named
                        .iter()
                        .map(|field| Field {
                            // Named fields always have an ident.
                            ident: field.ident.as_ref().expect("named field"),
                            ty: &field.ty,
                            attrs: FieldAttrs::from_attrs(&field.attrs, kind, errors),
                        })
                        .collect(),
                ),
                syn::Fields::Unnamed(fields) => Shape::Tuple(fields.span()),
                // `struct Foo;`: point at the name, there is nothing else.
                syn::Fields::Unit => Shape::Unit(input.ident.span()),
            },
            syn::Data::Enum(data) => Shape::Enum(data.enum_token.span),
            syn::Data::Union(data) => Shape::Union(data.union_token.span),
        };
        Self {
            ident: &input.ident,
            generics: &input.generics,
            attrs,
            shape,
        }
    }

    /// Whether to write an `impl DomainEvent for Ident` (a placeholder one if
    /// there were errors), so that uses of the type elsewhere still compile.
    /// Not for generic items, whose parameters we would have to invent bounds
    /// for, nor for unions, which cannot meet the `Serialize` supertrait.
    pub(crate) fn can_impl(&self) -> bool {
        self.generics.params.is_empty() && !matches!(self.shape, Shape::Union(_))
    }
}
