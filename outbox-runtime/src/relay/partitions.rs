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

use super::partitioner::Partitioner;
use super::telemetry as metric;

/// How long a topic's partition count is trusted before it is fetched again
/// (also re-fetched at once when a delivery lands elsewhere than predicted).
const METADATA_MAX_AGE: Duration = Duration::from_secs(300);
/// When a failed metadata request is tried again.
const METADATA_RETRY: Duration = Duration::from_secs(30);
/// Longest hold of a row of an unavailable partition (it is released at
/// once when the partition is back; this bounds the wait only if that
/// release is lost: the relay stopped, or its lane moved to another relay).
pub(crate) const HOLD_MAX: Duration = Duration::from_secs(300);
/// Bound of one metadata request (run on a blocking thread).
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

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

#[derive(Debug)]
struct Count {
    partitions: Option<i32>,
    refetch_at: Instant,
}

/// Partition health and prediction of one relay.
pub(crate) struct Partitions {
    partitioner: Option<Partitioner>,
    counts: HashMap<String, Count>,
    /// Topics whose partition count is wanted.
    wanted: Vec<String>,
    fetching: Option<(String, tokio::task::JoinHandle<Option<i32>>)>,
    down: HashMap<Tp, Down>,
    /// Last delivery seen on each partition.
    delivered_at: HashMap<Tp, Instant>,
    /// Rows held back for partitions that are available again, whose
    /// `next_attempt_at` is to be cleared so they are claimed at once.
    released: Vec<i64>,
    /// Shortest hold of a held-back row (`delivery_timeout`).
    hold_for: Duration,
    probe_backoff: (Duration, Duration),
}

impl Partitions {
    pub(crate) fn new(
        partitioner: Option<Partitioner>,
        hold_for: Duration,
        probe_backoff: (Duration, Duration),
    ) -> Self {
        Self {
            partitioner,
            counts: HashMap::new(),
            wanted: Vec::new(),
            fetching: None,
            down: HashMap::new(),
            delivered_at: HashMap::new(),
            released: Vec::new(),
            hold_for,
            probe_backoff,
        }
    }

    /// The partition librdkafka will put `key` of `topic` in, if known.
    pub(crate) fn predict(&mut self, topic: &str, key: &str) -> Option<i32> {
        let partitioner = self.partitioner?;
        let (partitions, stale) = match self.counts.get(topic) {
            Some(count) => (count.partitions, Instant::now() >= count.refetch_at),
            None => (None, true),
        };
        if stale {
            self.want(topic);
        }
        partitioner.partition(key.as_bytes(), partitions?)
    }

    fn want(&mut self, topic: &str) {
        let fetching = self.fetching.as_ref().is_some_and(|(t, _)| t == topic);
        if !fetching && !self.wanted.iter().any(|t| t == topic) {
            self.wanted.push(topic.to_owned());
        }
    }

