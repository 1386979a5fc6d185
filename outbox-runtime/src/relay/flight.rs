//! What the relay has handed to the producer and not settled yet: batches,
//! and stragglers (rows whose batch was settled without them because their
//! delivery report was late, typically a partition whose leader is down).
//!
//! Every sent row's delivery report is one future in one set, and reports
//! are recorded as they arrive, so a batch can be settled as soon as its last
//! report is in (in any order: marking is per row, and per-key order is
//! decided when sending), or split once it stalls: its reported rows are
//! settled and the late ones wait on as stragglers, holding their keys, no
//! longer holding a pipeline slot.
//!
//! Claims overlap deliveries: while batches are being delivered, the next one
//! is claimed and enqueued, and each batch is settled (marked) once its
//! deliveries are in, in whatever order they complete, so the database work
//! overlaps the broker's. Under a backlog two full batches are in flight; at
//! low rates a commit signal claims at once even while small batches are in
//! flight (up to [`MAX_IN_FLIGHT`]), so an event does not wait for the
//! previous batch's round trip. [`Flight::has_room`] decides when another
//! claim may join.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::channel::oneshot::Canceled;
use futures::stream::{FuturesUnordered, StreamExt};
use rdkafka::producer::future_producer::OwnedDeliveryResult;

use super::batch::{Batch, Enqueued, Report, Resolved, Straggler};
use super::keys::TopicKeys;
use super::partitions::Partitions;
use super::publish::{Outcome, report_outcome};

/// Most batches in flight at once.
pub(super) const MAX_IN_FLIGHT: usize = 4;

/// librdkafka fails every message after `message.timeout.ms`; this margin
/// only guards against a lost report.
const REPORT_GUARD: Duration = Duration::from_secs(5);

/// Everything in flight.
#[derive(Default)]
pub(crate) struct Flight {
    reports: FuturesUnordered<Report>,
    batches: Vec<Batch>,
    stragglers: HashMap<(u64, usize), Straggler>,
    resolved: Vec<Resolved>,
    next_seq: u64,
    last_delivery: Option<Instant>,
    /// Set when every row of a claimed batch was held (see
    /// [`held_keys`](Self::held_keys)): no further claim until a batch
    /// settles.
    claim_blocked: bool,
}

impl Flight {
    pub(crate) fn is_empty(&self) -> bool {
        self.batches.is_empty() && self.stragglers.is_empty() && self.resolved.is_empty()
    }

    /// Batches in flight (stragglers do not count).
    pub(crate) fn batch_count(&self) -> usize {
        self.batches.len()
    }

    /// Rows of the batches in flight.
    pub(crate) fn batch_rows(&self) -> usize {
        self.batches.iter().map(|b| b.rows.len()).sum()
    }

    pub(crate) fn straggler_count(&self) -> usize {
        self.stragglers.len()
    }

    /// Ids of every row in flight, to leave out of claims.
    pub(crate) fn ids(&self) -> Vec<i64> {
        let batches = self
            .batches
            .iter()
            .flat_map(|b| b.rows.iter().map(|r| r.id));
        let stragglers = self.stragglers.values().map(|s| s.row.id);
        batches.chain(stragglers).collect()
    }

    /// Keys (of their topic) of every row in flight.
    pub(crate) fn keys(&self) -> TopicKeys {
        let batches = self.batches.iter().flat_map(|b| b.rows.iter());
        let stragglers = self.stragglers.values().map(|s| &s.row);
        let mut keys = TopicKeys::default();
        for row in batches.chain(stragglers) {
            keys.insert(&row.topic, &row.partition_key);
        }
        keys
    }

    /// Keys (of their topic) whose later rows must not be sent yet, because
    /// order could break (docs/relay.md, "Per-key order within one relay"):
    /// a row of the key in flight that went out through an earlier producer
    /// than `generation` (rebuilt since), that is known not to be delivered
    /// (failed, held, not sent), or that is late (a straggler). A key whose
    /// rows in flight are merely unanswered or delivered is not held: its
    /// later rows follow them through the same idempotent producer. The key's
    /// rows of other topics are not held either: they are other sequences.
    pub(crate) fn held_keys(&self, generation: u64) -> TopicKeys {
        let mut held = TopicKeys::default();
        for batch in &self.batches {
            let old = batch.generation != generation;
            for (row, outcome) in batch.rows.iter().zip(&batch.outcomes) {
                let hold = match outcome {
                    None => old,
                    Some(Outcome::Delivered) => false,
                    Some(_) => true,
                };
                if hold {
                    held.insert(&row.topic, &row.partition_key);
                }
            }
        }
        for straggler in self.stragglers.values() {
            held.insert(&straggler.row.topic, &straggler.row.partition_key);
        }
        held
    }

