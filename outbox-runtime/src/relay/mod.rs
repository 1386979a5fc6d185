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
//! [`RelayConfig::lease_timeout`]). `docs/relay.md` explains the mechanism,
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
//! let summary = relay.shutdown().await;
//! assert!(summary.clean);
//! # Ok(()) }
//! ```

mod backoff;
mod config;
mod flight;
mod lanes;
mod membership;
pub mod notify;
mod partitioner;
mod partitions;
mod pipeline;
mod publish;
mod store;
pub mod telemetry;
mod wakeup;
mod worker;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;

use rdkafka::ClientConfig;
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use config::{RelayBuilder, RelayConfig};
#[cfg(feature = "test-hooks")]
#[doc(hidden)]
pub use store::claim_and_mark_without_publishing;

/// Benchmarks only (feature `test-hooks`): sets a connection up as the
/// relay sets its own. Not a public API.
#[cfg(feature = "test-hooks")]
#[doc(hidden)]
pub async fn configure_connection(conn: &mut sqlx::PgConnection) -> sqlx::Result<()> {
    store::configure_connection(conn).await
}

use crate::lifecycle::{Lifecycle, Stopped};
pub(crate) use membership::members;
use partitions::Partitions;
use publish::Publisher;
pub(crate) use publish::{WireRow, wire_headers};
use telemetry::Totals;
use wakeup::Wakeups;
use worker::Worker;

/// A relay ready to run: its configuration checked and its producer created.
///
/// The same shape as a consumer: [`Relay::builder`] → [`RelayBuilder::build`]
/// → [`spawn`](Self::spawn) (a task and its [`RelayHandle`]) or
/// [`run`](Self::run) (on the current task until a token is cancelled).
/// [`RelayBuilder::spawn`] is `build()?.spawn()` in one call.
pub struct Relay {
    pool: PgPool,
    config: RelayConfig,
    publisher: Publisher,
    partitions: Partitions,
}

