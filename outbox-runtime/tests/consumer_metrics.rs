//! The consumer records the documented metrics: consumed, handled, duplicates,
//! dead-lettered, unknown skipped, the lag gauge, and the saga metrics.
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
use txoutbox_runtime::saga::{SagaContext, saga, telemetry as s};

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

    /// The value of the gauge named `name` whose labels include all of
    /// `labels` (a gauge keeps its `f64` as bits).
    fn gauge(&self, name: &str, labels: &[&str]) -> Option<f64> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .find(|(k, _)| {
                k.starts_with(&format!("{name}{{")) && labels.iter().all(|l| k.contains(l))
            })
            .map(|(_, v)| f64::from_bits(v.load(Ordering::SeqCst)))
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

test_event!(MeteredOpened, "consumer-test.metrics.saga", "MeteredOpened");
test_event!(MeteredFailed, "consumer-test.metrics.saga", "MeteredFailed");
test_event!(MeteredUndo, "consumer-test.metrics.undo", "MeteredUndo");

/// A saga that registers one compensation when it starts and compensates on
/// `MeteredFailed`.
#[derive(serde::Serialize, serde::Deserialize)]
struct Metered {
    order_id: uuid::Uuid,
}

#[saga(id = uuid::Uuid, correlate = order_id, starts_with(MeteredOpened), handles(MeteredFailed))]
impl Metered {
    async fn on_opened(event: MeteredOpened, ctx: &mut SagaContext<'_>) -> Result<Self, String> {
        ctx.on_compensate(MeteredUndo {
            event_id: uuid::Uuid::new_v4(),
            order_id: event.order_id,
            amount: event.amount,
        });
        Ok(Self {
            order_id: event.order_id,
        })
    }

    async fn on_failed(
        &mut self,
        _event: MeteredFailed,
        ctx: &mut SagaContext<'_>,
    ) -> Result<(), String> {
        ctx.compensate();
        Ok(())
    }
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
    // Sagas: one compensated (a late failure of it is ignored), one left
    // open, and a failure of a saga that never started.
    create_topic(MeteredOpened::TOPIC, 1).await;
    start_group_at(&group, MeteredOpened::TOPIC, 1, true).await;
    let (ended, open) = (MeteredOpened::new(1), MeteredOpened::new(2));
    let fail = |order_id| MeteredFailed {
        event_id: uuid::Uuid::new_v4(),
        order_id,
        amount: 0,
    };
    for message in [&ended, &open] {
        produce_event(&producer, message).await;
    }
    produce_event(&producer, &fail(ended.order_id)).await;
    produce_event(&producer, &fail(ended.order_id)).await;
    let saga_end = high_watermarks(MeteredOpened::TOPIC, 1).await;
    let mut kafka = kafka_config();
    kafka.set("statistics.interval.ms", "200");
    let running = Consumer::builder(pool.clone(), kafka, &group)
        .handler(on_metered_paid)
        .saga::<Metered>()
        .backlog_interval(Duration::from_millis(200))
        .build()
        .unwrap()
        .spawn();
    let g = format!("group={group}");
    eventually(
        "all consumed and the lag reported",
        Duration::from_secs(20),
        || async {
            committed(&group, MeteredPaid::TOPIC, 1).await == end
                && committed(&group, MeteredOpened::TOPIC, 1).await == saga_end
                && recorded.has(m::LAG, &[&g])
        },
    )
    .await;
    // The failure of a saga that never started, alone in its batch (its
    // failed attempts roll back the rest of their batch, whose saga steps
    // would be counted again when retried): retried, then ignored.
    produce_event(&producer, &fail(uuid::Uuid::new_v4())).await;
    let saga_end = high_watermarks(MeteredOpened::TOPIC, 1).await;
    eventually(
        "the stray failure consumed",
        Duration::from_secs(20),
        || async { committed(&group, MeteredOpened::TOPIC, 1).await == saga_end },
    )
    .await;
    let saga = "saga=metered";
    eventually("the open-saga gauge", Duration::from_secs(10), || async {
        recorded.gauge(s::OPEN, &[saga]) == Some(1.0)
    })
    .await;
    running.shutdown().await.unwrap();

    assert_eq!(recorded.counter(s::STARTED, &[saga]), 2);
    assert_eq!(recorded.counter(s::STEPS, &[saga]), 3);
    assert_eq!(
        recorded.counter(s::STEPS, &[saga, "message=MeteredFailed"]),
        1
    );
    assert_eq!(
        recorded.counter(s::FINISHED, &[saga, "outcome=compensated"]),
        1
    );
    assert_eq!(recorded.counter(s::COMPENSATIONS, &[saga]), 1);
    assert_eq!(recorded.counter(s::IGNORED, &[saga, "reason=finished"]), 1);
    assert_eq!(
        recorded.counter(s::IGNORED, &[saga, "reason=unknown_saga"]),
        1
    );
    assert!(recorded.has(s::OLDEST_OPEN, &[saga]));

    assert_eq!(recorded.counter(m::CONSUMED, &[&g]), 9);
    assert_eq!(recorded.counter(m::HANDLED, &[&g]), 6);
    assert_eq!(recorded.counter(m::DUPLICATES, &[&g]), 1);
    assert_eq!(
        recorded.counter(m::DEAD_LETTERED, &[&g, "reason=not_json"]),
        1
    );
    assert_eq!(recorded.counter(m::UNKNOWN_SKIPPED, &[&g]), 1);
    // The stray failure's attempts: the batch's, the careful pass's, then
    // three retries in place; the fifth and last ignores it.
    assert_eq!(
        recorded.counter(m::HANDLER_ERRORS, &[&g, "event_type=MeteredFailed"]),
        5
    );
    assert_eq!(recorded.counter(m::HANDLER_ERRORS, &[&g]), 5);
}
