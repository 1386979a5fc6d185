//! How a relay's or consumer's background task ended, for supervisors.
//!
//! A service runs the relay and its consumers as tokio tasks. If one of them
//! ends while the service did not ask it to (a bug in the framework, a
//! configuration the running fleet refuses, a panic outside a handler), the
//! service is no longer doing its job and should exit so that its
//! orchestrator restarts it. [`RelayHandle::stopped`](crate::relay::RelayHandle::stopped)
//! and [`ConsumerHandle::stopped`](crate::consumer::ConsumerHandle::stopped)
//! resolve when the task ended, with a [`Stopped`] that tells a requested stop
//! from a failure:
//!
//! ```no_run
//! # async fn run(relay: txoutbox_runtime::relay::RelayHandle,
//! #              consumer: txoutbox_runtime::consumer::ConsumerHandle) -> std::process::ExitCode {
//! use txoutbox_runtime::lifecycle::Stopped;
//!
//! let failed = tokio::select! {
//!     _ = tokio::signal::ctrl_c() => None,
//!     stopped = relay.stopped() => Some(("relay", stopped)),
//!     stopped = consumer.stopped() => Some(("consumer", stopped)),
//! };
//! let _ = consumer.shutdown().await;
//! let _ = relay.shutdown().await;
//! match failed {
//!     Some((task, Stopped::Failed(reason))) => {
//!         eprintln!("the {task} stopped: {reason}");
//!         std::process::ExitCode::FAILURE
//!     }
//!     _ => std::process::ExitCode::SUCCESS,
//! }
//! # }
//! ```
//!
//! Each failure is also counted in [`TASKS_FAILED`] and logged at error level.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;

mod supervisor;

pub(crate) use supervisor::{Ended, Supervised, TaskName, catch};

/// Counter: background tasks that ended without being asked to (label
/// `task`: `relay`, `consumer`, `inbox_processor` or `periodic` (a
/// consumer's periodic work, such as the saga gauges); consumer tasks also
/// carry `group`). Any increase means a service lost part of its work until
/// it is restarted.
pub const TASKS_FAILED: &str = "outbox_tasks_failed_total";

/// How a background task ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stopped {
    /// It was asked to stop: `shutdown`, its cancellation token, or its
    /// handle dropped.
    Requested,
    /// It ended on its own; the text says why (an error or a panic message).
    Failed(String),
}

impl Stopped {
    /// Whether the task ended without being asked to.
    ///
    /// ```
    /// use txoutbox_runtime::lifecycle::Stopped;
    /// assert!(Stopped::Failed("boom".into()).is_failure());
    /// assert!(!Stopped::Requested.is_failure());
    /// ```
    pub fn is_failure(&self) -> bool {
        matches!(self, Self::Failed(_))
    }
}

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Requested => f.write_str("stopped on request"),
            Self::Failed(reason) => write!(f, "failed: {reason}"),
        }
    }
}

/// The state a task publishes and its handle watches.
#[derive(Debug, Clone)]
pub(crate) struct Lifecycle {
    state: Arc<watch::Sender<Option<Stopped>>>,
}

impl Lifecycle {
    pub(crate) fn new() -> Self {
        Self {
            state: Arc::new(watch::Sender::new(None)),
        }
    }

    /// Records how the task ended (the first call wins) and, for a failure,
    /// counts and logs it.
    pub(crate) fn finish(&self, stopped: Stopped, labels: &[(&'static str, String)]) {
        if let Stopped::Failed(reason) = &stopped {
            let labels: Vec<metrics::Label> = labels
                .iter()
                .map(|(key, value)| metrics::Label::new(*key, value.clone()))
                .collect();
            metrics::counter!(TASKS_FAILED, labels.clone()).increment(1);
            tracing::error!(
                labels = ?labels.iter().map(|l| format!("{}={}", l.key(), l.value())).collect::<Vec<_>>(),
                reason,
                "an outbox background task stopped on its own; the service should be restarted"
            );
        }
        self.state.send_if_modified(|state| {
            if state.is_some() {
                return false;
            }
            *state = Some(stopped);
            true
        });
    }

    /// How the task ended, if it has.
    pub(crate) fn current(&self) -> Option<Stopped> {
        self.state.borrow().clone()
    }

    /// Resolves when the task has ended.
    pub(crate) fn stopped(&self) -> impl Future<Output = Stopped> + Send + 'static {
        let mut receiver = self.state.subscribe();
        async move {
            match receiver.wait_for(Option::is_some).await {
                Ok(state) => state.clone().expect("waited for Some"),
                // The task and its lifecycle are gone without a word: only
                // possible if the runtime dropped the task (shutting down).
                Err(_) => Stopped::Failed("the task was dropped by the runtime".into()),
            }
        }
    }
}

/// The text of a caught panic's payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&'static str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic with a non-text payload".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_first_ending_wins_and_every_watcher_sees_it() {
        let lifecycle = Lifecycle::new();
        let early = lifecycle.stopped();
        assert_eq!(lifecycle.current(), None);
        lifecycle.finish(Stopped::Failed("boom".into()), &[("task", "relay".into())]);
        lifecycle.finish(Stopped::Requested, &[]);
        assert_eq!(early.await, Stopped::Failed("boom".into()));
        assert_eq!(lifecycle.stopped().await, Stopped::Failed("boom".into()));
        assert_eq!(lifecycle.current(), Some(Stopped::Failed("boom".into())));
    }

    #[test]
    fn panic_payloads_become_text() {
        let caught = std::panic::catch_unwind(|| panic!("at {}", 3)).unwrap_err();
        assert_eq!(panic_message(&*caught), "at 3");
        let caught = std::panic::catch_unwind(|| panic!("static")).unwrap_err();
        assert_eq!(panic_message(&*caught), "static");
    }
}
