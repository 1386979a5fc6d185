//! The relay drains a backlog to the real broker with the right key, value and
//! headers, loses nothing on graceful shutdown, and refuses idempotence off.

mod relay_support;

use std::collections::HashMap;
use std::time::Duration;

use relay_support::*;
use sqlx::PgPool;
use txoutbox_runtime::relay::{BuildError, Relay};

#[sqlx::test(migrations = false)]
async fn drains_a_backlog_with_key_value_and_headers(pool: PgPool) {
    migrated(&pool).await;
    let brokers = brokers();
    let topic = unique_topic("drain");
    create_topic(&brokers, &topic, 3).await;
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let events: Vec<NewEvent> = (0..2_500)
        .map(|i| NewEvent {
            traceparent: (i % 2 == 0).then(|| traceparent.to_owned()),
            ..NewEvent::new(&topic, format!("order-{}", i % 50), i)
        })
        .collect();
    let ids = insert(&pool, &events).await;

    let relay = Relay::builder(pool.clone(), kafka_config(&brokers))
        .batch_size(1000)
        .spawn()
        .unwrap();
    all_published(&pool, Duration::from_secs(20)).await;
    let summary = relay.shutdown().await.unwrap();
    assert!(summary.clean);
    assert_eq!(summary.published, 2_500);

    let received = read_topic(&brokers, &topic, events.len(), Duration::from_secs(20)).await;
    assert_eq!(received.len(), events.len(), "every event exactly once");
    let by_id: HashMap<_, _> = received.iter().map(|r| (r.event_id(), r)).collect();
    for (event, id) in events.iter().zip(&ids) {
        let got = by_id[id];
        assert_eq!(got.key, event.key);
        assert_eq!(got.value["event_id"], id.to_string());
        assert_eq!(got.value["seq"], event.seq);
        // Stored without it, the type goes out in the value too.
        assert_eq!(got.value["event_type"], "OrderCreated");
        assert_eq!(got.headers["event_type"], "OrderCreated");
        assert_eq!(got.headers["aggregate_type"], "Order");
        assert_eq!(got.headers["aggregate_id"], event.key);
        assert_eq!(got.headers["content-type"], "application/json");
        assert_eq!(
            got.headers.get("traceparent").map(String::as_str),
            event.traceparent.as_deref()
        );
    }
    let published_at_set: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_event WHERE published_at IS NOT NULL")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(published_at_set, 2_500, "rows are marked, never deleted");
}

/// Rows another writer stored: the value names the row's type when the
/// payload lacks `event_type`, keeps the payload's own when it has one, and
/// leaves a payload that is not an object alone; the rows are not changed.
#[sqlx::test(migrations = false)]
async fn the_value_names_the_event_type_whoever_wrote_the_row(pool: PgPool) {
    migrated(&pool).await;
    let brokers = brokers();
    let topic = unique_topic("value-type");
    create_topic(&brokers, &topic, 1).await;
    let payloads = [
        serde_json::json!({"event_id": "00000000-0000-0000-0000-000000000001", "n": 1}),
        serde_json::json!({"event_id": "00000000-0000-0000-0000-000000000002", "event_type": "Legacy"}),
        serde_json::json!(["not", "an", "object"]),
    ];
    for (n, payload) in payloads.iter().enumerate() {
        sqlx::query(
            "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type, payload,
                                       topic, partition_key)
             VALUES ($1, 'Order', 'k', 'OrderShipped', $2, $3, 'k')",
        )
        .bind(uuid::Uuid::from_u128(n as u128 + 1))
        .bind(payload)
        .bind(&topic)
        .execute(&pool)
        .await
        .unwrap();
    }
    let stored_before: Vec<String> =
        sqlx::query_scalar("SELECT payload::text FROM outbox_event ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let relay = Relay::builder(pool.clone(), kafka_config(&brokers))
        .spawn()
        .unwrap();
    all_published(&pool, Duration::from_secs(20)).await;
    relay.shutdown().await.unwrap();

    let mut received = read_topic(&brokers, &topic, 3, Duration::from_secs(20)).await;
    received.sort_by_key(|r| r.offset);
    let values: Vec<_> = received.iter().map(|r| r.value.clone()).collect();
    assert_eq!(
        values,
        [
            serde_json::json!({"event_id": "00000000-0000-0000-0000-000000000001", "n": 1, "event_type": "OrderShipped"}),
            payloads[1].clone(),
            payloads[2].clone(),
        ]
    );
    let stored_after: Vec<String> =
        sqlx::query_scalar("SELECT payload::text FROM outbox_event ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        stored_before, stored_after,
        "the stored rows are not changed"
    );
}

