//! The relay's pipeline: the batches between claim and settle, and the claim
//! pause.
//!
//! While batches are being delivered, the next one is claimed and enqueued,
//! and each batch is settled (marked) once its deliveries are in, in
//! whatever order they complete, so the database work overlaps the
//! broker's. Under a backlog two full batches are in flight; at low rates a
//! commit signal claims at once even while small batches are in flight (up
//! to [`MAX_IN_FLIGHT`]), so an event does not wait for the previous batch's
//! round trip. What is in flight is kept by [`Flight`]; this type decides
//! when another claim may join it.

use std::time::{Duration, Instant};

use super::batch::{Batch, Enqueued, Resolved};
use super::flight::Flight;
use super::keys::TopicKeys;
use super::partitions::Partitions;

/// Most batches in flight at once.
pub(super) const MAX_IN_FLIGHT: usize = 4;

/// The batches and stragglers in flight, and whether claiming is paused.
#[derive(Default)]
pub(super) struct Pipeline {
    /// Batches and stragglers handed to the producer, not settled yet.
    flight: Flight,
    /// Set when every row of a claimed batch was held (see
    /// `Flight::held_keys`): no further claim until a batch settles.
    claim_blocked: bool,
}

impl Pipeline {
    /// Nothing in flight: no batch, no straggler, nothing to settle.
    pub(super) fn is_empty(&self) -> bool {
        self.flight.is_empty()
    }

    /// Batches in flight (stragglers do not count).
    pub(super) fn batch_count(&self) -> usize {
        self.flight.batch_count()
    }

    /// Whether another batch may be claimed: not while a claim found only
    /// rows held back (until a batch settles); otherwise always up to two
    /// batches (claim overlapping delivery), more only while they are small.
    /// Late rows (stragglers) take no room.
    pub(super) fn has_room(&self, batch_size: usize) -> bool {
        if self.claim_blocked {
            return false;
        }
        let batches = self.flight.batch_count();
        batches < 2 || (batches < MAX_IN_FLIGHT && self.flight.batch_rows() < batch_size)
    }

    /// Lifts the claim pause once nothing is in flight (also after batches
    /// were dropped on errors: nothing is left to wait for).
    pub(super) fn unpause_if_empty(&mut self) {
        if self.flight.is_empty() {
            self.claim_blocked = false;
        }
    }

    /// Ids of every row in flight, to leave out of claims.
    pub(super) fn ids(&self) -> Vec<i64> {
        self.flight.ids()
    }

    /// Keys (of their topic) of every row in flight.
    pub(super) fn keys(&self) -> TopicKeys {
        self.flight.keys()
    }

    /// Keys whose later rows must not be sent yet (see [`Flight::held_keys`]).
    pub(super) fn held_keys(&self, generation: u64) -> TopicKeys {
        self.flight.held_keys(generation)
    }

    /// See [`Flight::waiting_only_on`].
    pub(super) fn waiting_only_on(&self, held: impl Fn(&str) -> bool) -> Vec<u64> {
        self.flight.waiting_only_on(held)
    }

    /// Takes a claimed batch in, as the publisher built it; returns its rows.
    /// A batch whose every row was held behind rows in flight is not taken:
    /// claiming again before something settles would find the same rows, so
    /// claims pause until a settle (and 0 is returned).
    pub(super) fn admit(&mut self, batch: Enqueued, delivery_timeout: Duration) -> usize {
        self.claim_blocked = !batch.needs_settling();
        if self.claim_blocked {
            return 0;
        }
        let claimed = batch.rows.len();
        self.flight.add(batch, delivery_timeout);
        claimed
    }

    /// Whether any delivery report came in since `since`.
    pub(super) fn delivered_since(&self, since: Instant) -> bool {
        self.flight.delivered_since(since)
    }

    /// See [`Flight::awaits_reports`].
    pub(super) fn awaits_reports(&self) -> bool {
        self.flight.awaits_reports()
    }

    /// See [`Flight::next_reports`] (cancel-safe; use it with
    /// [`awaits_reports`](Self::awaits_reports) as guard).
    pub(super) async fn next_reports(&mut self, partitions: &mut Partitions) {
        self.flight.next_reports(partitions).await;
    }

    /// See [`Flight::next_timer`].
    pub(super) fn next_timer(&self, stall_timeout: Duration) -> Option<Instant> {
        self.flight.next_timer(stall_timeout)
    }

    /// See [`Flight::expire`].
    pub(super) fn expire(&mut self, now: Instant) {
        self.flight.expire(now);
    }

    /// Batches whose every report is in, to settle. Settling frees what a
    /// claim was paused for.
    pub(super) fn take_complete(&mut self) -> Vec<Batch> {
        let complete = self.flight.take_complete();
        if !complete.is_empty() {
            self.claim_blocked = false;
        }
        complete
    }

    /// See [`Flight::stalled`].
    pub(super) fn stalled(&self, stall_timeout: Duration) -> Vec<u64> {
        self.flight.stalled(stall_timeout)
    }

    /// See [`Flight::batch`].
    pub(super) fn batch(&self, seq: u64) -> Option<&Batch> {
        self.flight.batch(seq)
    }

    /// Batch `seq`, to settle without its late rows (see [`Flight::split`]).
    /// Settling frees what a claim was paused for.
    pub(super) fn split(&mut self, seq: u64) -> Option<Batch> {
        let batch = self.flight.split(seq);
        if batch.is_some() {
            self.claim_blocked = false;
        }
        batch
    }

    /// Stragglers whose report is in (or lost), to settle. Settling frees
    /// what a claim was paused for.
    pub(super) fn take_resolved(&mut self) -> Vec<Resolved> {
        let resolved = self.flight.take_resolved();
        if !resolved.is_empty() {
            self.claim_blocked = false;
        }
        resolved
    }

    /// Rows in flight whose batch was settled without them.
    pub(super) fn straggler_count(&self) -> usize {
        self.flight.straggler_count()
    }

    /// Forgets everything in flight (the connection that could mark it is
    /// gone: the rows are published again later).
    pub(super) fn clear(&mut self) {
        self.flight.clear();
    }
}
