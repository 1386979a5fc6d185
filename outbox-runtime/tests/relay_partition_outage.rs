//! A partial broker outage: one broker of three down for longer than
//! `max_attempts` x `delivery_timeout`, against librdkafka's in-process mock
//! cluster (real sockets, real idempotent producer) and real PostgreSQL.
//!
//! Events of the partitions led by the healthy brokers keep flowing at about
//! their normal latency, no event is parked or counted as a failed attempt
//! (the broker is unavailable; the records are fine), and once the broker is
//! back everything is published, every key's events in order.

mod relay_support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use rdkafka::mocking::MockCluster;
use relay_support::*;
use sqlx::PgPool;
use txoutbox_core::Backoff;
use txoutbox_runtime::relay::Relay;
use uuid::Uuid;

const BROKERS: i32 = 3;
const PARTITIONS: i32 = 6;
/// The broker taken down: it leads partitions 2 and 5.
const DOWN: i32 = 3;
const KEYS: usize = 200;
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(3);
const MAX_ATTEMPTS: u32 = 2;
/// Longer than `MAX_ATTEMPTS` x `DELIVERY_TIMEOUT`.
const OUTAGE: Duration = Duration::from_secs(7);
/// Normal traffic before the outage (the reference figures).
const WARM_UP: Duration = Duration::from_secs(3);

fn leader(partition: i32) -> i32 {
    partition % BROKERS + 1
}

/// Writes `per_tick` events every 20 ms over `KEYS` keys, round robin, each
/// key's `seq` counting up from 0, until `stop`.
fn spawn_writer(
    pool: PgPool,
    topic: String,
    per_tick: usize,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let mut next_seq = vec![0i64; KEYS];
        let mut written = 0;
        while !stop.load(Ordering::Relaxed) {
            let events: Vec<NewEvent> = (0..per_tick)
                .map(|i| {
                    let key = (written + i) % KEYS;
                    let seq = next_seq[key];
                    next_seq[key] += 1;
                    NewEvent::new(&topic, format!("key-{key}"), seq)
                })
                .collect();
            insert(&pool, &events).await;
            written += per_tick;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        written
    })
}

