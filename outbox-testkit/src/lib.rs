//! Test support shared by the workspace's tests, benches and examples (dev
//! only, never published):
//!
//! - [`broker`]: the test broker's address (`KAFKA_BROKERS_TEST`), topic
//!   creation, unique topic and group names, and a private tansu broker
//!   process;
//! - [`db`]: uniquely named scratch databases on the server of
//!   `DATABASE_URL`, created, connected and dropped; [`mysql`]: the same on
//!   the MariaDB of `MYSQL_URL`;
//! - [`eventually`]: the one polling wait;
//! - [`count`] and [`count_rows`]: record counting;
//! - [`test_event!`]: test event types declared with `#[derive(DomainEvent)]`;
//! - [`measured_commit`]: the commit a benchmark measured.
//!
//! Migrations are the caller's: this crate depends on `txoutbox-core` only,
//! so that `txoutbox-runtime`'s own tests can use it.

pub mod broker;
pub mod db;
mod events;
pub mod mysql;
mod wait;

pub use db::{count, count_rows};
pub use wait::eventually;

#[doc(hidden)]
pub mod __private {
    pub use uuid;
}

/// `git describe --always --dirty` of the workspace being measured, for
/// benchmark output and chart captions ("unknown commit" outside a git
/// checkout).
pub fn measured_commit() -> String {
    std::process::Command::new("git")
        .args(["describe", "--always", "--dirty"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown commit".to_owned())
}

/// Logs in test output, filtered by `RUST_LOG` (e.g.
/// `RUST_LOG=txoutbox_runtime=debug`); a second call does nothing.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
}
