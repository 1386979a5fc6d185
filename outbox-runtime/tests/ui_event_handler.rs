//! Compile-time checks of `#[event_handler]`: one mistake per file in
//! `tests/ui_event_handler/fail/` with its expected `.stderr`, and a `pass/` set.
//! After an intended change of a message: `TRYBUILD=overwrite cargo test -p
//! txoutbox-runtime --test ui_event_handler`, then review the `.stderr` diff.
#![allow(missing_docs)]

#[test]
fn event_handler_ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui_event_handler/pass/*.rs");
    t.compile_fail("tests/ui_event_handler/fail/*.rs");
}
