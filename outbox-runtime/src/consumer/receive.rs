//! The receive loop: take what librdkafka fetched, check its offsets, hand
//! it in batches to the mode (dedup: handle; inbox: store), and store the
//! offsets of what is finished.
//!
//! Batches of different partitions run at once, each in its own transaction,
//! up to [`concurrent_batches`](super::ConsumerBuilder::concurrent_batches):
//! a slow batch holds its own partitions only. A partition has one batch in
//! flight at a time; what it receives meanwhile waits for that batch to end
//! (see [`Progress`]), so its messages are taken in offset order.
//!
//! Two kinds of work run beside the batches, on tasks of their own, so that
//! neither ever holds a partition but its own: the next attempts of an event
//! whose handler failed (dedup mode; its partition is paused meanwhile and
//! its later messages wait), and the dead letters, published one at a time
//! per partition, in offset order. Whatever they have not finished keeps
//! its partition's stored offset below it (see [`Progress`]).

use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use rdkafka::consumer::{CommitMode, Consumer as _};
use rdkafka::message::OwnedMessage;
use rdkafka::{Message, Offset, TopicPartitionList};
use tokio::task::JoinSet;
use tracing::Instrument;

use super::config::Mode;
use super::dead_letter::{Settled, dead_letter};
use super::dedup::Attempted;
use super::error::ConsumerError;
use super::offsets::{Positions, Seen};
use super::progress::{DeadLetter, NextBatch, PartitionId, Progress, Taken, size_of};
use super::run::Consumer;
use super::work::Retry;
use super::{dedup, inbox, telemetry as m};
use crate::wire::dead_letter::DeadLetterReason;

/// What a task beside the batches reports when it ends.
enum Side {
    /// One more attempt of a partition's retried event.
    Attempted {
        partition: PartitionId,
        epoch: u64,
        retry: Box<Retry>,
        outcome: Attempted,
    },
    /// A dead letter published or parked.
    DeadLettered {
        partition: PartitionId,
        epoch: u64,
        offset: i64,
        settled: Settled,
    },
}

/// A batch that ran through the mode: its messages, the epoch of each of
/// its partitions when it started, and what the mode decided.
struct Ended {
    messages: Vec<OwnedMessage>,
    partitions: Vec<(PartitionId, u64)>,
    taken: Taken,
}

/// The receive loop's state.
struct Receiver<'a> {
    consumer: &'a Consumer,
    progress: Progress,
    /// The batches running through the mode, at most `concurrent_batches`,
    /// no two of one partition.
    in_flight: FuturesUnordered<BoxFuture<'a, Ended>>,
    side: JoinSet<Side>,
    positions: Positions,
}

