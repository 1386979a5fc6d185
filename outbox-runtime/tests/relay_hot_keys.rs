//! A few keys carrying all the traffic: the relay sends a key's later rows
//! behind its earlier ones still in flight, through the same idempotent
//! producer, and holds a key back only where order could break (the cases of
//! docs/relay.md, "Per-key order within one relay"). Faults are injected with
//! librdkafka's mock cluster; the real broker checks order end to end.

mod relay_support;

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::mocking::MockCluster;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use relay_support::*;
use sqlx::PgPool;
use txoutbox_core::Backoff;
use txoutbox_runtime::relay::Relay;

/// Every key's `seq` values in topic order (partition, offset).
fn per_key(mut received: Vec<Received>) -> HashMap<String, Vec<i64>> {
    received.sort_by_key(|r| (r.partition, r.offset));
    let mut per_key: HashMap<String, Vec<i64>> = HashMap::new();
    for record in &received {
        per_key
            .entry(record.key.clone())
            .or_default()
            .push(record.value["seq"].as_i64().unwrap());
    }
    per_key
}

/// `keys` keys with `per_key` events each, interleaved round-robin.
fn hot_events(topic: &str, keys: usize, per_key: i64) -> Vec<NewEvent> {
    (0..per_key)
        .flat_map(|seq| (0..keys).map(move |k| NewEvent::new(topic, format!("hot-{k}"), seq)))
        .collect()
}

/// Case 1, on the real broker: 1 key and 10 keys, a backlog plus events
/// written while the relay drains it, every key read back in order, once each.
#[sqlx::test(migrations = false)]
async fn hot_keys_are_published_in_order_on_the_real_broker(pool: PgPool) {
    migrated(&pool).await;
    let brokers = brokers();
    let topic = unique_topic("hot");
    create_topic(&brokers, &topic, 4).await;
    const KEYS: usize = 10;
    const PER_KEY: i64 = 600;
    // The single hottest key carries as much as the ten others together.
    let mut events = hot_events(&topic, KEYS, PER_KEY);
    for (i, event) in events.iter_mut().enumerate().filter(|(i, _)| i % 2 == 1) {
        event.key = "hottest".into();
        event.seq = (i / 2) as i64;
    }
    // Renumber the other keys' events in order.
    let mut next: HashMap<String, i64> = HashMap::new();
    for event in events.iter_mut().filter(|e| e.key != "hottest") {
        let seq = next.entry(event.key.clone()).or_default();
        event.seq = *seq;
        *seq += 1;
    }
    let (backlog, live) = events.split_at(events.len() / 2);
    insert(&pool, backlog).await;
    let relay = Relay::builder(pool.clone(), kafka_config(&brokers))
        .batch_size(200)
        .spawn()
        .unwrap();
    for chunk in live.chunks(150) {
        insert(&pool, chunk).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    all_published(&pool, Duration::from_secs(30)).await;
    let summary = relay.shutdown().await.unwrap();
    assert!(summary.clean);
    assert_eq!(summary.published as usize, events.len());
    let received = read_topic(&brokers, &topic, events.len(), Duration::from_secs(30)).await;
    assert_eq!(received.len(), events.len(), "each event once");
    let mut expected: HashMap<String, Vec<i64>> = HashMap::new();
    for event in &events {
        expected
            .entry(event.key.clone())
            .or_default()
            .push(event.seq);
    }
    assert_eq!(per_key(received), expected, "every key in order");
}

/// Case 2: a transient error on the first records of hot keys (the first
/// produce requests answered `NOT_ENOUGH_REPLICAS`) while later rows of the
/// same keys follow in flight: the producer retries in order, nothing is
/// duplicated, nothing is counted.
#[sqlx::test(migrations = false)]
async fn hot_key_survives_a_transient_error_on_its_first_record(pool: PgPool) {
    migrated(&pool).await;
    let cluster = MockCluster::new(1).unwrap();
    let topic = "transient";
    cluster.create_topic(topic, 2, 1).unwrap();
    cluster.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS; 4],
    );
    // Small produce requests, slow answers: later requests of the keys are
    // in flight while the first ones are answered with the error.
    cluster
        .broker_round_trip_time(1, Duration::from_millis(50))
        .unwrap();
    let mut kafka = kafka_config(&cluster.bootstrap_servers());
    kafka.set("batch.num.messages", "20").set("linger.ms", "0");
    let events = hot_events(topic, 3, 500);
    insert(&pool, &events).await;
    let relay = Relay::builder(pool.clone(), kafka)
        .batch_size(100)
        .delivery_timeout(Duration::from_secs(10))
        .spawn()
        .unwrap();
    all_published(&pool, Duration::from_secs(30)).await;
    let summary = relay.shutdown().await.unwrap();
    assert!(summary.clean);
    assert_eq!(summary.published as usize, events.len());
    let attempts: i64 = sqlx::query_scalar("SELECT coalesce(sum(attempts), 0) FROM outbox_event")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(attempts, 0, "a transient error is no attempt");
    let received = read_topic(
        &cluster.bootstrap_servers(),
        topic,
        events.len(),
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(received.len(), events.len(), "no duplicate");
    for (key, seqs) in per_key(received) {
        assert_eq!(seqs, (0..500).collect::<Vec<_>>(), "order of {key}");
    }
}