    /// Batches still awaiting reports only for rows of topics `held` says
    /// are held: nothing else will come for them until librdkafka gives up
    /// on those rows, so they are settled at once without them (see
    /// [`split`](Self::split)).
    pub(crate) fn waiting_only_on(&self, held: impl Fn(&str) -> bool) -> Vec<u64> {
        self.batches
            .iter()
            .filter(|b| b.outstanding > 0)
            .filter(|b| b.pending().all(|(row, _)| held(&row.topic)))
            .map(|b| b.seq)
            .collect()
    }

    /// Whether any delivery report came in since `since`.
    pub(crate) fn delivered_since(&self, since: Instant) -> bool {
        self.last_delivery.is_some_and(|at| at >= since)
    }

    /// Whether another batch may be claimed: not while a claim found only
    /// rows held back (until a batch settles); otherwise always up to two
    /// batches (claim overlapping delivery), more only while they are small.
    /// Late rows (stragglers) take no room.
    pub(crate) fn has_room(&self, batch_size: usize) -> bool {
        if self.claim_blocked {
            return false;
        }
        let batches = self.batch_count();
        batches < 2 || (batches < MAX_IN_FLIGHT && self.batch_rows() < batch_size)
    }

    /// Lifts the claim pause once nothing is in flight (also after batches
    /// were dropped on errors: nothing is left to wait for).
    pub(crate) fn unpause_if_empty(&mut self) {
        if self.is_empty() {
            self.claim_blocked = false;
        }
    }

    /// Takes a claimed batch in, as the publisher built it; returns its rows.
    /// A batch whose every row was held behind rows in flight is not taken:
    /// claiming again before something settles would find the same rows, so
    /// claims pause until a settle (and 0 is returned).
    pub(crate) fn admit(&mut self, batch: Enqueued, delivery_timeout: Duration) -> usize {
        self.claim_blocked = !batch.needs_settling();
        if self.claim_blocked {
            return 0;
        }
        let claimed = batch.rows.len();
        self.add(batch, delivery_timeout);
        claimed
    }

