//! CloudEvents on the real broker, checked by an independent implementation:
//! the official CloudEvents SDK for Python (`cloudevents` from PyPI,
//! installed by this test into the project's cache on first use, run by
//! `interop_cloudevents/sdk.py`).
//!
//! - The relay's binary-mode records, read by the SDK's Kafka binding, are
//!   the events they should be (attributes, extensions, data).
//! - Records the SDK builds, in binary and in structured mode, are consumed
//!   by our consumers (dedup and inbox) with the event id and type from the
//!   CloudEvent's attributes.
#![allow(missing_docs)]

mod consumer_support;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use consumer_support::*;
use rdkafka::Message;
use rdkafka::message::{Headers, OwnedMessage};
use serde_json::{Value, json};
use sqlx::{PgPool, Postgres, Transaction};
use txoutbox_core::{DomainEvent, Events};
use txoutbox_runtime::consumer::{Consumer, EventMeta, Mode, event_handler};
use txoutbox_runtime::relay::{CloudEvents, Relay};
use txoutbox_testkit::broker::client_config;
use uuid::Uuid;

/// The SDK version the test installs (PyPI `cloudevents`, the official SDK).
const SDK: &str = "cloudevents==2.2.0";

test_event!(CeCreated, "cloudevents-test.orders", "CeCreated");
test_event!(CeCancelled, "cloudevents-test.orders", "CeCancelled");
test_event!(CeShipped, "cloudevents-test.shipments", "CeShipped");

/// Where the SDK is installed (once per machine), installing it if needed.
fn sdk_dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let cache = std::env::var_os("OUTBOX_CACHE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/outbox-dev")
            });
        let dir = cache.join("python").join(SDK.replace("==", "-"));
        if dir.join("cloudevents").join("__init__.py").exists() {
            return dir;
        }
        let tmp = cache
            .join("python")
            .join(format!("tmp-{}", Uuid::new_v4().simple()));
        let status = Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-warn-conflicts",
            ])
            .arg("--target")
            .arg(&tmp)
            .arg(SDK)
            .status()
            .expect("python3 runs (the CloudEvents check needs Python 3.10 or later with pip)");
        assert!(status.success(), "pip install {SDK} failed");
        // Another process may have finished first: either copy will do.
        if std::fs::rename(&tmp, &dir).is_err() {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        dir
    })
}

