//! The loop's wait: for delivery reports (settling what they complete), a
//! commit signal, the poll timer or the next rebalance; pauses after
//! failures and outages.

use std::time::{Duration, Instant};

use crate::relay::backend::Backend;

use super::{BatchError, Cadence, IDLE_WAIT_FIRST, Progress, REBUILD_AFTER_OUTAGES, Worker};
use crate::relay::backoff::error_delay;
use crate::relay::summary::Totals;

impl<B: Backend> Worker<B> {
    /// After a claim of `claimed` rows: idles if nothing is in flight, claims
    /// again at once under a backlog until two batches are in flight,
    /// otherwise waits and settles, backing off if the broker is out of
    /// reach.
    ///
    /// Polls (claims no commit signal asked for) find the rows of writers
    /// that do not signal this relay. While one wrote recently (see
    /// [`polls_quickly`](Self::polls_quickly)), every batch restarts the
    /// polls from [`IDLE_WAIT_FIRST`] and a settle is followed by a claim.
    /// Otherwise the relay claims when a signal arrives, and the polls
    /// stretch to `poll_interval`: a hop through in-process writers costs
    /// one claim, not three.
    pub(super) async fn settle_or_wait(&mut self, claimed: usize, cadence: &mut Cadence) {
        if self.flight.is_empty() {
            self.idle_for_poll(cadence).await;
            return;
        }
        // Only late rows in flight: poll as when idle (commits of other
        // processes are seen by polling), while awaiting their reports.
        let poll = if self.flight.batch_count() == 0 {
            cadence.idle_wait = (cadence.idle_wait * 2).min(self.config.poll_interval);
            Some(cadence.idle_wait)
        } else {
            if self.polls_quickly(cadence) {
                cadence.idle_wait = IDLE_WAIT_FIRST;
            }
            None
        };
        if claimed >= self.config.batch_size && self.flight.batch_count() < 2 {
            return; // a backlog: fill the pipeline first
        }
        match self
            .wait_and_settle(poll, cadence.next_rebalance.min(cadence.next_metrics))
            .await
        {
            Ok(progress) if progress.outage => self.outage(cadence).await,
            Ok(progress) => {
                if progress.answered {
                    cadence.failures = 0;
                    self.lanes.set_broker_failing(false);
                }
                // Settled, nothing left in flight, and nothing says rows
                // wait: no claim until a signal or the poll.
                if !progress.woken
                    && self.flight.is_empty()
                    && !cadence.claim_due
                    && !self.polls_quickly(cadence)
                {
                    self.idle_for_poll(cadence).await;
                }
            }
            Err(error) => {
                self.forget_in_flight();
                self.failed(error, cadence).await;
            }
        }
    }

    /// The broker is out of reach: settles what is in flight, rebuilds the
    /// producer after repeated outages, and pauses.
    async fn outage(&mut self, cadence: &mut Cadence) {
        // Rebalance before claiming again: if other relays can reach the
        // broker, this one hands its lanes to them.
        self.lanes.set_broker_failing(true);
        cadence.next_rebalance = Instant::now();
        // The batches behind it will most likely fail too: settle them
        // before pausing, so nothing stays in flight.
        if let Err(error) = self.settle_all().await {
            self.failed(error, cadence).await;
            return;
        }
        cadence.failures += 1;
        cadence.claim_due = true;
        if cadence.failures >= REBUILD_AFTER_OUTAGES {
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
        self.pause(error_delay(&self.config, cadence.failures))
            .await;
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
            let room = self.flight.has_room(self.config.batch_size);
            let timer = self
                .flight
                .next_timer(self.config.partition_stall_timeout)
                .map_or(until, |at| at.min(until));
            let awaits_reports = self.flight.awaits_reports();
            // A topic's metadata may hold it, and free the batches that
            // wait only for its rows (see `process_flight`): its answer is
            // awaited too.
            let mut metadata = self.partitions.take_metadata_fetch();
            let metadata_pending = metadata.as_ref().is_some_and(|f| f.pending());
            let renew_at = self.lanes.renew_at();
            let (woken, renew) = tokio::select! {
                // Settle delivered rows first: they are published only once
                // marked, and settling unblocks the keys they hold.
                biased;
                () = self.flight.next_reports(&mut self.partitions), if awaits_reports => (false, false),
                () = async { metadata.as_mut().expect("guarded").answered().await }, if metadata_pending => (false, false),
                () = tokio::time::sleep_until(timer.into()) => (false, false),
                // A slow broker must not let the lease expire.
                () = tokio::time::sleep_until(renew_at.into()) => (false, true),
                () = self.wakeup.committed(), if room => (true, false),
                () = tokio::time::sleep_until(poll_at.unwrap_or(until).into()), if room && poll_at.is_some() => (true, false),
                () = self.cancel.cancelled() => (true, false),
            };
            self.partitions.restore_metadata_fetch(metadata);
            if renew {
                self.lanes.renew().await?;
            }
            let mut progress = self.process_flight().await?;
            progress.woken = woken || Instant::now() >= until;
            if progress.woken || progress.settled || progress.outage || self.flight.is_empty() {
                return Ok(progress);
            }
        }
    }

    /// Sleeps, unless shutdown is requested, renewing the lease when due
    /// (a relay pausing after a broker outage keeps its lanes).
    pub(super) async fn pause(&mut self, duration: Duration) {
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

    /// Idles until a commit signal or the next poll (the poll wait doubled,
    /// up to `poll_interval`; never past the next rebalance).
    async fn idle_for_poll(&mut self, cadence: &mut Cadence) {
        cadence.idle_wait = (cadence.idle_wait * 2).min(self.config.poll_interval);
        let until_rebalance = cadence
            .next_rebalance
            .saturating_duration_since(Instant::now());
        self.idle(cadence.idle_wait.min(until_rebalance)).await;
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
