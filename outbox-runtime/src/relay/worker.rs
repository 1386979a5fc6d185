//! The relay loop: rebalance lanes, claim, publish, settle, wait.
//!
//! [`Worker::run`] turns these steps over the [`Flight`] of batches in
//! flight until shutdown, then drains it. The steps beyond the lanes live
//! in child modules: `claim.rs` (claim, then publish), `settle.rs` (mark what
//! the broker answered) and `wait.rs` (for reports, commits or timers).

mod claim;
mod settle;
mod wait;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::backend::Backend;
use super::backoff::error_delay;
use super::config::RelayConfig;
use super::error::RelayError;
use super::flight::Flight;
use super::held_topics::HeldTopics;
use super::lanes::{Lanes, Rebalanced};
use super::partitions::Partitions;
use super::publish::Publisher;
use super::session;
use super::summary::Totals;
use super::telemetry as metric;
use super::wakeup::Wakeups;

/// First wait after a poll that found fewer rows than a batch; doubles while
/// polls stay empty, up to `poll_interval`.
const IDLE_WAIT_FIRST: Duration = Duration::from_millis(5);

/// How long a claim that found rows no commit signal announced keeps the
/// relay polling quickly (from [`IDLE_WAIT_FIRST`] after every batch): a
/// writer that does not signal this relay (another process, without
/// `listen_notify`) wrote that recently. Otherwise the relay trusts the
/// signals: it claims when one arrives, and polls only every
/// `poll_interval` (after a short ramp), as the safety net.
const UNSIGNALED_WRITER_MEMORY: Duration = Duration::from_secs(10);

/// How long after a claim found rows no signal announced a signal may
/// still come for them: a claim can see a commit before its writer, a
/// moment later, signals it. Rows with no signal within this time were
/// written by a writer that does not signal.
const SIGNAL_GRACE: Duration = Duration::from_millis(50);

/// Consecutive batches that failed as a whole after which the producer is
/// rebuilt.
const REBUILD_AFTER_OUTAGES: u32 = 2;

/// One relay's loop and everything it works with.
pub(crate) struct Worker<B: Backend> {
    database: B,
    config: RelayConfig,
    lanes: Lanes<B>,
    publisher: Publisher,
    totals: Arc<Totals>,
    cancel: CancellationToken,
    wakeup: Wakeups,
    /// Batches and stragglers handed to the producer, not settled yet, and
    /// the claim pause.
    flight: Flight,
    /// Partition prediction and the partitions held back as unavailable.
    partitions: Partitions,
    /// Topics the broker refuses as a whole, left out of claims.
    held_topics: HeldTopics,
}

/// The loop's timing between turns.
#[derive(Debug)]
struct Cadence {
    /// Failed batches (or lane rebalances) in a row, for the backoff.
    failures: u32,
    /// The next wait while polls find fewer rows than a batch.
    idle_wait: Duration,
    next_rebalance: Instant,
    next_metrics: Instant,
    /// Rows may wait that no commit signal will announce (the last claim
    /// was full, had no room, or sent less than it found; lanes were taken;
    /// a step failed): the next turn claims, and its rows say nothing about
    /// unsignalled writers.
    claim_due: bool,
    /// When a claim that no signal, and nothing of the above, called for
    /// found rows, while no signal has come for them yet (see
    /// [`SIGNAL_GRACE`]).
    unannounced_rows_at: Option<Instant>,
    /// When such rows were last found and no signal came for them (see
    /// [`UNSIGNALED_WRITER_MEMORY`]).
    unsignaled_rows_at: Option<Instant>,
}

impl Cadence {
    /// A signal arrived: rows found unannounced within [`SIGNAL_GRACE`]
    /// before were most likely its commit's.
    fn signal_arrived(&mut self) {
        if self
            .unannounced_rows_at
            .is_some_and(|at| at.elapsed() <= SIGNAL_GRACE)
        {
            self.unannounced_rows_at = None;
        }
    }

    /// Rows found unannounced whose grace for a signal has passed were
    /// written by a writer that does not signal this relay: remembered as
    /// such. `signal_pending`: a signal arrived that the loop has not taken
    /// yet (it may be theirs).
    fn expire_unannounced(&mut self, signal_pending: bool) {
        if let Some(at) = self.unannounced_rows_at
            && !signal_pending
            && at.elapsed() > SIGNAL_GRACE
        {
            self.unsignaled_rows_at = Some(at);
            self.unannounced_rows_at = None;
        }
    }

    /// Whether a writer that does not signal this relay wrote recently, or
    /// may have (rows found unannounced, still within the grace for their
    /// signal). Call [`expire_unannounced`](Self::expire_unannounced) first.
    fn unsignaled_writer(&self) -> bool {
        self.unannounced_rows_at.is_some()
            || self
                .unsignaled_rows_at
                .is_some_and(|at| at.elapsed() < UNSIGNALED_WRITER_MEMORY)
    }
}

