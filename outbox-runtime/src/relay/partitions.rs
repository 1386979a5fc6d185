//! Which partitions are unavailable, and which partition a row goes to.
//!
//! When a partition's leader is down, librdkafka keeps that partition's
//! records queued until `message.timeout.ms` while every other partition
//! carries on. The relay follows suit: it predicts each row's partition
//! (librdkafka's partitioner over the topic's partition count from cached
//! metadata, see [`Partitioner`]) and, once a partition is known to be
//! unavailable, holds its rows back in the database (`next_attempt_at` set,
//! no attempt counted) instead of sending them, except for one probe at a
//! time. When the probe (or any row sent earlier) is delivered, the held-back
//! rows are released at once.
//!
//! A hold lasts as long as the partition has been down so far (at least
//! `delivery_timeout`, at most [`HOLD_MAX`]): a hold that expires brings its
//! key's whole backlog back into claims, so holds must not expire often in a
//! long outage; their early release on recovery is what keeps recovery fast.
//! When no claimed row can serve as the next probe (every key of the
//! partition held), the oldest held row is released early to be it.
//!
//! A partition is suspected when a batch's rows on it got no delivery report
//! within `partition_stall_timeout` while other partitions delivered; it is
//! back on the first delivery on it.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use rdkafka::producer::FutureProducer;
use txoutbox_core::Backoff;

use super::partitioner::Partitioner;
use super::prediction::{MetadataFetch, Prediction, TopicMetadata};
use super::telemetry as metric;

/// Longest hold of a row of an unavailable partition (it is released at
/// once when the partition is back; this bounds the wait only if that
/// release is lost: the relay stopped, or its lane moved to another relay).
pub(crate) const HOLD_MAX: Duration = Duration::from_secs(300);

/// A topic's partition.
pub(crate) type Tp = (String, i32);

/// What to do with a row whose partition is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// Send it.
    Send,
    /// Its partition is unavailable: send it as the partition's one probe.
    Probe,
    /// Its partition is unavailable: hold it back.
    HoldBack,
}

#[derive(Debug)]
struct Down {
    since: Instant,
    reason: String,
    /// Failed probes in a row.
    failures: u32,
    /// No probe before this (rows sent before the partition was suspected
    /// are probes enough until they time out).
    next_probe: Instant,
    /// The row id of the probe in flight.
    probe: Option<i64>,
    /// A held row released early to be the next probe, and when.
    probe_requested: Option<(i64, Instant)>,
    /// Rows held back, with the end of their hold, oldest first.
    held: VecDeque<(i64, Instant)>,
    held_total: u64,
}

/// Partition health and prediction of one relay.
pub(crate) struct Partitions {
    /// Which partition a key goes to.
    prediction: Prediction,
    down: HashMap<Tp, Down>,
    /// Last delivery seen on each partition.
    delivered_at: HashMap<Tp, Instant>,
    /// Rows held back for partitions that are available again, whose
    /// `next_attempt_at` is to be cleared so they are claimed at once.
    released: Vec<i64>,
    /// Shortest hold of a held-back row (`delivery_timeout`).
    hold_for: Duration,
    probe_backoff: Backoff,
}

impl Partitions {
    pub(crate) fn new(
        partitioner: Option<Partitioner>,
        hold_for: Duration,
        probe_backoff: Backoff,
    ) -> Self {
        Self {
            prediction: Prediction::new(partitioner),
            down: HashMap::new(),
            delivered_at: HashMap::new(),
            released: Vec::new(),
            hold_for,
            probe_backoff,
        }
    }

    /// The partition librdkafka will put `key` of `topic` in, if known.
    pub(crate) fn predict(&mut self, topic: &str, key: &str) -> Option<i32> {
        self.prediction.predict(topic, key)
    }

    /// See [`Prediction::refresh_metadata`].
    pub(crate) fn refresh_metadata(&mut self, producer: &FutureProducer) {
        self.prediction.refresh_metadata(producer);
    }

    /// See [`Prediction::take_fetch`].
    pub(crate) fn take_metadata_fetch(&mut self) -> Option<MetadataFetch> {
        self.prediction.take_fetch()
    }

    /// See [`Prediction::restore`].
    pub(crate) fn restore_metadata_fetch(&mut self, fetch: Option<MetadataFetch>) {
        self.prediction.restore(fetch);
    }

    /// See [`Prediction::take_answers`].
    pub(crate) fn take_topic_answers(&mut self) -> Vec<(String, TopicMetadata)> {
        self.prediction.take_answers()
    }

    /// Asks for `topic`'s metadata (a held topic's probe); the answer comes
    /// through [`take_topic_answers`](Self::take_topic_answers).
    pub(crate) fn want_metadata(&mut self, topic: &str) {
        self.prediction.want(topic);
    }

    /// Whether the partition is currently held back.
    pub(crate) fn is_down(&self, tp: &Tp) -> bool {
        self.down.contains_key(tp)
    }

    /// Decides about row `id` bound for `partition` of `topic` (known).
    pub(crate) fn route(&mut self, topic: &str, partition: i32, id: i64) -> Route {
        let Some(down) = self.down.get_mut(&(topic.to_owned(), partition)) else {
            return Route::Send;
        };
        if down.probe.is_none() && Instant::now() >= down.next_probe {
            down.probe = Some(id);
            down.probe_requested = None;
            return Route::Probe;
        }
        Route::HoldBack
    }

