//! `crate = "..."`: where generated code finds the framework's crates.
//!
//! Generated code names `::txoutbox_core` or `::txoutbox_runtime` by absolute
//! path, so a user's own items cannot change its meaning. A crate that uses
//! the macros through a re-export (no direct dependency) says where they are
//! with `crate = "my_app::outbox"`, a path inside a string (serde's
//! convention). Every macro reads that value here.

use quote::ToTokens;
use syn::meta::ParseNestedMeta;

/// A crate of the framework that generated code refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FrameworkCrate {
    /// `txoutbox_core`: `DomainEvent`, the unit of work.
    Core,
    /// `txoutbox_runtime`: consumers and sagas (it re-exports what it needs of
    /// `txoutbox_core`).
    Runtime,
}

impl FrameworkCrate {
    fn name(self) -> &'static str {
        match self {
            Self::Core => "txoutbox_core",
            Self::Runtime => "txoutbox_runtime",
        }
    }

    /// The path generated code uses: the `crate = ".."` override if one was
    /// given, else `::txoutbox_core` (`::txoutbox_runtime`).
    pub(crate) fn path(self, given: Option<&syn::Path>) -> syn::Path {
        match given {
            Some(path) => path.clone(),
            None => {
                let name = syn::Ident::new(self.name(), proc_macro2::Span::call_site());
                syn::parse_quote!(::#name)
            }
        }
    }

    /// [`Self::path`] as tokens.
    pub(crate) fn tokens(self, given: Option<&syn::Path>) -> proc_macro2::TokenStream {
        self.path(given).into_token_stream()
    }

    /// Reads the value of `crate = "path"`: the path inside the string.
    pub(crate) fn parse_path(self, value: &syn::LitStr) -> syn::Result<syn::Path> {
        value.parse::<syn::Path>().map_err(|_| {
            syn::Error::new(
                value.span(),
                format!(
                    "`crate` must be a path to the crate that re-exports `{}`, \
                     e.g. `crate = \"my_app::outbox\"`",
                    self.name()
                ),
            )
        })
    }

    /// Reads `crate = "path"` as an argument of [`super::args::parse_each`]
    /// into `slot`, reporting a second one.
    pub(crate) fn parse_arg(
        self,
        meta: &ParseNestedMeta<'_>,
        slot: &mut Option<syn::Path>,
    ) -> syn::Result<()> {
        let value: syn::LitStr = meta.value()?.parse()?;
        let path = self.parse_path(&value)?;
        super::args::once(slot.is_some(), meta)?;
        *slot = Some(path);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_to_the_absolute_path() {
        assert_eq!(
            FrameworkCrate::Core.tokens(None).to_string(),
            ":: txoutbox_core"
        );
        assert_eq!(
            FrameworkCrate::Runtime.tokens(None).to_string(),
            ":: txoutbox_runtime"
        );
        let given: syn::Path = syn::parse_quote!(my_app::outbox);
        assert_eq!(
            FrameworkCrate::Core.tokens(Some(&given)).to_string(),
            "my_app :: outbox"
        );
    }

    #[test]
    fn reads_the_path_inside_the_string() {
        let lit: syn::LitStr = syn::parse_quote!("my_app::outbox");
        assert!(FrameworkCrate::Core.parse_path(&lit).is_ok());
        let lit: syn::LitStr = syn::parse_quote!("not a path");
        let error = FrameworkCrate::Runtime.parse_path(&lit).unwrap_err();
        assert!(
            error.to_string().starts_with(
                "`crate` must be a path to the crate that re-exports `txoutbox_runtime`"
            ),
            "{error}"
        );
    }
}
