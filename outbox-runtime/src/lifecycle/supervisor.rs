//! The one supervisor of the runtime's background tasks: relays, consumers,
//! inbox processors and periodic work all run under it.
//!
//! A supervised task is spawned with its own cancellation token; its panics
//! are caught and turned into the task's error; how it ended is published
//! once (the [`Lifecycle`] its handle watches) and, for a failure, counted
//! and logged; its handle cancels the token when dropped; and stopping it is
//! bounded: after the shutdown timeout the task is aborted.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{Lifecycle, Stopped, panic_message};

/// Runs `task`, turning a panic into `Err` with the panic's text.
pub(crate) async fn catch<T>(task: impl Future<Output = T>) -> Result<T, String> {
    AssertUnwindSafe(task)
        .catch_unwind()
        .await
        .map_err(|panic| panic_message(&*panic))
}

/// What a supervised task is called, in its metrics and messages.
#[derive(Debug, Clone)]
pub(crate) struct TaskName {
    /// `relay`, `consumer`, `inbox_processor`...: the `task` label.
    kind: &'static str,
    /// How messages name it (`inbox processor 1`); the kind by default.
    called: String,
    /// More labels (a consumer's `group`).
    labels: Vec<(&'static str, String)>,
}

impl TaskName {
    pub(crate) fn new(kind: &'static str) -> Self {
        Self {
            kind,
            called: kind.to_owned(),
            labels: Vec::new(),
        }
    }

    /// How messages name the task.
    pub(crate) fn called(mut self, called: impl Into<String>) -> Self {
        self.called = called.into();
        self
    }

    pub(crate) fn label(mut self, key: &'static str, value: impl Into<String>) -> Self {
        self.labels.push((key, value.into()));
        self
    }

    fn all_labels(&self) -> Vec<(&'static str, String)> {
        let mut labels = vec![("task", self.kind.to_owned())];
        labels.extend(self.labels.iter().cloned());
        labels
    }
}

/// A spawned task under supervision, and the means to stop it.
///
/// Dropping it cancels the task's token (like tokio-util's `DropGuard`):
/// the task then stops as after [`shutdown`](Self::shutdown), in the
/// background.
#[derive(Debug)]
pub(crate) struct Supervised<T, E> {
    token: CancellationToken,
    /// `None` once `shutdown` or `join` took it.
    task: Option<JoinHandle<Result<T, E>>>,
    lifecycle: Lifecycle,
    shutdown_timeout: Duration,
    /// How messages name the task.
    called: String,
}

/// How a supervised task's end came out for the caller of `shutdown` or
/// `join`.
#[derive(Debug)]
pub(crate) enum Ended<T, E> {
    /// It returned.
    Returned(Result<T, E>),
    /// It had to be aborted at the shutdown timeout (or the runtime
    /// cancelled it).
    Aborted,
}

impl<T, E> Supervised<T, E>
where
    T: Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    /// Spawns `task`, which must stop soon after `token` is cancelled.
    /// `panicked` makes the task's error out of a caught panic's text.
    /// Must be called inside a tokio runtime.
    pub(crate) fn spawn(
        name: TaskName,
        token: CancellationToken,
        shutdown_timeout: Duration,
        task: impl Future<Output = Result<T, E>> + Send + 'static,
        panicked: fn(String) -> E,
    ) -> Self {
        let lifecycle = Lifecycle::new();
        let called = name.called.clone();
        let task = tokio::spawn({
            let (lifecycle, token) = (lifecycle.clone(), token.clone());
            async move {
                let (stopped, result) = match catch(task).await {
                    Ok(Ok(value)) if token.is_cancelled() => (Stopped::Requested, Ok(value)),
                    Ok(Ok(value)) => (
                        Stopped::Failed(format!("the {} ended unexpectedly", name.called)),
                        Ok(value),
                    ),
                    Ok(Err(error)) => (Stopped::Failed(error.to_string()), Err(error)),
                    Err(message) => (
                        Stopped::Failed(format!("the {} panicked: {message}", name.called)),
                        Err(panicked(message)),
                    ),
                };
                lifecycle.finish(stopped, &name.all_labels());
                result
            }
        });
        Self {
            token,
            task: Some(task),
            lifecycle,
            shutdown_timeout,
            called,
        }
    }