/// What one claim did.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Claimed {
    /// Rows the claim statement returned.
    found: usize,
    /// Rows taken into the flight (0 if all were held behind rows in
    /// flight).
    admitted: usize,
    /// Rows held back for an unavailable partition were released for this
    /// claim (no signal announces them).
    released: bool,
    /// Rows may be left that no commit signal will announce: the claim was
    /// skipped for lack of room, returned a full batch, or left rows unsent.
    rows_may_wait: bool,
}

/// What settling found.
#[derive(Debug, Default, Clone, Copy)]
struct Progress {
    /// Something was settled: keys and pipeline room were freed.
    settled: bool,
    /// The broker answered (a row delivered or refused).
    answered: bool,
    /// The wait ended for a commit signal, the poll timer, the next
    /// rebalance or shutdown, not only because something settled: claim.
    woken: bool,
    /// A batch got nothing through, only for reasons outside the messages,
    /// and nothing else was delivered meanwhile: the broker is unreachable,
    /// so back off instead of polling again.
    outage: bool,
}

impl Progress {
    fn merge(&mut self, other: Self) {
        self.settled |= other.settled;
        self.answered |= other.answered;
        self.outage |= other.outage;
        self.woken |= other.woken;
    }
}

#[derive(Debug, thiserror::Error)]
enum BatchError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("could not rebuild the producer: {0}")]
    Producer(#[from] rdkafka::error::KafkaError),
    /// `RelayBuilder::crash_before_mark` (feature `test-hooks`).
    #[cfg(feature = "test-hooks")]
    #[error("simulated crash between delivery and marking")]
    SimulatedCrash,
}

impl<B: Backend> Worker<B> {
    pub(crate) fn new(
        database: B,
        config: RelayConfig,
        publisher: Publisher,
        partitions: Partitions,
        totals: Arc<Totals>,
        cancel: CancellationToken,
        wakeup: Wakeups,
    ) -> Self {
        Self {
            database,
            lanes: Lanes::new(&config),
            held_topics: HeldTopics::new(config.error_backoff),
            config,
            publisher,
            totals,
            cancel,
            wakeup,
            flight: Flight::default(),
            partitions,
        }
    }

    /// The loop. Each turn rebalances lanes (when due), claims a batch and
    /// publishes it (while room is left in the [`Flight`]), then settles
    /// what the broker answered while waiting for reports, a commit signal or
    /// a timer. A batch whose last reports are late while other rows got
    /// through (a partition whose leader is down) is settled without them
    /// after `partition_stall_timeout`; see [`Flight`](super::flight::Flight)
    /// and [`Partitions`]. On shutdown what is in flight is awaited and
    /// marked, and the lanes are released.
    pub(crate) async fn run(mut self) -> Result<(), RelayError> {
        let mut cadence = Cadence {
            failures: 0,
            idle_wait: IDLE_WAIT_FIRST,
            next_rebalance: Instant::now(),
            next_metrics: Instant::now(),
            claim_due: true,
            unannounced_rows_at: None,
            unsignaled_rows_at: None,
        };
        while !self.cancel.is_cancelled() {
            if let Some(fatal) = self.lanes.take_fatal() {
                // Refused by the fleet or by the database set-up: retrying
                // cannot help, the service must be reconfigured.
                self.lanes.reset();
                return Err(fatal);
            }
            // `outbox status` reads the held topics from the membership row.
            if let Some(held) = self.held_topics.take_changed() {
                self.lanes.set_held_topics(&held);
            }
            let now = Instant::now();
            // Rebalance lanes (when due).
            if now >= cadence.next_rebalance && !self.rebalance(now, &mut cadence).await? {
                continue;
            }
            if now >= cadence.next_metrics {
                cadence.next_metrics = now + self.config.metrics_interval;
                self.refresh_backlog().await;
                self.partitions.log_unavailable();
            }
            if self.lanes.owned().is_empty() {
                self.pause(
                    cadence
                        .next_rebalance
                        .saturating_duration_since(Instant::now()),
                )
                .await;
                continue;
            }
            // Claim, then publish.
            let signalled = self.wakeup.take_signalled();
            if signalled {
                cadence.signal_arrived();
            }
            let due = std::mem::take(&mut cadence.claim_due);
            let claimed = match self.claim_and_publish().await {
                Ok(claimed) => claimed,
                Err(error) => {
                    // Unsettled batches cannot be marked on a dead
                    // connection either: they are published again later.
                    self.forget_in_flight();
                    self.failed(error, &mut cadence).await;
                    continue;
                }
            };
            // Rows nothing announced: some writer may not signal. (Or the
            // claim saw a commit before its writer signalled it: a signal
            // within `SIGNAL_GRACE` clears them.)
            if claimed.found > 0
                && !signalled
                && !due
                && !claimed.released
                && !self.wakeup.local_pending()
            {
                cadence.unannounced_rows_at.get_or_insert_with(Instant::now);
            }
            cadence.claim_due = claimed.rows_may_wait;
            // Settle what the broker answered, or wait.
            self.settle_or_wait(claimed.admitted, &mut cadence).await;
        }
        // Graceful shutdown: what is in flight is awaited and marked.
        if let Err(error) = self.settle_all().await {
            tracing::warn!(%error, "outbox relay could not settle its last batches");
        }
        self.lanes.release().await;
        Ok(())
    }

