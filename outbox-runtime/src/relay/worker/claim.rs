//! The loop's claim and publish steps: the next batch of the owned lanes'
//! rows, handed to the producer in order.

use std::collections::HashSet;
use std::time::Instant;

use tracing::{Instrument, Span, field};

use super::{BatchError, Claimed, Worker};
use crate::probe::{self, Stage};
use crate::relay::backend::Backend;
use crate::relay::batch::Enqueued;
use crate::relay::keys::TopicKeys;
use crate::relay::partitions::Route;
use crate::relay::prediction::TopicMetadata;
use crate::relay::publish::Outcome;
use crate::relay::session;
use crate::relay::store::ClaimedRow;
use crate::relay::summary::Totals;
use crate::relay::telemetry as metric;

impl<B: Backend> Worker<B> {
    /// Gets the partitions' state up to date (partition counts, probes due,
    /// rows released from holds), then, if the pipeline has room, claims the
    /// next batch and publishes it. Returns what the claim found and took
    /// into the pipeline (nothing when there was no room, nothing is
    /// publishable, or all of it was held behind rows in flight).
    pub(super) async fn claim_and_publish(&mut self) -> Result<Claimed, BatchError> {
        self.partitions.refresh_metadata(self.publisher.producer());
        self.update_held_topics();
        self.partitions.request_probes();
        let released = self.release_held_back().await?;
        self.flight.unpause_if_empty();
        if !self.flight.has_room(self.config.batch_size) {
            return Ok(Claimed {
                rows_may_wait: true,
                ..Claimed::default()
            });
        }
        let started = Instant::now();
        let claim_sent = probe::started();
        let rows = self.claim().await?;
        if rows.is_empty() {
            return Ok(Claimed::default());
        }
        let found = rows.len();
        probe::mark_each_at(
            Stage::ClaimSent,
            rows.iter().map(|row| row.event_id),
            claim_sent,
        );
        probe::mark_each(Stage::Claimed, rows.iter().map(|row| row.event_id));
        let span = tracing::info_span!(
            "outbox_relay_batch",
            claimed = rows.len(),
            published = field::Empty,
            held = field::Empty,
            held_back = field::Empty,
            straggling = field::Empty,
            rejected = field::Empty,
            topic_refused = field::Empty,
            unavailable = field::Empty,
        );
        let held_keys = self.flight.held_keys(self.publisher.generation());
        let batch = self
            .publish(rows, &held_keys, started, span.clone())
            .instrument(span)
            .await;
        let left_unsent = batch.outcomes.contains(&Some(Outcome::Held));
        // Rows of held keys are not sent. If that was all of them, claiming
        // again before something settles would find the same rows, so the
        // pipeline pauses claims until a settle.
        let admitted = self.flight.admit(batch, self.config.delivery_timeout);
        Ok(Claimed {
            found,
            admitted,
            released,
            rows_may_wait: left_unsent || found >= self.config.batch_size,
        })
    }

    /// Hands the topics' metadata answers to the held topics (a refused
    /// topic is held before any of its records is refused; a held one
    /// listed without error is released) and asks for the metadata of the
    /// held topics due a probe.
    pub(super) fn update_held_topics(&mut self) {
        for (topic, answer) in self.partitions.take_topic_answers() {
            match answer {
                TopicMetadata::Listed(_) => self.held_topics.metadata(&topic, None),
                TopicMetadata::Refused(reason) => {
                    self.held_topics.metadata(&topic, Some(&reason));
                }
                TopicMetadata::Unknown => self.held_topics.probe_failed(&topic),
            }
        }
        for topic in self.held_topics.due_probes() {
            self.partitions.want_metadata(&topic);
        }
    }

    /// Clears the hold of rows held back for partitions that are available
    /// again, so they are claimed at once.
    /// Returns whether it released any.
    async fn release_held_back(&mut self) -> Result<bool, BatchError> {
        let ids = self.partitions.take_released();
        if ids.is_empty() {
            return Ok(false);
        }
        let conn = self
            .lanes
            .connection()
            .ok_or(BatchError::Database(sqlx::Error::PoolClosed))?;
        session::bounded(
            self.config.database_timeout,
            "releasing held-back rows",
            B::release_held(conn, &ids),
        )
        .await?;
        Ok(true)
    }

