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

use super::backend::{Backend, Moved};
use super::backoff::error_delay;
use super::config::RelayConfig;
use super::session;
use super::summary::Totals;
use super::telemetry as metric;

/// Due rows moved per statement.
pub(super) const MOVE_BATCH: usize = 1000;

/// Shortest sleep after a pass that moved nothing while a row is due
/// already: another relay holds the move lock (it is moving that row), or a
/// `cancel_scheduled` holds the row. Keeps the scheduler from spinning.
const CONTENDED_WAIT: Duration = Duration::from_millis(10);

/// One relay's scheduler.
pub(crate) struct Scheduler<B> {
    database: B,
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

impl<B: Backend> Scheduler<B> {
    pub(crate) fn new(database: B, config: RelayConfig, totals: Arc<Totals>) -> Self {
        Self {
            database,
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
                Pass::Failed(error) if B::is_undefined_table(&error) => {
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
                self.database.move_due(MOVE_BATCH),
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
                txoutbox_core::__private::wakeup::notify_committed_in(
                    txoutbox_core::__private::wakeup::Scope::of_database(
                        self.database.database_name().as_deref(),
                    ),
                );
            }
            if moved.taken < MOVE_BATCH as i64 {
                break;
            }
        }
        let next = session::bounded(
            limit,
            "finding the next due scheduled event",
            self.database.next_due_in(),
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
            self.database.scheduled_pending(),
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

// The scheduler's statements on PostgreSQL (see `postgres.rs`).

/// Advisory lock class of the scheduler's moves: "obxs".
const SCHEDULE_LOCK: i32 = 0x6f62_7873;

/// Moves up to `limit` due rows from `outbox_scheduled` into `outbox_event`,
/// in due order (`deliver_after`, then recording order), in one transaction.
///
/// The moves of all relays are serialized by a transaction-level advisory
/// lock, taken without waiting: a relay that does not get it moves nothing
/// (the holder is moving the same rows). Without it, two relays moving
/// overlapping batches at once could interleave their `outbox_event` ids
/// and publish two due messages of one key out of order. `SKIP LOCKED`
/// keeps a move from waiting on a row a `cancel_scheduled` is deleting.
/// Rows are never lost or doubled: they leave `outbox_scheduled` in the
/// same transaction that inserts them (a crash rolls both back).
///
/// A moved row's `created_at` is the time of the move (its column default):
/// the backlog gauges, `outbox status` and `outbox replay` then see it as
/// written when it became due, not as a row waiting since it was recorded.
pub(super) async fn move_due(pool: &PgPool, limit: usize) -> sqlx::Result<Moved> {
    let mut tx = crate::txn::begin(pool).await?;
    let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1, 0)")
        .bind(SCHEDULE_LOCK)
        .fetch_one(&mut *tx)
        .await?;
    if !locked {
        tx.rollback().await?;
        return Ok(Moved {
            taken: 0,
            inserted: 0,
        });
    }
    let (taken, inserted): (i64, i64) = sqlx::query_as(
        "WITH due AS (
             DELETE FROM outbox_scheduled
             WHERE id IN (SELECT id FROM outbox_scheduled
                          WHERE deliver_after <= now()
                          ORDER BY deliver_after, id
                          LIMIT $1
                          FOR UPDATE SKIP LOCKED)
             RETURNING id, event_id, aggregate_type, aggregate_id, event_type, payload, topic,
                       partition_key, traceparent, headers, deliver_after),
         moved AS (
             INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type, payload,
                                       topic, partition_key, traceparent, headers, deliver_after)
             SELECT event_id, aggregate_type, aggregate_id, event_type, payload, topic,
                    partition_key, traceparent, headers, deliver_after
             FROM due
             ORDER BY deliver_after, id
             ON CONFLICT (event_id) DO NOTHING
             RETURNING 1)
         SELECT (SELECT count(*) FROM due), (SELECT count(*) FROM moved)",
    )
    .bind(limit as i64)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Moved { taken, inserted })
}

/// Seconds from now until the earliest due time of `outbox_scheduled`
/// (negative if a row is due already); `None` if nothing is scheduled. One
/// step of the `(deliver_after, id)` index.
pub(super) async fn next_due_in(pool: &PgPool) -> sqlx::Result<Option<f64>> {
    sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM min(deliver_after) - clock_timestamp())::float8
         FROM outbox_scheduled",
    )
    .fetch_one(pool)
    .await
}

/// Scheduled events not moved yet, due or not.
pub(super) async fn scheduled_pending(pool: &PgPool) -> sqlx::Result<i64> {
    sqlx::query_scalar("SELECT count(*) FROM outbox_scheduled")
        .fetch_one(pool)
        .await
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
