//! Moving generated tokens to the user's code, so that an error in them is
//! reported where the user can fix it.

use proc_macro2::{Group, Span, TokenStream, TokenTree};

/// `tokens` with every token's span set to `span`, so that a path the user
/// passed (`crate = "..."`) reports errors where the generated code around it
/// does.
pub(crate) fn respanned(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut tree| {
            if let TokenTree::Group(group) = &tree {
                let mut inner = Group::new(group.delimiter(), respanned(group.stream(), span));
                inner.set_span(span);
                tree = TokenTree::Group(inner);
            } else {
                tree.set_span(span);
            }
            tree
        })
        .collect()
}
