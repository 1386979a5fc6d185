//! Building, running and supervising a consumer: the public lifecycle.

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use rdkafka::ClientConfig;
use rdkafka::consumer::StreamConsumer;
use tokio_util::sync::CancellationToken;

use super::client_context::KafkaContext;
use super::config::{Mode, Settings};
use super::dlq::DeadLetters;
use super::error::{BuildError, ConsumerError};
use super::handler::Dispatch;
use super::inbox;
use super::shared::Shared;
use super::summary::{ConsumerSummary, Totals};
use crate::lifecycle::{Ended, Stopped, Supervised, TaskName};

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
    task: Supervised<ConsumerSummary, ConsumerError>,
    totals: Arc<Totals>,
    group_id: String,
}

impl std::fmt::Debug for ConsumerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerHandle")
            .field("cancelled", &self.task.is_cancelled())
            .field("finished", &self.task.is_finished())
            .finish_non_exhaustive()
    }
}

impl ConsumerHandle {
    /// The token that stops the consumer; cancel it from anywhere.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.task.token()
    }

    /// Stops taking messages, finishes (or abandons, without storing its
    /// offsets) the batch in hand, commits the offsets of everything durably
    /// handled, and waits for the processors to finish their transactions,
    /// within [`ConsumerBuilder::shutdown_timeout`](super::ConsumerBuilder::shutdown_timeout)
    /// (then the task is aborted and `clean` is `false`).
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
        let ended = self.task.shutdown().await;
        self.summarize(ended)
    }

    /// Waits until the consumer stops (after its token is cancelled or on a
    /// fatal error), without asking it to. The handle is consumed but the
    /// token is not cancelled while this waits.
    pub async fn join(mut self) -> Result<ConsumerSummary, ConsumerError> {
        let ended = self.task.join().await;
        self.summarize(ended)
    }

    fn summarize(
        &self,
        ended: Ended<ConsumerSummary, ConsumerError>,
    ) -> Result<ConsumerSummary, ConsumerError> {
        match ended {
            Ended::Returned(result) => result,
            Ended::Aborted => Ok(self.totals.summary(false)),
        }
    }

    /// What the consumer did so far, while it runs.
    pub fn summary(&self) -> ConsumerSummary {
        self.totals.summary(true)
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
        self.task.stopped()
    }

    /// Whether the consumer's task (its receive loop and, in inbox mode, its
    /// processors) is still running.
    pub fn is_running(&self) -> bool {
        self.task.is_running()
    }

    /// The consumer's group id.
    pub fn group_id(&self) -> &str {
        &self.group_id
    }

    pub(crate) fn lifecycle(&self) -> crate::lifecycle::Lifecycle {
        self.task.lifecycle()
    }
}

impl Consumer {
    pub(crate) fn new(
        pool: super::database::Pool,
        kafka: ClientConfig,
        settings: Settings,
        dispatch: Dispatch,
    ) -> Result<Self, BuildError> {
        let dlq = DeadLetters::new(
            &kafka,
            settings.dlq_suffix.clone(),
            settings.group_id.clone(),
            settings.max_message_bytes,
        )?;
        let mut kafka = fetch_settings(&kafka);
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
        let totals = Arc::clone(&self.ctx.counts.totals);
        let name = TaskName::new("consumer").label("group", self.ctx.group());
        let shutdown_timeout = self.ctx.settings.shutdown_timeout;
        let group_id = self.ctx.group();
        let run = self.run(token.clone());
        ConsumerHandle {
            task: Supervised::spawn(name, token, shutdown_timeout, run, ConsumerError::Panicked),
            totals,
            group_id,
        }
    }

    /// Runs until `token` is cancelled, then shuts down gracefully. Returns
    /// an error if the consumer stopped on its own: its subscription failed,
    /// or an inbox processor or its periodic work ended (then the receive
    /// loop is stopped too, so that the process can be restarted whole
    /// rather than half-working). Returns what it did, as
    /// [`ConsumerHandle::shutdown`] does; unlike it, waits without a time
    /// limit.
    pub async fn run(self, token: CancellationToken) -> Result<ConsumerSummary, ConsumerError> {
        let ctx = self.ctx.clone();
        // Our own token also stops the processors and any retry waits.
        let stop = ctx.token.clone();
        let mut helpers = Helpers(self.helpers());
        let mut helper_ended: FuturesUnordered<_> =
            helpers.0.iter().map(|helper| helper.stopped()).collect();
        let receive = self.receive();
        tokio::pin!(receive);
        let mut failure = None;
        let result = loop {
            tokio::select! {
                result = &mut receive => break result,
                () = token.cancelled(), if !stop.is_cancelled() => stop.cancel(),
                Some(stopped) = helper_ended.next(), if failure.is_none() => {
                    // A helper ended although nobody asked it to: stop the
                    // whole consumer so that its supervisor notices.
                    if let Stopped::Failed(reason) = stopped {
                        tracing::error!(group = %ctx.settings.group_id, %reason, "stopping the consumer");
                        failure = Some(reason);
                        stop.cancel();
                    }
                }
            }
        };
        stop.cancel();
        // Together: each is bounded by the shutdown timeout, not their sum.
        let ended = futures::future::join_all(helpers.0.iter_mut().map(Supervised::shutdown)).await;
        for ended in ended {
            if let (Ended::Returned(Err(panic)), None) = (ended, &failure) {
                failure = Some(panic);
            }
        }
        result?;
        match failure {
            Some(reason) => Err(ConsumerError::Processor(reason)),
            None => Ok(ctx.counts.totals.summary(true)),
        }
    }

