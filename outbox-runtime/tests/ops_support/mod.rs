//! Fixtures shared by the operator tooling's tests (the `ops` library's here,
//! the `outbox` binary's in `txoutbox-cli`): rows in every state the tooling
//! distinguishes, written with plain SQL, and a topic to read back (the
//! broker address, topic creation and counting come from `txoutbox-testkit`).

#![allow(dead_code)] // each test binary uses a different subset

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::json;
use sqlx::PgPool;
use txoutbox_testkit::broker::{client_config, unique_group};
use uuid::Uuid;

/// An outbox row to insert; ages are seconds before the database's `now()`.
#[derive(Debug, Clone)]
pub(crate) struct OutboxRow {
    pub topic: &'static str,
    pub event_type: &'static str,
    pub aggregate_type: &'static str,
    pub aggregate_id: String,
    pub created_ago: i64,
    pub published_ago: Option<i64>,
    pub parked_ago: Option<i64>,
    pub discarded_ago: Option<i64>,
    pub attempts: i32,
    pub last_error: Option<&'static str>,
    pub traceparent: Option<&'static str>,
}

impl OutboxRow {
    pub(crate) fn new(topic: &'static str) -> Self {
        Self {
            topic,
            event_type: "OrderCreated",
            aggregate_type: "Order",
            aggregate_id: "1".into(),
            created_ago: 0,
            published_ago: None,
            parked_ago: None,
            discarded_ago: None,
            attempts: 0,
            last_error: None,
            traceparent: None,
        }
    }

    pub(crate) fn published(mut self, created_ago: i64, published_ago: i64) -> Self {
        self.created_ago = created_ago;
        self.published_ago = Some(published_ago);
        self
    }

    pub(crate) fn parked(mut self, attempts: i32, error: &'static str) -> Self {
        self.parked_ago = Some(10);
        self.attempts = attempts;
        self.last_error = Some(error);
        self
    }

    /// Inserts the row; returns `(id, event_id)`.
    pub(crate) async fn insert(&self, pool: &PgPool) -> (i64, Uuid) {
        let event_id = Uuid::new_v4();
        let payload = json!({ "event_id": event_id, "aggregate_id": self.aggregate_id, "n": 1 });
        let ago = |secs: Option<i64>| secs.map(|s| s as f64);
        let id = sqlx::query_scalar(
            "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type, payload,
                 topic, partition_key, created_at, published_at, parked_at, discarded_at,
                 attempts, last_error, traceparent)
             VALUES ($1, $2, $3, $4, $5, $6, $3,
                 now() - make_interval(secs => $7),
                 now() - make_interval(secs => $8),
                 now() - make_interval(secs => $9),
                 now() - make_interval(secs => $10),
                 $11, $12, $13)
             RETURNING id",
        )
        .bind(event_id)
        .bind(self.aggregate_type)
        .bind(&self.aggregate_id)
        .bind(self.event_type)
        .bind(payload)
        .bind(self.topic)
        .bind(self.created_ago as f64)
        .bind(ago(self.published_ago))
        .bind(ago(self.parked_ago))
        .bind(ago(self.discarded_ago))
        .bind(self.attempts)
        .bind(self.last_error)
        .bind(self.traceparent)
        .fetch_one(pool)
        .await
        .unwrap();
        (id, event_id)
    }
}

/// Inserts an inbox row; ages in seconds before `now()`. Returns its event id.
pub(crate) async fn inbox_row(
    pool: &PgPool,
    topic: &str,
    received_ago: i64,
    processed_ago: Option<i64>,
    parked: Option<&str>,
) -> Uuid {
    let event_id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO inbox_event (event_id, received_at, payload, processed, processed_at,
             event_type, topic, attempts, last_error, parked_at)
         VALUES ($1, now() - make_interval(secs => $2), $3, $4 IS NOT NULL,
             now() - make_interval(secs => $4), 'PaymentTaken', $5,
             CASE WHEN $6::text IS NULL THEN 0 ELSE 5 END, $6,
             CASE WHEN $6::text IS NULL THEN NULL ELSE now() END)",
    )
    .bind(event_id)
    .bind(received_ago as f64)
    .bind(json!({ "event_id": event_id }))
    .bind(processed_ago.map(|s| s as f64))
    .bind(topic)
    .bind(parked)
    .execute(pool)
    .await
    .unwrap();
    event_id
}

/// Inserts a `processed_event` row processed `ago` seconds before `now()`.
pub(crate) async fn processed_row(pool: &PgPool, group: &str, ago: i64) -> Uuid {
    let event_id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO processed_event (consumer_group, event_id, processed_at)
         VALUES ($1, $2, now() - make_interval(secs => $3))",
    )
    .bind(group)
    .bind(event_id)
    .bind(ago as f64)
    .execute(pool)
    .await
    .unwrap();
    event_id
}

