//! The relay loop: rebalance lanes, claim, publish, mark, wait.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::wakeup::CommitListener;
use rand::Rng;
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, Span, field};

use super::config::RelayConfig;
use super::lanes::{self, Lanes, Rebalanced};
use super::publish::{Outcome, PendingBatch, Publisher};
use super::store::{self, ClaimedRow, Rejection};
use super::telemetry::{self as metric, Totals};

/// First wait after a poll that found fewer rows than a batch; doubles while
/// polls stay empty, up to `poll_interval`.
const IDLE_WAIT_FIRST: Duration = Duration::from_millis(5);

/// Consecutive batches that failed as a whole after which the producer is
/// rebuilt.
const REBUILD_AFTER_OUTAGES: u32 = 2;

/// Most batches in flight at once (see [`Worker::run`]).
const MAX_IN_FLIGHT: usize = 4;

pub(crate) struct Worker {
    pub pool: PgPool,
    pub config: RelayConfig,
    pub lanes: Lanes,
    pub publisher: Publisher,
    pub totals: Arc<Totals>,
    pub cancel: CancellationToken,
    pub wakeup: Wakeups,
    /// Set when every row of a claimed batch was held back behind a batch in
    /// flight: no further claim until a batch settles.
    pub claim_blocked: bool,
}

/// What wakes an idle relay besides its poll timer: commits of its own
/// process and, with `listen_notify`, notifications from other processes.
pub(crate) struct Wakeups {
    local: CommitListener,
    remote: Option<Arc<Notify>>,
}

impl Wakeups {
    pub(crate) fn new(local: CommitListener, remote: Option<Arc<Notify>>) -> Self {
        Self { local, remote }
    }

    /// Returns at the next commit signal or notification.
    async fn committed(&mut self) {
        match &self.remote {
            Some(remote) => tokio::select! {
                () = self.local.committed() => {}
                () = remote.notified() => {}
            },
            None => self.local.committed().await,
        }
    }
}

/// A claimed batch handed to the producer, not yet settled.
struct InFlight {
    rows: Vec<ClaimedRow>,
    pending: PendingBatch,
    started: Instant,
    span: Span,
}

impl InFlight {
    fn ids(&self) -> Vec<i64> {
        self.rows.iter().map(|row| row.id).collect()
    }

    fn keys(&self) -> HashSet<String> {
        self.rows
            .iter()
            .map(|row| row.partition_key.clone())
            .collect()
    }
}

/// What ended the wait for the oldest batch in flight.
enum Woke {
    Delivered,
    Committed,
    Renew,
}

/// What settling one batch found.
#[derive(Debug)]
struct Settled {
    /// Nothing got through and only for reasons outside the messages: the
    /// broker is unreachable, so back off instead of polling again.
    outage: bool,
}

#[derive(Debug, thiserror::Error)]
enum BatchError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("could not rebuild the producer: {0}")]
    Producer(#[from] rdkafka::error::KafkaError),
    #[error("simulated crash between delivery and marking")]
    SimulatedCrash,
}

