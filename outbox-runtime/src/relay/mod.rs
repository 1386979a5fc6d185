//! The relay: publishes `outbox_event` rows to Kafka, after their
//! transaction committed, with an idempotent producer.
//!
//! A relay claims a batch of unpublished rows (`FOR UPDATE SKIP LOCKED`),
//! enqueues the whole batch into an idempotent producer, awaits every delivery
//! report together, and marks the delivered rows with one `UPDATE`. Rows are
//! never deleted; only confirmed deliveries are marked, so a crash at any
//! point republishes at most the batches in flight (delivery is
//! at-least-once: receivers dedup on `event_id`). The next batch is claimed
//! while the previous one is being delivered.
//!
//! Several relays (in one process or many) can run against one database:
//! partition keys are hashed into lanes, each owned by one relay at a time
//! through PostgreSQL advisory locks, so events of one key are published by
//! one relay, in order. Relays of one database must agree on the lane count
//! (a relay with another count is refused), and hold leases: a relay whose
//! connection froze or whose host vanished loses its lanes to the others
//! within `lease_timeout + 2 x rebalance_interval` (14 s by default; see
//! [`RelayBuilder::lease_timeout`]). `docs/relay.md` explains the mechanism,
//! failure handling, metrics and tuning.
//!
//! ```no_run
//! # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use txoutbox_runtime::relay::Relay;
//!
//! let mut kafka = rdkafka::ClientConfig::new();
//! kafka.set("bootstrap.servers", "localhost:9092");
//! let relay = Relay::builder(pool, kafka).spawn()?;
//! tokio::signal::ctrl_c().await?;
//! let summary = relay.shutdown().await?;
//! assert!(summary.clean);
//! # Ok(()) }
//! ```

mod backend;
mod backoff;
mod batch;
mod builder;
mod config;
mod database;
mod error;
mod flight;
mod held_topics;
mod keys;
mod lanes;
pub(crate) mod membership;
#[cfg(feature = "mysql")]
mod mysql;
pub(crate) mod notify;
mod partitioner;
mod partitions;
mod postgres;
mod prediction;
mod publish;
mod run;
mod scheduler;
mod session;
mod store;
mod summary;
pub mod telemetry;
mod wakeup;
mod worker;

pub use crate::wire::cloudevents::CloudEvents;
pub use crate::wire::encode::HeaderNames;
pub use builder::RelayBuilder;
#[cfg(feature = "test-hooks")]
pub use builder::producer_settings_for_benchmark;
pub use config::{DEFAULT_LEASE_TIMEOUT, DEFAULT_REBALANCE_INTERVAL};
pub use database::Database;
pub use error::{BuildError, RelayError};
/// Tests only (features `test-hooks` and `mysql`): the MariaDB claim's walk
/// under `ANALYZE FORMAT=JSON` (see `explain_claim` for PostgreSQL).
#[cfg(all(feature = "test-hooks", feature = "mysql"))]
#[doc(hidden)]
pub use mysql::explain_claim as explain_claim_mysql;
pub use run::{Relay, RelayHandle};
#[cfg(feature = "test-hooks")]
#[doc(hidden)]
pub use store::{claim_and_mark_without_publishing, explain_claim};
pub use summary::RelaySummary;

/// Benchmarks only (feature `test-hooks`): sets a connection up as the
/// relay sets its own. Not a public API.
#[cfg(feature = "test-hooks")]
#[doc(hidden)]
pub async fn configure_connection(conn: &mut sqlx::PgConnection) -> sqlx::Result<()> {
    store::configure_connection(conn).await
}

pub(crate) use membership::members;
#[cfg(feature = "mysql")]
pub(crate) use mysql::{LockNames, NO_SUCH_TABLE, error_number};
