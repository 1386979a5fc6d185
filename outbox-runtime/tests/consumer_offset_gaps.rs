//! `refetch_offset_gaps`: a partition whose offsets jump is read again from
//! the first missing offset once, then the gap is accepted. Driven by real
//! gaps on the real broker: a transactional producer leaves a commit marker
//! after each transaction, an offset consumers never see. (librdkafka's mock
//! cluster writes no markers.) Every event is handled once, in order, and the
//! re-reads do not loop.
#![allow(missing_docs)]

mod consumer_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use consumer_support::*;
use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, Producer};
use sqlx::{PgPool, Postgres, Transaction};
use txoutbox_core::DomainEvent;
use txoutbox_runtime::consumer::{Consumer, event_handler};

test_event!(GapPaid, "consumer-test.gaps.paid", "GapPaid");

/// Counts `outbox_consumer_offset_gaps_total` (the only recorder of this binary).
#[derive(Clone, Default)]
struct GapCounter(Arc<AtomicU64>);

impl metrics::Recorder for GapCounter {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        if key.name() == txoutbox_runtime::consumer::telemetry::OFFSET_GAPS {
            metrics::Counter::from_arc(self.0.clone())
        } else {
            metrics::Counter::noop()
        }
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

#[event_handler]
async fn on_gap_paid(
    tx: &mut Transaction<'_, Postgres>,
    event: GapPaid,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO effect (event_id, amount) VALUES ($1, $2)")
        .bind(event.event_id)
        .bind(event.amount)
        .execute(&mut **tx)
        .await
        .map(drop)
}

#[sqlx::test(migrations = false)]
async fn gaps_are_read_again_once_and_nothing_is_lost_or_doubled(pool: PgPool) {
    let gaps = GapCounter::default();
    metrics::set_global_recorder(gaps.clone()).unwrap();
    prepare_db(&pool).await;
    let bootstrap = brokers();
    let topic_name = GapPaid::TOPIC;
    create_topic(topic_name, 1).await;
    let group = unique_group("gaps");
    start_group_at(&group, topic_name, 1, true).await;

    // 6 transactions of 5 events: offsets 0-4, marker 5, 6-10, marker 11, ...
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set(
            "transactional.id",
            format!("gap-test-{}", uuid::Uuid::new_v4()),
        )
        .create()
        .unwrap();
    producer.init_transactions(Duration::from_secs(10)).unwrap();
    for transaction in 0..6 {
        producer.begin_transaction().unwrap();
        for i in 0..5 {
            let mut event = GapPaid::new(transaction * 5 + i);
            event.order_id = uuid::Uuid::nil(); // one key: one partition, one order
            produce_event(&producer, &event).await;
        }
        producer
            .commit_transaction(Duration::from_secs(10))
            .unwrap();
    }

    drop(producer);
    let mut kafka = kafka_config();
    kafka.set("isolation.level", "read_committed");
    let running = Consumer::builder(pool.clone(), kafka, &group)
        .handler(on_gap_paid)
        .refetch_offset_gaps(true)
        .build()
        .unwrap()
        .spawn();
    eventually("every event handled", Duration::from_secs(30), || async {
        count(&pool, "SELECT count(*) FROM effect").await == 30
    })
    .await;
    // Time for a looping re-read to show up as extra effects or a stall.
    tokio::time::sleep(Duration::from_millis(500)).await;
    running.shutdown().await.unwrap();

    let amounts: Vec<i64> = sqlx::query_scalar("SELECT amount FROM effect ORDER BY at, amount")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(amounts, (0..30).collect::<Vec<_>>(), "once each, in order");
    // Five markers between the transactions: each gap seen twice (the first
    // time it is read again, the second time accepted).
    assert_eq!(gaps.0.load(Ordering::SeqCst), 10);
}