#[derive(Debug, sqlx::FromRow)]
struct Row {
    event_id: Uuid,
    created_at: DateTime<Utc>,
    published_at: Option<DateTime<Utc>>,
    attempts: i32,
    parked_at: Option<DateTime<Utc>>,
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

#[sqlx::test(migrations = false)]
async fn a_broker_down_holds_back_only_its_partitions_and_parks_nothing(pool: PgPool) {
    migrated(&pool).await;
    let cluster = MockCluster::new(BROKERS).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    let topic = unique_topic("partition-outage");
    cluster.create_topic(&topic, PARTITIONS, 1).unwrap();
    for partition in 0..PARTITIONS {
        cluster
            .partition_leader(&topic, partition, Some(leader(partition)))
            .unwrap();
    }

    let mut kafka = kafka_config(&bootstrap);
    kafka.set("reconnect.backoff.max.ms", "500");
    let relay = Relay::builder(pool.clone(), kafka)
        .delivery_timeout(DELIVERY_TIMEOUT)
        .max_attempts(MAX_ATTEMPTS)
        .retry_backoff(Backoff::new(
            Duration::from_millis(100),
            Duration::from_secs(300),
        ))
        .error_backoff(Backoff::new(
            Duration::from_millis(100),
            Duration::from_millis(500),
        ))
        .partition_stall_timeout(Duration::from_millis(300))
        .spawn()
        .unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(pool.clone(), topic.clone(), 10, Arc::clone(&stop));
    tokio::time::sleep(WARM_UP).await;
    let down_at = Utc::now();
    cluster.broker_down(DOWN).unwrap();
    tokio::time::sleep(OUTAGE).await;
    let up_at = Utc::now();
    cluster.broker_up(DOWN).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let written = writer.await.unwrap();

    eventually(
        "every event published after the broker is back",
        Duration::from_secs(30),
        || async { unpublished(&pool).await == 0 },
    )
    .await;
    let summary = relay.shutdown().await.unwrap();
    assert!(summary.clean);

    let rows: Vec<Row> = sqlx::query_as(
        "SELECT event_id, created_at, published_at, attempts, parked_at FROM outbox_event ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), written);
    let parked = rows.iter().filter(|r| r.parked_at.is_some()).count();
    let counted = rows.iter().filter(|r| r.attempts > 0).count();

    // The topic: every event, every key's events in order (first occurrences).
    let received = read_topic(&bootstrap, &topic, written, Duration::from_secs(30)).await;
    let mut partition_of: HashMap<Uuid, i32> = HashMap::new();
    let mut sequences: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let mut by_position: Vec<&Received> = received.iter().collect();
    by_position.sort_by_key(|r| (r.partition, r.offset));
    for record in by_position {
        if partition_of
            .insert(record.event_id(), record.partition)
            .is_none()
        {
            sequences
                .entry(record.key.clone())
                .or_default()
                .push(record.value["seq"].as_i64().unwrap());
        }
    }
    assert_eq!(partition_of.len(), written, "every event on the topic");
    for (key, seqs) in &sequences {
        let expected: Vec<i64> = (0..seqs.len() as i64).collect();
        assert_eq!(seqs, &expected, "events of {key} in order");
    }

    // Figures: healthy partitions' events during the outage vs before it.
    let down_partitions: BTreeSet<i32> = (0..PARTITIONS).filter(|&p| leader(p) == DOWN).collect();
    let healthy = |row: &&Row| !down_partitions.contains(&partition_of[&row.event_id]);
    let warm_up = chrono::Duration::from_std(WARM_UP).unwrap();
    let latency = |row: &&Row| (row.published_at.unwrap() - row.created_at).as_seconds_f64();
    let before: Vec<&Row> = rows
        .iter()
        .filter(healthy)
        .filter(|r| r.created_at >= down_at - warm_up && r.created_at < down_at)
        .collect();
    let during: Vec<&Row> = rows
        .iter()
        .filter(healthy)
        .filter(|r| r.created_at >= down_at && r.created_at < up_at)
        .collect();
    let published_during = during
        .iter()
        .filter(|r| r.published_at.unwrap() < up_at)
        .count();
    let healthy_published_in = |from: DateTime<Utc>, to: DateTime<Utc>| {
        rows.iter()
            .filter(healthy)
            .filter(|r| r.published_at.is_some_and(|at| at >= from && at < to))
            .count()
    };
    let (median_before, median_during) = (
        median(before.iter().map(latency).collect()),
        median(during.iter().map(latency).collect()),
    );
    println!(
        "[partition outage] broker {DOWN} of {BROKERS} down {:.1} s (partitions {down_partitions:?} of {PARTITIONS}); \
         {written} events over {KEYS} keys. Healthy partitions' events published per second: {:.0} before, \
         {:.0} during the outage; of the {} written during the outage {} were published before the broker was back, \
         median latency {:.0} ms (before the outage {:.0} ms). Held back {} times; parked {parked}; \
         rows with a failed attempt counted {counted}",
        (up_at - down_at).as_seconds_f64(),
        healthy_published_in(down_at - warm_up, down_at) as f64 / WARM_UP.as_secs_f64(),
        healthy_published_in(down_at, up_at) as f64 / (up_at - down_at).as_seconds_f64(),
        during.len(),
        published_during,
        median_during * 1000.0,
        median_before * 1000.0,
        summary.held_back,
    );
    assert_eq!(parked, 0, "no event is parked for an unavailable broker");
    assert_eq!(
        counted, 0,
        "no failed attempt is counted for an unavailable broker"
    );
    assert!(
        summary.held_back > 0,
        "the unavailable partitions' events were held back: {summary:?}"
    );
    // Generous bounds: the old relay waited out a delivery timeout for every
    // batch holding a row of the dead partitions.
    assert!(
        published_during * 10 >= during.len() * 8,
        "healthy partitions' events keep flowing during the outage: {published_during} of {}",
        during.len()
    );
    assert!(
        median_during < DELIVERY_TIMEOUT.as_secs_f64() / 2.0,
        "healthy events do not wait for the dead partitions' delivery timeout: median {median_during:.2} s"
    );
}