    /// Takes or releases lanes for a fair share (due at `now`). `Ok(false)`
    /// when the turn must start over (after an error, paused already); an
    /// error when the relay must stop.
    async fn rebalance(&mut self, now: Instant, cadence: &mut Cadence) -> Result<bool, RelayError> {
        cadence.next_rebalance = now + self.config.rebalance_interval;
        self.probe_broker_if_failing().await;
        let owned_before = self.lanes.owned();
        let mut result = self
            .lanes
            .rebalance(&self.database, self.flight.is_empty())
            .await;
        if let Ok(Rebalanced::MustRelease) = result {
            // Lanes are released only while nothing of ours is in flight, so
            // a lane's next owner cannot overtake our deliveries. Taking
            // lanes needs no such pause.
            if let Err(error) = self.settle_all().await {
                self.failed(error, cadence).await;
                return Ok(false);
            }
            result = self.lanes.rebalance(&self.database, true).await;
        }
        if let Err(error) = result {
            self.forget_in_flight(); // the lane connection is gone: they cannot be marked
            if let Some(fatal) = self.lanes.take_fatal() {
                self.lanes.reset();
                return Err(fatal);
            }
            tracing::warn!(%error, "outbox relay could not take its lanes");
            self.count_error("database");
            cadence.failures += 1;
            cadence.next_rebalance = Instant::now();
            self.pause(error_delay(&self.config, cadence.failures))
                .await;
            return Ok(false);
        }
        let owned = self.lanes.owned();
        if owned.iter().any(|lane| !owned_before.contains(lane)) {
            // The new lanes' rows were announced to their former owner.
            cadence.claim_due = true;
        }
        metrics::gauge!(metric::LANES_OWNED).set(owned.len() as f64);
        Ok(true)
    }

    /// While the relay cannot reach the broker and has handed its lanes
    /// over, asks the broker for metadata once per rebalance; an answer
    /// makes it a candidate for lanes again.
    async fn probe_broker_if_failing(&mut self) {
        if !self.lanes.broker_failing() || !self.lanes.owned().is_empty() {
            return;
        }
        let timeout = self
            .config
            .rebalance_interval
            .min(self.config.database_timeout);
        if self.publisher.reachable(timeout).await {
            self.lanes.set_broker_failing(false);
        }
    }

    /// Drops everything in flight (its connection is gone: it is published
    /// again later) and the partitions' state with the probes it held.
    fn forget_in_flight(&mut self) {
        self.flight.clear();
        self.partitions.reset();
    }

    /// Counts a failed step and pauses before the next turn.
    async fn failed(&mut self, error: BatchError, cadence: &mut Cadence) {
        tracing::warn!(%error, "outbox relay batch failed");
        match error {
            BatchError::Database(_) => {
                self.count_error("database");
                // The session may be gone, and its lane locks with it.
                self.lanes.reset();
                cadence.next_rebalance = Instant::now();
            }
            BatchError::Producer(_) => self.count_error("fatal_producer"),
            #[cfg(feature = "test-hooks")]
            BatchError::SimulatedCrash => {}
        }
        cadence.failures += 1;
        cadence.claim_due = true;
        self.pause(error_delay(&self.config, cadence.failures))
            .await;
    }

    /// Whether the relay polls quickly (from [`IDLE_WAIT_FIRST`] after
    /// every batch, and claims again after every settle) instead of
    /// trusting the commit signals: while a writer that does not signal it
    /// wrote recently, and while a partition is unavailable (its held-back
    /// rows are released by a claim).
    fn polls_quickly(&self, cadence: &mut Cadence) -> bool {
        cadence.expire_unannounced(self.wakeup.local_pending());
        cadence.unsignaled_writer() || self.partitions.any_down()
    }

    async fn refresh_backlog(&self) {
        let limit = self.config.database_timeout;
        match session::bounded(limit, "measuring the backlog", self.database.backlog()).await {
            Ok((rows, oldest_age)) => {
                metrics::gauge!(metric::BACKLOG).set(rows as f64);
                metrics::gauge!(metric::OLDEST_UNPUBLISHED_AGE).set(oldest_age);
            }
            Err(error) => tracing::debug!(%error, "outbox relay could not measure its backlog"),
        }
    }

    fn count_error(&self, kind: &'static str) {
        metric::error(kind);
        Totals::add(&self.totals.errors, 1);
    }
}
