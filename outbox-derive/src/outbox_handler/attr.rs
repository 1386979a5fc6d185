//! Parsing of `#[outbox_handler(...)]`'s arguments. The function itself is a
//! plain `syn::ItemFn` (a method in an `impl` block parses as one too).

use proc_macro2::{Span, TokenStream};
use syn::meta::ParseNestedMeta;
use syn::{LitInt, LitStr};

use crate::kernel::Errors;
use crate::kernel::args;
use crate::kernel::crate_path::FrameworkCrate;

/// The attribute's arguments, each with the span of its value for errors.
#[derive(Default)]
pub(crate) struct Args {
    /// `isolation = "..."`: the `txoutbox_core::IsolationLevel` variant name.
    pub isolation: Option<(&'static str, Span)>,
    /// `retries = N`.
    pub retries: Option<(u32, Span)>,
    /// `crate = "path"`: where `txoutbox_core` is (default `::txoutbox_core`).
    pub krate: Option<syn::Path>,
}

/// Accepted spellings of `isolation`, case-insensitive, `_` or space.
const ISOLATION_LEVELS: [(&str, &str); 3] = [
    ("read_committed", "ReadCommitted"),
    ("repeatable_read", "RepeatableRead"),
    ("serializable", "Serializable"),
];

impl Args {
    /// Parses the arguments, recording every mistake rather than stopping at
    /// the first.
    pub(crate) fn parse(tokens: TokenStream, errors: &mut Errors) -> Self {
        let mut parsed = Args::default();
        args::parse_each(tokens, errors, |meta| parsed.arg(meta));
        parsed
    }

    /// The path generated code names `txoutbox_core` by.
    pub(crate) fn krate(&self) -> TokenStream {
        FrameworkCrate::Core.tokens(self.krate.as_ref())
    }

    fn arg(&mut self, meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
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
                        "unknown isolation level `{}`; expected one of \"read_committed\", \
                         \"repeatable_read\", \"serializable\"",
                        value.value()
                    ),
                ));
            };
            args::once(self.isolation.is_some(), meta)?;
            self.isolation = Some((variant, value.span()));
            Ok(())
        } else if meta.path.is_ident("retries") {
            let value: LitInt = meta.value()?.parse()?;
            let retries = value.base10_parse::<u32>().map_err(|_| {
                syn::Error::new(
                    value.span(),
                    "`retries` must be a small non-negative integer, e.g. `retries = 3`",
                )
            })?;
            args::once(self.retries.is_some(), meta)?;
            self.retries = Some((retries, value.span()));
            Ok(())
        } else if meta.path.is_ident("crate") {
            FrameworkCrate::Core.parse_arg(meta, &mut self.krate)
        } else {
            Err(meta.error(
                "unknown `outbox_handler` argument; expected `isolation = \"serializable\"` (or \
                 \"repeatable_read\", \"read_committed\"), `retries = N` or \
                 `crate = \"path::to::txoutbox_core\"`",
            ))
        }
    }
}
