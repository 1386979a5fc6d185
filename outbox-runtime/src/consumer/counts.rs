//! What a consumer counts: its metrics (labelled with its group) and the
//! totals its handle and summary read, kept together so that a figure is
//! never counted in one and not the other.

use std::sync::Arc;

use super::summary::Totals;
use super::telemetry as m;

/// The counters of one consumer. Cheap to clone (its parts share them).
#[derive(Debug, Clone)]
pub(crate) struct Counts {
    group: String,
    pub(crate) totals: Arc<Totals>,
}

impl Counts {
    pub(crate) fn new(group: String) -> Self {
        Self {
            group,
            totals: Arc::default(),
        }
    }

    fn group(&self) -> String {
        self.group.clone()
    }

    /// Committed handlers and duplicates (dedup mode's metrics have no event
    /// type label).
    pub(crate) fn handled(&self, handled: u64, duplicates: u64) {
        metrics::counter!(m::HANDLED, "group" => self.group()).increment(handled);
        metrics::counter!(m::DUPLICATES, "group" => self.group()).increment(duplicates);
        Totals::add(&self.totals.handled, handled);
        Totals::add(&self.totals.duplicates, duplicates);
    }

    /// Rows inserted into the inbox and duplicates it absorbed.
    pub(crate) fn stored(&self, inserted: u64, duplicates: u64) {
        metrics::counter!(m::INBOX_STORED, "group" => self.group()).increment(inserted);
        metrics::counter!(m::DUPLICATES, "group" => self.group()).increment(duplicates);
        Totals::add(&self.totals.stored, inserted);
        Totals::add(&self.totals.duplicates, duplicates);
    }

    /// Committed handlers per event type (inbox mode).
    pub(crate) fn handled_by_type(&self, handled: impl IntoIterator<Item = (String, u64)>) {
        for (event_type, count) in handled {
            metrics::counter!(m::HANDLED, "group" => self.group(), "event_type" => event_type)
                .increment(count);
            Totals::add(&self.totals.handled, count);
        }
    }

    /// A message skipped by the unknown-event policy.
    pub(crate) fn skipped(&self, topic: &str, event_type: &str) {
        metrics::counter!(m::UNKNOWN_SKIPPED, "group" => self.group(), "topic" => topic.to_owned())
            .increment(1);
        Totals::add(&self.totals.skipped, 1);
        tracing::debug!(topic, event_type, "no handler; skipped");
    }

    /// A database error of the consumer's own statements.
    pub(crate) fn database_error(&self) {
        metrics::counter!(m::DB_ERRORS, "group" => self.group()).increment(1);
        Totals::add(&self.totals.database_errors, 1);
    }

    /// A failed handler call (logged with the handler and the event).
    pub(crate) fn handler_failed(&self, failed: &FailedCall<'_>) {
        let FailedCall {
            handler,
            event_type,
            event_id,
            error,
            timed_out,
        } = *failed;
        let event_type = event_type.to_owned();
        metrics::counter!(m::HANDLER_ERRORS, "group" => self.group(), "event_type" => event_type.clone())
            .increment(1);
        if timed_out {
            metrics::counter!(m::HANDLER_TIMEOUTS, "group" => self.group(), "event_type" => event_type)
                .increment(1);
        }
        tracing::warn!(%error, handler, %event_id, "handler failed");
    }
}

/// A failed handler call, as the counts record it.
#[derive(Clone, Copy)]
pub(crate) struct FailedCall<'a> {
    /// The handler's name.
    pub(crate) handler: &'a str,
    pub(crate) event_type: &'a str,
    pub(crate) event_id: uuid::Uuid,
    pub(crate) error: &'a dyn std::fmt::Display,
    /// Abandoned at the handler timeout.
    pub(crate) timed_out: bool,
}
