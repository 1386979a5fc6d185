//! The relay loop: rebalance lanes, claim, publish, mark, wait.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, Span, field};
use txoutbox_core::wakeup::CommitListener;

use super::config::RelayConfig;
use super::flight::{Batch, Enqueued, Flight, Resolved};
use super::lanes::{self, Lanes, Rebalanced};
use super::partitions::{Partitions, Route, Tp};
use super::publish::{Outcome, Publisher};
use super::store::{self, ClaimedRow, Retry};
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
    /// Set when every row of a claimed batch was held (see
    /// `Flight::held_keys`): no further claim until a batch settles.
    pub claim_blocked: bool,
    /// Batches and stragglers handed to the producer, not settled yet.
    pub flight: Flight,
    /// Partition prediction and the partitions held back as unavailable.
    pub partitions: Partitions,
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

/// What settling found.
#[derive(Debug, Default, Clone, Copy)]
struct Progress {
    /// Something was settled: keys and pipeline room were freed.
    settled: bool,
    /// The broker answered (a row delivered or refused).
    answered: bool,
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
    }
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
    /// its deliveries are in, in whatever order they complete, so the
    /// database work overlaps the broker's. Under a backlog two full batches
    /// are in flight; at low rates a commit signal claims at once even while
    /// small batches are in flight (up to `MAX_IN_FLIGHT`), so an event does
    /// not wait for the previous batch's round trip. A batch whose last
    /// reports are late while other rows got through (a partition whose
    /// leader is down) is settled without them after
    /// `partition_stall_timeout`; see [`Flight`] and [`Partitions`].
    pub(crate) async fn run(mut self) -> Result<(), super::RelayError> {
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
                let mut result = self
                    .lanes
                    .rebalance(&self.pool, self.flight.is_empty())
                    .await;
                if let Ok(Rebalanced::MustRelease) = result {
                    // Lanes are released only while nothing of ours is in
                    // flight, so a lane's next owner cannot overtake our
                    // deliveries. Taking lanes needs no such pause.
                    if let Err(error) = self.settle_all().await {
                        self.failed(error, &mut failures, &mut next_rebalance).await;
                        continue;
                    }
                    result = self.lanes.rebalance(&self.pool, true).await;
                }
                if let Err(error) = result {
                    self.forget_in_flight(); // the lane connection is gone: they cannot be marked
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
                self.partitions.log_unavailable();
            }
            if self.lanes.owned().is_empty() {
                self.pause(next_rebalance.saturating_duration_since(Instant::now()))
                    .await;
                continue;
            }
            self.partitions.refresh_metadata(self.publisher.producer());
            self.partitions.request_probes();
            if let Err(error) = self.release_held_back().await {
                self.forget_in_flight();
                self.failed(error, &mut failures, &mut next_rebalance).await;
                continue;
            }

            let mut claimed = 0;
            if self.flight.is_empty() {
                self.claim_blocked = false; // also after batches were dropped on errors
            }
            if self.has_room() {
                match self.claim_and_enqueue().await {
                    Ok(rows) => claimed = rows,
                    Err(error) => {
                        // Unsettled batches cannot be marked on a dead
                        // connection either: they are published again later.
                        self.forget_in_flight();
                        self.failed(error, &mut failures, &mut next_rebalance).await;
                        continue;
                    }
                }
            }
            if self.flight.is_empty() {
                idle_wait = (idle_wait * 2).min(self.config.poll_interval);
                let until_rebalance = next_rebalance.saturating_duration_since(Instant::now());
                self.idle(idle_wait.min(until_rebalance)).await;
                continue;
            }
            // Only late rows in flight: poll as when idle (commits of other
            // processes are seen by polling), while awaiting their reports.
            let poll = if self.flight.batch_count() == 0 {
                idle_wait = (idle_wait * 2).min(self.config.poll_interval);
                Some(idle_wait)
            } else {
                idle_wait = IDLE_WAIT_FIRST;
                None
            };
            if claimed >= self.config.batch_size && self.flight.batch_count() < 2 {
                continue; // a backlog: fill the pipeline first
            }
            match self
                .wait_and_settle(poll, next_rebalance.min(next_metrics))
                .await
            {
                Ok(progress) if progress.outage => {
                    // Rebalance before claiming again: if other relays can
                    // reach the broker, this one hands its lanes to them.
                    self.lanes.set_broker_failing(true);
                    next_rebalance = Instant::now();
                    // The batches behind it will most likely fail too: settle
                    // them before pausing, so nothing stays in flight.
                    if let Err(error) = self.settle_all().await {
                        self.failed(error, &mut failures, &mut next_rebalance).await;
                        continue;
                    }
                    failures += 1;
                    if failures >= REBUILD_AFTER_OUTAGES {
                        match self.publisher.rebuild() {
                            Ok(()) => {
                                Totals::add(&self.totals.producer_rebuilds, 1);
                                self.partitions.reset();
                            }
                            Err(error) => {
                                tracing::error!(%error, "outbox relay could not rebuild its producer");
                            }
                        }
                    }
                    self.pause(error_delay(&self.config, failures)).await;
                }
                Ok(progress) => {
                    if progress.answered {
                        failures = 0;
                        self.lanes.set_broker_failing(false);
                    }
                }
                Err(error) => {
                    self.forget_in_flight();
                    self.failed(error, &mut failures, &mut next_rebalance).await;
                }
            }
        }
        // Graceful shutdown: what is in flight is awaited and marked.
        if let Err(error) = self.settle_all().await {
            tracing::warn!(%error, "outbox relay could not settle its last batches");
        }
        self.lanes.release().await;
        Ok(())
    }

    /// Waits for delivery reports (settling what they complete), a commit
    /// signal (with room to claim), the poll timer `poll` or `until`.
    /// Returns once something was settled or it is time to claim.
    async fn wait_and_settle(
        &mut self,
        poll: Option<Duration>,
        until: Instant,
    ) -> Result<Progress, BatchError> {
        let poll_at = poll.map(|poll| Instant::now() + poll);
        loop {
            let room = self.has_room();
            let timer = self
                .flight
                .next_timer(self.config.partition_stall_timeout)
                .map_or(until, |at| at.min(until));
            let awaits_reports = self.flight.awaits_reports();
            let renew_at = self.lanes.renew_at();
            let woken = tokio::select! {
                // Settle delivered rows first: they are published only once
                // marked, and settling unblocks the keys they hold.
                biased;
                () = self.flight.next_reports(&mut self.partitions), if awaits_reports => false,
                () = tokio::time::sleep_until(timer.into()) => false,
                // A slow broker must not let the lease expire.
                () = tokio::time::sleep_until(renew_at.into()) => {
                    self.lanes.renew().await?;
                    false
                }
                () = self.wakeup.committed(), if room => true,
                () = tokio::time::sleep_until(poll_at.unwrap_or(until).into()), if room && poll_at.is_some() => true,
                () = self.cancel.cancelled() => true,
            };
            let progress = self.process_flight().await?;
            if woken
                || progress.settled
                || progress.outage
                || self.flight.is_empty()
                || Instant::now() >= until
            {
                return Ok(progress);
            }
        }
    }

    /// Settles what is complete: batches whose reports are all in (in any
    /// order), stalled batches without their late rows, stragglers whose
    /// report came.
    async fn process_flight(&mut self) -> Result<Progress, BatchError> {
        let mut progress = Progress::default();
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

    /// Whether another batch may be claimed: not while a claim found only
    /// rows held back (until a batch settles); otherwise always up to two
    /// batches (claim overlapping delivery), more only while they are small.
    /// Late rows (stragglers) take no room.
    fn has_room(&self) -> bool {
        if self.claim_blocked {
            return false;
        }
        let batches = self.flight.batch_count();
        batches < 2
            || (batches < MAX_IN_FLIGHT && self.flight.batch_rows() < self.config.batch_size)
    }

    /// Settles everything in flight, late rows included (they take at most
    /// `delivery_timeout`).
    async fn settle_all(&mut self) -> Result<(), BatchError> {
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

    /// Clears the hold of rows held back for partitions that are available
    /// again, so they are claimed at once.
    async fn release_held_back(&mut self) -> Result<(), BatchError> {
        let ids = self.partitions.take_released();
        if ids.is_empty() {
            return Ok(());
        }
        let conn = self
            .lanes
            .connection()
            .ok_or(BatchError::Database(sqlx::Error::PoolClosed))?;
        lanes::bounded(
            self.config.database_timeout,
            "releasing held-back rows",
            store::release_held(conn, &ids),
        )
        .await?;
        Ok(())
    }

    /// Claims the next batch (leaving out the rows in flight) and hands it to
    /// the producer. Returns the rows claimed into the pipeline (0 when
    /// nothing is publishable or all of it was held behind rows in flight).
    async fn claim_and_enqueue(&mut self) -> Result<usize, BatchError> {
        let started = Instant::now();
        let lanes = self.lanes.owned();
        let lane_count = self.lanes.lane_count();
        let exclude = self.flight.ids();
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
            return Ok(0);
        }
        let span = tracing::info_span!(
            "outbox_relay_batch",
            claimed = rows.len(),
            published = field::Empty,
            held = field::Empty,
            held_back = field::Empty,
            straggling = field::Empty,
            rejected = field::Empty,
            unavailable = field::Empty,
        );
        let held_keys = self.flight.held_keys(self.publisher.generation());
        let batch = self
            .enqueue(rows, &held_keys, started, span.clone())
            .instrument(span)
            .await;
        // Rows of held keys are not sent. If that was all of them, claiming
        // again before something settles would find the same rows, so wait
        // for a settle.
        self.claim_blocked = !batch.needs_settling();
        if self.claim_blocked {
            return Ok(0);
        }
        let claimed = batch.rows.len();
        self.flight.add(batch, self.config.delivery_timeout);
        Ok(claimed)
    }

    /// Enqueues every row, in order, and returns at once: the deliveries
    /// proceed while the relay claims its next batch. A row whose key has
    /// earlier rows in flight follows them through the same idempotent
    /// producer, which keeps them in order. A row is not sent if its key is
    /// in `held_keys` (an earlier row failed, is late, or went out through a
    /// producer since rebuilt: see `Flight::held_keys`) or had an earlier row
    /// fail to enqueue or be held back here. The first row of a key of a
    /// partition known to be unavailable is held back in the database (unless
    /// it is the partition's one probe, and only if no row of its key is in
    /// flight), which keeps the key's later rows out of claims; the key's
    /// later rows of this claim just wait.
    async fn enqueue(
        &mut self,
        rows: Vec<ClaimedRow>,
        held_keys: &HashSet<String>,
        started: Instant,
        span: Span,
    ) -> Enqueued {
        let deadline = Instant::now() + self.config.delivery_timeout;
        let mut outcomes = vec![None; rows.len()];
        let mut predicted = Vec::with_capacity(rows.len());
        let mut sent = Vec::with_capacity(rows.len());
        let mut failed_keys: HashSet<&str> = HashSet::new();
        let any_down = self.partitions.unavailable() > 0;
        // Only needed to hold back rows of unavailable partitions.
        let in_flight_keys = if any_down {
            self.flight.keys()
        } else {
            HashSet::new()
        };
        let generation = self.publisher.generation();
        for (index, row) in rows.iter().enumerate() {
            let key = row.partition_key.as_str();
            let partition = self.partitions.predict(&row.topic, key);
            predicted.push(partition);
            let tp = partition
                .filter(|_| any_down)
                .map(|p| (row.topic.clone(), p));
            let down = tp.as_ref().is_some_and(|tp| self.partitions.is_down(tp));
            // An earlier row of the key in this claim failed or was held
            // back, or one in flight makes order uncertain: this one waits,
            // unwritten (once the earlier one's hold is recorded, the claim
            // skips the key's later rows).
            let held = held_keys.contains(key);
            if failed_keys.contains(key) || (held && !down) {
                outcomes[index] = Some(Outcome::Held);
                continue;
            }
            let in_flight = held || in_flight_keys.contains(key);
            let route = match &tp {
                Some(_) if down && in_flight => Route::HoldBack,
                Some((topic, partition)) => self.partitions.route(topic, *partition, row.id),
                None => Route::Send,
            };
            if route == Route::HoldBack {
                let tp = tp.expect("a partition held back is known");
                let (hold, reason) = self.partitions.held_back(&tp, row.id);
                outcomes[index] = Some(Outcome::Deferred { reason, hold });
                failed_keys.insert(key);
                continue;
            }
            match self.publisher.send(row, deadline).await {
                Ok(report) => sent.push((index, report, route == Route::Probe)),
                Err(outcome) => {
                    if route == Route::Probe {
                        self.partitions
                            .reported(&row.topic, partition, partition, row.id, false);
                    }
                    outcomes[index] = Some(outcome);
                    failed_keys.insert(key);
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

    /// Records a batch whose reports are in (its late rows excepted).
    async fn settle(&mut self, batch: Batch) -> Result<Progress, BatchError> {
        let span = batch.span.clone();
        self.settle_batch(batch).instrument(span).await
    }

    async fn settle_batch(&mut self, batch: Batch) -> Result<Progress, BatchError> {
        // Whatever this batch held back may go out now.
        self.claim_blocked = false;
        let Batch {
            rows,
            outcomes,
            partitions,
            started,
            span,
            ..
        } = batch;
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
        for ((row, outcome), partition) in rows.iter().zip(&outcomes).zip(&partitions) {
            match outcome {
                Outcome::Delivered => {}
                Outcome::Rejected(error) => {
                    rejected += 1;
                    retries.push(self.refused(row, error));
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
        let parked = self.record(&delivered, &retries).await?;

        span.record("published", delivered.len());
        span.record("held", held);
        span.record("held_back", held_back);
        span.record("straggling", straggling);
        span.record("rejected", rejected);
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
            answered: !delivered.is_empty() || rejected > 0,
            // After a fatal error the new producer deserves a try at once.
            outage: delivered.is_empty()
                && rejected == 0
                && unavailable > 0
                && !others_delivered
                && !rebuilt,
        })
    }

    /// Records late rows whose reports came (or were given up on).
    async fn settle_stragglers(&mut self, resolved: Vec<Resolved>) -> Result<Progress, BatchError> {
        self.claim_blocked = false;
        if self.config.crash_before_mark {
            return Err(BatchError::SimulatedCrash);
        }
        let mut delivered = Vec::new();
        let mut retries = Vec::new();
        let mut unavailable = 0usize;
        for Resolved { row, outcome } in &resolved {
            match outcome {
                Outcome::Delivered => delivered.push(row.id),
                Outcome::Rejected(error) => retries.push(self.refused(row, error)),
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
            answered: !delivered.is_empty() || !retries.is_empty(),
            outage: false,
        })
    }

    /// A counted retry of a row the broker refused.
    /// Marks `delivered` and records `retries` on the relay's connection
    /// (bounded by `database_timeout`); returns how many rows were parked.
    async fn record(&mut self, delivered: &[i64], retries: &[Retry]) -> Result<u64, BatchError> {
        let conn = self
            .lanes
            .connection()
            .ok_or(BatchError::Database(sqlx::Error::PoolClosed))?;
        let settlement = lanes::bounded(
            self.config.database_timeout,
            "marking a batch",
            store::settle(conn, delivered, retries, self.config.max_attempts),
        )
        .await?;
        self.log_unrecordable(&settlement.unrecordable);
        Ok(settlement.parked)
    }

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

/// [`txoutbox_core::Backoff`]'s delay with a 0-based `exponent`.
pub(super) fn jittered_exponential(initial: Duration, max: Duration, exponent: u32) -> Duration {
    txoutbox_core::Backoff::new(initial, max).delay(exponent.saturating_add(1))
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
