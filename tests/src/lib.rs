//! Shared helpers of the end-to-end and fault-injection tests.
//!
//! [`faults`] is the fault-injection harness of `tests/tests/faults_*.rs` and
//! of the `faults-*` process binaries it spawns (see `RELIABILITY.md`).

pub mod faults;
