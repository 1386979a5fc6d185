//! Helpers shared by the relay tests: outbox rows by plain SQL, topics, a
//! topic reader and a private broker that can be stopped.
#![allow(dead_code, missing_docs)]

use std::collections::HashMap;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use sqlx::PgPool;
use uuid::Uuid;

pub(crate) fn brokers() -> String {
    std::env::var("KAFKA_BROKERS_TEST").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

pub(crate) fn kafka_config(brokers: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", brokers);
    config
}

pub(crate) fn unique_topic(name: &str) -> String {
    format!("relay-test-{name}-{}", Uuid::new_v4().simple())
}

pub(crate) async fn create_topic(brokers: &str, topic: &str, partitions: i32) {
    let admin: AdminClient<_> = kafka_config(brokers).create().unwrap();
    let results = admin
        .create_topics(
            &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .unwrap();
    for result in results {
        if let Err((name, code)) = result {
            assert_eq!(
                code,
                rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists,
                "{name}"
            );
        }
    }
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
    txoutbox_core::wakeup::notify_committed();
    ids
}

pub(crate) async fn unpublished(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox_event WHERE published_at IS NULL")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Waits until `cond` holds, panicking with `what` after `timeout`.
pub(crate) async fn eventually<F, Fut>(timeout: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) async fn all_published(pool: &PgPool, timeout: Duration) {
    eventually(timeout, "every outbox row published", || async {
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
/// `expected` records arrived (then a short grace period for extra ones).
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
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut broker = Self { port, child: None };
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
        let bin = std::env::var("TANSU_BIN").unwrap_or_else(|_| {
            format!(
                "{}/.cache/outbox-dev/bin/tansu",
                std::env::var("HOME").unwrap()
            )
        });
        let url = format!("tcp://127.0.0.1:{}", self.port);
        let child = Command::new(bin)
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
            ])
            .args(["--storage-engine", "memory://tansu/"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("tansu binary (scripts/services.sh tansu installs it; or set TANSU_BIN)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(15);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "own tansu did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for OwnBroker {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Relay logs in test output, filtered by `RUST_LOG` (e.g. `RUST_LOG=txoutbox_runtime=debug`).
pub(crate) fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
}
