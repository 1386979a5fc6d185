//! Compile-time checks of `#[outbox_handler]`: one mistake per file in
//! `tests/ui_handler/`, with the expected compiler output next to it
//! (`.stderr`), and a `pass/` set that must compile and run.
//!
//! After changing a message, regenerate the snapshots with
//! `TRYBUILD=overwrite cargo test -p txoutbox-core --test ui_handler` and review
//! the diff by eye.

#[test]
fn outbox_handler_ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui_handler/*.rs");
    t.pass("tests/ui_handler/pass/*.rs");
}
