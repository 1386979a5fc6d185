//! A broker that refuses a whole topic (it does not exist and may not be
//! created, or the relay is not authorized for it) refuses it for every
//! record alike: that is no fault of the records. The relay holds the
//! topic (its rows wait in the outbox, no attempt counted, nothing parked)
//! while every other topic flows, also for the same partition keys; it says
//! so in its log, its metrics and `outbox status`, and once the topic is
//! accepted again its rows go out, every key in order, nothing lost.
//! Against librdkafka's mock cluster and real PostgreSQL.
//!
//! The metrics recorder is global to the process, so this binary holds one
//! test.
#![allow(missing_docs)]

mod relay_support;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::{
    Counter, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use rdkafka::mocking::MockCluster;
use rdkafka::types::RDKafkaRespErr;
use relay_support::*;
use sqlx::PgPool;
use txoutbox_core::Backoff;
use txoutbox_runtime::ops::status;
use txoutbox_runtime::relay::Relay;
use txoutbox_runtime::relay::telemetry as m;

/// The last value of every gauge, and every counter, by `name{labels}`.
#[derive(Default, Clone)]
struct Recorded {
    counters: Arc<Mutex<HashMap<String, Arc<AtomicU64>>>>,
    gauges: Arc<Mutex<HashMap<String, Arc<Last>>>>,
}

#[derive(Default)]
struct Last(Mutex<f64>);

impl GaugeFn for Last {
    fn increment(&self, value: f64) {
        *self.0.lock().unwrap() += value;
    }
    fn decrement(&self, value: f64) {
        *self.0.lock().unwrap() -= value;
    }
    fn set(&self, value: f64) {
        *self.0.lock().unwrap() = value;
    }
}

impl HistogramFn for Last {
    fn record(&self, _: f64) {}
}

fn key_string(key: &Key) -> String {
    let mut labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    labels.sort();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

impl Recorded {
    fn counter(&self, key: &str) -> u64 {
        self.counters
            .lock()
            .unwrap()
            .get(key)
            .map_or(0, |c| c.load(Ordering::SeqCst))
    }

    /// A gauge without labels.
    fn gauge(&self, name: &str) -> Option<f64> {
        let gauges = self.gauges.lock().unwrap();
        gauges
            .get(&format!("{name}{{}}"))
            .map(|g| *g.0.lock().unwrap())
    }
}

impl Recorder for Recorded {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let mut counters = self.counters.lock().unwrap();
        Counter::from_arc(counters.entry(key_string(key)).or_default().clone())
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        let mut gauges = self.gauges.lock().unwrap();
        Gauge::from_arc(gauges.entry(key_string(key)).or_default().clone())
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(Arc::new(Last::default()))
    }
}

const KEYS: usize = 20;
const PER_KEY: i64 = 10;

#[derive(Debug, sqlx::FromRow)]
struct Row {
    topic: String,
    attempts: i32,
    parked: bool,
    published: bool,
    /// Seconds from commit to publish.
    delay: Option<f64>,
}

async fn rows(pool: &PgPool) -> Vec<Row> {
    sqlx::query_as(
        "SELECT topic, attempts, parked_at IS NOT NULL AS parked,
                published_at IS NOT NULL AS published,
                EXTRACT(EPOCH FROM published_at - created_at)::float8 AS delay
         FROM outbox_event ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Every key's `seq` values in topic order, first copies only (what a
/// receiver that dedups on the event id sees), and how many later copies
/// there were.
fn first_copies(mut received: Vec<Received>) -> (HashMap<String, Vec<i64>>, usize) {
    received.sort_by_key(|r| (r.partition, r.offset));
    let mut seen = HashSet::new();
    let mut duplicates = 0;
    let mut per_key: HashMap<String, Vec<i64>> = HashMap::new();
    for record in received {
        if !seen.insert(record.event_id()) {
            duplicates += 1;
            continue;
        }
        per_key
            .entry(record.key.clone())
            .or_default()
            .push(record.value["seq"].as_i64().unwrap());
    }
    (per_key, duplicates)
}

#[sqlx::test(migrations = false)]
async fn a_refused_topic_is_held_without_attempts_while_other_topics_flow(pool: PgPool) {
    let recorded = Recorded::default();
    metrics::set_global_recorder(recorded.clone()).unwrap();
    migrated(&pool).await;
    let cluster = MockCluster::new(1).unwrap();
    let healthy = "orders";
    let unknown = "orders-v2"; // not created (yet), and the broker creates none
    let forbidden = "payments"; // the relay may not write to it (yet)
    cluster.create_topic(healthy, 2, 1).unwrap();
    cluster
        .topic_error(
            forbidden,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED,
        )
        .unwrap();

    // Each key's rows for the refused topics come first, then its rows for
    // the healthy one: the same partition keys on three topics.
    let mut events = Vec::new();
    for seq in 0..PER_KEY {
        for topic in [unknown, forbidden, healthy] {
            events.extend((0..KEYS).map(|k| NewEvent::new(topic, format!("key-{k}"), seq)));
        }
    }
    let ids = insert(&pool, &events).await;

    let mut kafka = kafka_config(&cluster.bootstrap_servers());
    kafka
        .set("allow.auto.create.topics", "false")
        // librdkafka fails the records of a topic it found missing after
        // this (default 30 s), so refusals come back as delivery reports too.
        .set("topic.metadata.propagation.max.ms", "1000");
    let relay = Relay::builder(pool.clone(), kafka)
        .batch_size(100)
        .max_attempts(3)
        .retry_backoff(Backoff::new(
            Duration::from_millis(500),
            Duration::from_secs(300),
        ))
        .error_backoff(Backoff::new(
            Duration::from_millis(100),
            Duration::from_millis(500),
        ))
        .partition_stall_timeout(Duration::from_millis(500))
        .rebalance_interval(Duration::from_millis(300))
        .metrics_interval(Duration::from_millis(200))
        .spawn()
        .unwrap();

    let healthy_rows = KEYS * PER_KEY as usize;
    eventually(
        "every row of the healthy topic published",
        Duration::from_secs(15),
        || async {
            rows(&pool)
                .await
                .iter()
                .filter(|r| r.topic == healthy && r.published)
                .count()
                == healthy_rows
        },
    )
    .await;
    let delays: Vec<f64> = rows(&pool)
        .await
        .iter()
        .filter(|r| r.topic == healthy)
        .map(|r| r.delay.unwrap())
        .collect();
    let mut sorted = delays.clone();
    sorted.sort_by(f64::total_cmp);
    let (median, max) = (sorted[sorted.len() / 2], sorted[sorted.len() - 1]);
    println!(
        "healthy topic: {} rows published, commit-to-publish median {:.0} ms, max {:.0} ms",
        delays.len(),
        median * 1e3,
        max * 1e3
    );
    assert!(
        max < 1.0,
        "the healthy topic's rows are not held up by the refused topics' (max delay {max:.2} s)"
    );

    // Several probes later the refused topics are still held: not one
    // attempt counted, nothing parked, nothing published.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for row in rows(&pool).await.iter().filter(|r| r.topic != healthy) {
        assert_eq!(
            (row.attempts, row.parked, row.published),
            (0, false, false),
            "{row:?}"
        );
    }
    assert_eq!(
        recorded.gauge(m::HELD_TOPICS),
        Some(2.0),
        "gauge of held topics"
    );
    for topic in [unknown, forbidden] {
        let refusals = recorded.counter(&format!("{}{{topic={topic}}}", m::TOPIC_REFUSALS));
        assert!(refusals > 0, "refusals of {topic} counted");
    }
    let relays = eventually_value("outbox status shows the held topics", || async {
        let relays = status::collect(&pool, 5).await.unwrap().relays;
        (relays.len() == 1 && relays[0].held_topics.len() == 2).then_some(relays)
    })
    .await;
    let mut held: Vec<(&str, &str)> = relays[0]
        .held_topics
        .iter()
        .map(|h| (h.topic.as_str(), h.reason.as_str()))
        .collect();
    held.sort();
    assert_eq!(held[0].0, unknown);
    assert!(held[0].1.contains("Unknown topic"), "{held:?}");
    assert_eq!(held[1].0, forbidden);
    assert!(held[1].1.to_lowercase().contains("authoriz"), "{held:?}");

    // The topics are fixed: everything goes out, every key in order.
    cluster.create_topic(unknown, 2, 1).unwrap();
    cluster
        .topic_error(forbidden, RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR)
        .unwrap();
    all_published(&pool, Duration::from_secs(20)).await;
    let summary = relay.shutdown().await.unwrap();
    assert!(summary.clean);
    assert_eq!(summary.parked, 0);
    for row in rows(&pool).await {
        assert_eq!((row.attempts, row.parked), (0, false), "{row:?}");
    }
    assert_eq!(recorded.gauge(m::HELD_TOPICS), Some(0.0));
    let expected: Vec<i64> = (0..PER_KEY).collect();
    let mut received_ids = HashSet::new();
    for topic in [unknown, forbidden, healthy] {
        let received = read_topic(
            &cluster.bootstrap_servers(),
            topic,
            healthy_rows,
            Duration::from_secs(20),
        )
        .await;
        received_ids.extend(received.iter().map(Received::event_id));
        let (per_key, duplicates) = first_copies(received);
        println!("{topic}: {duplicates} duplicates (absorbed by dedup)");
        assert_eq!(per_key.len(), KEYS, "{topic}: every key");
        for (key, seqs) in per_key {
            assert_eq!(seqs, expected, "{topic} {key} in order");
        }
    }
    assert_eq!(
        received_ids,
        ids.into_iter().collect::<HashSet<_>>(),
        "nothing lost"
    );
}

/// Polls `check` every 100 ms for up to 10 s until it returns a value.
async fn eventually_value<T, F, Fut>(what: &str, check: F) -> T
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
