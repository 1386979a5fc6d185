//! The outbox tasks of one service, watched and stopped as one.
//!
//! A service typically runs one relay (publishing its outbox) and one or
//! more consumers. [`Service`] holds their handles: [`Service::stopped`]
//! resolves when the first of them ends (with which one and why),
//! [`Service::status`] feeds a liveness probe, and [`Service::shutdown`]
//! stops them in the right order: the consumers first (the events their last
//! handlers record are still published), then the relays, each within its
//! own shutdown timeout.
//!
//! ```no_run
//! # async fn run(pool: sqlx::PgPool, kafka: rdkafka::ClientConfig)
//! #     -> Result<(), Box<dyn std::error::Error>> {
//! use txoutbox_runtime::consumer::Consumer;
//! use txoutbox_runtime::relay::Relay;
//! use txoutbox_runtime::service::Service;
//!
//! let service = Service::new()
//!     .relay(Relay::builder(pool.clone(), kafka.clone()).spawn()?)
//!     .consumer(Consumer::builder(pool, kafka, "billing").build()?.spawn());
//! let failed = tokio::select! {
//!     _ = tokio::signal::ctrl_c() => None,
//!     stopped = service.stopped() => Some(stopped),
//! };
//! service.shutdown().await?;
//! if let Some(stopped) = failed {
//!     eprintln!("{stopped}");
//!     std::process::exit(1);
//! }
//! # Ok(()) }
//! ```

use std::future::Future;

use futures::future::{FutureExt, join_all, select_all};

use crate::consumer::{ConsumerError, ConsumerHandle};
use crate::lifecycle::{Lifecycle, Stopped};
use crate::relay::{RelayError, RelayHandle};

/// The relays and consumers of one service (see the [module](self)).
/// Dropping it drops their handles, which asks each to stop.
#[derive(Debug, Default)]
pub struct Service {
    relays: Vec<(String, RelayHandle)>,
    consumers: Vec<(String, ConsumerHandle)>,
}

/// Why [`Service::shutdown`] could not stop every task cleanly: the first
/// task, in shutdown order, that had stopped on its own (the others are
/// logged).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// A relay had failed.
    #[error("{name}: {source}")]
    Relay {
        /// The task's name, as [`TaskState::name`].
        name: String,
        /// Its error.
        #[source]
        source: RelayError,
    },
    /// A consumer had failed.
    #[error("{name}: {source}")]
    Consumer {
        /// The task's name, as [`TaskState::name`].
        name: String,
        /// Its error.
        #[source]
        source: ConsumerError,
    },
}

/// What a liveness probe reads: the state of each of a service's tasks.
/// Cheap to clone; it watches the tasks and does not keep them running.
#[derive(Debug, Clone)]
pub struct ServiceStatus {
    tasks: Vec<(String, Lifecycle)>,
}

/// One task of a [`ServiceStatus`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TaskState {
    /// `relay` (`relay 2`... for more than one) or `consumer <group>`.
    pub name: String,
    /// How it ended; `None` while it runs.
    pub stopped: Option<Stopped>,
}

impl Service {
    /// No tasks yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a relay, named `relay` (the second one `relay 2`, and so on).
    pub fn relay(mut self, relay: RelayHandle) -> Self {
        let name = match self.relays.len() {
            0 => "relay".to_owned(),
            n => format!("relay {}", n + 1),
        };
        self.relays.push((name, relay));
        self
    }

    /// Adds a consumer, named `consumer <group id>`.
    pub fn consumer(mut self, consumer: ConsumerHandle) -> Self {
        let name = format!("consumer {}", consumer.group_id());
        self.consumers.push((name, consumer));
        self
    }

    /// Resolves when the first task ends: [`Stopped::Failed`] with the
    /// task's name before its reason if it ended on its own (the service
    /// should exit non-zero so that it is restarted), [`Stopped::Requested`]
    /// if its token was cancelled. Never resolves for an empty service.
    pub fn stopped(&self) -> impl Future<Output = Stopped> + Send + 'static {
        let watched: Vec<_> = self
            .status()
            .tasks
            .into_iter()
            .map(|(name, lifecycle)| {
                let stopped = lifecycle.stopped();
                async move {
                    match stopped.await {
                        Stopped::Failed(reason) => Stopped::Failed(format!("{name}: {reason}")),
                        requested => requested,
                    }
                }
                .boxed()
            })
            .collect();
        async move {
            if watched.is_empty() {
                std::future::pending::<()>().await;
            }
            select_all(watched).await.0
        }
    }

    /// The state of each task, for a liveness probe.
    pub fn status(&self) -> ServiceStatus {
        let relays = self
            .relays
            .iter()
            .map(|(name, relay)| (name.clone(), relay.lifecycle()));
        let consumers = self
            .consumers
            .iter()
            .map(|(name, consumer)| (name.clone(), consumer.lifecycle()));
        ServiceStatus {
            tasks: relays.chain(consumers).collect(),
        }
    }

    /// Stops the consumers (together), then the relays (together), each as
    /// its handle's `shutdown` does, within its own shutdown timeout; logs
    /// what each did. Returns the first error of a task that had stopped on
    /// its own.
    pub async fn shutdown(self) -> Result<(), ServiceError> {
        let mut first = None;
        let consumers = join_all(
            self.consumers
                .into_iter()
                .map(|(name, consumer)| async move { (name, consumer.shutdown().await) }),
        )
        .await;
        for (name, result) in consumers {
            match result {
                Ok(summary) => tracing::info!(
                    task = %name,
                    handled = summary.handled,
                    duplicates = summary.duplicates,
                    dead_lettered = summary.dead_lettered,
                    clean = summary.clean,
                    "stopped"
                ),
                Err(source) => {
                    tracing::error!(task = %name, error = %source, "had stopped on its own");
                    first.get_or_insert(ServiceError::Consumer { name, source });
                }
            }
        }
        let relays = join_all(
            self.relays
                .into_iter()
                .map(|(name, relay)| async move { (name, relay.shutdown().await) }),
        )
        .await;
        for (name, result) in relays {
            match result {
                Ok(summary) => tracing::info!(
                    task = %name,
                    published = summary.published,
                    parked = summary.parked,
                    clean = summary.clean,
                    "stopped"
                ),
                Err(source) => {
                    tracing::error!(task = %name, error = %source, "had stopped on its own");
                    first.get_or_insert(ServiceError::Relay { name, source });
                }
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl ServiceStatus {
    /// Every task with its state, relays first.
    pub fn tasks(&self) -> Vec<TaskState> {
        self.tasks
            .iter()
            .map(|(name, lifecycle)| TaskState {
                name: name.clone(),
                stopped: lifecycle.current(),
            })
            .collect()
    }

    /// Whether every task still runs.
    pub fn is_live(&self) -> bool {
        self.tasks
            .iter()
            .all(|(_, lifecycle)| lifecycle.current().is_none())
    }
}