    /// Cancels the task's token and waits for it to end, at most the
    /// shutdown timeout; then aborts it.
    pub(crate) async fn shutdown(&mut self) -> Ended<T, E> {
        self.token.cancel();
        // The task stays in `self` while this waits: if this future is
        // dropped (its caller aborted), `abort` can still reach it.
        let waited = match self.task.as_mut() {
            Some(task) => tokio::time::timeout(self.shutdown_timeout, task).await,
            None => return Ended::Aborted,
        };
        let task = self.task.take().expect("present while waited for");
        let ended = match waited {
            Ok(Ok(result)) => Ended::Returned(result),
            Ok(Err(_cancelled)) => Ended::Aborted,
            Err(_elapsed) => {
                tracing::warn!(
                    task = %self.called,
                    timeout = ?self.shutdown_timeout,
                    "did not stop within its shutdown timeout; aborted (what it had not \
                     committed is done again after the restart)"
                );
                task.abort();
                Ended::Aborted
            }
        };
        self.lifecycle.finish(Stopped::Requested, &[]);
        ended
    }

    /// Waits for the task to end without asking it to.
    pub(crate) async fn join(&mut self) -> Ended<T, E> {
        let joined = match self.task.as_mut() {
            Some(task) => task.await,
            None => return Ended::Aborted,
        };
        self.task = None;
        match joined {
            Ok(result) => Ended::Returned(result),
            Err(_cancelled) => Ended::Aborted,
        }
    }

    /// Aborts the task if it still runs (for a supervisor that is itself
    /// being aborted: its tasks must not outlive it).
    pub(crate) fn abort(&mut self) {
        if let Some(task) = self.task.take() {
            self.token.cancel();
            task.abort();
        }
    }

    /// The task's token.
    pub(crate) fn token(&self) -> CancellationToken {
        self.token.clone()
    }

    /// Whether the token was cancelled.
    pub(crate) fn is_cancelled(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Whether the task was taken by `shutdown` or `join`, or has ended.
    pub(crate) fn is_finished(&self) -> bool {
        self.task.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Resolves when the task has ended.
    pub(crate) fn stopped(&self) -> impl Future<Output = Stopped> + Send + 'static {
        self.lifecycle.stopped()
    }

    /// The state the task publishes, for watchers that outlive the handle.
    pub(crate) fn lifecycle(&self) -> Lifecycle {
        self.lifecycle.clone()
    }

    /// Whether the task still runs.
    pub(crate) fn is_running(&self) -> bool {
        self.lifecycle.current().is_none()
    }
}

impl<T, E> Drop for Supervised<T, E> {
    fn drop(&mut self) {
        // After `join`, the task has ended already: nothing to cancel.
        if self.task.is_some() {
            self.token.cancel();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spawn(
        task: impl Future<Output = Result<u32, String>> + Send + 'static,
        token: CancellationToken,
        timeout: Duration,
    ) -> Supervised<u32, String> {
        Supervised::spawn(TaskName::new("test"), token, timeout, task, |m| m)
    }

    #[tokio::test]
    async fn a_requested_stop_returns_the_value() {
        let token = CancellationToken::new();
        let stop = token.clone();
        let mut task = spawn(
            async move {
                stop.cancelled().await;
                Ok(7)
            },
            token,
            Duration::from_secs(5),
        );
        let stopped = task.stopped();
        assert!(task.is_running());
        assert!(matches!(task.shutdown().await, Ended::Returned(Ok(7))));
        assert_eq!(stopped.await, Stopped::Requested);
    }

    #[tokio::test]
    async fn a_panic_is_the_tasks_error_and_a_failure() {
        let mut task = spawn(
            async { panic!("at the disco") },
            CancellationToken::new(),
            Duration::from_secs(5),
        );
        assert_eq!(
            task.stopped().await,
            Stopped::Failed("the test panicked: at the disco".into())
        );
        match task.join().await {
            Ended::Returned(Err(message)) => assert_eq!(message, "at the disco"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn ending_unasked_is_a_failure() {
        let task = spawn(
            async { Ok(1) },
            CancellationToken::new(),
            Duration::from_secs(5),
        );
        assert_eq!(
            task.stopped().await,
            Stopped::Failed("the test ended unexpectedly".into())
        );
    }

    #[tokio::test]
    async fn shutdown_is_bounded() {
        let mut task = spawn(
            std::future::pending(),
            CancellationToken::new(),
            Duration::from_millis(50),
        );
        let started = std::time::Instant::now();
        assert!(matches!(task.shutdown().await, Ended::Aborted));
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(task.stopped().await, Stopped::Requested);
    }

    #[tokio::test]
    async fn dropping_the_handle_cancels_the_token() {
        let token = CancellationToken::new();
        let watched = token.clone();
        drop(spawn(std::future::pending(), token, Duration::from_secs(5)));
        assert!(watched.is_cancelled());
    }
}
