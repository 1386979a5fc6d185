//! Helpers shared by the relay tests: outbox rows by plain SQL, a topic
//! reader and a private broker that can be stopped; the broker address,
//! topics and waiting come from `txoutbox-testkit`.
#![allow(dead_code, missing_docs)]

use std::collections::{BTreeMap, HashMap};
use std::process::Child;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use sqlx::PgPool;
use txoutbox_testkit::broker::{free_port, spawn_tansu, wait_listening};
use uuid::Uuid;

#[allow(unused_imports)] // each test binary uses a different subset
pub(crate) use txoutbox_testkit::broker::{brokers, client_config as kafka_config, create_topic};
#[allow(unused_imports)]
pub(crate) use txoutbox_testkit::{eventually, init_tracing};

/// A topic name of this run: `relay-test-<name>-<random>`.
pub(crate) fn unique_topic(name: &str) -> String {
    txoutbox_testkit::broker::unique_topic(&format!("relay-test-{name}"))
}

pub(crate) async fn migrated(pool: &PgPool) {
    init_tracing();
    txoutbox_runtime::migrations::run(pool).await.unwrap();
}

/// An event to insert: (topic, key, payload size filler).
#[derive(Debug, Clone)]
pub(crate) struct NewEvent {
    pub topic: String,
    pub key: String,
    pub seq: i64,
    pub traceparent: Option<String>,
    pub filler: usize,
}

impl NewEvent {
    pub(crate) fn new(topic: &str, key: impl Into<String>, seq: i64) -> Self {
        Self {
            topic: topic.to_owned(),
            key: key.into(),
            seq,
            traceparent: None,
            filler: 0,
        }
    }
}

/// Inserts the events in order (one statement) and returns their event ids.
pub(crate) async fn insert(pool: &PgPool, events: &[NewEvent]) -> Vec<Uuid> {
    let ids: Vec<Uuid> = events.iter().map(|_| Uuid::now_v7()).collect();
    let payloads: Vec<serde_json::Value> = events
        .iter()
        .zip(&ids)
        .map(|(e, id)| {
            serde_json::json!({
                "event_id": id.to_string(),
                "key": e.key,
                "seq": e.seq,
                "filler": "x".repeat(e.filler),
            })
        })
        .collect();
    let topics: Vec<&str> = events.iter().map(|e| e.topic.as_str()).collect();
    let keys: Vec<&str> = events.iter().map(|e| e.key.as_str()).collect();
    let traces: Vec<Option<&str>> = events.iter().map(|e| e.traceparent.as_deref()).collect();
    sqlx::query(
        "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type, payload,
                                   topic, partition_key, traceparent)
         SELECT e.id, 'Order', e.key, 'OrderCreated', e.payload, e.topic, e.key, e.trace
         FROM unnest($1::uuid[], $2::jsonb[], $3::text[], $4::text[], $5::text[])
              WITH ORDINALITY AS e(id, payload, topic, key, trace, n)
         ORDER BY e.n",
    )
    .bind(&ids)
    .bind(&payloads)
    .bind(&topics)
    .bind(&keys)
    .bind(&traces)
    .execute(pool)
    .await
    .unwrap();
    txoutbox_core::__private::wakeup::notify_committed();
    ids
}

pub(crate) async fn unpublished(pool: &PgPool) -> i64 {
    txoutbox_testkit::count(
        pool,
        "SELECT count(*) FROM outbox_event WHERE published_at IS NULL",
    )
    .await
}

pub(crate) async fn all_published(pool: &PgPool, timeout: Duration) {
    eventually("every outbox row published", timeout, || async {
        unpublished(pool).await == 0
    })
    .await;
}

/// One record read back from a topic.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    pub partition: i32,
    pub offset: i64,
    pub key: String,
    pub value: serde_json::Value,
    pub headers: HashMap<String, String>,
}

