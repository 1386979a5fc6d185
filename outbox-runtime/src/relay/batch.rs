//! One claimed batch on its way: as the publisher built it ([`Enqueued`]),
//! while its delivery reports come in ([`Batch`]), and the rows settled
//! without it that still await theirs (stragglers).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use futures::FutureExt;
use futures::channel::oneshot::Canceled;
use rdkafka::producer::DeliveryFuture;
use rdkafka::producer::future_producer::OwnedDeliveryResult;
use tracing::Span;

use super::publish::Outcome;
use super::store::ClaimedRow;

/// A sent row's delivery report, tagged with where it belongs.
pub(super) struct Report {
    pub seq: u64,
    pub index: usize,
    pub future: DeliveryFuture,
}

impl Future for Report {
    type Output = (u64, usize, Result<OwnedDeliveryResult, Canceled>);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let (seq, index) = (self.seq, self.index);
        self.future
            .poll_unpin(cx)
            .map(|report| (seq, index, report))
    }
}

/// A claimed batch being delivered.
pub(crate) struct Batch {
    pub rows: Vec<ClaimedRow>,
    /// `None` while a sent row's report is outstanding.
    pub outcomes: Vec<Option<Outcome>>,
    /// The partition each row went to (from its report), else the predicted one.
    pub partitions: Vec<Option<i32>>,
    pub started: Instant,
    pub span: Span,
    /// The producer it was sent through (`Publisher::generation`).
    pub generation: u64,
    /// Its number in the flight.
    pub seq: u64,
    /// Sent rows whose report is outstanding.
    pub outstanding: usize,
    /// When its outstanding reports count as lost.
    pub deadline: Instant,
}

impl Batch {
    /// Rows whose report is outstanding, with their predicted partition.
    pub(crate) fn pending(&self) -> impl Iterator<Item = (&ClaimedRow, Option<i32>)> {
        self.rows
            .iter()
            .zip(&self.outcomes)
            .zip(&self.partitions)
            .filter(|((_, outcome), _)| outcome.is_none())
            .map(|((row, _), partition)| (row, *partition))
    }
}

/// A row of a batch settled without it, its report still to come.
pub(super) struct Straggler {
    pub row: ClaimedRow,
    pub predicted: Option<i32>,
    pub deadline: Instant,
}

/// A straggler whose report is in.
pub(crate) struct Resolved {
    pub row: ClaimedRow,
    pub outcome: Outcome,
}

/// A batch as the publisher built it.
pub(crate) struct Enqueued {
    pub rows: Vec<ClaimedRow>,
    /// One per row; `None` for a sent row.
    pub outcomes: Vec<Option<Outcome>>,
    pub predicted: Vec<Option<i32>>,
    /// Sent rows: index, report, and whether the row is its partition's probe
    /// (a straggler from the start: its partition is known to be down).
    pub sent: Vec<(usize, DeliveryFuture, bool)>,
    pub started: Instant,
    pub span: Span,
    /// The producer it was sent through (`Publisher::generation`).
    pub generation: u64,
}

impl Enqueued {
    /// `false` when every row was held behind a row in flight: nothing was
    /// sent, refused or held back, so there is nothing to await or record.
    pub(crate) fn needs_settling(&self) -> bool {
        !self.sent.is_empty() || self.outcomes.iter().any(|o| *o != Some(Outcome::Held))
    }
}
