//! Compile-time checks of the macros `txoutbox_runtime` exports, with
//! trybuild: `#[event_handler]` in `tests/ui_event_handler/` and `#[saga]` in
//! `tests/ui_saga/` (on MySQL, feature `mysql`: `tests/ui_saga_mysql/`).
//!
//! Each `fail/` case holds one mistake (`several_mistakes.rs` several, to show
//! they are reported together) with its expected `.stderr`; the `pass/` cases
//! must compile and run. After an intended change of a message:
//! `TRYBUILD=overwrite cargo test -p txoutbox-runtime --test ui`, then review
//! the `.stderr` diff.
#![allow(missing_docs)]

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    // #[event_handler]
    cases.pass("tests/ui_event_handler/pass/*.rs");
    cases.compile_fail("tests/ui_event_handler/fail/*.rs");
    #[cfg(feature = "sea-orm")]
    cases.compile_fail("tests/ui_event_handler_sea_orm/*.rs");
    #[cfg(feature = "mysql")]
    cases.compile_fail("tests/ui_event_handler_mysql/*.rs");
    // #[saga]
    cases.pass("tests/ui_saga/pass/*.rs");
    cases.compile_fail("tests/ui_saga/fail/*.rs");
    #[cfg(feature = "mysql")]
    {
        cases.pass("tests/ui_saga_mysql/pass/*.rs");
        cases.compile_fail("tests/ui_saga_mysql/fail/*.rs");
    }
}
