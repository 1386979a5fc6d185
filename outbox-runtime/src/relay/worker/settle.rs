//! The loop's settle step: what the broker answered is marked, retried,
//! held back or parked, on the relay's own connection.

use std::time::Instant;

use tracing::Instrument;

use super::{BatchError, Progress, Worker};
use crate::relay::backend::Backend;
use crate::relay::backoff::retry_delay;
use crate::relay::batch::{Batch, Resolved};
use crate::relay::partitions::Tp;
use crate::relay::publish::Outcome;
use crate::relay::session;
use crate::relay::store::{ClaimedRow, Retry};
use crate::relay::summary::Totals;
use crate::relay::telemetry as metric;

impl<B: Backend> Worker<B> {
    /// Settles what is complete: batches whose reports are all in (in any
    /// order), stalled batches without their late rows, stragglers whose
    /// report came.
    pub(super) async fn process_flight(&mut self) -> Result<Progress, BatchError> {
        let mut progress = Progress::default();
        self.partitions.refresh_metadata(self.publisher.producer());
        self.update_held_topics();
        self.flight.expire(Instant::now());
        for batch in self.flight.take_complete() {
            progress.merge(self.settle(batch).await?);
        }
        for seq in self.flight.stalled(self.config.partition_stall_timeout) {
            self.suspect_stalled(seq);
            if let Some(batch) = self.flight.split(seq) {
                progress.merge(self.settle(batch).await?);
            }
        }
        // Rows of a topic held since they were sent get their reports only
        // when librdkafka gives up on them (up to `delivery_timeout`): their
        // batch's other rows are settled now, without them.
        if self.held_topics.watching() {
            let held = &self.held_topics;
            for seq in self.flight.waiting_only_on(|topic| held.is_held(topic)) {
                if let Some(batch) = self.flight.split(seq) {
                    progress.merge(self.settle(batch).await?);
                }
            }
        }
        let resolved = self.flight.take_resolved();
        if !resolved.is_empty() {
            progress.merge(self.settle_stragglers(resolved).await?);
        }
        metrics::gauge!(metric::STRAGGLING).set(self.flight.straggler_count() as f64);
        Ok(progress)
    }

    /// A stalled batch's late rows are on partitions that delivered nothing
    /// since the batch was claimed, while others did: those partitions are
    /// unavailable.
    fn suspect_stalled(&mut self, seq: u64) {
        let Some(batch) = self.flight.batch(seq) else {
            return;
        };
        let started = batch.started;
        let mut suspects: Vec<Tp> = batch
            .pending()
            .filter_map(|(row, partition)| Some((row.topic.clone(), partition?)))
            .filter(|tp| !self.partitions.delivered_since(tp, started))
            .collect();
        suspects.sort();
        suspects.dedup();
        let reason = format!(
            "no delivery report within {:?} while other partitions delivered",
            self.config.partition_stall_timeout
        );
        for tp in suspects {
            if self.partitions.suspect(&tp, reason.clone()) {
                self.count_error("partition_unavailable");
            }
        }
    }

    /// Settles everything in flight, late rows included (they take at most
    /// `delivery_timeout`).
    pub(super) async fn settle_all(&mut self) -> Result<(), BatchError> {
        while !self.flight.is_empty() {
            let timer = self.flight.next_timer(self.config.partition_stall_timeout);
            let awaits_reports = self.flight.awaits_reports();
            let renew_at = self.lanes.renew_at();
            // Renew the lease while waiting: late rows take up to
            // `delivery_timeout`.
            let renew = tokio::select! {
                biased;
                () = self.flight.next_reports(&mut self.partitions), if awaits_reports => false,
                () = tokio::time::sleep_until(timer.unwrap_or_else(Instant::now).into()), if timer.is_some() => false,
                () = tokio::time::sleep_until(renew_at.into()), if awaits_reports || timer.is_some() => true,
                else => false,
            };
            if renew && let Err(error) = self.lanes.renew().await {
                self.forget_in_flight();
                return Err(error.into());
            }
            if let Err(error) = self.process_flight().await {
                self.forget_in_flight();
                return Err(error);
            }
        }
        Ok(())
    }

    /// Records a batch whose reports are in (its late rows excepted).
    async fn settle(&mut self, batch: Batch) -> Result<Progress, BatchError> {
        let span = batch.span.clone();
        self.settle_batch(batch).instrument(span).await
    }