/// Runs `sdk.py` on `request` and returns its answer.
fn sdk(request: &Value) -> Value {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop_cloudevents/sdk.py");
    let mut child = Command::new("python3")
        .arg(script)
        .env("PYTHONPATH", sdk_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    serde_json::to_writer(child.stdin.take().unwrap(), request).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "the SDK refused: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// A record as the SDK's script takes it.
fn as_sdk_record(message: &OwnedMessage) -> Value {
    let headers: Vec<Value> = message
        .headers()
        .map(|headers| {
            headers
                .iter()
                .map(|h| json!([h.key, String::from_utf8_lossy(h.value.unwrap_or_default())]))
                .collect()
        })
        .unwrap_or_default();
    json!({
        "headers": headers,
        "key": message.key().map(|k| String::from_utf8_lossy(k).into_owned()),
        "value": String::from_utf8_lossy(message.payload().unwrap_or_default()),
    })
}

fn event_id_of(message: &OwnedMessage) -> Option<Uuid> {
    header(message, "ce_id")?.parse().ok()
}

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[sqlx::test(migrations = false)]
async fn the_relays_binary_mode_records_are_cloudevents_to_the_official_sdk(pool: PgPool) {
    prepare_db(&pool).await;
    let topic = CeShipped::TOPIC;
    create_topic(topic, 1).await;
    let from = high_watermarks(topic, 1).await[0];
    let (first, second) = (CeShipped::new(7), CeShipped::new(8));
    let mut events = Events::new();
    events.record(first.clone());
    events.record(second.clone());
    let mut conn = pool.acquire().await.unwrap();
    txoutbox_core::insert_events(&mut conn, &events)
        .await
        .unwrap();
    drop(conn);
    // The first was recorded inside a trace.
    sqlx::query("UPDATE outbox_event SET traceparent = $1 WHERE event_id = $2")
        .bind(TRACEPARENT)
        .bind(first.event_id)
        .execute(&pool)
        .await
        .unwrap();
    let (created_at,): (chrono::DateTime<chrono::Utc>,) =
        sqlx::query_as("SELECT created_at FROM outbox_event WHERE event_id = $1")
            .bind(first.event_id)
            .fetch_one(&pool)
            .await
            .unwrap();

    assert!(matches!(
        Relay::builder(pool.clone(), client_config(&brokers()))
            .cloudevents(CloudEvents::binary().source(""))
            .build(),
        Err(txoutbox_runtime::relay::BuildError::CloudEvents(_))
    ));
    let relay = Relay::builder(pool.clone(), client_config(&brokers()))
        .cloudevents(
            CloudEvents::binary()
                .source("https://shipping.example.com")
                .dataschema_base("https://schemas.example.com/"),
        )
        .spawn()
        .unwrap();
    let ids = [first.event_id, second.event_id];
    let ours = |m: &OwnedMessage| event_id_of(m).is_some_and(|id| ids.contains(&id));
    let read = read_until(topic, from, Duration::from_secs(30), |read| {
        read.iter().filter(|m| ours(m)).count() >= 2
    })
    .await;
    relay.shutdown().await.unwrap();
    let records: Vec<&OwnedMessage> = read.iter().filter(|m| ours(m)).collect();
    // Next to the framework's own headers, which stay.
    assert_eq!(
        header(records[0], "event_id"),
        Some(first.event_id.to_string())
    );

    let answer =
        sdk(&json!({ "read": records.iter().map(|m| as_sdk_record(m)).collect::<Vec<_>>() }));
    let event = &answer[0];
    assert_eq!(event["specversion"], "1.0");
    assert_eq!(event["id"], first.event_id.to_string());
    assert_eq!(event["source"], "https://shipping.example.com");
    assert_eq!(event["type"], "CeShipped");
    assert_eq!(event["subject"], first.order_id.to_string());
    assert_eq!(event["datacontenttype"], "application/json");
    assert_eq!(
        event["dataschema"],
        "https://schemas.example.com/cloudevents-test.shipments/CeShipped.json"
    );
    assert_eq!(event["partitionkey"], first.order_id.to_string());
    assert_eq!(event["traceparent"], TRACEPARENT);
    let time = chrono::DateTime::parse_from_rfc3339(event["time"].as_str().unwrap()).unwrap();
    assert_eq!(time, created_at, "the recording time, to the microsecond");
    // The value is the event's JSON object, unchanged.
    assert_eq!(event["data"]["amount"], 7);
    assert_eq!(event["data"]["event_id"], first.event_id.to_string());
    assert_eq!(event["data"]["event_type"], "CeShipped");
    assert_eq!(answer[1]["id"], second.event_id.to_string());
    assert_eq!(answer[1]["traceparent"], Value::Null);
}

#[sqlx::test(migrations = false)]
async fn records_without_the_frameworks_headers_are_still_ours_to_consume(pool: PgPool) {
    prepare_db(&pool).await;
    let topic = CeShipped::TOPIC;
    create_topic(topic, 1).await;
    let from = high_watermarks(topic, 1).await[0];
    let group = unique_group("ce-only");
    start_group_at(&group, topic, 1, true).await;
    let event = CeShipped::new(9);
    let mut events = Events::new();
    events.record(event.clone());
    let mut conn = pool.acquire().await.unwrap();
    txoutbox_core::insert_events(&mut conn, &events)
        .await
        .unwrap();
    drop(conn);
    let relay = Relay::builder(pool.clone(), client_config(&brokers()))
        .cloudevents(CloudEvents::binary().without_framework_headers())
        .spawn()
        .unwrap();
    let read = read_until(topic, from, Duration::from_secs(30), |read| {
        read.iter().any(|m| event_id_of(m) == Some(event.event_id))
    })
    .await;
    let record = read
        .iter()
        .find(|m| event_id_of(m) == Some(event.event_id))
        .unwrap();
    assert_eq!(header(record, "event_id"), None);
    assert_eq!(header(record, "event_type"), None);
    let database: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        header(record, "ce_source"),
        Some(format!("/txoutbox/{database}")),
        "the default source names the service's database"
    );
    let consumer = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_shipped)
        .spawn()
        .unwrap();
    eventually("the event applied", Duration::from_secs(30), || async {
        effects_of(&pool, &[event.event_id]).await.len() == 1
    })
    .await;
    consumer.shutdown().await.unwrap();
    relay.shutdown().await.unwrap();
    assert_eq!(
        effects_of(&pool, &[event.event_id]).await,
        [(event.event_id, 9, "CeShipped".to_owned())]
    );
}

