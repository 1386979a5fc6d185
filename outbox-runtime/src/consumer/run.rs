//! The polling loop shared by both modes, offsets, and lifecycle.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::FutureExt;
use outbox_core::Events;
use rdkafka::consumer::{CommitMode, Consumer as _, StreamConsumer};
use rdkafka::message::OwnedMessage;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::config::{ConsumerBuilder, Mode, Settings};
use super::context::KafkaContext;
use super::dlq::DeadLetters;
use super::handler::{Dispatch, ErasedHandler, EventMeta, HandlerError};
use super::message::DeadLetterReason;
use super::{BuildError, ConsumerError, dedup, inbox, metric_names as m};
use crate::lifecycle::{Lifecycle, Stopped, panic_message};

/// A Kafka consumer that runs [`EventHandler`](super::EventHandler)s
/// idempotently. Build it with [`Consumer::builder`], run it with
/// [`spawn`](Self::spawn) or [`run`](Self::run).
pub struct Consumer {
    pub(crate) ctx: Arc<Ctx>,
    kafka: StreamConsumer<KafkaContext>,
}

/// State shared by the receiving loop and the inbox processors.
pub(crate) struct Ctx {
    pub(crate) pool: PgPool,
    pub(crate) dispatch: Dispatch,
    pub(crate) settings: Settings,
    pub(crate) dlq: DeadLetters,
    /// Wakes idle inbox processors when rows were stored.
    pub(crate) stored: Notify,
    pub(crate) token: CancellationToken,
    /// Set when a handler recorded outbox events that are not committed yet.
    pub(crate) events_recorded: AtomicBool,
}

/// A spawned consumer. Dropping it leaves the consumer running; call
/// [`shutdown`](Self::shutdown) to stop it gracefully, and watch
/// [`stopped`](Self::stopped) to learn if it ends on its own.
pub struct ConsumerHandle {
    token: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), ConsumerError>>,
    lifecycle: Lifecycle,
}

