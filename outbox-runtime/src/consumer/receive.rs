//! The receive loop: take what librdkafka fetched as a batch, check its
//! offsets, hand it to the mode (dedup: handle; inbox: store), store the
//! offsets of what is finished.

use std::collections::HashMap;
use std::time::Duration;

use futures::FutureExt;
use rdkafka::consumer::{CommitMode, Consumer as _};
use rdkafka::message::OwnedMessage;
use rdkafka::{Message, Offset, TopicPartitionList};
use tracing::Instrument;

use super::config::Mode;
use super::error::ConsumerError;
use super::offsets::{Positions, Seen, next_offsets};
use super::run::Consumer;
use super::{dedup, inbox, telemetry as m};

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