    /// Claims the next batch of the owned lanes, leaving out the rows in
    /// flight and the held topics.
    async fn claim(&mut self) -> Result<Vec<ClaimedRow>, BatchError> {
        let lanes = self.lanes.owned();
        let lane_count = self.lanes.lane_count();
        let exclude = self.flight.ids();
        let held_topics = self.held_topics.topics();
        let conn = self
            .lanes
            .connection()
            .ok_or(BatchError::Database(sqlx::Error::PoolClosed))?;
        let rows = session::bounded(
            self.config.database_timeout,
            "claiming a batch",
            B::claim(
                conn,
                lane_count,
                &lanes,
                &exclude,
                &held_topics,
                self.config.batch_size,
            ),
        )
        .await?;
        Totals::add(&self.totals.claims, 1);
        if rows.is_empty() {
            Totals::add(&self.totals.empty_claims, 1);
        }
        metric::claim(rows.is_empty());
        Ok(rows)
    }

    /// Enqueues every row, in order, and returns at once: the deliveries
    /// proceed while the relay claims its next batch. A row whose key has
    /// earlier rows in flight follows them through the same idempotent
    /// producer, which keeps them in order. Keys are keys of a topic. A row
    /// is not sent if its key is in `held_keys` (an earlier row failed, is
    /// late, or went out through a producer since rebuilt: see
    /// `Flight::held_keys`) or had an earlier row fail to enqueue or be held
    /// back here, nor if its topic is held (refused as a whole, here or
    /// since the claim). The first row of a key of a
    /// partition known to be unavailable is held back in the database (unless
    /// it is the partition's one probe, and only if no row of its key is in
    /// flight), which keeps the key's later rows out of claims; the key's
    /// later rows of this claim just wait.
    async fn publish(
        &mut self,
        rows: Vec<ClaimedRow>,
        held_keys: &TopicKeys,
        started: Instant,
        span: Span,
    ) -> Enqueued {
        let deadline = Instant::now() + self.config.delivery_timeout;
        let mut outcomes = vec![None; rows.len()];
        let mut predicted = Vec::with_capacity(rows.len());
        let mut sent = Vec::with_capacity(rows.len());
        let mut failed_keys: HashSet<(&str, &str)> = HashSet::new();
        let any_down = self.partitions.unavailable() > 0;
        // Only needed to hold back rows of unavailable partitions.
        let in_flight_keys = if any_down {
            self.flight.keys()
        } else {
            TopicKeys::default()
        };
        let generation = self.publisher.generation();
        for (index, row) in rows.iter().enumerate() {
            let (topic, key) = (row.topic.as_str(), row.partition_key.as_str());
            let partition = self.partitions.predict(topic, key);
            predicted.push(partition);
            if self.held_topics.is_held(topic) {
                outcomes[index] = Some(Outcome::Held);
                continue;
            }
            let tp = partition
                .filter(|_| any_down)
                .map(|p| (row.topic.clone(), p));
            let down = tp.as_ref().is_some_and(|tp| self.partitions.is_down(tp));
            // An earlier row of the key in this claim failed or was held
            // back, or one in flight makes order uncertain: this one waits,
            // unwritten (once the earlier one's hold is recorded, the claim
            // skips the key's later rows).
            let held = held_keys.contains(topic, key);
            if failed_keys.contains(&(topic, key)) || (held && !down) {
                outcomes[index] = Some(Outcome::Held);
                continue;
            }
            let in_flight = held || in_flight_keys.contains(topic, key);
            let route = match &tp {
                Some(_) if down && in_flight => Route::HoldBack,
                Some((topic, partition)) => self.partitions.route(topic, *partition, row.id),
                None => Route::Send,
            };
            if route == Route::HoldBack {
                let tp = tp.expect("a partition held back is known");
                let (hold, reason) = self.partitions.held_back(&tp, row.id);
                outcomes[index] = Some(Outcome::Deferred { reason, hold });
                failed_keys.insert((topic, key));
                continue;
            }
            match self.publisher.send(row, deadline).await {
                Ok(report) => {
                    probe::mark(Stage::Sent, row.event_id);
                    sent.push((index, report, route == Route::Probe));
                }
                Err(outcome) => {
                    if route == Route::Probe {
                        self.partitions
                            .reported(topic, partition, partition, row.id, false);
                    }
                    // librdkafka knows the topic is refused: the claim's
                    // other rows of it are not sent.
                    if let Outcome::TopicRefused(reason) = &outcome {
                        self.held_topics.hold_now(topic, reason);
                    }
                    outcomes[index] = Some(outcome);
                    failed_keys.insert((topic, key));
                }
            }
        }
        drop(failed_keys);
        Enqueued {
            rows,
            outcomes,
            predicted,
            sent,
            started,
            span,
            generation,
        }
    }
}