    async fn settle_batch(&mut self, batch: Batch) -> Result<Progress, BatchError> {
        let Batch {
            rows,
            outcomes,
            partitions,
            started,
            span,
            ..
        } = batch;
        #[cfg(feature = "test-hooks")]
        if self.config.crash_before_mark {
            return Err(BatchError::SimulatedCrash);
        }
        let outcomes: Vec<Outcome> = outcomes
            .into_iter()
            .map(|outcome| outcome.unwrap_or(Outcome::Straggling))
            .collect();
        let delivered: Vec<i64> = rows
            .iter()
            .zip(&outcomes)
            .filter(|(_, outcome)| **outcome == Outcome::Delivered)
            .map(|(row, _)| row.id)
            .collect();
        // Other rows got through since this batch was claimed: what did not
        // is the fault of its partitions, not of the broker as a whole.
        let others_delivered = self.flight.delivered_since(started);
        let mut retries = Vec::new();
        let (mut rejected, mut unavailable, mut held, mut held_back, mut straggling) =
            (0usize, 0usize, 0usize, 0usize, 0usize);
        let mut topic_refused = 0usize;
        for ((row, outcome), partition) in rows.iter().zip(&outcomes).zip(&partitions) {
            match outcome {
                Outcome::Delivered => {
                    if self.held_topics.watching() {
                        self.held_topics.delivered(&row.topic);
                    }
                }
                Outcome::Rejected(error) => {
                    rejected += 1;
                    retries.push(self.refused(row, error));
                }
                // Never counted, nothing recorded: the topic is held and
                // the row claimed again once the broker accepts the topic.
                Outcome::TopicRefused(reason) => {
                    topic_refused += 1;
                    self.held_topics.refused(&row.topic, reason);
                }
                Outcome::Deferred { reason, hold } => {
                    held_back += 1;
                    retries.push(Retry {
                        id: row.id,
                        error: reason.clone(),
                        retry_in_ms: hold.as_millis() as i64,
                        counts: false,
                    });
                }
                // Never counted: the record is fine, the broker or the
                // partition's leader is not reachable. Claimed again.
                Outcome::Unavailable(error) => {
                    unavailable += 1;
                    if let Some(partition) = partition.filter(|_| others_delivered) {
                        let tp = (row.topic.clone(), partition);
                        if self.partitions.suspect(&tp, error.clone()) {
                            self.count_error("partition_unavailable");
                        }
                    }
                }
                Outcome::Held => held += 1,
                Outcome::Straggling => straggling += 1,
            }
        }
        let mark_sent = crate::probe::started();
        let parked = self.record(&delivered, &retries).await?;
        let marked = || {
            rows.iter()
                .zip(&outcomes)
                .filter(|(_, outcome)| **outcome == Outcome::Delivered)
                .map(|(row, _)| row.event_id)
        };
        crate::probe::mark_each_at(crate::probe::Stage::MarkSent, marked(), mark_sent);
        crate::probe::mark_each(crate::probe::Stage::Marked, marked());

        span.record("published", delivered.len());
        span.record("held", held);
        span.record("held_back", held_back);
        span.record("straggling", straggling);
        span.record("rejected", rejected);
        span.record("topic_refused", topic_refused);
        span.record("unavailable", unavailable);
        Totals::add(&self.totals.published, delivered.len() as u64);
        Totals::add(&self.totals.parked, parked);
        Totals::add(&self.totals.held_back, held_back as u64);
        Totals::add(&self.totals.batches, 1);
        metrics::counter!(metric::PUBLISHED).increment(delivered.len() as u64);
        metrics::counter!(metric::PARKED).increment(parked);
        if held_back > 0 {
            metrics::counter!(metric::HELD_BACK).increment(held_back as u64);
        }
        metrics::histogram!(metric::BATCH_SIZE).record(rows.len() as f64);
        metrics::histogram!(metric::BATCH_DURATION).record(started.elapsed().as_secs_f64());
        if rejected > 0 {
            self.count_error("rejected");
            let first_error = retries.iter().find(|r| r.counts).map(|r| r.error.as_str());
            tracing::warn!(
                rejected,
                parked,
                first_error,
                "outbox relay: broker refused events"
            );
        }
        if topic_refused > 0 {
            self.count_error("topic_refused");
        }
        if unavailable > 0 {
            self.count_error("broker_unavailable");
            let error = outcomes.iter().find_map(|o| match o {
                Outcome::Unavailable(error) => Some(error.as_str()),
                _ => None,
            });
            tracing::warn!(
                unavailable,
                error,
                "outbox relay: broker unavailable, events kept"
            );
        }
        let rebuilt = self.rebuild_if_fatal()?;
        Ok(Progress {
            settled: true,
            answered: !delivered.is_empty() || rejected > 0 || topic_refused > 0,
            // After a fatal error the new producer deserves a try at once.
            outage: delivered.is_empty()
                && rejected == 0
                && topic_refused == 0
                && unavailable > 0
                && !others_delivered
                && !rebuilt,
            woken: false,
        })
    }

