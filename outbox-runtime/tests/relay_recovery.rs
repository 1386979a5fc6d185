//! Recovery without a restart: the idempotent producer's fatal error (injected
//! through librdkafka's mock cluster) and the database dropping the relay's
//! connections.

mod relay_support;

use std::time::Duration;

use rdkafka::mocking::MockCluster;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use relay_support::*;
use sqlx::PgPool;
use txoutbox_core::Backoff;
use txoutbox_runtime::relay::Relay;

#[sqlx::test(migrations = false)]
async fn a_fatal_producer_error_rebuilds_the_producer(pool: PgPool) {
    migrated(&pool).await;
    let cluster = MockCluster::new(1).unwrap();
    let topic = "fatal";
    cluster.create_topic(topic, 1, 1).unwrap();
    // With the gapless guarantee, a sequence error is fatal for the idempotent producer.
    cluster.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER; 3],
    );
    let mut kafka = kafka_config(&cluster.bootstrap_servers());
    kafka.set("enable.gapless.guarantee", "true");
    let relay = Relay::builder(pool.clone(), kafka)
        .delivery_timeout(Duration::from_secs(3))
        .error_backoff(Backoff::new(
            Duration::from_millis(100),
            Duration::from_millis(300),
        ))
        .spawn()
        .unwrap();
    insert(
        &pool,
        &(0..200)
            .map(|i| NewEvent::new(topic, "k", i))
            .collect::<Vec<_>>(),
    )
    .await;
    all_published(&pool, Duration::from_secs(20)).await;
    let summary = relay.shutdown().await.unwrap();
    assert!(
        summary.producer_rebuilds >= 1,
        "the fatal error was met and cured"
    );
    assert!(summary.clean);
}

#[sqlx::test(migrations = false)]
async fn the_relay_reconnects_after_the_database_dropped_it(pool: PgPool) {
    migrated(&pool).await;
    let brokers = brokers();
    let topic = unique_topic("db");
    create_topic(&brokers, &topic, 1).await;
    let relay = Relay::builder(pool.clone(), kafka_config(&brokers))
        .error_backoff(Backoff::new(
            Duration::from_millis(100),
            Duration::from_millis(300),
        ))
        .rebalance_interval(Duration::from_millis(200))
        .spawn()
        .unwrap();
    insert(
        &pool,
        &(0..100)
            .map(|i| NewEvent::new(&topic, "k", i))
            .collect::<Vec<_>>(),
    )
    .await;
    all_published(&pool, Duration::from_secs(10)).await;

    // Every other session of this test database dies, the relay's lane
    // connection among them (its advisory locks go with it). The call is in
    // the select list, which runs only for the rows the filter kept: in the
    // filter, PostgreSQL may call it before testing the database, and it
    // killed the sessions of the test running beside this one (and tried
    // the server's own processes).
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(killed >= 1);
    // The test's pool held killed connections too: write through a new one.
    let writer = PgPool::connect_with((*pool.connect_options()).clone())
        .await
        .unwrap();
    insert(
        &writer,
        &(100..300)
            .map(|i| NewEvent::new(&topic, "k", i))
            .collect::<Vec<_>>(),
    )
    .await;
    all_published(&writer, Duration::from_secs(15)).await;
    let summary = relay.shutdown().await.unwrap();
    assert_eq!(summary.published, 300);
    let received = read_topic(&brokers, &topic, 300, Duration::from_secs(15)).await;
    let seqs: Vec<i64> = received
        .iter()
        .map(|r| r.value["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, (0..300).collect::<Vec<_>>(), "in order, each once");
}
