//! Telling a database that stopped answering from one that is slow.
//!
//! A connection can freeze: a network partition, a hung proxy or pooler, a
//! host that stopped. The sockets stay open and nothing arrives, so a
//! statement awaited on it never ends, and neither TCP keepalives nor the
//! server's `statement_timeout` help (the server's answer is what does not
//! arrive). A batch waiting on it would hold its partition, and its batch
//! slot, for good.
//!
//! Every wait of the consumer's own work has a bound that wakes it: a
//! statement is ended by the server's `statement_timeout` (the handler
//! timeout), a handler call by the handler timeout, a pool acquire by the
//! pool's `acquire_timeout`, a pause by the backoff's longest delay. So
//! work that goes longer than the longest of these plus a grace
//! ([`stall_limit`]) without being woken once is not slow but stuck on a
//! connection that will not answer. [`unless_stalled`] runs work under that
//! watch and drops it when it stalls; its transaction is then abandoned
//! (PostgreSQL ends the session at its `idle_in_transaction_session_timeout`
//! of the same length, releasing its locks) and the caller runs the work
//! again on another connection. Whatever the abandoned transaction had
//! committed (its `COMMIT` may have arrived) is absorbed by the dedup row or
//! the inbox key, as for any redelivery.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::task::{ArcWake, AtomicWaker, waker_ref};
use tokio::time::Instant;

/// Added to the longest bound of a wait: room for a loaded machine's
/// scheduling and the answer's way back.
const GRACE: Duration = Duration::from_secs(5);

/// Beyond this the watch is off (`handler_timeout(Duration::MAX)` turns
/// the timeouts off, and with them the bound this watch relies on).
const OFF: Duration = Duration::from_secs(365 * 24 * 3600);

/// How long the consumer's work may go without being woken before it counts
/// as stalled: the longest of the bounds of its waits, plus a grace. `None`
/// (no watch) when a bound is off.
pub(crate) fn stall_limit(bounds: &[Duration]) -> Option<Duration> {
    let longest = bounds.iter().copied().max().unwrap_or_default();
    let limit = longest.saturating_add(GRACE);
    (limit < OFF).then_some(limit)
}

/// The work went `limit` without being woken: its connection is taken for
/// dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stalled {
    pub(crate) limit: Duration,
}

impl std::fmt::Display for Stalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the database did not answer for {:?} (longer than any statement, handler call, \
             acquire or pause may take): the connection is taken for dead, its transaction \
             abandoned, and the work runs again on another connection; look for a network \
             path, proxy or pooler that stops forwarding without closing connections",
            self.limit
        )
    }
}

impl Stalled {
    /// As a database error: the caller's outage path counts it, logs it
    /// and backs off before running the work again.
    pub(crate) fn into_db_error(self) -> sqlx::Error {
        sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            self.to_string(),
        ))
    }
}

/// Whether the watched work was woken since it was last polled, and whom to
/// wake then.
struct Watch {
    woken: AtomicBool,
    outer: AtomicWaker,
}

impl ArcWake for Watch {
    fn wake_by_ref(watch: &Arc<Self>) {
        watch.woken.store(true, Ordering::Release);
        watch.outer.wake();
    }
}

/// Runs `work` unless it goes `limit` without being woken (see the module
/// docs); with no limit, runs it as it is.
///
/// Work that is busy in one long poll is not stalled: the clock starts
/// again when a poll returns.
pub(crate) async fn unless_stalled<F: Future>(
    work: F,
    limit: Option<Duration>,
) -> Result<F::Output, Stalled> {
    let Some(limit) = limit else {
        return Ok(work.await);
    };
    let mut work = pin!(work);
    let watch = Arc::new(Watch {
        woken: AtomicBool::new(true),
        outer: AtomicWaker::new(),
    });
    // The timer is moved only when it fires early (work was polled since
    // it was set), not at every poll: at most once per `limit`.
    let mut last_poll = Instant::now();
    let mut deadline = pin!(tokio::time::sleep(limit));
    std::future::poll_fn(|cx: &mut Context<'_>| {
        watch.outer.register(cx.waker());
        if watch.woken.swap(false, Ordering::AcqRel) {
            let waker = waker_ref(&watch);
            if let Poll::Ready(output) = work.as_mut().poll(&mut Context::from_waker(&waker)) {
                return Poll::Ready(Ok(output));
            }
            last_poll = Instant::now();
        }
        while deadline.as_mut().poll(cx).is_ready() {
            let stalls_at = last_poll + limit;
            if stalls_at <= Instant::now() {
                return Poll::Ready(Err(Stalled { limit }));
            }
            deadline.as_mut().reset(stalls_at);
        }
        Poll::Pending
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_the_longest_bound_plus_the_grace_and_off_with_a_bound() {
        let bounds = [Duration::from_secs(30), Duration::from_secs(10)];
        assert_eq!(stall_limit(&bounds), Some(Duration::from_secs(35)));
        assert_eq!(stall_limit(&[Duration::from_secs(30), Duration::MAX]), None);
    }

    #[tokio::test(start_paused = true)]
    async fn work_that_is_never_woken_stalls_at_the_limit() {
        let started = Instant::now();
        let limit = Duration::from_secs(7);
        let outcome = unless_stalled(std::future::pending::<()>(), Some(limit)).await;
        assert_eq!(outcome, Err(Stalled { limit }));
        assert_eq!(started.elapsed(), limit);
    }

    #[tokio::test(start_paused = true)]
    async fn work_woken_within_the_limit_runs_on_for_as_long_as_it_takes() {
        // Forty waits of 5 s each: 200 s in all, each shorter than the
        // 7 s limit.
        let work = async {
            for _ in 0..40 {
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
            "done"
        };
        let started = Instant::now();
        let outcome = unless_stalled(work, Some(Duration::from_secs(7))).await;
        assert_eq!(outcome, Ok("done"));
        assert_eq!(started.elapsed(), Duration::from_secs(200));
    }

    #[tokio::test(start_paused = true)]
    async fn one_wait_longer_than_the_limit_stalls_after_earlier_progress() {
        let work = async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            tokio::time::sleep(Duration::from_secs(60)).await;
        };
        let started = Instant::now();
        let outcome = unless_stalled(work, Some(Duration::from_secs(7))).await;
        assert!(outcome.is_err());
        assert_eq!(started.elapsed(), Duration::from_secs(12));
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_limit_the_work_is_not_watched() {
        let work = async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            1
        };
        assert_eq!(unless_stalled(work, None).await, Ok(1));
    }

    /// A poll that itself takes longer than the limit (work that blocks
    /// its thread) is busy, not stalled. (Real time: a blocked thread does
    /// not move a paused clock.)
    #[tokio::test]
    async fn a_long_poll_is_not_a_stall() {
        let limit = Duration::from_millis(50);
        let work = async {
            std::thread::sleep(Duration::from_millis(120));
            tokio::task::yield_now().await;
            "done"
        };
        assert_eq!(unless_stalled(work, Some(limit)).await, Ok("done"));
    }
}
