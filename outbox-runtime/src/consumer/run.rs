//! Building, running and supervising a consumer: the public lifecycle.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use rdkafka::ClientConfig;
use rdkafka::consumer::StreamConsumer;
use sqlx::PgPool;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::client_context::KafkaContext;
use super::config::{Mode, Settings};
use super::dlq::DeadLetters;
use super::error::{BuildError, ConsumerError};
use super::handler::Dispatch;
use super::inbox;
use super::shared::Shared;
use super::summary::{ConsumerSummary, Totals};
use crate::lifecycle::{Lifecycle, Stopped, panic_message};

/// A Kafka consumer that runs [`EventHandler`](super::EventHandler)s
/// idempotently. Build it with [`Consumer::builder`], run it with
/// [`spawn`](Self::spawn) or [`run`](Self::run).
pub struct Consumer {
    pub(crate) ctx: Arc<Shared>,
    pub(super) kafka: StreamConsumer<KafkaContext>,
}

/// Shows the group and the mode.
impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("group_id", &self.ctx.settings.group_id)
            .field("mode", &self.ctx.settings.mode)
            .finish_non_exhaustive()
    }
}

/// A spawned consumer. Call [`shutdown`](Self::shutdown) to stop it
/// gracefully, and watch [`stopped`](Self::stopped) to learn if it ends on
/// its own.
///
/// Dropping the handle cancels the consumer's token, as a relay's handle
/// does (like tokio-util's `DropGuard`): the consumer then stops as after
/// `shutdown`, in the background. Keep the handle for as long as the consumer
/// should run.
pub struct ConsumerHandle {
    token: CancellationToken,
    /// `None` once `shutdown` or `join` took it.
    task: Option<tokio::task::JoinHandle<Result<ConsumerSummary, ConsumerError>>>,
    totals: Arc<Totals>,
    lifecycle: Lifecycle,
}

impl std::fmt::Debug for ConsumerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerHandle")
            .field("cancelled", &self.token.is_cancelled())
            .field(
                "finished",
                &self.task.as_ref().is_none_or(|task| task.is_finished()),
            )
            .finish_non_exhaustive()
    }
}

impl Drop for ConsumerHandle {
    fn drop(&mut self) {
        // After `join`, the task has ended already: nothing to cancel.
        if self.task.is_some() {
            self.token.cancel();
        }
    }
}

impl ConsumerHandle {
    /// The token that stops the consumer; cancel it from anywhere.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.token.clone()
    }

    /// Stops taking messages, finishes (or abandons, without storing its
    /// offsets) the batch in hand, commits the offsets of everything durably
    /// handled, and waits for the processors to finish their transactions.
    /// Returns what the consumer did, or why it had stopped on its own
    /// (the same shape as [`RelayHandle::shutdown`](crate::relay::RelayHandle::shutdown)).
    ///
    /// ```no_run
    /// # async fn run(handle: txoutbox_runtime::consumer::ConsumerHandle) -> Result<(), Box<dyn std::error::Error>> {
    /// let summary = handle.shutdown().await?;
    /// println!("handled {} events, {} duplicates", summary.handled, summary.duplicates);
    /// # Ok(()) }
    /// ```
    pub async fn shutdown(mut self) -> Result<ConsumerSummary, ConsumerError> {
        self.token.cancel();
        self.take_task().await?
    }

    /// Waits until the consumer stops (after its token is cancelled or on a
    /// fatal error), without asking it to. The handle is consumed but the
    /// token is not cancelled while this waits.
    pub async fn join(mut self) -> Result<ConsumerSummary, ConsumerError> {
        self.take_task().await?
    }

    fn take_task(&mut self) -> tokio::task::JoinHandle<Result<ConsumerSummary, ConsumerError>> {
        self.task
            .take()
            .expect("the task is taken only by shutdown or join")
    }

    /// What the consumer did so far, while it runs.
    pub fn summary(&self) -> ConsumerSummary {
        self.totals.summary()
    }

    /// Resolves when the consumer's task has ended: [`Stopped::Requested`]
    /// after [`shutdown`](Self::shutdown) or its token was cancelled,
    /// [`Stopped::Failed`] if it ended on its own (its subscription failed,
    /// an inbox processor died, a panic outside a handler). A service should
    /// then exit so that it is restarted (see [`crate::lifecycle`]). Handler
    /// panics never end the consumer: they count as failed attempts of their
    /// event. Can be awaited any number of times, from any task.
    ///
    /// ```no_run
    /// # async fn run(consumer: txoutbox_runtime::consumer::ConsumerHandle) {
    /// let stopped = consumer.stopped().await;
    /// if stopped.is_failure() {
    ///     eprintln!("consumer {stopped}");
    ///     std::process::exit(1);
    /// }
    /// # }
    /// ```
    pub fn stopped(&self) -> impl std::future::Future<Output = Stopped> + Send + 'static {
        self.lifecycle.stopped()
    }

    /// Whether the consumer's task (its receive loop and, in inbox mode, its
    /// processors) is still running.
    pub fn is_running(&self) -> bool {
        self.lifecycle.current().is_none()
    }
}