impl ConsumerHandle {
    /// The token that stops the consumer; cancel it from anywhere.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.token.clone()
    }

    /// Stops taking messages, finishes (or abandons, without storing its
    /// offsets) the batch in hand, commits the offsets of everything durably
    /// handled, and waits for the processors to finish their transactions.
    pub async fn shutdown(self) -> Result<(), ConsumerError> {
        self.token.cancel();
        self.task.await?
    }

    /// Waits until the consumer stops (after its token is cancelled or on a fatal error).
    pub async fn join(self) -> Result<(), ConsumerError> {
        self.task.await?
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
    /// # async fn run(consumer: outbox_runtime::consumer::ConsumerHandle) {
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
    /// Starts a builder: the pool for `processed_event` / `inbox_event` and your
    /// handlers' writes, the Kafka client configuration (at least
    /// `bootstrap.servers`), and the consumer group id, which is also the dedup
    /// scope in `processed_event`.
    pub fn builder(
        pool: PgPool,
        kafka_config: ClientConfig,
        group_id: impl Into<String>,
    ) -> ConsumerBuilder {
        ConsumerBuilder::new(pool, kafka_config, group_id.into())
    }

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
            // Feeds the lag gauge (see `context.rs`).
            kafka.set("statistics.interval.ms", "10000");
        }
        let kafka: StreamConsumer<KafkaContext> =
            kafka.create_with_context(KafkaContext::new(settings.group_id.clone()))?;
        Ok(Self {
            ctx: Arc::new(Ctx {
                pool,
                dispatch,
                settings,
                dlq,
                stored: Notify::new(),
                token: CancellationToken::new(),
                events_recorded: AtomicBool::new(false),
            }),
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
        let lifecycle = Lifecycle::new();
        let labels = [("task", "consumer".to_owned()), ("group", self.ctx.group())];
        let task = tokio::spawn({
            let (lifecycle, token) = (lifecycle.clone(), token.clone());
            async move {
                let ended = AssertUnwindSafe(self.run(token.clone()))
                    .catch_unwind()
                    .await;
                let (stopped, result) = match ended {
                    Ok(Ok(())) if token.is_cancelled() => (Stopped::Requested, Ok(())),
                    Ok(Ok(())) => (
                        Stopped::Failed("the receive loop ended unexpectedly".into()),
                        Ok(()),
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
            task,
            lifecycle,
        }
    }

    /// Runs until `token` is cancelled, then shuts down gracefully. Returns
    /// an error if the consumer stopped on its own: its subscription failed,
    /// or an inbox processor ended (then the receive loop is stopped too, so
    /// that the process can be restarted whole rather than half-working).
    pub async fn run(self, token: CancellationToken) -> Result<(), ConsumerError> {
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
        while let Some(joined) = processors.join_next().await {
            if let (Ok((index, Err(panic))), None) = (joined, &failure) {
                failure = Some(format!("inbox processor {index} panicked: {panic}"));
            }
        }
        result?;
        match failure {
            Some(reason) => Err(ConsumerError::Processor(reason)),
            None => Ok(()),
        }
    }

    async fn receive(self) -> Result<(), ConsumerError> {
        let ctx = &self.ctx;
        let topics = ctx.dispatch.topics();
        self.kafka
            .subscribe(&topics)
            .map_err(|source| ConsumerError::Subscribe {
                topics: topics.iter().map(|t| t.to_string()).collect(),
                source,
            })?;
        tracing::info!(group = %ctx.settings.group_id, ?topics, mode = ?ctx.settings.mode, "consumer started");
        let group = ctx.settings.group_id.clone();
        let mut positions = Positions::default();
        loop {
            let first = tokio::select! {
                biased;
                () = ctx.token.cancelled() => break,
                received = self.kafka.recv() => received,
            };
            let mut batch = Vec::with_capacity(ctx.settings.batch_size);
            match first {
                Ok(message) => batch.push(message.detach()),
                Err(error) => {
                    tracing::warn!(%error, "kafka consumer error");
                    continue;
                }
            }
            // A batch is what librdkafka has already fetched: never wait for more.
            while batch.len() < ctx.settings.batch_size {
                match self.kafka.recv().now_or_never() {
                    Some(Ok(message)) => batch.push(message.detach()),
                    Some(Err(error)) => tracing::warn!(%error, "kafka consumer error"),
                    None => break,
                }
            }
            positions.follow(self.kafka.context().rebalance_generation());
            let batch = self.check_offsets(&mut positions, batch);
            if batch.is_empty() {
                continue;
            }
            for message in &batch {
                metrics::counter!(m::CONSUMED, "group" => group.clone(), "topic" => message.topic().to_owned())
                    .increment(1);
            }
            let span =
                tracing::info_span!("outbox.consume_batch", group = %group, size = batch.len());
            let done = match ctx.settings.mode {
                Mode::Dedup => dedup::handle_batch(ctx, &batch).instrument(span).await,
                Mode::Inbox => inbox::store_batch(ctx, &batch).instrument(span).await,
            };
            let offsets = next_offsets(&batch, &done);
            if !offsets.is_empty() {
                self.store(&offsets);
            }
            if done.iter().any(|d| !d) {
                // Only a shutdown leaves messages unfinished. Their offsets stay
                // unstored, so they are redelivered to whoever consumes next.
                break;
            }
        }
        self.close();
        Ok(())
    }

    /// Notes every message's offset. With `refetch_offset_gaps`, a partition
    /// whose offsets jump is read again from the first missing offset (once
    /// per gap): its messages from the jump on are dropped from this batch,
    /// to come again, in order, after the seek.
    fn check_offsets(
        &self,
        positions: &mut Positions,
        batch: Vec<OwnedMessage>,
    ) -> Vec<OwnedMessage> {
        let group = &self.ctx.settings.group_id;
        let refetch = self.ctx.settings.refetch_offset_gaps;
        let mut cut: Vec<(String, i32)> = Vec::new();
        let mut kept = Vec::with_capacity(batch.len());
        for message in batch {
            let partition = (message.topic().to_owned(), message.partition());
            if cut.contains(&partition) {
                continue;
            }
            match positions.observe(group, &partition, message.offset(), refetch) {
                Seen::InOrder | Seen::GapAccepted => kept.push(message),
                Seen::GapToRefetch { expected } => {
                    let sought = self.kafka.seek(
                        &partition.0,
                        partition.1,
                        Offset::Offset(expected),
                        Duration::from_secs(10),
                    );
                    match sought {
                        Ok(()) => {
                            tracing::warn!(
                                group = %group,
                                topic = %partition.0,
                                partition = partition.1,
                                expected,
                                offset = message.offset(),
                                "offsets skipped by the broker: reading the partition again from {expected}"
                            );
                            positions.rewind(&partition, expected);
                            cut.push(partition);
                        }
                        Err(error) => {
                            tracing::warn!(%error, topic = %partition.0, partition = partition.1, "could not seek back over an offset gap; accepting it");
                            kept.push(message);
                        }
                    }
                }
            }
        }
        kept
    }

    fn store(&self, offsets: &HashMap<(String, i32), i64>) {
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), next) in offsets {
            if let Err(error) = tpl.add_partition_offset(topic, *partition, Offset::Offset(*next)) {
                tracing::warn!(%error, topic, partition, "cannot store offset");
            }
        }
        // Fails for partitions revoked meanwhile; their new owner redelivers and
        // the dedup table / inbox key absorbs the repeat.
        if let Err(error) = self.kafka.store_offsets(&tpl) {
            tracing::debug!(%error, "storing offsets failed (partition revoked?)");
        }
    }

    fn close(&self) {
        match self.kafka.commit_consumer_state(CommitMode::Sync) {
            Ok(()) => {}
            Err(rdkafka::error::KafkaError::ConsumerCommit(
                rdkafka::types::RDKafkaErrorCode::NoOffset,
            )) => {}
            Err(error) => tracing::warn!(%error, "final offset commit failed"),
        }
        self.kafka.unsubscribe();
        tracing::info!(group = %self.ctx.settings.group_id, "consumer stopped");
    }
}

/// The offset expected next in each partition, to notice gaps (see
/// [`m::OFFSET_GAPS`]). Forgotten at every rebalance: a partition assigned
/// again starts wherever its group committed.
#[derive(Default)]
struct Positions {
    generation: u64,
    next: HashMap<(String, i32), i64>,
    /// Per partition, the first missing offset of the gap already read again.
    refetched: HashMap<(String, i32), i64>,
}

/// What [`Positions::observe`] found.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    InOrder,
    /// Offsets were skipped; read the partition again from `expected`.
    GapToRefetch {
        expected: i64,
    },
    /// Offsets were skipped and stay skipped (already read again, or
    /// re-fetching is off).
    GapAccepted,
}

impl Positions {
    fn follow(&mut self, generation: u64) {
        if generation != self.generation {
            self.generation = generation;
            self.next.clear();
            self.refetched.clear();
        }
    }

    /// Notes the offset of a message received from `partition` (topic,
    /// partition number).
    fn observe(
        &mut self,
        group: &str,
        partition: &(String, i32),
        offset: i64,
        refetch: bool,
    ) -> Seen {
        let expected = self.next.get(partition).copied();
        let seen = match expected {
            Some(expected) if offset > expected => {
                record_gap(group, partition, expected, offset);
                if refetch && self.refetched.get(partition) != Some(&expected) {
                    // Read again from `expected` (the caller seeks and rewinds).
                    self.refetched.insert(partition.clone(), expected);
                    return Seen::GapToRefetch { expected };
                }
                self.refetched.remove(partition);
                Seen::GapAccepted
            }
            Some(expected) if offset == expected => {
                if self.refetched.remove(partition).is_some() {
                    tracing::warn!(
                        group,
                        topic = %partition.0,
                        partition = partition.1,
                        offset,
                        "the re-read found the offsets the broker had skipped"
                    );
                }
                Seen::InOrder
            }
            _ => Seen::InOrder,
        };
        self.rewind(partition, offset + 1);
        seen
    }

    /// Sets the offset expected next (also after a seek back to `expected`).
    fn rewind(&mut self, partition: &(String, i32), expected: i64) {
        match self.next.get_mut(partition) {
            Some(next) => *next = expected,
            None => {
                self.next.insert(partition.clone(), expected);
            }
        }
    }
}

/// Counts a gap and logs it at debug level (target `…::consumer::offsets`).
fn record_gap(group: &str, partition: &(String, i32), expected: i64, offset: i64) {
    metrics::counter!(
        m::OFFSET_GAPS,
        "group" => group.to_owned(),
        "topic" => partition.0.clone(),
        "partition" => partition.1.to_string()
    )
    .increment(1);
    tracing::debug!(
        target: "outbox_runtime::consumer::offsets",
        group,
        topic = %partition.0,
        partition = partition.1,
        expected,
        offset,
        "offset gap: the broker served offset {offset} after {}",
        expected - 1
    );
}

/// A message that does not reach a handler.
pub(crate) enum Aside {
    /// To the dead-letter topic.
    Dead(DeadLetterReason, String),
    /// No handler for this event type (the string; empty if none was named),
    /// skipped by policy.
    Skip(String),
}

/// Per partition, the offset after the last message of the unbroken run of
/// finished messages from the batch's start.
fn next_offsets(batch: &[OwnedMessage], done: &[bool]) -> HashMap<(String, i32), i64> {
    let mut next = HashMap::new();
    let mut blocked: Vec<(&str, i32)> = Vec::new();
    for (message, &done) in batch.iter().zip(done) {
        let key = (message.topic(), message.partition());
        if blocked.contains(&key) {
            continue;
        }
        if done {
            next.insert((key.0.to_owned(), key.1), message.offset() + 1);
        } else {
            blocked.push(key);
        }
    }
    next
}

impl Ctx {
    pub(crate) fn group(&self) -> String {
        self.settings.group_id.clone()
    }

    /// Sleeps `delay`; false if the consumer is shutting down.
    pub(crate) async fn pause(&self, delay: Duration) -> bool {
        tokio::select! {
            () = self.token.cancelled() => false,
            () = tokio::time::sleep(delay) => true,
        }
    }

    /// After a database error: counts it and waits before the next try.
    /// False if the consumer is shutting down.
    pub(crate) async fn db_failed(&self, error: &sqlx::Error, retry: &mut u32) -> bool {
        *retry += 1;
        metrics::counter!(m::DB_ERRORS, "group" => self.group()).increment(1);
        tracing::warn!(error = %outbox_core::DbErrorDisplay(error), retry = *retry, "database unavailable; pausing before retry");
        self.pause(self.settings.backoff(*retry)).await
    }

    /// After a commit of a handler's transaction: wakes the relay of this
    /// process if handlers recorded events. Best effort (processors share the
    /// flag, so one commit may take another's wake-up); the relay polls anyway.
    pub(crate) fn committed(&self) {
        if self.events_recorded.swap(false, Ordering::Relaxed) {
            outbox_core::wakeup::notify_committed();
        }
    }

    /// Whether the database answers; a handler error while it does not is an
    /// outage, not the event's fault, and must not use up the event's attempts.
    pub(crate) async fn db_reachable(&self) -> bool {
        let ping = sqlx::query("SELECT 1").execute(&self.pool);
        matches!(
            tokio::time::timeout(Duration::from_secs(5), ping).await,
            Ok(Ok(_))
        )
    }

    /// Runs the handler inside the producer's trace (from `traceparent`), then
    /// inserts the events it recorded into `outbox_event` in the same
    /// transaction. Callers call [`Ctx::committed`] after committing `tx`.
    pub(crate) async fn call(
        &self,
        handler: &dyn ErasedHandler,
        tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
        event: super::handler::Decoded,
        meta: &EventMeta,
    ) -> Result<(), HandlerError> {
        let span = tracing::debug_span!(
            "outbox.handle",
            handler = handler.name(),
            event_id = %meta.event_id,
            event_type = %meta.event_type,
        );
        let mut events = Events::new();
        let result = outbox_core::trace::with_traceparent(meta.traceparent.clone(), async {
            // A panic is this event's failure, not the consumer's: it is
            // caught, the transaction is rolled back by the caller, and the
            // attempt counts like any other failed one.
            AssertUnwindSafe(handler.call(tx, event, meta, &mut events))
                .catch_unwind()
                .await
                .unwrap_or_else(|panic| {
                    Err(HandlerError::new(format!(
                        "the handler panicked: {}",
                        panic_message(&*panic)
                    )))
                })?;
            if let Some(failure) = events.failure() {
                return Err(HandlerError::new(format!(
                    "an event the handler recorded cannot be stored: {failure}"
                )));
            }
            if !events.is_empty() {
                outbox_core::insert_records(tx, events.records())
                    .await
                    .map_err(|e| {
                        HandlerError::new(format!(
                            "storing recorded events: {}",
                            outbox_core::DbErrorDisplay(&e)
                        ))
                    })?;
                self.events_recorded.store(true, Ordering::Relaxed);
            }
            Ok(())
        })
        .instrument(span)
        .await;
        if let Err(error) = &result {
            metrics::counter!(m::HANDLER_ERRORS, "group" => self.group(), "event_type" => meta.event_type.clone())
                .increment(1);
            tracing::warn!(%error, handler = handler.name(), event_id = %meta.event_id, "handler failed");
        }
        result
    }

    /// Publishes to the dead-letter topic, retrying until the broker takes it.
    /// False if the consumer is shutting down first.
    pub(crate) async fn dead_letter(
        &self,
        message: &OwnedMessage,
        reason: DeadLetterReason,
        error: &str,
    ) -> bool {
        let mut retry = 0;
        loop {
            match self.dlq.publish(message, reason, error).await {
                Ok(()) => {
                    metrics::counter!(m::DEAD_LETTERED, "group" => self.group(), "topic" => message.topic().to_owned(), "reason" => reason.as_str())
                        .increment(1);
                    tracing::warn!(
                        topic = message.topic(),
                        partition = message.partition(),
                        offset = message.offset(),
                        %reason,
                        error,
                        "message dead-lettered"
                    );
                    return true;
                }
                Err(kafka) => {
                    retry += 1;
                    tracing::warn!(error = %kafka, dlq = %self.dlq.topic_for(message.topic()), "dead-letter publish failed; retrying");
                    if !self.pause(self.settings.backoff(retry)).await {
                        return false;
                    }
                }
            }
        }
    }

    /// Dead-letters or skips the messages set aside, in offset order, marking
    /// each finished; stops at the first one interrupted by shutdown.
    pub(crate) async fn set_aside(
        &self,
        batch: &[OwnedMessage],
        mut aside: Vec<(usize, Aside)>,
        done: &mut [bool],
    ) {
        aside.sort_by_key(|(index, _)| *index);
        for (index, what) in aside {
            let finished = match what {
                Aside::Dead(reason, error) => self.dead_letter(&batch[index], reason, &error).await,
                Aside::Skip(event_type) => {
                    metrics::counter!(m::UNKNOWN_SKIPPED, "group" => self.group(), "topic" => batch[index].topic().to_owned())
                        .increment(1);
                    tracing::debug!(
                        topic = batch[index].topic(),
                        event_type,
                        "no handler; skipped"
                    );
                    true
                }
            };
            if !finished {
                return;
            }
            done[index] = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::message::Timestamp;

    use super::*;

    fn message(topic: &str, partition: i32, offset: i64) -> OwnedMessage {
        OwnedMessage::new(
            None,
            None,
            topic.to_owned(),
            Timestamp::NotAvailable,
            partition,
            offset,
            None,
        )
    }

    #[test]
    fn offset_gaps_are_noticed_per_partition_and_forgotten_at_a_rebalance() {
        let key = ("a".to_owned(), 0);
        let mut positions = Positions::default();
        positions.follow(0);
        let seen: Vec<Seen> = [
            ("a", 0, 10),
            ("a", 0, 11),
            ("a", 1, 3),
            ("a", 0, 14),
            ("a", 1, 4),
        ]
        .iter()
        .map(|&(t, p, o)| positions.observe("g", &(t.to_owned(), p), o, false))
        .collect();
        use Seen::*;
        assert_eq!(seen, [InOrder, InOrder, InOrder, GapAccepted, InOrder]);
        // A redelivery (offset below the expected one) is not a gap.
        assert_eq!(positions.observe("g", &key, 12, false), InOrder);
        assert_eq!(positions.observe("g", &key, 13, false), InOrder);
        // After a rebalance the partition may resume anywhere.
        positions.follow(1);
        assert_eq!(positions.observe("g", &key, 40, false), InOrder);
        assert_eq!(positions.observe("g", &key, 42, false), GapAccepted);
    }

    #[test]
    fn a_gap_is_read_again_once_then_accepted() {
        let key = ("a".to_owned(), 0);
        let mut positions = Positions::default();
        assert_eq!(positions.observe("g", &key, 5, true), Seen::InOrder);
        // 6 and 7 skipped: read again from 6.
        assert_eq!(
            positions.observe("g", &key, 8, true),
            Seen::GapToRefetch { expected: 6 }
        );
        positions.rewind(&key, 6);
        // The re-read brings them (the broker was late): in order, the gap closed.
        for offset in 6..=8 {
            assert_eq!(positions.observe("g", &key, offset, true), Seen::InOrder);
        }
        // A real gap (a transaction marker at 9): re-read once, then accepted.
        assert_eq!(
            positions.observe("g", &key, 10, true),
            Seen::GapToRefetch { expected: 9 }
        );
        positions.rewind(&key, 9);
        assert_eq!(positions.observe("g", &key, 10, true), Seen::GapAccepted);
        assert_eq!(positions.observe("g", &key, 11, true), Seen::InOrder);
        // The next gap is read again as well.
        assert_eq!(
            positions.observe("g", &key, 13, true),
            Seen::GapToRefetch { expected: 12 }
        );
    }

    #[test]
    fn offsets_stop_at_the_first_unfinished_message_of_each_partition() {
        let batch = [
            message("a", 0, 10),
            message("a", 1, 5),
            message("a", 0, 11),
            message("a", 1, 6),
            message("a", 0, 12),
            message("b", 0, 3),
        ];
        let done = [true, false, true, true, false, true];
        let next = next_offsets(&batch, &done);
        let mut next: Vec<_> = next.into_iter().collect();
        next.sort();
        // a/0: 10 and 11 done, 12 not: next is 12. a/1: 5 not done, so 6 must
        // not be committed either. b/0: 3 done.
        assert_eq!(
            next,
            vec![(("a".to_owned(), 0), 12), (("b".to_owned(), 0), 4)]
        );
    }
}
