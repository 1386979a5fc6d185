//! A relay or consumer task that ends on its own is reported by its handle
//! (issue 12, item 2): `stopped()` resolves with `Stopped::Failed` and the
//! reason, `is_running()` turns false, and `outbox_tasks_failed_total` counts
//! it. The failure is a panic outside any handler, caused here by a faulty
//! metrics recorder (a real way for a library's own code to panic: a
//! recorder is user code the framework calls).
//!
//! The recorder is global to the process, so this binary holds one test.
#![allow(missing_docs)]

mod consumer_support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use consumer_support::*;
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, Key, KeyName, Metadata, Recorder, SharedString,
    Unit,
};
use sqlx::{PgPool, Postgres, Transaction};
use txoutbox_core::DomainEvent;
use txoutbox_runtime::consumer::{Consumer, Mode, event_handler, telemetry as consumer_telemetry};
use txoutbox_runtime::lifecycle::{Stopped, TASKS_FAILED};
use txoutbox_runtime::relay::{Relay, telemetry};

/// Counts counters by `name{labels}`; panics when a metric named in
/// `poisoned` is touched while `armed`.
#[derive(Clone, Default)]
struct Faulty {
    counters: Arc<Mutex<HashMap<String, Arc<Count>>>>,
    armed: Arc<AtomicBool>,
}

const POISONED: [&str; 2] = [consumer_telemetry::HANDLED, telemetry::LANES_OWNED];

struct Count {
    value: AtomicU64,
    poisoned: bool,
    armed: Arc<AtomicBool>,
}

impl Count {
    fn touch(&self) {
        assert!(
            !(self.poisoned && self.armed.load(Ordering::SeqCst)),
            "the metrics recorder is broken"
        );
    }
}

impl CounterFn for Count {
    fn increment(&self, value: u64) {
        self.touch();
        self.value.fetch_add(value, Ordering::SeqCst);
    }
    fn absolute(&self, value: u64) {
        self.touch();
        self.value.store(value, Ordering::SeqCst);
    }
}

impl GaugeFn for Count {
    fn increment(&self, _: f64) {
        self.touch();
    }
    fn decrement(&self, _: f64) {
        self.touch();
    }
    fn set(&self, _: f64) {
        self.touch();
    }
}

impl Faulty {
    fn entry(&self, key: &Key) -> Arc<Count> {
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        self.counters
            .lock()
            .unwrap()
            .entry(name)
            .or_insert_with(|| {
                Arc::new(Count {
                    value: AtomicU64::new(0),
                    poisoned: POISONED.contains(&key.name()),
                    armed: self.armed.clone(),
                })
            })
            .clone()
    }

    fn failures(&self, labels: &str) -> u64 {
        self.counters
            .lock()
            .unwrap()
            .get(&format!("{TASKS_FAILED}{{{labels}}}"))
            .map_or(0, |c| c.value.load(Ordering::SeqCst))
    }
}

impl Recorder for Faulty {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.entry(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.entry(key))
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

test_event!(Doomed, "consumer-test.task-failure", "Doomed");

#[event_handler]
async fn on_doomed(tx: &mut Transaction<'_, Postgres>, event: Doomed) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO effect (event_id, amount) VALUES ($1, $2)")
        .bind(event.event_id)
        .bind(event.amount)
        .execute(&mut **tx)
        .await
        .map(drop)
}

#[sqlx::test(migrations = false)]
async fn a_task_that_ends_on_its_own_is_reported_by_its_handle(pool: PgPool) {
    let faulty = Faulty::default();
    metrics::set_global_recorder(faulty.clone()).expect("the only recorder of this binary");
    prepare_db(&pool).await;
    create_topic(Doomed::TOPIC, 1).await;
    let group = unique_group("task-failure");
    start_group_at(&group, Doomed::TOPIC, 1, true).await;

    let consumer = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_doomed)
        .mode(Mode::Inbox)
        // The processor, not the receiving loop, handles the event and dies.
        .handle_on_receipt(false)
        .processors(2)
        .processor_poll_interval(Duration::from_millis(20))
        .build()
        .unwrap()
        .spawn();
    let relay = Relay::builder(pool.clone(), kafka_config())
        .poll_interval(Duration::from_millis(50))
        .rebalance_interval(Duration::from_millis(100))
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(consumer.is_running() && relay.is_running());

    // From now on the processor's "handled" counter and the relay's lanes
    // gauge panic: both tasks die outside any handler.
    faulty.armed.store(true, Ordering::SeqCst);
    let doomed = Doomed::new(1);
    produce_event(&producer(), &doomed).await;
    let consumer_stopped = tokio::time::timeout(Duration::from_secs(30), consumer.stopped())
        .await
        .expect("the consumer's end is reported");
    let relay_stopped = tokio::time::timeout(Duration::from_secs(30), relay.stopped())
        .await
        .expect("the relay's end is reported");
    faulty.armed.store(false, Ordering::SeqCst);

    let Stopped::Failed(reason) = &consumer_stopped else {
        panic!("consumer: {consumer_stopped:?}");
    };
    assert!(
        reason.contains("inbox processor") && reason.contains("the metrics recorder is broken"),
        "{reason}"
    );
    let Stopped::Failed(reason) = &relay_stopped else {
        panic!("relay: {relay_stopped:?}");
    };
    assert!(
        reason.contains("panicked") && reason.contains("the metrics recorder is broken"),
        "{reason}"
    );
    assert!(!consumer.is_running() && !relay.is_running());
    assert_eq!(
        faulty.failures(&format!("group={group},task=inbox_processor")),
        1
    );
    assert_eq!(faulty.failures(&format!("group={group},task=consumer")), 1);
    assert_eq!(faulty.failures("task=relay"), 1);
    // The event was handled (the panic came after the commit).
    let handled: i64 = sqlx::query_scalar("SELECT count(*) FROM effect WHERE event_id = $1")
        .bind(doomed.event_id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(handled, 1);
    assert!(
        consumer.shutdown().await.is_err(),
        "shutting down a failed consumer returns its error"
    );
    let relay_error = relay.shutdown().await.unwrap_err();
    assert!(
        relay_error
            .to_string()
            .contains("the metrics recorder is broken"),
        "shutting down a failed relay returns its error, as a consumer's handle does: {relay_error}"
    );
}
