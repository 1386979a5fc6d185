//! Parsing of `#[event_handler(...)]`'s arguments: only `crate = "..."`.

use proc_macro2::TokenStream;

use crate::kernel::Errors;
use crate::kernel::args;
use crate::kernel::crate_path::FrameworkCrate;

/// What the attribute says.
#[derive(Default)]
pub(crate) struct Args {
    /// `crate = "path"`: where `txoutbox_runtime` is (default `::txoutbox_runtime`).
    pub krate: Option<syn::Path>,
}

impl Args {
    pub(crate) fn parse(tokens: TokenStream, errors: &mut Errors) -> Self {
        let mut parsed = Args::default();
        args::parse_each(tokens, errors, |meta| {
            if meta.path.is_ident("crate") {
                FrameworkCrate::Runtime.parse_arg(meta, &mut parsed.krate)
            } else {
                Err(meta.error(
                    "#[event_handler] takes only `crate = \"path::to::txoutbox_runtime\"`: the \
                     topic and event type come from the event's `DomainEvent` impl",
                ))
            }
        });
        parsed
    }
}