/// Case 3: a fatal producer error (a sequence error under
/// `enable.gapless.guarantee`) on the first records of hot keys, with later
/// rows of them in flight: the producer is rebuilt and no row of a key goes
/// out on the new producer before the old producer's rows of it settled. The
/// first occurrence of every event is in order; copies are allowed only of
/// what the old producer had in flight.
#[sqlx::test(migrations = false)]
async fn a_fatal_error_holds_the_key_until_the_old_producer_settled(pool: PgPool) {
    migrated(&pool).await;
    let cluster = MockCluster::new(1).unwrap();
    let topic = "fatal-hot";
    cluster.create_topic(topic, 1, 1).unwrap();
    cluster.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER; 3],
    );
    cluster
        .broker_round_trip_time(1, Duration::from_millis(50))
        .unwrap();
    let mut kafka = kafka_config(&cluster.bootstrap_servers());
    kafka
        .set("enable.gapless.guarantee", "true")
        .set("batch.num.messages", "20")
        .set("linger.ms", "0");
    let events = hot_events(topic, 2, 500);
    insert(&pool, &events).await;
    let relay = Relay::builder(pool.clone(), kafka)
        .batch_size(100)
        .delivery_timeout(Duration::from_secs(3))
        .error_backoff(Backoff::new(
            Duration::from_millis(100),
            Duration::from_millis(300),
        ))
        .spawn()
        .unwrap();
    all_published(&pool, Duration::from_secs(30)).await;
    let summary = relay.shutdown().await.unwrap();
    assert!(summary.clean);
    assert!(summary.producer_rebuilds >= 1, "the fatal error was met");
    let received = read_topic(
        &cluster.bootstrap_servers(),
        topic,
        events.len(),
        Duration::from_secs(20),
    )
    .await;
    let copies = received.len() - events.len();
    eprintln!(
        "{copies} copies, {} producer rebuilds",
        summary.producer_rebuilds
    );
    for (key, seqs) in per_key(received) {
        let mut first = Vec::new();
        for seq in seqs {
            if !first.contains(&seq) {
                first.push(seq);
            }
        }
        assert_eq!(first, (0..500).collect::<Vec<_>>(), "order of {key}");
    }
    assert!(
        copies <= 2 * 100 * 4,
        "copies only of what was in flight: {copies}"
    );
}

/// Case 4: the broker refuses the first records of hot keys for good
/// (`MSG_SIZE_TOO_LARGE`) while later rows of them are in flight. Without
/// the gap-less guarantee librdkafka writes the later records: the refused
/// events come after them (the documented order break), but only after the
/// rows that were already in flight, never after rows sent once the failure
/// was known; every event once, every other event in order.
#[sqlx::test(migrations = false)]
async fn a_refused_first_record_holds_its_key_and_breaks_order_only_behind_it(pool: PgPool) {
    migrated(&pool).await;
    let cluster = MockCluster::new(1).unwrap();
    let topic = "refused-hot";
    cluster.create_topic(topic, 1, 1).unwrap();
    cluster.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE],
    );
    const BATCH: usize = 100;
    const PER_KEY: i64 = 1_000;
    // Small produce requests, slow answers: several requests of the
    // partition are in flight when the first one is refused.
    cluster
        .broker_round_trip_time(1, Duration::from_millis(50))
        .unwrap();
    let mut kafka = kafka_config(&cluster.bootstrap_servers());
    kafka.set("batch.num.messages", "20").set("linger.ms", "0");
    let events = hot_events(topic, 2, PER_KEY);
    insert(&pool, &events).await;
    let relay = Relay::builder(pool.clone(), kafka)
        .batch_size(BATCH)
        .retry_backoff(Backoff::new(
            Duration::from_millis(200),
            Duration::from_secs(300),
        ))
        .spawn()
        .unwrap();
    all_published(&pool, Duration::from_secs(30)).await;
    let summary = relay.shutdown().await.unwrap();
    assert!(summary.clean);
    let refused: Vec<(String, i64)> = sqlx::query_as(
        "SELECT partition_key, (payload->>'seq')::bigint FROM outbox_event WHERE attempts > 0",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(!refused.is_empty(), "the refusal was met");
    let received = read_topic(
        &cluster.bootstrap_servers(),
        topic,
        events.len(),
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(received.len(), events.len(), "each event once");
    for (key, seqs) in per_key(received) {
        let refused_here: Vec<i64> = refused
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, s)| *s)
            .collect();
        let others: Vec<i64> = seqs
            .iter()
            .copied()
            .filter(|s| !refused_here.contains(s))
            .collect();
        let mut sorted = others.clone();
        sorted.sort_unstable();
        assert_eq!(
            others, sorted,
            "order of {key} apart from its refused events"
        );
        for seq in &refused_here {
            let at = seqs.iter().position(|s| s == seq).unwrap();
            let overtaken = seqs[..at].iter().filter(|s| *s > seq).count();
            eprintln!("{key}:{seq} refused, overtaken by {overtaken} events of its key");
            // The pipeline holds at most 2 full batches, or 4 small ones
            // of fewer rows than a batch in all, plus the claim being sent.
            assert!(
                overtaken <= 3 * BATCH,
                "{key}:{seq} overtaken by {overtaken} events"
            );
        }
    }
}
