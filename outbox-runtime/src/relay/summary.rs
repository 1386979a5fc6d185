//! What a relay did: the counters it keeps while it runs and the summary
//! they make.

use std::sync::atomic::{AtomicU64, Ordering};

/// What a relay did, returned by
/// [`RelayHandle::shutdown`](super::RelayHandle::shutdown).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelaySummary {
    /// Events delivered and marked as published.
    pub published: u64,
    /// Events parked after `max_attempts` failed attempts.
    pub parked: u64,
    /// Times an event was held back (not sent, no attempt counted) because
    /// its partition was unavailable.
    pub held_back: u64,
    /// Non-empty batches completed.
    pub batches: u64,
    /// Errors met (each also counted in `outbox_relay_errors_total`).
    pub errors: u64,
    /// Times the producer was replaced after a fatal error or an outage.
    pub producer_rebuilds: u64,
    /// Scheduled events this relay's scheduler moved into `outbox_event`
    /// when they were due (see `docs/relay.md`, *Scheduled delivery*).
    pub scheduled_moved: u64,
    /// Claim statements run (each also counted in
    /// `outbox_relay_claims_total`).
    pub claims: u64,
    /// Of those, claims that found nothing (polls, and claims after a
    /// commit signal whose rows an earlier claim had taken).
    pub empty_claims: u64,
    /// `true` if the relay stopped within `shutdown_timeout`; `false` if it
    /// had to be aborted (its unmarked rows are published again later).
    pub clean: bool,
}

/// Totals of one relay, read by [`RelayHandle`](super::RelayHandle).
#[derive(Debug, Default)]
pub(crate) struct Totals {
    pub published: AtomicU64,
    pub parked: AtomicU64,
    pub held_back: AtomicU64,
    pub batches: AtomicU64,
    pub errors: AtomicU64,
    pub producer_rebuilds: AtomicU64,
    pub scheduled_moved: AtomicU64,
    pub claims: AtomicU64,
    pub empty_claims: AtomicU64,
}

impl Totals {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    /// The totals so far as a summary.
    pub(crate) fn summary(&self, clean: bool) -> RelaySummary {
        RelaySummary {
            published: Self::get(&self.published),
            parked: Self::get(&self.parked),
            held_back: Self::get(&self.held_back),
            batches: Self::get(&self.batches),
            errors: Self::get(&self.errors),
            producer_rebuilds: Self::get(&self.producer_rebuilds),
            scheduled_moved: Self::get(&self.scheduled_moved),
            claims: Self::get(&self.claims),
            empty_claims: Self::get(&self.empty_claims),
            clean,
        }
    }
}
