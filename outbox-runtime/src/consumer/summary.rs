//! What a consumer did: the counters it keeps while it runs and the summary
//! they make (the consumer's side of [`RelaySummary`](crate::relay::RelaySummary)).

use std::sync::atomic::{AtomicU64, Ordering};

/// What a consumer did, returned by
/// [`ConsumerHandle::shutdown`](super::ConsumerHandle::shutdown),
/// [`join`](super::ConsumerHandle::join) and [`Consumer::run`](super::Consumer::run),
/// and read while it runs with [`ConsumerHandle::summary`](super::ConsumerHandle::summary).
/// Each figure is also a metric (see [`telemetry`](super::telemetry)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConsumerSummary {
    /// Events whose handler ran and committed.
    pub handled: u64,
    /// Events received again and not handled again (already processed, or
    /// already in the inbox).
    pub duplicates: u64,
    /// Messages published to a dead-letter topic.
    pub dead_lettered: u64,
    /// Dead letters their topic refused, kept in `consumer_dead_letter`.
    pub dead_letters_parked: u64,
    /// Messages of event types without a handler, skipped by policy.
    pub skipped: u64,
    /// Inbox mode: rows inserted into `inbox_event` (handled on receipt or
    /// pending).
    pub stored: u64,
    /// Inbox mode: rows parked (out of attempts, or no handler can take them).
    pub parked: u64,
    /// Failures of the consumer's own database work (an outage, or a
    /// connection that stopped answering and was abandoned), each followed
    /// by a pause and another try.
    pub database_errors: u64,
    /// `true` if the consumer stopped within its
    /// [`shutdown_timeout`](super::ConsumerBuilder::shutdown_timeout);
    /// `false` if it had to be aborted (what it had not committed is
    /// received again, and deduplicated, after the restart).
    pub clean: bool,
}

/// Totals of one consumer, shared by its receive loop and processors.
#[derive(Debug, Default)]
pub(crate) struct Totals {
    pub(crate) handled: AtomicU64,
    pub(crate) duplicates: AtomicU64,
    pub(crate) dead_lettered: AtomicU64,
    pub(crate) dead_letters_parked: AtomicU64,
    pub(crate) skipped: AtomicU64,
    pub(crate) stored: AtomicU64,
    pub(crate) parked: AtomicU64,
    pub(crate) database_errors: AtomicU64,
}

impl Totals {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// The totals so far as a summary.
    pub(crate) fn summary(&self, clean: bool) -> ConsumerSummary {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ConsumerSummary {
            handled: get(&self.handled),
            duplicates: get(&self.duplicates),
            dead_lettered: get(&self.dead_lettered),
            dead_letters_parked: get(&self.dead_letters_parked),
            skipped: get(&self.skipped),
            stored: get(&self.stored),
            parked: get(&self.parked),
            database_errors: get(&self.database_errors),
            clean,
        }
    }
}