    /// The tasks beside the receive loop: the inbox processors, and the
    /// periodic work if any was registered; each stops with the consumer.
    fn helpers(&self) -> Vec<Supervised<(), String>> {
        let ctx = &self.ctx;
        let spawn = |name: TaskName, task: BoxFuture<'static, ()>| {
            Supervised::spawn(
                name.label("group", ctx.group()),
                ctx.token.child_token(),
                ctx.settings.shutdown_timeout,
                async move {
                    task.await;
                    Ok(())
                },
                |panic| panic,
            )
        };
        let mut helpers = Vec::new();
        if ctx.settings.mode == Mode::Inbox {
            for index in 0..ctx.settings.processors {
                let name =
                    TaskName::new("inbox_processor").called(format!("inbox processor {index}"));
                helpers.push(spawn(name, inbox::process(ctx.clone(), index).boxed()));
            }
        }
        if !ctx.settings.periodic.is_empty() {
            let name = TaskName::new("periodic").called("periodic work");
            helpers.push(spawn(name, periodic(ctx.clone()).boxed()));
        }
        helpers
    }
}

/// The consumer's helper tasks. If the consumer's own task is aborted (at
/// its shutdown timeout) they are aborted with it instead of running on,
/// e.g. a processor stuck in a handler that never returns.
struct Helpers(Vec<Supervised<(), String>>);

impl Drop for Helpers {
    fn drop(&mut self) {
        for helper in &mut self.0 {
            helper.abort();
        }
    }
}

/// Runs the consumer's periodic work every `backlog_interval` until the
/// consumer stops (a run in progress is dropped then).
async fn periodic(ctx: Arc<Shared>) {
    loop {
        for task in &ctx.settings.periodic {
            tokio::select! {
                () = ctx.token.cancelled() => return,
                ran = (task.run)(ctx.db.pool().clone()) => if let Err(error) = ran {
                    tracing::debug!(task = task.name, error = %txoutbox_core::DbErrorDisplay(&error), "periodic consumer work failed");
                },
            }
        }
        if !ctx.db.pause(ctx.settings.backlog_interval).await {
            return;
        }
    }
}

/// How long the broker may hold a fetch that found nothing new, unless the
/// user sets `fetch.wait.max.ms`: librdkafka's 500 ms suits brokers that
/// answer a held fetch as soon as a record arrives (Apache Kafka,
/// Redpanda), but a broker that holds it to the end (tansu, librdkafka's
/// mock cluster) then delays every record by up to that long. At 10 ms a
/// record waits at most 10 ms for such a broker, at the cost of up to 100
/// empty fetches a second per broker connection while idle. See
/// docs/consumer.md, "Latency and fetch settings".
pub(crate) const DEFAULT_FETCH_WAIT_MAX_MS: &str = "10";

/// Benchmarks only: the fetch settings of a consumer built from `user`,
/// for a bench's plain consumer. Not a public API.
#[cfg(feature = "test-hooks")]
pub fn fetch_settings_for_benchmark(user: &ClientConfig) -> ClientConfig {
    fetch_settings(user)
}

/// The user's settings with the consumer's fetch defaults where the user
/// set nothing.
pub(crate) fn fetch_settings(user: &ClientConfig) -> ClientConfig {
    let mut kafka = user.clone();
    if user.get("fetch.wait.max.ms").is_none() {
        kafka.set("fetch.wait.max.ms", DEFAULT_FETCH_WAIT_MAX_MS);
    }
    kafka
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fetch_wait_defaults_to_10_ms_unless_the_user_sets_it() {
        let config = fetch_settings(&ClientConfig::new());
        assert_eq!(
            config.get("fetch.wait.max.ms"),
            Some(DEFAULT_FETCH_WAIT_MAX_MS)
        );
        let mut user = ClientConfig::new();
        user.set("fetch.wait.max.ms", "500");
        assert_eq!(fetch_settings(&user).get("fetch.wait.max.ms"), Some("500"));
    }
}