impl Consumer {
    pub(super) async fn receive(self) -> Result<(), ConsumerError> {
        let ctx = &self.ctx;
        let topics = ctx.dispatch.topics();
        match ctx.dlq.missing(&topics).await {
            Some(missing) if !missing.is_empty() => {
                if !ctx.settings.create_missing_dlq_topics {
                    return Err(ConsumerError::MissingDeadLetterTopics { topics: missing });
                }
                ctx.dlq.create(&missing).await?;
                tracing::info!(topics = ?missing, "created the missing dead-letter topics");
            }
            Some(_) => {}
            None => tracing::warn!(
                "could not check that the dead-letter topics exist (broker unreachable); starting anyway"
            ),
        }
        self.kafka
            .subscribe(&topics)
            .map_err(|source| ConsumerError::Subscribe {
                topics: topics.iter().map(|t| t.to_string()).collect(),
                source,
            })?;
        tracing::info!(group = %ctx.settings.group_id, ?topics, mode = ?ctx.settings.mode, "consumer started");
        let mut receiver = Receiver {
            consumer: &self,
            progress: Progress::default(),
            in_flight: FuturesUnordered::new(),
            side: JoinSet::new(),
            positions: Positions::default(),
        };
        receiver.run().await;
        // Side tasks still running are abandoned with their offsets unstored.
        receiver.side.abort_all();
        self.close();
        Ok(())
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

impl<'a> Receiver<'a> {
    /// Until shutdown; then waits for the batches in flight to end (each
    /// commits or, interrupted, abandons its messages unfinished) and stores
    /// the offsets of what is finished.
    async fn run(&mut self) {
        let ctx = &self.consumer.ctx;
        let settings = &ctx.settings;
        loop {
            let next_due = self.progress.next_due();
            // Nothing more is taken from librdkafka while every batch slot
            // is taken. Otherwise only busy (or blocked) partitions keep
            // what they receive waiting, and each is paused once a batch's
            // worth waits (see `apply_pauses`).
            let room = self.in_flight.len() < settings.concurrent_batches;
            let running = tokio::select! {
                biased;
                () = ctx.token.cancelled() => false,
                Some(ended) = self.in_flight.next() => self.end(ended),
                Some(joined) = self.side.join_next() => match joined {
                    Ok(side) => self.settle(side),
                    // A side task panicked or was aborted: its message stays
                    // unfinished (its offset unstored) until a redelivery.
                    Err(error) => {
                        tracing::error!(%error, "a consumer side task failed");
                        true
                    }
                },
                () = sleep_until(next_due), if next_due.is_some() => {
                    self.start_side_tasks();
                    true
                }
                received = self.consumer.kafka.recv(), if room => match received {
                    Ok(first) => {
                        self.collect(first.detach());
                        true
                    }
                    Err(error) => {
                        tracing::warn!(%error, "kafka consumer error");
                        true
                    }
                },
            };
            if !running {
                break;
            }
            self.start_batches();
            self.start_side_tasks();
            self.apply_pauses();
            self.store();
            metrics::gauge!(m::PARTITIONS_BACKING_OFF, "group" => ctx.group())
                .set(self.progress.blocked_count() as f64);
            metrics::gauge!(m::BATCHES_IN_FLIGHT, "group" => ctx.group())
                .set(self.in_flight.len() as f64);
        }
        while let Some(ended) = self.in_flight.next().await {
            self.end(ended);
        }
        self.store();
        metrics::gauge!(m::BATCHES_IN_FLIGHT, "group" => ctx.group()).set(0.0);
    }

    /// Receives `first` and what librdkafka has already fetched behind it
    /// (never a wait for more), up to a batch's size and bytes; checks the
    /// offsets, and hands the messages to [`Progress`], where they wait for
    /// a batch (or behind their partition's retried event).
    fn collect(&mut self, first: OwnedMessage) {
        let settings = &self.consumer.ctx.settings;
        let mut bytes = size_of(&first);
        let mut received = Vec::with_capacity(settings.batch_size.min(64));
        received.push(first);
        while received.len() < settings.batch_size && bytes < settings.batch_max_bytes {
            match self.consumer.kafka.recv().now_or_never() {
                Some(Ok(message)) => {
                    let message = message.detach();
                    bytes += size_of(&message);
                    received.push(message);
                }
                Some(Err(error)) => tracing::warn!(%error, "kafka consumer error"),
                None => break,
            }
        }
        let context = self.consumer.kafka.context();
        self.positions.follow(context.rebalance_generation());
        for partition in context.take_moved() {
            // Assigned anew or revoked: the broker redelivers from the
            // committed offset, so nothing kept of it is current (a batch
            // of it still in flight ends into the void). A pause is
            // librdkafka's to keep across assignments: lift it.
            self.progress.forget(&partition);
            self.pause(&partition, false);
        }
        let received = self.check_offsets(received);
        for message in received {
            metrics::counter!(m::CONSUMED, "group" => self.consumer.ctx.group(), "topic" => message.topic().to_owned())
                .increment(1);
            self.progress.receive(message);
        }
    }

    /// Starts batches of the waiting messages while there are batch slots
    /// and partitions ready (neither in flight nor blocked).
    fn start_batches(&mut self) {
        let ctx: &'a super::shared::Shared = &self.consumer.ctx;
        let settings = &ctx.settings;
        while self.in_flight.len() < settings.concurrent_batches {
            let Some(NextBatch {
                messages,
                partitions,
            }) = self.progress.next_batch(
                settings.batch_size,
                settings.batch_max_bytes,
                settings.concurrent_batches - self.in_flight.len(),
            )
            else {
                break;
            };
            self.in_flight.push(Box::pin(async move {
                let span = tracing::info_span!("outbox.consume_batch", group = %settings.group_id, size = messages.len());
                let taken = take_unless_stalled(ctx, &messages).instrument(span).await;
                Ended {
                    messages,
                    partitions,
                    taken,
                }
            }));
        }
    }

    /// Records what became of each message of a batch that ended. False if
    /// the consumer is shutting down.
    fn end(&mut self, ended: Ended) -> bool {
        let Ended {
            messages,
            partitions,
            taken,
        } = ended;
        // Partitions revoked or assigned anew while the batch ran are not
        // this batch's any more: their messages come again from the
        // committed offset (and the dedup table or the inbox key absorbs
        // what this batch committed of them).
        let current: Vec<&PartitionId> = partitions
            .iter()
            .filter(|(partition, epoch)| self.progress.batch_done(partition, *epoch))
            .map(|(partition, _)| partition)
            .collect();
        let is_current = |message: &OwnedMessage| {
            current.iter().any(|(topic, partition)| {
                topic == message.topic() && *partition == message.partition()
            })
        };
        let Taken {
            done,
            dead,
            retry,
            interrupted,
        } = taken;
        for index in done {
            if is_current(&messages[index]) {
                self.progress.finish(&messages[index]);
            }
        }
        for (index, reason, error) in dead {
            if is_current(&messages[index]) {
                self.progress.queue_dead_letter(DeadLetter {
                    message: messages[index].clone(),
                    reason,
                    error,
                });
            }
        }
        if interrupted {
            return false;
        }
        let mut released = Vec::new();
        for (index, retry) in retry {
            let head = &messages[index];
            if !is_current(head) {
                continue;
            }
            let partition = (head.topic().to_owned(), head.partition());
            let behind: Vec<OwnedMessage> = messages[index + 1..]
                .iter()
                .filter(|m| m.topic() == partition.0 && m.partition() == partition.1)
                .filter(|m| !self.progress.is_finished(m))
                .cloned()
                .collect();
            let attempts = retry.attempts;
            let due = Instant::now() + self.consumer.ctx.settings.backoff.delay(attempts);
            self.progress.block(head, retry, due, behind);
            if attempts >= self.consumer.ctx.settings.max_attempts {
                released.push(partition);
            }
        }
        for partition in released {
            let epoch = self.progress.epoch(&partition);
            self.give_up(&partition, epoch);
        }
        true
    }

    /// The retried event of `partition` is out of attempts: it goes to the
    /// dead letters, and the messages behind it go on.
    fn give_up(&mut self, partition: &PartitionId, epoch: u64) {
        let Some((head, retry, behind)) = self.progress.unblock_spent(partition, epoch) else {
            return;
        };
        self.progress.queue_dead_letter(DeadLetter {
            message: head,
            reason: DeadLetterReason::HandlerFailed,
            error: retry.give_up_error(),
        });
        self.progress.requeue(partition, epoch, behind);
    }

    /// Applies what a side task reported. False if the consumer is
    /// shutting down.
    fn settle(&mut self, side: Side) -> bool {
        let settings = &self.consumer.ctx.settings;
        match side {
            Side::DeadLettered {
                partition,
                epoch,
                offset,
                settled,
            } => {
                self.progress
                    .dead_letter_settled(&partition, epoch, offset, settled.finished());
                settled.finished()
            }
            Side::Attempted {
                partition,
                epoch,
                mut retry,
                outcome,
            } => {
                if !self.progress.is_current(&partition, epoch) {
                    return true; // revoked meanwhile
                }
                match outcome {
                    Attempted::Interrupted => false,
                    Attempted::Handled => {
                        let Some((head, behind)) = self.progress.unblock(&partition, epoch) else {
                            return true;
                        };
                        self.progress.finish(&head);
                        self.progress.requeue(&partition, epoch, behind);
                        true
                    }
                    Attempted::Failed(error) => {
                        retry.attempts += 1;
                        retry.last_error = error;
                        let spent = retry.attempts >= settings.max_attempts;
                        let due = Instant::now() + settings.backoff.delay(retry.attempts);
                        self.progress.retry_later(&partition, epoch, *retry, due);
                        if spent {
                            self.give_up(&partition, epoch);
                        }
                        true
                    }
                }
            }
        }
    }

    /// Starts the due attempts of retried events and the next dead letter
    /// of each partition.
    fn start_side_tasks(&mut self) {
        let ctx = &self.consumer.ctx;
        for (partition, epoch, mut retry) in self.progress.due(Instant::now()) {
            let ctx = ctx.clone();
            self.side.spawn(async move {
                let outcome = dedup::attempt(ctx, &mut retry).await;
                Side::Attempted {
                    partition,
                    epoch,
                    retry: Box::new(retry),
                    outcome,
                }
            });
        }
        for (partition, epoch, dead) in self.progress.dead_letters_to_start() {
            let ctx = ctx.clone();
            self.side.spawn(async move {
                let settled = dead_letter(&ctx, &dead.message, dead.reason, &dead.error).await;
                Side::DeadLettered {
                    partition,
                    epoch,
                    offset: dead.message.offset(),
                    settled,
                }
            });
        }
    }

    /// Pauses or resumes fetching the partitions whose state asks for it
    /// (see [`Progress::pauses`]).
    fn apply_pauses(&mut self) {
        let settings = &self.consumer.ctx.settings;
        for (partition, pause) in self
            .progress
            .pauses(settings.batch_size, settings.batch_max_bytes)
        {
            self.pause(&partition, pause);
        }
    }

    /// Pauses (or resumes) fetching `partition`.
    fn pause(&self, partition: &PartitionId, pause: bool) {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&partition.0, partition.1);
        let done = if pause {
            self.consumer.kafka.pause(&tpl)
        } else {
            self.consumer.kafka.resume(&tpl)
        };
        if let Err(error) = done {
            tracing::debug!(%error, topic = %partition.0, partition = partition.1, pause, "pause/resume failed (partition revoked?)");
        }
    }

    /// Notes every message's offset. With `refetch_offset_gaps`, a partition
    /// whose offsets jump is read again from the first missing offset (once
    /// per gap): its messages from the jump on are dropped from this batch,
    /// to come again, in order, after the seek.
    fn check_offsets(&mut self, batch: Vec<OwnedMessage>) -> Vec<OwnedMessage> {
        let group = &self.consumer.ctx.settings.group_id;
        let refetch = self.consumer.ctx.settings.refetch_offset_gaps;
        let mut cut: Vec<(String, i32)> = Vec::new();
        let mut kept = Vec::with_capacity(batch.len());
        for message in batch {
            let partition = (message.topic().to_owned(), message.partition());
            if cut.contains(&partition) {
                continue;
            }
            match self
                .positions
                .observe(group, &partition, message.offset(), refetch)
            {
                Seen::InOrder | Seen::GapAccepted => kept.push(message),
                Seen::GapToRefetch { expected } => {
                    let sought = self.consumer.kafka.seek(
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
                            self.positions.rewind(&partition, expected);
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

    /// Stores the offsets that moved: for each partition, up to its first
    /// unfinished message.
    fn store(&mut self) {
        let offsets = self.progress.offsets_to_store();
        if offsets.is_empty() {
            return;
        }
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), next) in &offsets {
            if let Err(error) = tpl.add_partition_offset(topic, *partition, Offset::Offset(*next)) {
                tracing::warn!(%error, topic, partition, "cannot store offset");
            }
        }
        // Fails for partitions revoked meanwhile; their new owner redelivers and
        // the dedup table / inbox key absorbs the repeat.
        if let Err(error) = self.consumer.kafka.store_offsets(&tpl) {
            tracing::debug!(%error, "storing offsets failed (partition revoked?)");
        }
    }
}

/// Sleeps until `at` (for ever when `None`, which the select's guard rules out).
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// Takes a batch in the consumer's mode; again, on another connection, when
/// an attempt stalls on one that stopped answering ([`super::stall`]). Each
/// attempt is whole: what an abandoned one committed (its `COMMIT` may have
/// arrived) is absorbed by the dedup rows or the inbox keys, and the batch's
/// partitions stay busy meanwhile, so their order holds.
async fn take_unless_stalled(ctx: &super::shared::Shared, messages: &[OwnedMessage]) -> Taken {
    let mut stalls = 0;
    loop {
        let attempt = async {
            match ctx.settings.mode {
                Mode::Dedup => dedup::take(ctx, messages).await,
                Mode::Inbox => inbox::take(ctx, messages).await,
            }
        };
        match ctx.unless_stalled(attempt).await {
            Ok(taken) => return taken,
            Err(stalled) => {
                if !ctx.db.failed(&stalled.into_db_error(), &mut stalls).await {
                    return Taken::interrupted();
                }
            }
        }
    }
}
