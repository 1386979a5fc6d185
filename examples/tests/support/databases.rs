//! The databases a demo creates, for the example's tests to drop afterwards
//! (the server's URL and dropping are `txoutbox-testkit`'s). Included with
//! `#[path]` by each test that needs it.

/// The three databases a demo named `name` creates.
pub(crate) fn demo_databases(name: &str) -> Vec<String> {
    vec![
        format!("{name}_orders"),
        format!("{name}_inventory"),
        format!("{name}_payments"),
    ]
}
