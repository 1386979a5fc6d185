//! Compile-time checks of the macros `txoutbox_core` exports, with trybuild:
//! `#[derive(DomainEvent)]` / `#[derive(Command)]` in `tests/ui/`, and
//! `#[outbox_handler]` in `tests/ui_handler/` (on SeaORM's transaction in
//! `tests/ui_handler_sea_orm/`, with feature `sea-orm`; on MySQL in
//! `tests/ui_handler_mysql/`, with feature `mysql`).
//!
//! Each `fail` case holds one mistake (`all_errors_at_once.rs` several, to
//! show they are reported together); its `.stderr` is the exact diagnostic the
//! user sees. The `pass` cases must compile and run cleanly (one of them under
//! `#![deny(warnings)]`). After an intended change of a message, regenerate
//! the snapshots and review every diff by eye (the message must be clear and
//! point at the offending token):
//!
//! ```text
//! TRYBUILD=overwrite cargo test -p txoutbox-core --test ui
//! ```
//!
//! trybuild builds all cases in one project under
//! `$CARGO_TARGET_DIR/tests/trybuild/`; the snapshots depend on the rustc
//! version (`rust-version` in the workspace `Cargo.toml`).

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    // #[derive(DomainEvent)], #[derive(Command)]
    cases.pass("tests/ui/pass/*.rs");
    cases.compile_fail("tests/ui/fail/*.rs");
    // #[outbox_handler]
    cases.pass("tests/ui_handler/pass/*.rs");
    cases.compile_fail("tests/ui_handler/*.rs");
    // #[outbox_handler] on SeaORM's transaction
    #[cfg(feature = "sea-orm")]
    {
        cases.pass("tests/ui_handler_sea_orm/pass/*.rs");
        cases.compile_fail("tests/ui_handler_sea_orm/*.rs");
    }
    // #[outbox_handler] on a MySQL transaction
    #[cfg(feature = "mysql")]
    {
        cases.pass("tests/ui_handler_mysql/pass/*.rs");
        cases.compile_fail("tests/ui_handler_mysql/*.rs");
    }
}