#[sqlx::test(migrations = false)]
async fn graceful_shutdown_loses_nothing(pool: PgPool) {
    migrated(&pool).await;
    let brokers = brokers();
    let topic = unique_topic("shutdown");
    create_topic(&brokers, &topic, 2).await;
    let relay = Relay::builder(pool.clone(), kafka_config(&brokers))
        .batch_size(100)
        .spawn()
        .unwrap();
    // Keep writing while the relay runs, and stop it in the middle.
    let mut written = Vec::new();
    for round in 0..20 {
        let events: Vec<NewEvent> = (0..100)
            .map(|i| NewEvent::new(&topic, format!("k{}", i % 7), round * 100 + i))
            .collect();
        written.extend(insert(&pool, &events).await);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let summary = relay.shutdown().await.unwrap();
    assert!(summary.clean);
    let marked_by_first = 2_000 - unpublished(&pool).await;
    assert_eq!(summary.published as i64, marked_by_first);

    // What the first relay marked is on the topic; the rest is published by the next.
    let relay = Relay::builder(pool.clone(), kafka_config(&brokers))
        .spawn()
        .unwrap();
    all_published(&pool, Duration::from_secs(20)).await;
    relay.shutdown().await.unwrap();
    let received = read_topic(&brokers, &topic, written.len(), Duration::from_secs(20)).await;
    let mut ids: Vec<_> = received.iter().map(Received::event_id).collect();
    ids.sort();
    written.sort();
    assert_eq!(
        ids, written,
        "each event exactly once: marked means delivered"
    );
}

#[tokio::test]
async fn a_config_disabling_idempotence_is_refused() {
    let pool = PgPool::connect_lazy("postgres://unused@127.0.0.1:1/none").unwrap();
    for (key, value) in [("enable.idempotence", "false"), ("acks", "1")] {
        let mut kafka = kafka_config(&brokers());
        kafka.set(key, value);
        let err = Relay::builder(pool.clone(), kafka).spawn().unwrap_err();
        assert!(matches!(err, BuildError::IdempotenceRequired { .. }));
        let text = err.to_string();
        assert!(
            text.contains("enable.idempotence=true and acks=all") && text.contains(key),
            "{text}"
        );
    }
}

/// builder -> build -> run(token) on the caller's task, as a consumer runs:
/// the relay drains until its token is cancelled and returns its totals.
#[sqlx::test(migrations = false)]
async fn a_built_relay_runs_on_the_callers_task_until_its_token_is_cancelled(pool: PgPool) {
    migrated(&pool).await;
    let brokers = brokers();
    let topic = unique_topic("run");
    create_topic(&brokers, &topic, 2).await;
    let events: Vec<NewEvent> = (0..300)
        .map(|i| NewEvent::new(&topic, format!("k-{}", i % 10), i))
        .collect();
    insert(&pool, &events).await;
    let relay = Relay::builder(pool.clone(), kafka_config(&brokers))
        .build()
        .unwrap();
    let token = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(relay.run(token.clone()));
    all_published(&pool, Duration::from_secs(20)).await;
    token.cancel();
    let summary = tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("the relay stops once its token is cancelled")
        .unwrap()
        .expect("a clean stop");
    assert!(summary.clean);
    assert_eq!(summary.published, 300);
}
