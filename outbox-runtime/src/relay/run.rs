//! A relay's lifecycle: the built [`Relay`], run on the current task or
//! spawned, and the [`RelayHandle`] that stops it.

use std::sync::Arc;

use rdkafka::ClientConfig;
use tokio_util::sync::CancellationToken;

use super::backend::Backend;
use super::config::RelayConfig;
use super::database::Database;
use super::error::{BuildError, RelayError};
use super::partitions::Partitions;
use super::publish::Publisher;
use super::scheduler::Scheduler;
use super::summary::{RelaySummary, Totals};
use super::wakeup::Wakeups;
use super::worker::Worker;
use crate::lifecycle::{Ended, Stopped, Supervised, TaskName};

/// A relay ready to run: its configuration checked and its producer created.
///
/// The same shape as a consumer: [`Relay::builder`] → [`RelayBuilder::build`](super::RelayBuilder::build)
/// → [`spawn`](Self::spawn) (a task and its [`RelayHandle`]) or
/// [`run`](Self::run) (on the current task until a token is cancelled).
/// [`RelayBuilder::spawn`](super::RelayBuilder::spawn) is `build()?.spawn()` in one call.
pub struct Relay {
    database: Database,
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
    /// Creates the producer; the configuration was validated by the builder.
    pub(crate) fn new(
        database: Database,
        kafka: ClientConfig,
        config: RelayConfig,
    ) -> Result<Self, BuildError> {
        let publisher = Publisher::new(
            kafka,
            config.header_names.clone(),
            config.cloudevents.clone(),
        )?;
        let partitions = Partitions::new(
            publisher.partitioner(),
            config.delivery_timeout,
            config.error_backoff,
        );
        Ok(Self {
            database,
            config,
            publisher,
            partitions,
        })
    }

    /// The relay's loop and its scheduler on the database's backend: the
    /// one place that asks which database the relay runs on.
    fn tasks(
        self,
        cancel: CancellationToken,
        totals: Arc<Totals>,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<(), RelayError>> + Send + 'static>> {
        let Self {
            database,
            config,
            publisher,
            partitions,
        } = self;
        match database {
            Database::Postgres(pool) => {
                Box::pin(tasks(pool, config, publisher, partitions, cancel, totals))
            }
            #[cfg(feature = "mysql")]
            Database::MySql(pool) => Box::pin(tasks(
                super::mysql::MySqlRelay::new(pool),
                config,
                publisher,
                partitions,
                cancel,
                totals,
            )),
        }
    }

    /// Runs the relay on the current task until `token` is cancelled (then
    /// it stops as [`RelayHandle::shutdown`] does, without a time limit), and
    /// returns its totals; an error if it ended on its own (see
    /// [`RelayHandle::stopped`]). For supervisors that own their tasks, e.g.
    /// in a `JoinSet`.
    ///
    /// ```no_run
    /// # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
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
        self.tasks(token, Arc::clone(&totals)).await?;
        Ok(totals.summary(true))
    }

    /// Starts the relay on a new tokio task. Must be called inside a tokio
    /// runtime.
    pub fn spawn(self) -> RelayHandle {
        let token = CancellationToken::new();
        let totals = Arc::new(Totals::default());
        let shutdown_timeout = self.config.shutdown_timeout;
        let tasks = self.tasks(token.clone(), Arc::clone(&totals));
        RelayHandle {
            task: Supervised::spawn(
                TaskName::new("relay"),
                token,
                shutdown_timeout,
                tasks,
                RelayError::Panicked,
            ),
            totals,
        }
    }
}

/// A running relay. Dropping the handle asks the relay to stop (like
/// [`shutdown`](Self::shutdown) without waiting).
#[derive(Debug)]
pub struct RelayHandle {
    task: Supervised<(), RelayError>,
    totals: Arc<Totals>,
}

impl RelayHandle {
    /// Stops claiming, lets the batch in flight finish (deliveries awaited and
    /// marked), releases the lanes and returns, within
    /// [`RelayBuilder::shutdown_timeout`](super::RelayBuilder::shutdown_timeout).
    /// Returns what the relay did (`clean` is `false` if it had to be
    /// aborted), or why it had stopped on its own: the same shape as
    /// [`ConsumerHandle::shutdown`](crate::consumer::ConsumerHandle::shutdown).
    ///
    /// ```no_run
    /// # async fn run(handle: txoutbox_runtime::relay::RelayHandle) -> Result<(), Box<dyn std::error::Error>> {
    /// let summary = handle.shutdown().await?;
    /// println!("published {} events in {} batches", summary.published, summary.batches);
    /// # Ok(()) }
    /// ```
    pub async fn shutdown(mut self) -> Result<RelaySummary, RelayError> {
        let ended = self.task.shutdown().await;
        self.summarize(ended)
    }

    /// Waits until the relay stops (after its token is cancelled, or on its
    /// own), without asking it to; returns as [`shutdown`](Self::shutdown)
    /// does (the same shape as [`ConsumerHandle::join`](crate::consumer::ConsumerHandle::join)).
    pub async fn join(mut self) -> Result<RelaySummary, RelayError> {
        let ended = self.task.join().await;
        self.summarize(ended)
    }

    fn summarize(&self, ended: Ended<(), RelayError>) -> Result<RelaySummary, RelayError> {
        match ended {
            Ended::Returned(Ok(())) => Ok(self.totals.summary(true)),
            Ended::Returned(Err(error)) => Err(error),
            Ended::Aborted => Ok(self.totals.summary(false)),
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
        self.task.stopped()
    }

    /// Whether the relay's task is still running.
    pub fn is_running(&self) -> bool {
        self.task.is_running()
    }

    pub(crate) fn lifecycle(&self) -> crate::lifecycle::Lifecycle {
        self.task.lifecycle()
    }

    /// The token that stops the relay, e.g. to tie it to a server's graceful
    /// shutdown (`axum::serve(..).with_graceful_shutdown(token.cancelled_owned())`)
    /// or to stop it from another task.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.task.token()
    }
}

/// The relay's loop and its scheduler, as one future: the scheduler
/// (moving due scheduled events into the outbox) runs next to the worker,
/// on the same task, and stops when the worker stops, whether it was asked
/// to or ended on its own (a panic of either ends both).
async fn tasks<B: Backend>(
    database: B,
    config: RelayConfig,
    publisher: Publisher,
    partitions: Partitions,
    cancel: CancellationToken,
    totals: Arc<Totals>,
) -> Result<(), RelayError> {
    // Woken by the commits of its own database in this process (and those
    // whose database the writer did not know).
    let wakeup_scope =
        txoutbox_core::__private::wakeup::Scope::of_database(database.database_name().as_deref());
    let scheduler = Scheduler::new(database.clone(), config.clone(), Arc::clone(&totals));
    let stop_scheduler = cancel.child_token();
    let remote = config.listen_notify.then(|| {
        let wake = Arc::new(tokio::sync::Notify::new());
        database.spawn_listener(Arc::clone(&wake), cancel.child_token());
        wake
    });
    let worker = Worker::new(
        database,
        config,
        publisher,
        partitions,
        totals,
        cancel,
        Wakeups::new(
            txoutbox_core::__private::wakeup::listener_in(wakeup_scope),
            remote,
        ),
    );
    let worker = async {
        let result = worker.run().await;
        stop_scheduler.cancel();
        result
    };
    let (result, ()) = tokio::join!(worker, scheduler.run(stop_scheduler.clone()));
    result
}