/// Shows the configuration (the librdkafka settings are in the builder's
/// `Debug`, with secrets redacted).
impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Relay {
    /// Starts configuring a relay over `pool` (the service's database, with
    /// the outbox migrations applied) publishing through a producer built
    /// from `kafka` (any librdkafka settings: `bootstrap.servers`, TLS, SASL,
    /// compression, linger...). The relay adds `enable.idempotence=true` and
    /// `acks=all`, and sets `message.timeout.ms` from
    /// [`RelayConfig::delivery_timeout`].
    ///
    /// ```no_run
    /// # async fn run(pool: sqlx::PgPool) -> Result<(), txoutbox_runtime::relay::RelayError> {
    /// let mut kafka = rdkafka::ClientConfig::new();
    /// kafka.set("bootstrap.servers", "localhost:9092");
    /// let handle = txoutbox_runtime::relay::Relay::builder(pool, kafka).spawn()?;
    /// # Ok(()) }
    /// ```
    pub fn builder(pool: PgPool, kafka: ClientConfig) -> RelayBuilder {
        RelayBuilder::new(pool, kafka)
    }

    /// Creates the producer; the configuration was validated by the builder.
    pub(crate) fn new(
        pool: PgPool,
        kafka: ClientConfig,
        config: RelayConfig,
    ) -> Result<Self, RelayError> {
        let publisher = Publisher::new(kafka)?;
        let partitions = Partitions::new(
            publisher.partitioner(),
            config.delivery_timeout,
            (config.error_backoff_initial, config.error_backoff_max),
        );
        Ok(Self {
            pool,
            config,
            publisher,
            partitions,
        })
    }

    /// The relay's loop, stopped by `cancel`, counting into `totals`.
    fn worker(self, cancel: CancellationToken, totals: Arc<Totals>) -> Worker {
        let remote = self.config.listen_notify.then(|| {
            let wake = Arc::new(tokio::sync::Notify::new());
            notify::spawn_listener(&self.pool, Arc::clone(&wake), cancel.child_token());
            wake
        });
        Worker::new(
            self.pool,
            self.config,
            self.publisher,
            self.partitions,
            totals,
            cancel,
            Wakeups::new(txoutbox_core::wakeup::listener(), remote),
        )
    }

    /// Runs the relay on the current task until `token` is cancelled (then
    /// it stops as [`RelayHandle::shutdown`] does, without a time limit), and
    /// returns its totals; an error if it ended on its own (see
    /// [`RelayHandle::stopped`]). For supervisors that own their tasks, e.g.
    /// in a `JoinSet`.
    ///
    /// ```no_run
    /// # async fn run(pool: sqlx::PgPool) -> Result<(), txoutbox_runtime::relay::RelayError> {
    /// let mut kafka = rdkafka::ClientConfig::new();
    /// kafka.set("bootstrap.servers", "localhost:9092");
    /// let relay = txoutbox_runtime::relay::Relay::builder(pool, kafka).build()?;
    /// let token = tokio_util::sync::CancellationToken::new();
    /// let summary = relay.run(token.child_token()).await?;
    /// println!("published {}", summary.published);
    /// # Ok(()) }
    /// ```
    pub async fn run(self, token: CancellationToken) -> Result<RelaySummary, RelayError> {
        let totals = Arc::new(Totals::default());
        self.worker(token, Arc::clone(&totals)).run().await?;
        Ok(totals.summary(true))
    }

    /// Starts the relay on a new tokio task. Must be called inside a tokio
    /// runtime.
    pub fn spawn(self) -> RelayHandle {
        let cancel = CancellationToken::new();
        let totals = Arc::new(Totals::default());
        let shutdown_timeout = self.config.shutdown_timeout;
        let worker = self.worker(cancel.clone(), Arc::clone(&totals));
        let lifecycle = Lifecycle::new();
        let task = tokio::spawn({
            let (lifecycle, cancel) = (lifecycle.clone(), cancel.clone());
            async move {
                let ended = AssertUnwindSafe(worker.run()).catch_unwind().await;
                let stopped = match ended {
                    Ok(Ok(())) if cancel.is_cancelled() => Stopped::Requested,
                    Ok(Ok(())) => Stopped::Failed("the relay loop ended unexpectedly".into()),
                    Ok(Err(error)) => Stopped::Failed(error.to_string()),
                    Err(panic) => Stopped::Failed(format!(
                        "the relay panicked: {}",
                        crate::lifecycle::panic_message(&*panic)
                    )),
                };
                lifecycle.finish(stopped, &[("task", "relay".to_owned())]);
            }
        });
        RelayHandle {
            cancel,
            task: Some(task),
            totals,
            shutdown_timeout,
            lifecycle,
        }
    }
}

/// A running relay. Dropping the handle asks the relay to stop (like
/// [`shutdown`](Self::shutdown) without waiting).
#[derive(Debug)]
pub struct RelayHandle {
    cancel: CancellationToken,
    task: Option<JoinHandle<()>>,
    totals: Arc<Totals>,
    shutdown_timeout: std::time::Duration,
    lifecycle: Lifecycle,
}

/// What a relay did, returned by [`RelayHandle::shutdown`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelaySummary {
    /// Events delivered and marked as published.
    pub published: u64,
    /// Events parked after `max_attempts` failed attempts.
    pub parked: u64,
    /// Times an event was held back (not sent, no attempt counted) because
    /// its partition was unavailable.
    pub held_back: u64,
    /// Non-empty batches completed.
    pub batches: u64,
    /// Errors met (each also counted in `outbox_relay_errors_total`).
    pub errors: u64,
    /// Times the producer was replaced after a fatal error or an outage.
    pub producer_rebuilds: u64,
    /// `true` if the relay stopped within `shutdown_timeout`; `false` if it
    /// had to be aborted (its unmarked rows are published again later).
    pub clean: bool,
}

