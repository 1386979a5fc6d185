//! Compile-time checks of `#[derive(DomainEvent)]`, with trybuild.
//!
//! `tests/ui/fail/<mistake>.rs` holds one mistake each; its `.stderr` is the
//! exact diagnostic the user sees. After changing a message, regenerate the
//! snapshots and review every diff by eye (the message must be clear and point
//! at the offending token):
//!
//! ```text
//! TRYBUILD=overwrite cargo test -p txoutbox-core --test ui
//! ```
//!
//! `tests/ui/pass/*.rs` must compile and run cleanly (one of them under
//! `#![deny(warnings)]`). trybuild builds them in its own project under
//! `$CARGO_TARGET_DIR/tests/trybuild/`; the snapshots depend on the rustc
//! version (`rust-version` in the workspace `Cargo.toml`).

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/pass/*.rs");
    cases.compile_fail("tests/ui/fail/*.rs");
}