impl Worker {
    /// The loop is a pipeline: while batches are being delivered, the next
    /// one is claimed and enqueued, and each batch is settled (marked) once
    /// its deliveries are in, oldest first, so the database work overlaps the
    /// broker's. Under a backlog two full batches are in flight; at low rates
    /// a commit signal claims at once even while small batches are in flight
    /// (up to `MAX_IN_FLIGHT`), so an event does not wait for the previous
    /// batch's round trip.
    pub(crate) async fn run(mut self) -> Result<(), super::RelayError> {
        let mut in_flight: VecDeque<InFlight> = VecDeque::new();
        let mut failures = 0u32;
        let mut idle_wait = IDLE_WAIT_FIRST;
        let mut next_rebalance = Instant::now();
        let mut next_metrics = Instant::now();
        while !self.cancel.is_cancelled() {
            if let Some(fatal) = self.lanes.take_fatal() {
                // Refused by the fleet or by the database set-up: retrying
                // cannot help, the service must be reconfigured.
                self.lanes.reset();
                return Err(fatal);
            }
            let now = Instant::now();
            if now >= next_rebalance {
                next_rebalance = now + self.config.rebalance_interval;
                self.probe_broker_if_failing().await;
                let mut result = self.lanes.rebalance(&self.pool, in_flight.is_empty()).await;
                if let Ok(Rebalanced::MustRelease) = result {
                    // Lanes are released only while nothing of ours is in
                    // flight, so a lane's next owner cannot overtake our
                    // deliveries. Taking lanes needs no such pause.
                    if let Err(error) = self.settle_all(&mut in_flight).await {
                        self.failed(error, &mut failures, &mut next_rebalance).await;
                        continue;
                    }
                    result = self.lanes.rebalance(&self.pool, true).await;
                }
                if let Err(error) = result {
                    in_flight.clear(); // the lane connection is gone: they cannot be marked
                    if let Some(fatal) = self.lanes.take_fatal() {
                        self.lanes.reset();
                        return Err(fatal);
                    }
                    tracing::warn!(%error, "outbox relay could not take its lanes");
                    self.count_error("database");
                    failures += 1;
                    next_rebalance = Instant::now();
                    self.pause(error_delay(&self.config, failures)).await;
                    continue;
                }
                metrics::gauge!(metric::LANES_OWNED).set(self.lanes.owned().len() as f64);
            }
            if now >= next_metrics {
                next_metrics = now + self.config.metrics_interval;
                self.refresh_backlog().await;
            }
            if self.lanes.owned().is_empty() {
                self.pause(next_rebalance.saturating_duration_since(Instant::now()))
                    .await;
                continue;
            }

            let mut claimed = 0;
            if in_flight.is_empty() {
                self.claim_blocked = false; // also after batches were dropped on errors
            }
            if self.has_room(&in_flight) {
                match self.claim_and_enqueue(&in_flight).await {
                    Ok(Some(batch)) => {
                        // Rows of keys still in flight are not sent. If that
                        // was all of them, claiming again before a batch
                        // settles would find the same rows (with few keys, a
                        // backlog spins on them), so wait for a settle.
                        self.claim_blocked = !batch.pending.needs_settling();
                        if batch.pending.needs_settling() {
                            claimed = batch.rows.len();
                            in_flight.push_back(batch);
                        }
                    }
                    Ok(None) => {}
                    Err(error) => {
                        // Unsettled batches cannot be marked on a dead
                        // connection either: they are published again later.
                        in_flight.clear();
                        self.failed(error, &mut failures, &mut next_rebalance).await;
                        continue;
                    }
                }
            }
            if in_flight.is_empty() {
                idle_wait = (idle_wait * 2).min(self.config.poll_interval);
                let until_rebalance = next_rebalance.saturating_duration_since(Instant::now());
                self.idle(idle_wait.min(until_rebalance)).await;
                continue;
            }
            idle_wait = IDLE_WAIT_FIRST;
            if claimed >= self.config.batch_size && in_flight.len() < 2 {
                continue; // a backlog: fill the pipeline first
            }
            let room = self.has_room(&in_flight);
            let renew_at = self.lanes.renew_at();
            let oldest = in_flight.front_mut().expect("not empty");
            let woke = tokio::select! {
                // Settle a delivered batch first: its rows are published only
                // once marked, and settling unblocks the keys it holds.
                biased;
                () = oldest.pending.delivered() => Woke::Delivered,
                () = self.wakeup.committed(), if room => Woke::Committed,
                // A slow broker must not let the lease expire.
                () = tokio::time::sleep_until(renew_at.into()) => Woke::Renew,
            };
            match woke {
                Woke::Delivered => {}
                Woke::Committed => continue, // claim the new commits now, settle afterwards
                Woke::Renew => {
                    if let Err(error) = self.lanes.renew().await {
                        in_flight.clear();
                        self.failed(error.into(), &mut failures, &mut next_rebalance)
                            .await;
                    }
                    continue;
                }
            }
            let batch = in_flight.pop_front().expect("not empty");
            match self.settle(batch).await {
                Ok(settled) if settled.outage => {
                    // Rebalance before claiming again: if other relays can
                    // reach the broker, this one hands its lanes to them.
                    self.lanes.set_broker_failing(true);
                    next_rebalance = Instant::now();
                    // The batches behind it will most likely fail too: settle
                    // them before pausing, so nothing stays in flight.
                    if let Err(error) = self.settle_all(&mut in_flight).await {
                        self.failed(error, &mut failures, &mut next_rebalance).await;
                        continue;
                    }
                    failures += 1;
                    if failures >= REBUILD_AFTER_OUTAGES {
                        match self.publisher.rebuild() {
                            Ok(()) => Totals::add(&self.totals.producer_rebuilds, 1),
                            Err(error) => {
                                tracing::error!(%error, "outbox relay could not rebuild its producer");
                            }
                        }
                    }
                    self.pause(error_delay(&self.config, failures)).await;
                }
                Ok(_) => {
                    failures = 0;
                    self.lanes.set_broker_failing(false);
                }
                Err(error) => {
                    in_flight.clear();
                    self.failed(error, &mut failures, &mut next_rebalance).await;
                }
            }
        }
        // Graceful shutdown: the batches in flight are awaited and marked.
        if let Err(error) = self.settle_all(&mut in_flight).await {
            tracing::warn!(%error, "outbox relay could not settle its last batches");
        }
        self.lanes.release().await;
        Ok(())
    }