    /// Records that row `id` was held back for its unavailable partition;
    /// returns how long it stays out of claims and why.
    pub(crate) fn held_back(&mut self, tp: &Tp, id: i64) -> (Duration, String) {
        let now = Instant::now();
        let Some(down) = self.down.get_mut(tp) else {
            return (self.hold_for, String::new());
        };
        let hold = down
            .since
            .elapsed()
            .clamp(self.hold_for, HOLD_MAX.max(self.hold_for));
        while down.held.front().is_some_and(|&(_, until)| until <= now) {
            down.held.pop_front();
        }
        if down.held.len() >= 1024 && down.held.len().is_power_of_two() {
            down.held.retain(|&(_, until)| until > now);
        }
        down.held.push_back((id, now + hold));
        down.held_total += 1;
        let reason = format!(
            "held back: partition {} of topic {} unavailable ({}); not counted as an attempt",
            tp.1, tp.0, down.reason
        );
        (hold, reason)
    }

    /// For each unavailable partition due a probe that no claim provided
    /// (every key of it held), releases its oldest held row early so that the
    /// next claim finds it and sends it as the probe.
    pub(crate) fn request_probes(&mut self) {
        let now = Instant::now();
        for down in self.down.values_mut() {
            let requested_lately = down
                .probe_requested
                .is_some_and(|(_, at)| now < at + self.hold_for);
            if down.probe.is_some() || now < down.next_probe || requested_lately {
                continue;
            }
            let Some(position) = down.held.iter().position(|&(_, until)| until > now) else {
                continue;
            };
            let (id, _) = down.held.remove(position).expect("found");
            down.probe_requested = Some((id, now));
            self.released.push(id);
        }
    }

    /// Suspects a partition (no-op if already down). `reason` goes into logs
    /// and the held-back rows' `last_error`.
    pub(crate) fn suspect(&mut self, tp: &Tp, reason: String) -> bool {
        if self.down.contains_key(tp) {
            return false;
        }
        tracing::warn!(
            topic = %tp.0,
            partition = tp.1,
            %reason,
            "outbox relay: partition unavailable; holding back its events, the other partitions keep flowing"
        );
        let now = Instant::now();
        self.down.insert(
            tp.clone(),
            Down {
                since: now,
                reason,
                failures: 0,
                // Rows already sent to it time out within this (or are
                // delivered, which ends the outage): no probe needed before.
                next_probe: now + self.hold_for,
                probe: None,
                probe_requested: None,
                held: VecDeque::new(),
                held_total: 0,
            },
        );
        metrics::gauge!(metric::UNAVAILABLE_PARTITIONS).set(self.down.len() as f64);
        true
    }

    /// A delivery report for row `id` on `partition` (`None`: not known).
    /// A delivery ends the partition's outage; a failed probe backs off.
    pub(crate) fn reported(
        &mut self,
        topic: &str,
        partition: Option<i32>,
        predicted: Option<i32>,
        id: i64,
        delivered: bool,
    ) {
        let Some(partition) = partition.filter(|p| *p >= 0) else {
            return;
        };
        if delivered && predicted.is_some_and(|p| p != partition) {
            // The partition count changed: fetch it again.
            self.prediction.want(topic);
        }
        let tp = (topic.to_owned(), partition);
        if delivered {
            self.delivered_at.insert(tp.clone(), Instant::now());
            if let Some(down) = self.down.remove(&tp) {
                self.up(tp, down);
            }
            return;
        }
        if let Some(down) = self.down.get_mut(&tp)
            && down.probe == Some(id)
        {
            down.probe = None;
            down.failures += 1;
            down.next_probe = Instant::now() + self.probe_backoff.delay(down.failures);
        }
    }

    /// Whether `tp` had a delivery since `since`.
    pub(crate) fn delivered_since(&self, tp: &Tp, since: Instant) -> bool {
        self.delivered_at.get(tp).is_some_and(|at| *at >= since)
    }

    /// Whether a partition is unavailable, or rows held back for one wait
    /// to be released.
    pub(crate) fn any_down(&self) -> bool {
        !self.down.is_empty() || !self.released.is_empty()
    }

    /// Forgets every outage (a new producer starts afresh), releasing the
    /// held-back rows.
    pub(crate) fn reset(&mut self) {
        for (tp, down) in std::mem::take(&mut self.down) {
            self.up(tp, down);
        }
    }

    fn up(&mut self, (topic, partition): Tp, down: Down) {
        let now = Instant::now();
        let ids: Vec<i64> = down
            .held
            .iter()
            .filter(|&&(_, until)| until > now)
            .map(|&(id, _)| id)
            .collect();
        tracing::info!(
            %topic,
            partition,
            down_for_s = down.since.elapsed().as_secs_f64(),
            held_back = down.held_total,
            released = ids.len(),
            "outbox relay: partition available again; its held-back events are released"
        );
        metrics::gauge!(metric::UNAVAILABLE_PARTITIONS).set(self.down.len() as f64);
        self.released.extend(ids);
    }

    /// Rows to release (held back for partitions that are back).
    pub(crate) fn take_released(&mut self) -> Vec<i64> {
        std::mem::take(&mut self.released)
    }

    /// Logs every partition still unavailable (called every `metrics_interval`).
    pub(crate) fn log_unavailable(&self) {
        for ((topic, partition), down) in &self.down {
            tracing::warn!(
                %topic,
                partition,
                down_for_s = down.since.elapsed().as_secs_f64(),
                held_back = down.held_total,
                failed_probes = down.failures,
                reason = %down.reason,
                "outbox relay: partition still unavailable; its events are held back"
            );
        }
    }

    /// Number of partitions held back.
    pub(crate) fn unavailable(&self) -> usize {
        self.down.len()
    }
}

#[cfg(test)]
mod tests;
