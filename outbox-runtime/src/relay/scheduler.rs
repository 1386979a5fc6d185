//! The relay's scheduler: moves scheduled events (`outbox_scheduled`,
//! recorded with `Events::record_after` / `record_at`) into `outbox_event`
//! when they are due, then wakes the relay's worker to publish them.
//!
//! It runs next to the worker, on the relay's task, and stops with it. Each
//! pass moves the due rows in batches of [`MOVE_BATCH`] (again at once while
//! a batch comes back full), then sleeps until the earliest due time (one
//! indexed `min()`), at most `schedule_poll_interval`, or until shutdown.
//! Database errors are logged and counted (`outbox_relay_errors_total{kind="database"}`),
//! and the scheduler backs off like the worker (`error_backoff`); they
//! never stop the relay.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::backoff::error_delay;
use super::config::RelayConfig;
use super::session;
use super::store;
use super::summary::Totals;
use super::telemetry as metric;

/// Due rows moved per statement.
pub(super) const MOVE_BATCH: usize = 1000;

/// Shortest sleep after a pass that moved nothing while a row is due
/// already: another relay holds the move lock (it is moving that row), or a
/// `cancel_scheduled` holds the row. Keeps the scheduler from spinning.
const CONTENDED_WAIT: Duration = Duration::from_millis(10);

/// One relay's scheduler.
pub(crate) struct Scheduler {
    pool: PgPool,
    config: RelayConfig,
    totals: Arc<Totals>,
}

/// Why a pass ended.
enum Pass {
    /// Sleep this long before the next pass.
    Sleep(Duration),
    /// A statement failed: back off.
    Failed(sqlx::Error),
}

impl Scheduler {
    pub(crate) fn new(pool: PgPool, config: RelayConfig, totals: Arc<Totals>) -> Self {
        Self {
            pool,
            config,
            totals,
        }
    }

    /// Moves due rows until `cancel` is cancelled.
    pub(crate) async fn run(self, cancel: CancellationToken) {
        let mut failures = 0u32;
        let mut warned_missing = false;
        let mut next_metrics = Instant::now();
        while !cancel.is_cancelled() {
            if Instant::now() >= next_metrics {
                next_metrics = Instant::now() + self.config.metrics_interval;
                self.refresh_pending().await;
            }
            let sleep = match self.pass().await {
                Pass::Sleep(sleep) => {
                    failures = 0;
                    sleep
                }
                Pass::Failed(error) if is_undefined_table(&error) => {
                    // A database without migration 0007: nothing can be
                    // scheduled there either. Said once; looked at again
                    // now and then, in case it is migrated meanwhile.
                    if !warned_missing {
                        warned_missing = true;
                        tracing::warn!(
                            "outbox relay: table outbox_scheduled missing (migration 0007 not \
                             applied); scheduled delivery is off until it is"
                        );
                    }
                    self.config.error_backoff.max()
                }
                Pass::Failed(error) => {
                    tracing::warn!(
                        error = %txoutbox_core::DbErrorDisplay(&error),
                        "outbox relay could not move due scheduled events"
                    );
                    metric::error("database");
                    Totals::add(&self.totals.errors, 1);
                    failures = failures.saturating_add(1);
                    error_delay(&self.config, failures)
                }
            };
            tokio::select! {
                () = tokio::time::sleep(sleep) => {}
                () = cancel.cancelled() => {}
            }
        }
    }

    /// Moves what is due, then measures how long to sleep.
    async fn pass(&self) -> Pass {
        let limit = self.config.database_timeout;
        let mut moved_any = false;
        loop {
            let moved = match session::bounded(
                limit,
                "moving due scheduled events",
                store::move_due(&self.pool, MOVE_BATCH),
            )
            .await
            {
                Ok(moved) => moved,
                Err(error) => return Pass::Failed(error),
            };
            if moved.inserted > 0 {
                moved_any = true;
                metrics::counter!(metric::SCHEDULED_MOVED).increment(moved.inserted as u64);
                Totals::add(&self.totals.scheduled_moved, moved.inserted as u64);
                // The worker publishes them now rather than at its next poll.
                txoutbox_core::__private::wakeup::notify_committed();
            }
            if moved.taken < MOVE_BATCH as i64 {
                break;
            }
        }
        let next = session::bounded(
            limit,
            "finding the next due scheduled event",
            store::next_due_in(&self.pool),
        )
        .await;
        match next {
            Ok(next) => Pass::Sleep(sleep_for(
                next,
                moved_any,
                self.config.schedule_poll_interval,
            )),
            Err(error) => Pass::Failed(error),
        }
    }

    async fn refresh_pending(&self) {
        let limit = self.config.database_timeout;
        let pending = session::bounded(
            limit,
            "counting scheduled events",
            store::scheduled_pending(&self.pool),
        )
        .await;
        match pending {
            Ok(pending) => metrics::gauge!(metric::SCHEDULED_PENDING).set(pending as f64),
            Err(error) => {
                tracing::debug!(%error, "outbox relay could not count its scheduled events");
            }
        }
    }
}

/// `undefined_table`: the schema predates migration 0007.
fn is_undefined_table(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| code == "42P01")
}

/// The sleep before the next pass: until the earliest due time
/// (`next_due_in` seconds from now; `None`: nothing scheduled), at most
/// `poll`. A row due already is moved at once after a pass that moved
/// something (it became due meanwhile), after [`CONTENDED_WAIT`] otherwise.
fn sleep_for(next_due_in: Option<f64>, moved_any: bool, poll: Duration) -> Duration {
    match next_due_in {
        None => poll,
        Some(seconds) if seconds > 0.0 => Duration::try_from_secs_f64(seconds)
            .unwrap_or(poll)
            .min(poll),
        Some(_) if moved_any => Duration::ZERO,
        Some(_) => CONTENDED_WAIT.min(poll),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sleeps_until_the_next_due_time_within_the_poll_interval() {
        let poll = Duration::from_millis(200);
        assert_eq!(sleep_for(None, false, poll), poll, "nothing scheduled");
        assert_eq!(
            sleep_for(Some(0.125), false, poll),
            Duration::from_millis(125)
        );
        assert_eq!(sleep_for(Some(3600.0), true, poll), poll);
        assert_eq!(sleep_for(Some(f64::MAX), false, poll), poll);
        assert_eq!(sleep_for(Some(-0.5), true, poll), Duration::ZERO);
        assert_eq!(sleep_for(Some(0.0), false, poll), CONTENDED_WAIT);
        assert_eq!(
            sleep_for(Some(-1.0), false, Duration::from_millis(1)),
            Duration::from_millis(1)
        );
    }
}
