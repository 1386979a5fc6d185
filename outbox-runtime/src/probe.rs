//! Benchmarks only (the `test-hooks` feature; not a public API): when each
//! record passed each stage of its way through the relay and the consumer,
//! for the hops benchmark's breakdown of a hop's latency. Without the
//! feature every mark compiles to nothing; with it, a mark costs one atomic
//! load until `enable` is called.
#![cfg_attr(not(feature = "test-hooks"), allow(unreachable_pub))]

use uuid::Uuid;

/// A point on a record's way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Stage {
    /// The relay's claim that returned the row was sent (taken when it
    /// returned, with the time it was sent).
    ClaimSent,
    /// The relay's claim returned the row.
    Claimed,
    /// The relay handed the row to the producer.
    Sent,
    /// The broker acknowledged the record (delivery report received).
    Acked,
    /// The relay's mark of the row's batch was sent (taken when it
    /// returned, with the time it was sent).
    MarkSent,
    /// The relay's mark of the row's batch committed.
    Marked,
    /// The consumer took the record from its fetch queue (routed).
    Received,
    /// Inbox mode: the transaction storing the record committed.
    Stored,
    /// The transaction that ran the record's handler committed.
    Committed,
}

#[cfg(feature = "test-hooks")]
mod points {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{SystemTime, UNIX_EPOCH};

    use uuid::Uuid;

    use super::Stage;

    /// One mark: the event, the stage, and the wall clock in microseconds
    /// since the epoch (comparable with the database's timestamps on the
    /// same host).
    #[derive(Debug, Clone, Copy)]
    pub struct Point {
        /// The event's id.
        pub event_id: Uuid,
        /// Which stage.
        pub stage: Stage,
        /// When, in microseconds since the epoch.
        pub at_us: i64,
    }

    static ENABLED: AtomicBool = AtomicBool::new(false);
    static POINTS: Mutex<Vec<Point>> = Mutex::new(Vec::new());

    /// Starts recording marks (process-wide).
    pub fn enable() {
        ENABLED.store(true, Ordering::Relaxed);
    }

    /// Stops recording marks (process-wide); those recorded stay until taken.
    pub fn disable() {
        ENABLED.store(false, Ordering::Relaxed);
    }

    /// The marks recorded since the previous call, in the order taken.
    pub fn take() -> Vec<Point> {
        std::mem::take(&mut *POINTS.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn now_us() -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64)
    }

    pub(crate) fn started() -> i64 {
        match ENABLED.load(Ordering::Relaxed) {
            true => now_us(),
            false => 0,
        }
    }

    pub(crate) fn mark_each(stage: Stage, ids: impl IntoIterator<Item = Uuid>) {
        if !ENABLED.load(Ordering::Relaxed) {
            return;
        }
        mark_each_at(stage, ids, now_us());
    }

    pub(crate) fn mark_each_at(stage: Stage, ids: impl IntoIterator<Item = Uuid>, at_us: i64) {
        // 0: the stage started while recording was off.
        if at_us == 0 || !ENABLED.load(Ordering::Relaxed) {
            return;
        }
        let mut points = POINTS.lock().unwrap_or_else(|e| e.into_inner());
        points.extend(ids.into_iter().map(|event_id| Point {
            event_id,
            stage,
            at_us,
        }));
    }
}

#[cfg(feature = "test-hooks")]
pub use points::{Point, disable, enable, take};

/// Marks `ids` as having reached `stage` now.
#[inline]
pub(crate) fn mark_each(stage: Stage, ids: impl IntoIterator<Item = Uuid>) {
    #[cfg(feature = "test-hooks")]
    points::mark_each(stage, ids);
    #[cfg(not(feature = "test-hooks"))]
    let _ = (stage, ids);
}

/// When a stage that [`mark_each_at`] will record starts: the wall clock in
/// microseconds while recording, 0 otherwise (and without the feature).
#[inline]
pub(crate) fn started() -> i64 {
    #[cfg(feature = "test-hooks")]
    return points::started();
    #[cfg(not(feature = "test-hooks"))]
    0
}

/// Marks `ids` as having reached `stage` at `at_us` (from [`started`]).
#[inline]
pub(crate) fn mark_each_at(stage: Stage, ids: impl IntoIterator<Item = Uuid>, at_us: i64) {
    #[cfg(feature = "test-hooks")]
    points::mark_each_at(stage, ids, at_us);
    #[cfg(not(feature = "test-hooks"))]
    let _ = (stage, ids, at_us);
}

/// Marks one event.
#[inline]
pub(crate) fn mark(stage: Stage, event_id: Uuid) {
    mark_each(stage, [event_id]);
}