    /// Takes a batch in.
    pub(crate) fn add(&mut self, batch: Enqueued, delivery_timeout: Duration) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let deadline = Instant::now() + delivery_timeout + REPORT_GUARD;
        let mut outcomes = batch.outcomes;
        let mut outstanding = 0;
        for (index, future, probe) in batch.sent {
            if probe {
                outcomes[index] = Some(Outcome::Straggling);
                self.stragglers.insert(
                    (seq, index),
                    Straggler {
                        row: batch.rows[index].clone(),
                        predicted: batch.predicted[index],
                        deadline,
                    },
                );
            } else {
                outstanding += 1;
            }
            self.reports.push(Report { seq, index, future });
        }
        self.batches.push(Batch {
            rows: batch.rows,
            outcomes,
            partitions: batch.predicted,
            started: batch.started,
            span: batch.span,
            generation: batch.generation,
            seq,
            outstanding,
            deadline,
        });
    }

    /// Waits for the next delivery report and records it, with every other
    /// one already in. Never returns if nothing is awaited (use it in a
    /// `select!` with [`awaits_reports`](Self::awaits_reports) as guard).
    /// Cancel-safe: a report is recorded as soon as it is taken.
    pub(crate) async fn next_reports(&mut self, partitions: &mut Partitions) {
        match self.reports.next().await {
            Some(report) => self.record(report, partitions),
            None => std::future::pending().await,
        }
        while let Some(Some(report)) = self.reports.next().now_or_never() {
            self.record(report, partitions);
        }
    }

    pub(crate) fn awaits_reports(&self) -> bool {
        !self.reports.is_empty()
    }

    fn record(
        &mut self,
        (seq, index, report): (u64, usize, Result<OwnedDeliveryResult, Canceled>),
        partitions: &mut Partitions,
    ) {
        let (outcome, partition) = report_outcome(report);
        if outcome == Outcome::Delivered {
            self.last_delivery = Some(Instant::now());
        }
        let delivered = outcome == Outcome::Delivered;
        if let Some(straggler) = self.stragglers.remove(&(seq, index)) {
            let row = straggler.row;
            if delivered {
                crate::probe::mark(crate::probe::Stage::Acked, row.event_id);
            }
            partitions.reported(
                &row.topic,
                partition,
                straggler.predicted,
                row.id,
                delivered,
            );
            self.resolved.push(Resolved { row, outcome });
            return;
        }
        // A report of a batch already settled without it (lost, then late)
        // finds nothing: its row was left unmarked and is sent again.
        let Some(batch) = self.batches.iter_mut().find(|b| b.seq == seq) else {
            return;
        };
        if batch.outcomes[index].is_some() {
            return;
        }
        let row = &batch.rows[index];
        if delivered {
            crate::probe::mark(crate::probe::Stage::Acked, row.event_id);
        }
        partitions.reported(
            &row.topic,
            partition,
            batch.partitions[index],
            row.id,
            delivered,
        );
        if partition.is_some() {
            batch.partitions[index] = partition;
        }
        batch.outcomes[index] = Some(outcome);
        batch.outstanding -= 1;
    }

    /// When something must be looked at even without a report: a batch
    /// reaching its stall timeout or its deadline, a straggler its deadline.
    pub(crate) fn next_timer(&self, stall_timeout: Duration) -> Option<Instant> {
        let now = Instant::now();
        let batches = self.batches.iter().filter(|b| b.outstanding > 0).map(|b| {
            let stall = b.started + stall_timeout;
            if stall > now {
                stall.min(b.deadline)
            } else {
                b.deadline
            }
        });
        let stragglers = self.stragglers.values().map(|s| s.deadline);
        batches.chain(stragglers).min()
    }

    /// Gives up on reports past their deadline (lost): those rows count as
    /// unavailable, left unmarked.
    pub(crate) fn expire(&mut self, now: Instant) {
        let lost = || Outcome::Unavailable("no delivery report in time".into());
        for batch in self.batches.iter_mut().filter(|b| b.deadline <= now) {
            for outcome in batch.outcomes.iter_mut().filter(|o| o.is_none()) {
                *outcome = Some(lost());
            }
            batch.outstanding = 0;
        }
        let expired: Vec<(u64, usize)> = self
            .stragglers
            .iter()
            .filter(|(_, s)| s.deadline <= now)
            .map(|(key, _)| *key)
            .collect();
        for key in expired {
            let straggler = self.stragglers.remove(&key).expect("listed");
            self.resolved.push(Resolved {
                row: straggler.row,
                outcome: lost(),
            });
        }
    }

    /// Batches whose every report is in, in claim order. Settling frees
    /// what a claim was paused for.
    pub(crate) fn take_complete(&mut self) -> Vec<Batch> {
        let (complete, pending): (Vec<Batch>, Vec<Batch>) = std::mem::take(&mut self.batches)
            .into_iter()
            .partition(|b| b.outstanding == 0);
        self.batches = pending;
        if !complete.is_empty() {
            self.claim_blocked = false;
        }
        complete
    }

    /// Batches stalled: reports outstanding `stall_timeout` after the claim
    /// while reports of other rows came in since (so the broker is not down
    /// as a whole: some partitions are late).
    pub(crate) fn stalled(&self, stall_timeout: Duration) -> Vec<u64> {
        let now = Instant::now();
        self.batches
            .iter()
            .filter(|b| b.outstanding > 0 && b.started + stall_timeout <= now)
            .filter(|b| self.delivered_since(b.started))
            .map(|b| b.seq)
            .collect()
    }

    /// The batch `seq`, for a look before [`split`](Self::split).
    pub(crate) fn batch(&self, seq: u64) -> Option<&Batch> {
        self.batches.iter().find(|b| b.seq == seq)
    }

    /// Takes batch `seq` out to be settled now; its rows still awaiting a
    /// report stay in flight as stragglers. Settling frees what a claim was
    /// paused for.
    pub(crate) fn split(&mut self, seq: u64) -> Option<Batch> {
        let position = self.batches.iter().position(|b| b.seq == seq)?;
        let mut batch = self.batches.remove(position);
        self.claim_blocked = false;
        for index in 0..batch.rows.len() {
            if batch.outcomes[index].is_none() {
                batch.outcomes[index] = Some(Outcome::Straggling);
                self.stragglers.insert(
                    (seq, index),
                    Straggler {
                        row: batch.rows[index].clone(),
                        predicted: batch.partitions[index],
                        deadline: batch.deadline,
                    },
                );
            }
        }
        batch.outstanding = 0;
        Some(batch)
    }

    /// Stragglers whose report is in (or lost), to settle. Settling frees
    /// what a claim was paused for.
    pub(crate) fn take_resolved(&mut self) -> Vec<Resolved> {
        let resolved = std::mem::take(&mut self.resolved);
        if !resolved.is_empty() {
            self.claim_blocked = false;
        }
        resolved
    }

    /// Forgets everything (the connection that could mark it is gone: the
    /// rows are published again later).
    pub(crate) fn clear(&mut self) {
        *self = Self {
            next_seq: self.next_seq,
            claim_blocked: self.claim_blocked,
            ..Self::default()
        };
    }
}

#[cfg(test)]
mod tests;
