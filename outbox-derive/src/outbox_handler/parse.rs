//! Parsing `#[outbox_handler(...)]`'s arguments. The function itself is a plain
//! `syn::ItemFn` (a method in an `impl` block parses as one too).

use proc_macro2::{Span, TokenStream};
use syn::parse::Parser;
use syn::{LitInt, LitStr, meta::ParseNestedMeta};

/// The attribute's arguments, each with the span of its value for errors.
#[derive(Default)]
pub(crate) struct HandlerArgs {
    /// `isolation = "..."`: the `txoutbox_core::IsolationLevel` variant name.
    pub isolation: Option<(&'static str, Span)>,
    /// `retries = N`.
    pub retries: Option<(u32, Span)>,
    /// `crate = "path"`: where `txoutbox_core` is (default `::txoutbox_core`).
    pub krate: Option<syn::Path>,
}

impl HandlerArgs {
    /// The path generated code names `txoutbox_core` by.
    pub(crate) fn krate(&self) -> TokenStream {
        match &self.krate {
            Some(path) => quote::quote!(#path),
            None => quote::quote!(::txoutbox_core),
        }
    }
}

/// Accepted spellings of `isolation`, case-insensitive, `_` or space.
const ISOLATION_LEVELS: [(&str, &str); 3] = [
    ("read_committed", "ReadCommitted"),
    ("repeatable_read", "RepeatableRead"),
    ("serializable", "Serializable"),
];

/// Parses the arguments, collecting every error rather than stopping at the first.
pub(crate) fn args(tokens: TokenStream) -> (HandlerArgs, Vec<syn::Error>) {
    let mut args = HandlerArgs::default();
    let mut errors = Vec::new();
    let parser = syn::meta::parser(|meta| {
        if let Err(error) = arg(&mut args, &meta) {
            errors.push(error);
            // Skip the value so the following arguments are still checked.
            if meta.input.peek(syn::Token![=]) {
                let _ = meta.value()?.parse::<syn::Expr>();
            }
        }
        Ok(())
    });
    if let Err(error) = parser.parse2(tokens) {
        errors.push(error);
    }
    (args, errors)
}

fn arg(args: &mut HandlerArgs, meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
    if meta.path.is_ident("isolation") {
        let value: LitStr = meta.value()?.parse()?;
        let normalized = value.value().to_ascii_lowercase().replace([' ', '-'], "_");
        let Some((_, variant)) = ISOLATION_LEVELS
            .iter()
            .find(|(name, _)| *name == normalized)
        else {
            return Err(syn::Error::new(
                value.span(),
                format!(
                    "unknown isolation level `{}`; expected one of \"read_committed\", \"repeatable_read\", \"serializable\"",
                    value.value()
                ),
            ));
        };
        duplicate(args.isolation.is_some(), meta)?;
        args.isolation = Some((variant, value.span()));
        Ok(())
    } else if meta.path.is_ident("retries") {
        let value: LitInt = meta.value()?.parse()?;
        let retries = value.base10_parse::<u32>().map_err(|_| {
            syn::Error::new(
                value.span(),
                "`retries` must be a small non-negative integer, e.g. `retries = 3`",
            )
        })?;
        duplicate(args.retries.is_some(), meta)?;
        args.retries = Some((retries, value.span()));
        Ok(())
    } else if meta.path.is_ident("crate") {
        let value: LitStr = meta.value()?.parse()?;
        let path = value.parse::<syn::Path>().map_err(|_| {
            syn::Error::new(
                value.span(),
                "`crate` must be a path to the crate that re-exports `txoutbox_core`, e.g. `crate = \"my_app::outbox\"`",
            )
        })?;
        duplicate(args.krate.is_some(), meta)?;
        args.krate = Some(path);
        Ok(())
    } else {
        Err(meta.error(
            "unknown `outbox_handler` argument; expected `isolation = \"serializable\"` (or \"repeatable_read\", \"read_committed\"), `retries = N` or `crate = \"path::to::txoutbox_core\"`",
        ))
    }
}

fn duplicate(seen: bool, meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
    if seen {
        return Err(meta.error("duplicate argument; give it once"));
    }
    Ok(())
}
