//! Reading the types of a handler's parameters.

use syn::{Type, TypePath};

/// The last segment of the type argument of `Transaction<'_, DB>`: `DB`.
pub(crate) fn database_argument(ty: &Type) -> Option<String> {
    let Type::Path(TypePath { path, .. }) = ty else {
        return None;
    };
    let syn::PathArguments::AngleBracketed(args) = &path.segments.last()?.arguments else {
        return None;
    };
    args.args.iter().find_map(|arg| match arg {
        syn::GenericArgument::Type(Type::Path(TypePath { path, .. })) => {
            path.segments.last().map(|s| s.ident.to_string())
        }
        _ => None,
    })
}