    /// Whether another batch may be claimed: not while a claim found only
    /// rows held back (until a batch settles); otherwise always up to two
    /// batches (claim overlapping delivery), more only while they are small.
    fn has_room(&self, in_flight: &VecDeque<InFlight>) -> bool {
        if self.claim_blocked {
            return false;
        }
        let rows: usize = in_flight.iter().map(|batch| batch.rows.len()).sum();
        in_flight.len() < 2 || (in_flight.len() < MAX_IN_FLIGHT && rows < self.config.batch_size)
    }

    /// Settles every batch in flight, oldest first.
    async fn settle_all(&mut self, in_flight: &mut VecDeque<InFlight>) -> Result<(), BatchError> {
        while let Some(mut batch) = in_flight.pop_front() {
            let mut settled = self.await_delivery(&mut batch).await;
            if settled.is_ok() {
                settled = self.settle(batch).await.map(|_| ());
            }
            if let Err(error) = settled {
                in_flight.clear();
                return Err(error);
            }
        }
        Ok(())
    }

    /// Waits for a batch's delivery reports, renewing the lease meanwhile (a
    /// batch may be in flight for the whole `delivery_timeout`).
    async fn await_delivery(&mut self, batch: &mut InFlight) -> Result<(), BatchError> {
        loop {
            let renew_at = self.lanes.renew_at();
            tokio::select! {
                () = batch.pending.delivered() => return Ok(()),
                () = tokio::time::sleep_until(renew_at.into()) => self.lanes.renew().await?,
            }
        }
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

    async fn failed(
        &mut self,
        error: BatchError,
        failures: &mut u32,
        next_rebalance: &mut Instant,
    ) {
        tracing::warn!(%error, "outbox relay batch failed");
        match error {
            BatchError::Database(_) => {
                self.count_error("database");
                // The session may be gone, and its lane locks with it.
                self.lanes.reset();
                *next_rebalance = Instant::now();
            }
            BatchError::Producer(_) => self.count_error("fatal_producer"),
            BatchError::SimulatedCrash => {}
        }
        *failures += 1;
        self.pause(error_delay(&self.config, *failures)).await;
    }

    /// Claims the next batch (leaving out the ones in flight) and hands it to
    /// the producer. `None` when nothing is publishable.
    async fn claim_and_enqueue(
        &mut self,
        in_flight: &VecDeque<InFlight>,
    ) -> Result<Option<InFlight>, BatchError> {
        let started = Instant::now();
        let lanes = self.lanes.owned();
        let lane_count = self.lanes.lane_count();
        let exclude: Vec<i64> = in_flight.iter().flat_map(InFlight::ids).collect();
        let conn = self
            .lanes
            .connection()
            .ok_or(BatchError::Database(sqlx::Error::PoolClosed))?;
        let rows = lanes::bounded(
            self.config.database_timeout,
            "claiming a batch",
            store::claim(conn, lane_count, &lanes, &exclude, self.config.batch_size),
        )
        .await?;
        if rows.is_empty() {
            return Ok(None);
        }
        let span = tracing::info_span!(
            "outbox_relay_batch",
            claimed = rows.len(),
            published = field::Empty,
            held = field::Empty,
            rejected = field::Empty,
            unavailable = field::Empty,
        );
        let held_keys: HashSet<String> = in_flight.iter().flat_map(InFlight::keys).collect();
        let pending = self
            .publisher
            .enqueue(&rows, &held_keys)
            .instrument(span.clone())
            .await;
        Ok(Some(InFlight {
            rows,
            pending,
            started,
            span,
        }))
    }

    /// Awaits a batch's deliveries and records them in one transaction.
    async fn settle(&mut self, batch: InFlight) -> Result<Settled, BatchError> {
        let span = batch.span.clone();
        self.settle_inner(batch).instrument(span).await
    }

    async fn settle_inner(&mut self, batch: InFlight) -> Result<Settled, BatchError> {
        // Whatever this batch held back may go out now.
        self.claim_blocked = false;
        let InFlight {
            rows,
            pending,
            started,
            span,
        } = batch;
        let outcomes = pending.outcomes().await;
        if self.config.crash_before_mark {
            return Err(BatchError::SimulatedCrash);
        }
        let delivered: Vec<i64> = rows
            .iter()
            .zip(&outcomes)
            .filter(|(_, outcome)| **outcome == Outcome::Delivered)
            .map(|(row, _)| row.id)
            .collect();
        let mut rejections = Vec::new();
        let (mut unavailable, mut held) = (0usize, 0usize);
        for (row, outcome) in rows.iter().zip(&outcomes) {
            let error = match outcome {
                Outcome::Rejected(error) => error,
                // Others got through, so the fault is this message's (e.g. a
                // topic that does not exist): count it, or it would retry forever.
                Outcome::Unavailable(error) if !delivered.is_empty() => error,
                Outcome::Unavailable(_) => {
                    unavailable += 1;
                    continue;
                }
                Outcome::Held => {
                    held += 1;
                    continue;
                }
                Outcome::Delivered => continue,
            };
            rejections.push(Rejection {
                id: row.id,
                error: error.clone(),
                retry_in_ms: retry_delay(&self.config, row.attempts).as_millis() as i64,
            });
        }
        let conn = self
            .lanes
            .connection()
            .ok_or(BatchError::Database(sqlx::Error::PoolClosed))?;
        let parked = lanes::bounded(
            self.config.database_timeout,
            "marking a batch",
            store::settle(conn, &delivered, &rejections, self.config.max_attempts),
        )
        .await?;

        span.record("published", delivered.len());
        span.record("held", held);
        span.record("rejected", rejections.len());
        span.record("unavailable", unavailable);
        Totals::add(&self.totals.published, delivered.len() as u64);
        Totals::add(&self.totals.parked, parked);
        Totals::add(&self.totals.batches, 1);
        metrics::counter!(metric::PUBLISHED).increment(delivered.len() as u64);
        metrics::counter!(metric::PARKED).increment(parked);
        metrics::histogram!(metric::BATCH_SIZE).record(rows.len() as f64);
        metrics::histogram!(metric::BATCH_DURATION).record(started.elapsed().as_secs_f64());
        if !rejections.is_empty() {
            self.count_error("rejected");
            tracing::warn!(
                rejected = rejections.len(),
                parked,
                first_error = %rejections[0].error,
                "outbox relay: broker refused events"
            );
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
        let rebuilt = self.publisher.rebuild_if_fatal()?;
        if let Some(fatal) = &rebuilt {
            tracing::error!(%fatal, "outbox relay rebuilt its producer after a fatal error");
            self.count_error("fatal_producer");
            Totals::add(&self.totals.producer_rebuilds, 1);
        }
        Ok(Settled {
            // After a fatal error the new producer deserves a try at once.
            outage: delivered.is_empty()
                && rejections.is_empty()
                && unavailable > 0
                && rebuilt.is_none(),
        })
    }

    async fn refresh_backlog(&self) {
        let limit = self.config.database_timeout;
        match lanes::bounded(limit, "measuring the backlog", store::backlog(&self.pool)).await {
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

    /// Sleeps, unless shutdown is requested, renewing the lease when due
    /// (a relay pausing after a broker outage keeps its lanes).
    async fn pause(&mut self, duration: Duration) {
        let until = tokio::time::Instant::now() + duration;
        loop {
            let renew_at = tokio::time::Instant::from(self.lanes.renew_at());
            tokio::select! {
                () = tokio::time::sleep_until(until) => return,
                () = self.cancel.cancelled() => return,
                () = tokio::time::sleep_until(renew_at), if renew_at < until => {
                    if let Err(error) = self.lanes.renew().await {
                        tracing::warn!(%error, "outbox relay could not renew its lease");
                        self.count_error("database");
                    }
                }
            }
        }
    }

    /// Waits for a commit signal, the timeout or shutdown, whichever is first.
    async fn idle(&mut self, duration: Duration) {
        tokio::select! {
            () = self.wakeup.committed() => {}
            () = tokio::time::sleep(duration) => {}
            () = self.cancel.cancelled() => {}
        }
    }
}

/// Exponential backoff with "equal jitter": half the delay fixed, half random,
/// so relays that failed together do not retry together.
pub(super) fn jittered_exponential(initial: Duration, max: Duration, exponent: u32) -> Duration {
    let delay = initial.saturating_mul(1u32 << exponent.min(20)).min(max);
    let half = delay / 2;
    half + half.mul_f64(rand::rng().random::<f64>())
}

fn error_delay(config: &RelayConfig, failures: u32) -> Duration {
    jittered_exponential(
        config.error_backoff_initial,
        config.error_backoff_max,
        failures.saturating_sub(1),
    )
}

fn retry_delay(config: &RelayConfig, attempts_before: i32) -> Duration {
    jittered_exponential(
        config.retry_backoff_initial,
        config.retry_backoff_max,
        attempts_before.max(0) as u32,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_within_jitter_and_is_capped() {
        let (initial, max) = (Duration::from_millis(100), Duration::from_secs(1));
        for exponent in 0..30 {
            let expected = (initial * 2u32.pow(exponent.min(20))).min(max);
            let got = jittered_exponential(initial, max, exponent);
            assert!(
                got >= expected / 2 && got <= expected,
                "{exponent}: {got:?}"
            );
        }
    }
}