impl Consumer {
    pub(crate) fn new(
        pool: PgPool,
        mut kafka: ClientConfig,
        settings: Settings,
        dispatch: Dispatch,
    ) -> Result<Self, BuildError> {
        let dlq = DeadLetters::new(
            &kafka,
            settings.dlq_suffix.clone(),
            settings.group_id.clone(),
            settings.max_message_bytes,
        )?;
        if kafka.get("auto.offset.reset").is_none() {
            kafka.set("auto.offset.reset", "earliest");
        }
        // Offsets are stored by us, after the database commit, and librdkafka
        // commits what was stored: periodically, on rebalance (revoke) and on
        // close. A commit per message would cost a broker round trip each.
        kafka
            .set("group.id", &settings.group_id)
            .set("enable.auto.commit", "true")
            .set("enable.auto.offset.store", "false");
        let needed = (settings.max_message_bytes + 64 * 1024).max(1_048_576);
        if kafka.get("fetch.message.max.bytes").is_none() {
            kafka.set("fetch.message.max.bytes", needed.to_string());
        }
        if kafka.get("statistics.interval.ms").is_none() {
            // Feeds the lag gauge (see `client_context.rs`).
            kafka.set("statistics.interval.ms", "10000");
        }
        let kafka: StreamConsumer<KafkaContext> =
            kafka.create_with_context(KafkaContext::new(settings.group_id.clone()))?;
        Ok(Self {
            ctx: Arc::new(Shared::new(pool, dispatch, settings, dlq)),
            kafka,
        })
    }

    /// The topics this consumer subscribes to (those of its handlers).
    pub fn topics(&self) -> Vec<&'static str> {
        self.ctx.dispatch.topics()
    }

    /// Runs the consumer on a new task.
    pub fn spawn(self) -> ConsumerHandle {
        let token = self.ctx.token.clone();
        let totals = Arc::clone(&self.ctx.totals);
        let lifecycle = Lifecycle::new();
        let labels = [("task", "consumer".to_owned()), ("group", self.ctx.group())];
        let task = tokio::spawn({
            let (lifecycle, token) = (lifecycle.clone(), token.clone());
            async move {
                let ended = AssertUnwindSafe(self.run(token.clone()))
                    .catch_unwind()
                    .await;
                let (stopped, result) = match ended {
                    Ok(Ok(summary)) if token.is_cancelled() => (Stopped::Requested, Ok(summary)),
                    Ok(Ok(summary)) => (
                        Stopped::Failed("the receive loop ended unexpectedly".into()),
                        Ok(summary),
                    ),
                    Ok(Err(error)) => (Stopped::Failed(error.to_string()), Err(error)),
                    Err(panic) => {
                        let message = panic_message(&*panic);
                        (
                            Stopped::Failed(format!("the consumer panicked: {message}")),
                            Err(ConsumerError::Panicked(message)),
                        )
                    }
                };
                lifecycle.finish(stopped, &labels);
                result
            }
        });
        ConsumerHandle {
            token,
            task: Some(task),
            totals,
            lifecycle,
        }
    }

    /// Runs until `token` is cancelled, then shuts down gracefully. Returns
    /// an error if the consumer stopped on its own: its subscription failed,
    /// or an inbox processor ended (then the receive loop is stopped too, so
    /// that the process can be restarted whole rather than half-working).
    /// Returns what it did, as [`ConsumerHandle::shutdown`] does.
    pub async fn run(self, token: CancellationToken) -> Result<ConsumerSummary, ConsumerError> {
        let ctx = self.ctx.clone();
        // Our own token also stops the processors and any retry waits.
        let stop = ctx.token.clone();
        let forward = {
            let stop = stop.clone();
            tokio::spawn(async move {
                token.cancelled().await;
                stop.cancel();
            })
        };
        let mut processors = JoinSet::new();
        if ctx.settings.mode == Mode::Inbox {
            for index in 0..ctx.settings.processors {
                let ctx = ctx.clone();
                processors.spawn(async move {
                    let ended = AssertUnwindSafe(inbox::process(ctx, index))
                        .catch_unwind()
                        .await;
                    (index, ended.map_err(|panic| panic_message(&*panic)))
                });
            }
        }
        let gauges = (!ctx.settings.periodic.is_empty()).then(|| {
            let ctx = ctx.clone();
            tokio::spawn(async move {
                loop {
                    for task in &ctx.settings.periodic {
                        if let Err(error) = (task.run)(ctx.pool.clone()).await {
                            tracing::debug!(task = task.name, error = %txoutbox_core::DbErrorDisplay(&error), "periodic consumer work failed");
                        }
                    }
                    tokio::select! {
                        _ = ctx.token.cancelled() => break,
                        _ = tokio::time::sleep(ctx.settings.backlog_interval) => {}
                    }
                }
            })
        });
        let receive = self.receive();
        tokio::pin!(receive);
        let mut failure = None;
        let result = loop {
            tokio::select! {
                result = &mut receive => break result,
                Some(joined) = processors.join_next(), if failure.is_none() => {
                    if stop.is_cancelled() {
                        continue;
                    }
                    // A processor ended although nobody asked it to: stop the
                    // whole consumer so that its supervisor notices.
                    let reason = match joined {
                        Ok((index, Ok(()))) => format!("inbox processor {index} ended unexpectedly"),
                        Ok((index, Err(panic))) => format!("inbox processor {index} panicked: {panic}"),
                        Err(error) => format!("an inbox processor task failed: {error}"),
                    };
                    metrics::counter!(
                        crate::lifecycle::TASKS_FAILED,
                        "task" => "inbox_processor",
                        "group" => ctx.group()
                    )
                    .increment(1);
                    tracing::error!(group = %ctx.settings.group_id, %reason, "stopping the consumer");
                    failure = Some(reason);
                    stop.cancel();
                }
            }
        };
        stop.cancel();
        forward.abort();
        if let Some(gauges) = gauges {
            gauges.abort();
        }
        while let Some(joined) = processors.join_next().await {
            if let (Ok((index, Err(panic))), None) = (joined, &failure) {
                failure = Some(format!("inbox processor {index} panicked: {panic}"));
            }
        }
        result?;
        match failure {
            Some(reason) => Err(ConsumerError::Processor(reason)),
            None => Ok(ctx.totals.summary()),
        }
    }
}
