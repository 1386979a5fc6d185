//! Compile-time checks of `#[saga]`: one mistake per file in
//! `tests/ui_saga/fail/` with its expected `.stderr` (`several_mistakes.rs`
//! shows they are all reported at once), and a `pass/` set that must compile
//! and run. After an intended change of a message: `TRYBUILD=overwrite cargo
//! test -p txoutbox-runtime --test ui_saga`, then review the `.stderr` diff.
#![allow(missing_docs)]

#[test]
fn saga_ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui_saga/pass/*.rs");
    t.compile_fail("tests/ui_saga/fail/*.rs");
}
