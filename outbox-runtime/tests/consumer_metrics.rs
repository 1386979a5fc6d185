//! The consumer records the documented metrics: consumed, handled, duplicates,
//! dead-lettered, unknown skipped, and the lag gauge.
#![allow(missing_docs)]

mod consumer_support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use consumer_support::*;
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use sqlx::{PgPool, Postgres, Transaction};
use txoutbox_core::DomainEvent;
use txoutbox_runtime::consumer::{Consumer, event_handler, telemetry as m};

/// Keeps every counter and gauge, keyed by name and sorted labels.
#[derive(Default, Clone)]
struct Recorded(Arc<Mutex<HashMap<String, Arc<AtomicU64>>>>);

impl Recorded {
    fn slot(&self, key: &Key) -> Arc<AtomicU64> {
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        self.0.lock().unwrap().entry(name).or_default().clone()
    }

    /// Sum of the counters named `name` whose labels include all of `labels`.
    fn counter(&self, name: &str, labels: &[&str]) -> u64 {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(k, _)| {
                k.starts_with(&format!("{name}{{")) && labels.iter().all(|l| k.contains(l))
            })
            .map(|(_, v)| v.load(Ordering::SeqCst))
            .sum()
    }

    fn has(&self, name: &str, labels: &[&str]) -> bool {
        self.0
            .lock()
            .unwrap()
            .keys()
            .any(|k| k.starts_with(&format!("{name}{{")) && labels.iter().all(|l| k.contains(l)))
    }
}

impl Recorder for Recorded {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.slot(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.slot(key))
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

test_event!(MeteredPaid, "consumer-test.metrics.paid", "MeteredPaid");

#[event_handler]
async fn on_metered_paid(
    _tx: &mut Transaction<'_, Postgres>,
    _event: MeteredPaid,
) -> Result<(), sqlx::Error> {
    Ok(())
}

#[sqlx::test(migrations = false)]
async fn the_documented_metrics_are_recorded(pool: PgPool) {
    let recorded = Recorded::default();
    metrics::set_global_recorder(recorded.clone()).expect("the only recorder of this binary");
    prepare_db(&pool).await;
    create_topic(MeteredPaid::TOPIC, 1).await;
    let group = unique_group("metrics");
    start_group_at(&group, MeteredPaid::TOPIC, 1, true).await;
    let producer = producer();
    let event = MeteredPaid::new(1);
    produce_event(&producer, &event).await;
    produce_event(&producer, &event).await;
    produce(&producer, MeteredPaid::TOPIC, None, b"garbage", &[]).await;
    let unknown = format!(r#"{{"event_id":"{}"}}"#, uuid::Uuid::new_v4());
    produce(
        &producer,
        MeteredPaid::TOPIC,
        None,
        unknown.as_bytes(),
        &[("event_type", "Other")],
    )
    .await;
    let end = high_watermarks(MeteredPaid::TOPIC, 1).await;
    let mut kafka = kafka_config();
    kafka.set("statistics.interval.ms", "200");
    let running = Consumer::builder(pool.clone(), kafka, &group)
        .handler(on_metered_paid)
        .build()
        .unwrap()
        .spawn();
    let g = format!("group={group}");
    eventually(
        "all consumed and the lag reported",
        Duration::from_secs(20),
        || async {
            committed(&group, MeteredPaid::TOPIC, 1).await == end && recorded.has(m::LAG, &[&g])
        },
    )
    .await;
    running.shutdown().await.unwrap();

    assert_eq!(recorded.counter(m::CONSUMED, &[&g]), 4);
    assert_eq!(recorded.counter(m::HANDLED, &[&g]), 1);
    assert_eq!(recorded.counter(m::DUPLICATES, &[&g]), 1);
    assert_eq!(
        recorded.counter(m::DEAD_LETTERED, &[&g, "reason=not_json"]),
        1
    );
    assert_eq!(recorded.counter(m::UNKNOWN_SKIPPED, &[&g]), 1);
    assert_eq!(recorded.counter(m::HANDLER_ERRORS, &[&g]), 0);
}
