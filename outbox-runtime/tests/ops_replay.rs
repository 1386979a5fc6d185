//! Replay against real PostgreSQL and the real broker at KAFKA_BROKERS_TEST:
//! exactly the selected events arrive again, with their key, value and
//! headers; failures and the rate limit are recorded and honoured.

mod ops_support;

use std::time::{Duration, Instant};

use chrono::{TimeDelta, Utc};
use ops_support::{OutboxRow, brokers, new_topic, read_back};
use rdkafka::ClientConfig;
use sqlx::PgPool;
use txoutbox_runtime::ops::OpsError;
use txoutbox_runtime::ops::replay::{self, HEADER_REPLAY, Replay, ReplayFilter};

#[sqlx::test(migrations = false)]
async fn replay_of_a_filtered_range_delivers_exactly_the_selected_events(pool: PgPool) {
    txoutbox_runtime::migrations::run(&pool).await.unwrap();
    let topic: &'static str = Box::leak(new_topic().await.into_boxed_str());
    let row = |created_min: i64, event_type: &'static str, aggregate: &str, published: bool| {
        let mut row = OutboxRow::new(topic);
        row.created_ago = created_min * 60;
        row.published_ago = published.then_some(created_min * 60 - 5);
        row.event_type = event_type;
        row.aggregate_id = aggregate.into();
        row
    };
    row(60, "OrderCreated", "0", true).insert(&pool).await; // before the range
    let mut traced = row(40, "OrderCreated", "1", true);
    traced.traceparent = Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
    let (_, e1) = traced.insert(&pool).await;
    row(30, "OrderPaid", "1", true).insert(&pool).await; // other type
    let (_, e2) = row(30, "OrderCreated", "2", true).insert(&pool).await;
    row(20, "OrderCreated", "9", false).insert(&pool).await; // unpublished
    let (_, e3) = row(20, "OrderCreated", "3", true).insert(&pool).await;
    row(5, "OrderCreated", "4", true).insert(&pool).await; // after the range
    let mut elsewhere = OutboxRow::new("cli-replay-other-topic").published(1_800, 1_700);
    elsewhere.event_type = "OrderCreated";
    elsewhere.insert(&pool).await;
    let before: Vec<(i64, Option<chrono::DateTime<Utc>>)> =
        sqlx::query_as("SELECT id, published_at FROM outbox_event ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();

    let now = Utc::now();
    let filter = ReplayFilter {
        from: Some(now - TimeDelta::minutes(50)),
        to: Some(now - TimeDelta::minutes(10)),
        topic: Some(topic.to_owned()),
        event_type: Some("OrderCreated".into()),
        ..Default::default()
    };
    assert_eq!(replay::count(&pool, &filter).await.unwrap(), 3);
    let producer = producer();
    let mut progress = Vec::new();
    let report = Replay::new(filter.clone())
        .batch_size(2)
        .run(&pool, &producer, |n| progress.push(n))
        .await
        .unwrap();
    assert_eq!((report.selected, report.published), (3, 3));
    assert_eq!(progress, [2, 1], "pipelined in batches of two");

    let received = read_back(topic).await;
    assert_eq!(received.len(), 3);
    // The value is byte for byte what the relay sends: the row's jsonb as text.
    let stored: Vec<(uuid::Uuid, String, String)> = sqlx::query_as(
        "SELECT event_id, partition_key, payload::text FROM outbox_event WHERE event_id = ANY($1) ORDER BY id",
    )
    .bind(vec![e1, e2, e3])
    .fetch_all(&pool)
    .await
    .unwrap();
    for (got, (event_id, key, payload)) in received.iter().zip(&stored) {
        assert_eq!(&got.key, key);
        assert_eq!(&got.payload, payload);
        let h = &got.headers;
        assert_eq!(h["event_id"], event_id.to_string());
        assert_eq!(h["event_type"], "OrderCreated");
        assert_eq!(h["aggregate_type"], "Order");
        assert_eq!(h["aggregate_id"], *key);
        assert_eq!(h["content-type"], "application/json");
        assert_eq!(h[HEADER_REPLAY], report.run_id.to_string());
    }
    assert_eq!(
        received[0].headers.get("traceparent").map(String::as_str),
        traced.traceparent
    );
    assert!(!received[1].headers.contains_key("traceparent"));

    // The audit trail: outbox rows untouched, the run recorded.
    let after: Vec<(i64, Option<chrono::DateTime<Utc>>)> =
        sqlx::query_as("SELECT id, published_at FROM outbox_event ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(before, after);
    let (filter_json, selected, published, finished, error): (
        serde_json::Value,
        i64,
        i64,
        bool,
        Option<String>,
    ) = sqlx::query_as(
        "SELECT filter, selected, published, finished_at IS NOT NULL, error
         FROM outbox_replay_run WHERE id = $1",
    )
    .bind(report.run_id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((selected, published, finished, error), (3, 3, true, None));
    assert_eq!(filter_json["topic"], topic);
    assert_eq!(filter_json["event_type"], "OrderCreated");
    assert!(filter_json.get("aggregate_id").is_none());
}

#[sqlx::test(migrations = false)]
async fn replay_honours_the_rate_and_the_target_topic(pool: PgPool) {
    txoutbox_runtime::migrations::run(&pool).await.unwrap();
    let target = new_topic().await;
    for i in 0..15 {
        let mut row = OutboxRow::new("cli-replay-source").published(60, 30);
        row.aggregate_id = i.to_string();
        row.insert(&pool).await;
    }
    let filter = ReplayFilter {
        topic: Some("cli-replay-source".into()),
        ..Default::default()
    };
    let producer = producer();
    let started = Instant::now();
    let report = Replay::new(filter)
        .target_topic(target.clone())
        .rate(10.0)
        .run(&pool, &producer, |_| {})
        .await
        .unwrap();
    let elapsed = started.elapsed();
    assert_eq!(report.published, 15);
    // 10 events go at once, the next 5 only after the first second.
    assert!(elapsed >= Duration::from_millis(950), "took {elapsed:?}");
    let received = read_back(&target).await;
    let keys: Vec<_> = received.iter().map(|r| r.key.as_str()).collect();
    let expected: Vec<String> = (0..15).map(|i| i.to_string()).collect();
    assert_eq!(keys, expected, "id order");
}

#[sqlx::test(migrations = false)]
async fn a_failed_replay_is_recorded_with_its_error(pool: PgPool) {
    txoutbox_runtime::migrations::run(&pool).await.unwrap();
    OutboxRow::new("cli-replay-unreachable")
        .published(60, 30)
        .insert(&pool)
        .await;
    // Nothing listens on port 1: the delivery times out quickly.
    let producer = ClientConfig::new()
        .set("bootstrap.servers", "127.0.0.1:1")
        .set("enable.idempotence", "true")
        .set("message.timeout.ms", "1500")
        .create()
        .unwrap();
    let filter = ReplayFilter {
        topic: Some("cli-replay-unreachable".into()),
        ..Default::default()
    };
    let error = Replay::new(filter)
        .run(&pool, &producer, |_| {})
        .await
        .unwrap_err();
    let OpsError::ReplayFailed {
        run_id, published, ..
    } = &error
    else {
        panic!("unexpected error {error}");
    };
    assert_eq!(*published, 0);
    let (finished, recorded): (bool, Option<String>) = sqlx::query_as(
        "SELECT finished_at IS NOT NULL, error FROM outbox_replay_run WHERE id = $1",
    )
    .bind(run_id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(finished);
    assert!(recorded.unwrap().contains("kafka"), "{error}");
}

/// An idempotent producer, as `outbox replay` makes one.
fn producer() -> rdkafka::producer::FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .create()
        .unwrap()
}