    /// Records late rows whose reports came (or were given up on).
    async fn settle_stragglers(&mut self, resolved: Vec<Resolved>) -> Result<Progress, BatchError> {
        #[cfg(feature = "test-hooks")]
        if self.config.crash_before_mark {
            return Err(BatchError::SimulatedCrash);
        }
        let mut delivered = Vec::new();
        let mut retries = Vec::new();
        let (mut unavailable, mut topic_refused) = (0usize, 0usize);
        for Resolved { row, outcome } in &resolved {
            match outcome {
                Outcome::Delivered => {
                    delivered.push(row.id);
                    if self.held_topics.watching() {
                        self.held_topics.delivered(&row.topic);
                    }
                }
                Outcome::Rejected(error) => retries.push(self.refused(row, error)),
                Outcome::TopicRefused(reason) => {
                    topic_refused += 1;
                    self.held_topics.refused(&row.topic, reason);
                }
                _ => unavailable += 1,
            }
        }
        let parked = self.record(&delivered, &retries).await?;
        Totals::add(&self.totals.published, delivered.len() as u64);
        Totals::add(&self.totals.parked, parked);
        metrics::counter!(metric::PUBLISHED).increment(delivered.len() as u64);
        metrics::counter!(metric::PARKED).increment(parked);
        if !retries.is_empty() {
            self.count_error("rejected");
        }
        if topic_refused > 0 {
            self.count_error("topic_refused");
        }
        if unavailable > 0 {
            self.count_error("broker_unavailable");
            tracing::debug!(
                unavailable,
                "outbox relay: late events not delivered (partition still unavailable), kept"
            );
        }
        self.rebuild_if_fatal()?;
        Ok(Progress {
            settled: true,
            answered: !delivered.is_empty() || !retries.is_empty() || topic_refused > 0,
            outage: false,
            woken: false,
        })
    }

    /// Marks `delivered` and records `retries` on the relay's connection
    /// (bounded by `database_timeout`); returns how many rows were parked.
    async fn record(&mut self, delivered: &[i64], retries: &[Retry]) -> Result<u64, BatchError> {
        let conn = self
            .lanes
            .connection()
            .ok_or(BatchError::Database(sqlx::Error::PoolClosed))?;
        let settlement = session::bounded(
            self.config.database_timeout,
            "marking a batch",
            B::settle(conn, delivered, retries, self.config.max_attempts),
        )
        .await?;
        self.log_unrecordable(&settlement.unrecordable);
        Ok(settlement.parked)
    }

    /// A counted retry of a row the broker refused.
    fn refused(&self, row: &ClaimedRow, error: &str) -> Retry {
        Retry {
            id: row.id,
            error: error.to_owned(),
            retry_in_ms: retry_delay(&self.config, row.attempts).as_millis() as i64,
            counts: true,
        }
    }

    fn log_unrecordable(&self, unrecordable: &[(i64, String)]) {
        for (id, error) in unrecordable {
            tracing::warn!(
                id,
                %error,
                "outbox relay could not record a row's failure; parked it (a refused row) or left it"
            );
        }
    }

    /// Rebuilds the producer after a fatal error; `true` if it did.
    fn rebuild_if_fatal(&mut self) -> Result<bool, BatchError> {
        let Some(fatal) = self.publisher.rebuild_if_fatal()? else {
            return Ok(false);
        };
        tracing::error!(%fatal, "outbox relay rebuilt its producer after a fatal error");
        self.count_error("fatal_producer");
        Totals::add(&self.totals.producer_rebuilds, 1);
        self.partitions.reset();
        Ok(true)
    }
}
