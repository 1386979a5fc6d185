//! Reading the types of a handler's parameters.

use syn::{Type, TypePath};

/// The last segment of the type argument of `Transaction<'_, DB>`: `DB`.
pub(crate) fn database_argument(ty: &Type) -> Option<String> {
    let Type::Path(TypePath { path, .. }) = ungrouped(ty) else {
        return None;
    };
    let syn::PathArguments::AngleBracketed(args) = &path.segments.last()?.arguments else {
        return None;
    };
    args.args.iter().find_map(|arg| match arg {
        syn::GenericArgument::Type(ty) => match ungrouped(ty) {
            Type::Path(TypePath { path, .. }) => path.segments.last().map(|s| s.ident.to_string()),
            _ => None,
        },
        _ => None,
    })
}

/// `ty` without the invisible groups (a type passed through a `macro_rules!`
/// `$t:ty`) and parentheses around it.
pub(crate) fn ungrouped(ty: &Type) -> &Type {
    match ty {
        Type::Group(group) => ungrouped(&group.elem),
        Type::Paren(paren) => ungrouped(&paren.elem),
        other => other,
    }
}