impl Received {
    pub(crate) fn event_id(&self) -> Uuid {
        self.headers["event_id"].parse().unwrap()
    }
}

/// Reads every partition of `topic` from the beginning until at least
/// `expected` records arrived (then a short grace period for extra ones),
/// in offset order per partition.
///
/// tansu can serve a partition's later record before an earlier one (the
/// consumer's `refetch_offset_gaps` is for that), and a plain reader then
/// steps past the earlier one for good. A read that comes up short is
/// therefore made again, from the beginning with a fresh reader, within the
/// same `timeout`, and the reads are merged by (partition, offset): a
/// record published twice has two offsets and still shows twice.
pub(crate) async fn read_topic(
    brokers: &str,
    topic: &str,
    expected: usize,
    timeout: Duration,
) -> Vec<Received> {
    let brokers = brokers.to_owned();
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || read_topic_blocking(&brokers, &topic, expected, timeout))
        .await
        .unwrap()
}

fn read_topic_blocking(
    brokers: &str,
    topic: &str,
    expected: usize,
    timeout: Duration,
) -> Vec<Received> {
    const READS: u32 = 3;
    // Expecting nothing: one read for the whole timeout.
    let reads = if expected == 0 { 1 } else { READS };
    let deadline = Instant::now() + timeout;
    let mut merged: BTreeMap<(i32, i64), Received> = BTreeMap::new();
    for read in 0..reads {
        let window = deadline.saturating_duration_since(Instant::now()) / (reads - read);
        for record in read_once(brokers, topic, expected, window) {
            merged.insert((record.partition, record.offset), record);
        }
        if merged.len() >= expected || Instant::now() >= deadline {
            break;
        }
    }
    merged.into_values().collect()
}

/// One reader's pass over `topic` from the beginning; see [`read_topic`].
fn read_once(brokers: &str, topic: &str, expected: usize, timeout: Duration) -> Vec<Received> {
    let consumer: BaseConsumer = kafka_config(brokers)
        .set("group.id", format!("reader-{}", Uuid::new_v4()))
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    let mut assignment = TopicPartitionList::new();
    for partition in metadata.topics()[0].partitions() {
        assignment
            .add_partition_offset(topic, partition.id(), Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&assignment).unwrap();
    let deadline = Instant::now() + timeout;
    let mut grace_until: Option<Instant> = None;
    let mut received = Vec::new();
    loop {
        let now = Instant::now();
        if now > deadline || grace_until.is_some_and(|g| now > g) {
            break;
        }
        let Some(message) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let message = message.unwrap();
        let headers = message
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| {
                        let value = h.value.map(|v| String::from_utf8(v.to_vec()).unwrap());
                        (h.key.to_owned(), value.unwrap_or_default())
                    })
                    .collect()
            })
            .unwrap_or_default();
        received.push(Received {
            partition: message.partition(),
            offset: message.offset(),
            key: String::from_utf8(message.key().unwrap_or_default().to_vec()).unwrap(),
            value: serde_json::from_slice(message.payload().unwrap_or_default()).unwrap(),
            headers,
        });
        if received.len() >= expected && grace_until.is_none() {
            grace_until = Some(Instant::now() + Duration::from_millis(500));
        }
    }
    received
}

/// A tansu broker of the test's own, on a free port; killed on drop.
pub(crate) struct OwnBroker {
    pub port: u16,
    child: Option<Child>,
}

impl OwnBroker {
    pub(crate) fn start() -> Self {
        let mut broker = Self {
            port: free_port(),
            child: None,
        };
        broker.restart();
        broker
    }

    pub(crate) fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub(crate) fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the broker again (memory storage: topics are gone and must be recreated).
    pub(crate) fn restart(&mut self) {
        self.stop();
        self.child = Some(spawn_tansu(self.port, &self.address()));
        wait_listening(self.port);
    }
}

impl Drop for OwnBroker {
    fn drop(&mut self) {
        self.stop();
    }
}