/// A `saga_state` row to insert; ages are seconds before the database's
/// `now()`.
#[derive(Debug, Clone)]
pub(crate) struct SagaRow {
    pub saga_type: &'static str,
    pub saga_id: &'static str,
    pub status: &'static str,
    pub state: serde_json::Value,
    /// Stored compensations: `(event_type, topic, partition_key)` each, in
    /// registration order.
    pub compensations: Vec<(&'static str, &'static str, &'static str)>,
    pub version: i64,
    pub last_message_type: Option<&'static str>,
    pub started_ago: i64,
    pub updated_ago: i64,
    pub finished_ago: Option<i64>,
}

impl SagaRow {
    /// A running saga whose last step was `updated_ago` seconds ago.
    pub(crate) fn running(
        saga_type: &'static str,
        saga_id: &'static str,
        updated_ago: i64,
    ) -> Self {
        Self {
            saga_type,
            saga_id,
            status: "running",
            state: json!({ "id": saga_id, "stage": "waiting" }),
            compensations: Vec::new(),
            version: 2,
            last_message_type: Some("StockReserved"),
            started_ago: updated_ago + 60,
            updated_ago,
            finished_ago: None,
        }
    }

    /// A saga that ended (`completed` or `compensated`) with its last step
    /// `finished_ago` seconds ago.
    pub(crate) fn finished(
        saga_type: &'static str,
        saga_id: &'static str,
        status: &'static str,
        finished_ago: i64,
    ) -> Self {
        Self {
            status,
            finished_ago: Some(finished_ago),
            ..Self::running(saga_type, saga_id, finished_ago)
        }
    }

    /// Inserts the row; returns the event ids given to its compensations
    /// and its `last_event_id`.
    pub(crate) async fn insert(&self, pool: &PgPool) -> (Vec<Uuid>, Uuid) {
        let mut ids = Vec::new();
        let compensations: Vec<serde_json::Value> = self
            .compensations
            .iter()
            .map(|(event_type, topic, key)| {
                let event_id = Uuid::new_v4();
                ids.push(event_id);
                // The shape the saga runtime stores (saga::store::records_to_json).
                json!({
                    "event_id": event_id, "aggregate_type": "Order", "aggregate_id": self.saga_id,
                    "event_type": event_type, "topic": topic, "partition_key": key,
                    "traceparent": null, "payload": { "event_id": event_id },
                })
            })
            .collect();
        let last_event_id = Uuid::new_v4();
        sqlx::query(
            "INSERT INTO saga_state (saga_type, saga_id, status, state, compensations, version,
                 last_message_type, last_event_id, started_at, updated_at, finished_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8,
                 now() - make_interval(secs => $9),
                 now() - make_interval(secs => $10),
                 now() - make_interval(secs => $11))",
        )
        .bind(self.saga_type)
        .bind(self.saga_id)
        .bind(self.status)
        .bind(&self.state)
        .bind(serde_json::Value::Array(compensations))
        .bind(self.version)
        .bind(self.last_message_type)
        .bind(last_event_id)
        .bind(self.started_ago as f64)
        .bind(self.updated_ago as f64)
        .bind(self.finished_ago.map(|s| s as f64))
        .execute(pool)
        .await
        .unwrap();
        (ids, last_event_id)
    }
}

#[allow(unused_imports)] // each test binary uses a different subset
pub(crate) use txoutbox_testkit::broker::brokers;
#[allow(unused_imports)]
pub(crate) use txoutbox_testkit::count;

/// A new single-partition topic, `cli-replay-<random>`.
pub(crate) async fn new_topic() -> String {
    txoutbox_testkit::broker::new_topic(&brokers(), "cli-replay", 1).await
}

pub(crate) struct Received {
    pub key: String,
    pub payload: String,
    pub headers: HashMap<String, String>,
}

/// Reads the topic's only partition from the start up to an end marker this
/// function appends, so "exactly these records" needs no waiting for silence.
pub(crate) async fn read_back(topic: &str) -> Vec<Received> {
    let marker: FutureProducer = client_config(&brokers()).create().unwrap();
    marker
        .send(
            FutureRecord::to(topic).key("end-marker").payload("{}"),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    let consumer: StreamConsumer = client_config(&brokers())
        .set("group.id", unique_group("cli-replay-test"))
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&assignment).unwrap();
    let mut received = Vec::new();
    loop {
        let message = tokio::time::timeout(Duration::from_secs(20), consumer.recv())
            .await
            .expect("records arrive")
            .unwrap();
        let key = String::from_utf8(message.key().unwrap().to_vec()).unwrap();
        if key == "end-marker" {
            return received;
        }
        let headers = message
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| {
                        let value = String::from_utf8(h.value.unwrap().to_vec()).unwrap();
                        (h.key.to_owned(), value)
                    })
                    .collect()
            })
            .unwrap_or_default();
        received.push(Received {
            key,
            payload: String::from_utf8(message.payload().unwrap().to_vec()).unwrap(),
            headers,
        });
    }
}