    /// Collects a finished metadata request and starts the next wanted one
    /// (one at a time, on a blocking thread: librdkafka's call blocks).
    pub(crate) fn refresh_metadata(&mut self, producer: &FutureProducer) {
        if let Some((_, fetch)) = &self.fetching {
            if !fetch.is_finished() {
                return;
            }
            let (topic, fetch) = self.fetching.take().expect("checked");
            let partitions = futures::FutureExt::now_or_never(fetch)
                .and_then(Result::ok)
                .flatten();
            let wait = if partitions.is_some() {
                METADATA_MAX_AGE
            } else {
                METADATA_RETRY
            };
            let refetch_at = Instant::now() + wait;
            self.wanted.retain(|t| *t != topic);
            self.counts.insert(
                topic,
                Count {
                    partitions,
                    refetch_at,
                },
            );
        }
        let Some(topic) = self.wanted.pop() else {
            return;
        };
        let producer = producer.clone();
        let name = topic.clone();
        let fetch = tokio::task::spawn_blocking(move || {
            use rdkafka::producer::Producer;
            let metadata = producer
                .client()
                .fetch_metadata(Some(&name), METADATA_TIMEOUT)
                .ok()?;
            let found = metadata.topics().iter().find(|t| t.name() == name)?;
            if found.error().is_some() || found.partitions().is_empty() {
                return None;
            }
            Some(found.partitions().len() as i32)
        });
        self.fetching = Some((topic, fetch));
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
            self.want(topic);
        }
        let tp = (topic.to_owned(), partition);
        if delivered {
            self.delivered_at.insert(tp.clone(), Instant::now());
            if let Some(down) = self.down.remove(&tp) {
                self.up(tp, down);
            }
            return;
        }
        let (initial, max) = self.probe_backoff;
        if let Some(down) = self.down.get_mut(&tp)
            && down.probe == Some(id)
        {
            down.probe = None;
            down.failures += 1;
            down.next_probe = Instant::now()
                + super::backoff::jittered_exponential(initial, max, down.failures - 1);
        }
    }

    /// Whether `tp` had a delivery since `since`.
    pub(crate) fn delivered_since(&self, tp: &Tp, since: Instant) -> bool {
        self.delivered_at.get(tp).is_some_and(|at| *at >= since)
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
mod tests {
    use std::collections::HashMap;

    use rdkafka::ClientConfig;
    use rdkafka::mocking::MockCluster;
    use rdkafka::producer::FutureRecord;

    use super::*;

    /// The prediction is where librdkafka really puts each key, for the
    /// default partitioner and the Java-compatible one.
    #[tokio::test]
    async fn predictions_match_librdkafkas_partitioning() {
        let cluster = MockCluster::new(1).unwrap();
        for setting in [None, Some("murmur2_random"), Some("fnv1a")] {
            let topic = format!("predict-{}", setting.unwrap_or("default"));
            cluster.create_topic(&topic, 7, 1).unwrap();
            let mut config = ClientConfig::new();
            config.set("bootstrap.servers", cluster.bootstrap_servers());
            if let Some(setting) = setting {
                config.set("partitioner", setting);
            }
            let producer: FutureProducer = config.create().unwrap();
            let mut partitions = Partitions::new(
                Partitioner::from_setting(setting),
                Duration::from_secs(1),
                (Duration::from_millis(1), Duration::from_millis(1)),
            );
            assert_eq!(partitions.predict(&topic, "k"), None, "count not known yet");
            let deadline = Instant::now() + Duration::from_secs(10);
            while partitions.predict(&topic, "k").is_none() {
                assert!(Instant::now() < deadline, "metadata never arrived");
                partitions.refresh_metadata(&producer);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let mut actual = HashMap::new();
            for i in 0..300 {
                let key = format!("key-{i}-{}", "x".repeat(i % 7));
                let delivery = producer
                    .send(
                        FutureRecord::to(&topic).key(&key).payload("{}"),
                        Duration::from_secs(5),
                    )
                    .await
                    .unwrap();
                actual.insert(key, delivery.partition);
            }
            for (key, partition) in &actual {
                assert_eq!(
                    partitions.predict(&topic, key),
                    Some(*partition),
                    "{setting:?} {key}"
                );
            }
        }
    }

    #[test]
    fn one_probe_at_a_time_and_a_delivery_releases_the_held_back_rows() {
        let mut partitions = Partitions::new(
            None,
            Duration::from_secs(60),
            (Duration::from_millis(1), Duration::from_millis(1)),
        );
        let tp = ("t".to_owned(), 2);
        assert_eq!(partitions.route("t", 2, 1), Route::Send);
        assert!(partitions.suspect(&tp, "stalled".into()));
        assert!(!partitions.suspect(&tp, "again".into()));
        // Rows sent before the suspicion are probes enough for a while.
        assert_eq!(partitions.route("t", 2, 1), Route::HoldBack);
        partitions.down.get_mut(&tp).unwrap().next_probe = Instant::now();
        assert_eq!(partitions.route("t", 2, 1), Route::Probe);
        assert_eq!(partitions.route("t", 2, 2), Route::HoldBack);
        let (hold, reason) = partitions.held_back(&tp, 2);
        assert_eq!(hold, Duration::from_secs(60));
        assert!(reason.contains("partition 2 of topic t"), "{reason}");
        assert_eq!(
            partitions.route("t", 3, 3),
            Route::Send,
            "other partitions flow"
        );
        // The probe fails: the next one after a backoff.
        partitions.reported("t", Some(2), Some(2), 1, false);
        assert!(partitions.is_down(&tp));
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(partitions.route("t", 2, 4), Route::Probe);
        partitions.reported("t", Some(2), Some(2), 4, true);
        assert!(!partitions.is_down(&tp));
        assert_eq!(partitions.take_released(), vec![2]);
        assert_eq!(partitions.unavailable(), 0);
    }

    #[test]
    fn holds_grow_with_the_outage_and_a_held_row_is_released_to_probe() {
        let base = Duration::from_millis(20);
        let mut partitions = Partitions::new(None, base, (base, base));
        let tp = ("t".to_owned(), 0);
        partitions.suspect(&tp, "down".into());
        let (first, _) = partitions.held_back(&tp, 10);
        assert_eq!(first, base, "at least delivery_timeout");
        partitions.held_back(&tp, 11);
        std::thread::sleep(base * 3);
        let (later, _) = partitions.held_back(&tp, 12);
        assert!(later >= base * 3, "as long as the outage so far: {later:?}");
        // No claimed row became the probe: the oldest row still held is
        // released to be it, once.
        partitions.request_probes();
        assert_eq!(partitions.take_released(), vec![12]);
        partitions.request_probes();
        assert!(partitions.take_released().is_empty());
        assert_eq!(partitions.route("t", 0, 12), Route::Probe);
    }
}