impl RelayHandle {
    /// Stops claiming, lets the batch in flight finish (deliveries awaited and
    /// marked), releases the lanes and returns, within
    /// [`RelayConfig::shutdown_timeout`].
    ///
    /// ```no_run
    /// # async fn run(handle: txoutbox_runtime::relay::RelayHandle) {
    /// let summary = handle.shutdown().await;
    /// println!("published {} events in {} batches", summary.published, summary.batches);
    /// # }
    /// ```
    pub async fn shutdown(mut self) -> RelaySummary {
        self.cancel.cancel();
        let mut clean = true;
        if let Some(mut task) = self.task.take() {
            match tokio::time::timeout(self.shutdown_timeout, &mut task).await {
                Ok(joined) => clean = joined.is_ok(),
                Err(_elapsed) => {
                    task.abort();
                    clean = false;
                }
            }
        }
        self.lifecycle.finish(Stopped::Requested, &[]);
        RelaySummary {
            clean,
            ..self.summary()
        }
    }

    /// The totals so far, while the relay runs (`clean` is `true`).
    pub fn summary(&self) -> RelaySummary {
        self.totals.summary(true)
    }

    /// Resolves when the relay's task has ended: [`Stopped::Requested`] after
    /// [`shutdown`](Self::shutdown) or its token was cancelled,
    /// [`Stopped::Failed`] if it ended on its own (see [`crate::lifecycle`]:
    /// a service should then exit so that it is restarted). Can be awaited
    /// any number of times, from any task.
    ///
    /// ```no_run
    /// # async fn run(relay: txoutbox_runtime::relay::RelayHandle) {
    /// let stopped = relay.stopped().await;
    /// if stopped.is_failure() {
    ///     eprintln!("relay {stopped}");
    ///     std::process::exit(1);
    /// }
    /// # }
    /// ```
    pub fn stopped(&self) -> impl std::future::Future<Output = Stopped> + Send + 'static {
        self.lifecycle.stopped()
    }

    /// Whether the relay's task is still running.
    pub fn is_running(&self) -> bool {
        self.lifecycle.current().is_none()
    }

    /// The token that stops the relay, e.g. to tie it to a server's graceful
    /// shutdown (`axum::serve(..).with_graceful_shutdown(token.cancelled_owned())`)
    /// or to stop it from another task.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.cancel.clone()
    }
}

impl Drop for RelayHandle {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Why a relay could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// The Kafka configuration disables idempotence or weakens `acks`.
    #[error(
        "the outbox relay's producer must run with enable.idempotence=true \
         and acks=all, but `{setting}={value}` was configured; remove that setting"
    )]
    IdempotenceRequired {
        /// The librdkafka setting at fault.
        setting: String,
        /// Its configured value.
        value: String,
    },
    /// A tuning value is out of range.
    #[error("invalid relay configuration: {0}")]
    InvalidConfig(&'static str),
    /// librdkafka refused the configuration.
    #[error("could not create the relay's kafka producer: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// Another relay runs against the same database with a different
    /// [`RelayConfig::lanes`]. Lanes of different counts cover different
    /// keys, so both relays would publish some keys, out of order: the relay
    /// that joins last is refused (its task ends with this error).
    #[error(
        "this relay is configured with {configured} lanes, but the relay {member} runs \
         against the same database with {running} lanes; every relay of a database must \
         use the same `lanes` (per-key order): configure {running}, or stop every relay \
         to change the count"
    )]
    LaneCountMismatch {
        /// This relay's lane count.
        configured: u32,
        /// The running relay's lane count.
        running: u32,
        /// The running relay: process, host and backend pid.
        member: String,
    },
    /// The relay's own connection is not a database session of its own: its
    /// lanes are session-level advisory locks, which a transaction-mode
    /// connection pooler hands to other clients.
    #[error(
        "the relay's own database connection is not a session of its own ({0}); its lanes \
         are session-level advisory locks, which a transaction-mode pooler (PgBouncer \
         pool_mode=transaction) hands to other clients: give the relay a pool that \
         connects to PostgreSQL directly or through a session-mode pool"
    )]
    SharedSession(String),
    /// The relay membership table (migration 0006) does not exist.
    #[error(
        "the relay membership table outbox_relay_member is missing: apply the outbox \
         migrations (`outbox migrate` or txoutbox_runtime::migrations::run)"
    )]
    NotMigrated,
}