#[event_handler]
async fn on_created(
    tx: &mut Transaction<'_, Postgres>,
    event: CeCreated,
    meta: &EventMeta,
) -> Result<(), sqlx::Error> {
    record_effect(tx, event.event_id, event.amount, &meta.event_type).await
}

#[event_handler]
async fn on_cancelled(
    tx: &mut Transaction<'_, Postgres>,
    event: CeCancelled,
    meta: &EventMeta,
) -> Result<(), sqlx::Error> {
    record_effect(tx, event.event_id, event.amount, &meta.event_type).await
}

#[event_handler]
async fn on_shipped(
    tx: &mut Transaction<'_, Postgres>,
    event: CeShipped,
    meta: &EventMeta,
) -> Result<(), sqlx::Error> {
    record_effect(tx, event.event_id, event.amount, &meta.event_type).await
}

#[sqlx::test(migrations = false)]
async fn cloudevents_built_by_the_official_sdk_are_consumed_in_both_modes(pool: PgPool) {
    prepare_db(&pool).await;
    let topic = CeCreated::TOPIC;
    create_topic(topic, 1).await;
    let producer = producer();
    for mode in [Mode::Dedup, Mode::Inbox] {
        let group = unique_group("cloudevents");
        start_group_at(&group, topic, 1, true).await;
        let (binary_id, structured_id) = (Uuid::new_v4(), Uuid::new_v4());
        let order = Uuid::new_v4();
        // Two types on one topic, so the type must come from the event;
        // the data has no event id: it is the CloudEvent's `id`.
        let built = sdk(&json!({ "write": [
            {
                "mode": "binary",
                "attributes": {
                    "id": binary_id, "type": "CeCreated", "source": "/python",
                    "datacontenttype": "application/json", "partitionkey": order,
                    "traceparent": TRACEPARENT,
                },
                "data": { "order_id": order, "amount": 1 },
            },
            {
                "mode": "structured",
                "attributes": {
                    "id": structured_id, "type": "CeCancelled", "source": "/python",
                    "datacontenttype": "application/json", "partitionkey": order,
                },
                "data": { "order_id": order, "amount": 2 },
            },
        ]}));
        assert_eq!(
            built[1]["headers"],
            json!([["content-type", "application/cloudevents+json"]])
        );
        for record in built.as_array().unwrap() {
            let headers: Vec<(String, String)> = record["headers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|h| {
                    (
                        h[0].as_str().unwrap().to_owned(),
                        h[1].as_str().unwrap().to_owned(),
                    )
                })
                .collect();
            let headers: Vec<(&str, &str)> = headers
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .collect();
            produce(
                &producer,
                topic,
                record["key"].as_str(),
                record["value"].as_str().unwrap().as_bytes(),
                &headers,
            )
            .await;
        }
        let consumer = Consumer::builder(pool.clone(), kafka_config(), &group)
            .mode(mode)
            .handler(on_created)
            .handler(on_cancelled)
            .spawn()
            .unwrap();
        let ids = [binary_id, structured_id];
        eventually(
            &format!("{mode:?}: both applied"),
            Duration::from_secs(30),
            || async { effects_of(&pool, &ids).await.len() == 2 },
        )
        .await;
        consumer.shutdown().await.unwrap();
        assert_eq!(
            effects_of(&pool, &ids).await,
            [
                (binary_id, 1, "CeCreated".to_owned()),
                (structured_id, 2, "CeCancelled".to_owned()),
            ],
            "{mode:?}"
        );
    }
}
