//! The relay records the metrics `docs/relay.md` documents, with the right
//! values: published and parked totals, errors by kind (`rejected`,
//! `broker_unavailable`, `database`), the claims by what they found, the
//! batch size and duration histograms, the backlog and oldest-age gauges and
//! the lanes owned.
//!
//! The recorder is global to the process, so this binary holds one test.
#![allow(missing_docs)]

mod relay_support;

use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::{
    Counter, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use relay_support::*;
use sqlx::PgPool;
use txoutbox_core::Backoff;
use txoutbox_runtime::relay::Relay;
use txoutbox_runtime::relay::telemetry as m;

/// Every value a gauge was set to, or a histogram recorded, in order.
#[derive(Default)]
struct Series(Mutex<Vec<f64>>);

impl Series {
    fn values(&self) -> Vec<f64> {
        self.0.lock().unwrap().clone()
    }
}

impl GaugeFn for Series {
    fn increment(&self, value: f64) {
        let mut values = self.0.lock().unwrap();
        let last = values.last().copied().unwrap_or(0.0);
        values.push(last + value);
    }
    fn decrement(&self, value: f64) {
        self.increment(-value);
    }
    fn set(&self, value: f64) {
        self.0.lock().unwrap().push(value);
    }
}

impl HistogramFn for Series {
    fn record(&self, value: f64) {
        self.0.lock().unwrap().push(value);
    }
}

/// Counters, gauges and histograms, keyed by `name{label=value,...}`.
#[derive(Default, Clone)]
struct Recorded {
    counters: Arc<Mutex<HashMap<String, Arc<AtomicU64>>>>,
    series: Arc<Mutex<HashMap<String, Arc<Series>>>>,
}

fn key_string(key: &Key) -> String {
    let mut labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    labels.sort();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

impl Recorded {
    fn series_of(&self, key: &Key) -> Arc<Series> {
        let mut series = self.series.lock().unwrap();
        series.entry(key_string(key)).or_default().clone()
    }

    fn counter(&self, name: &str) -> u64 {
        self.counters
            .lock()
            .unwrap()
            .get(name)
            .map_or(0, |c| c.load(Ordering::SeqCst))
    }

    /// The values of a gauge or histogram without labels.
    fn values(&self, name: &str) -> Vec<f64> {
        let key = format!("{name}{{}}");
        self.series
            .lock()
            .unwrap()
            .get(&key)
            .map(|s| s.values())
            .unwrap_or_default()
    }
}

impl Recorder for Recorded {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let mut counters = self.counters.lock().unwrap();
        Counter::from_arc(counters.entry(key_string(key)).or_default().clone())
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.series_of(key))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.series_of(key))
    }
}

fn errors(recorded: &Recorded, kind: &str) -> u64 {
    recorded.counter(&format!("{}{{kind={kind}}}", m::ERRORS))
}

#[sqlx::test(migrations = false)]
async fn the_documented_metrics_are_recorded_with_their_values(pool: PgPool) {
    let recorded = Recorded::default();
    metrics::set_global_recorder(recorded.clone()).expect("the only recorder of this binary");
    migrated(&pool).await;
    let brokers = brokers();
    let topic = unique_topic("metrics");
    create_topic(&brokers, &topic, 2).await;

    // 1,200 events written 90 s ago, and one poison row (over this
    // producer's size limit) on a key of its own.
    let mut events: Vec<NewEvent> = (0..1_200)
        .map(|i| NewEvent::new(&topic, format!("k{}", i % 40), i))
        .collect();
    events.push(NewEvent {
        filler: 30_000,
        ..NewEvent::new(&topic, "poison", 0)
    });
    insert(&pool, &events).await;
    sqlx::query("UPDATE outbox_event SET created_at = now() - interval '90 seconds'")
        .execute(&pool)
        .await
        .unwrap();

    let mut kafka = kafka_config(&brokers);
    kafka.set("message.max.bytes", "20000");
    let relay = Relay::builder(pool.clone(), kafka)
        .batch_size(500)
        .max_attempts(1)
        .metrics_interval(Duration::from_millis(100))
        .spawn()
        .unwrap();
    eventually(
        "published, poison parked, backlog gauge back to 0",
        Duration::from_secs(20),
        || async {
            unpublished(&pool).await == 1
                && recorded.values(m::BACKLOG).last() == Some(&0.0)
                && recorded.counter(&format!("{}{{}}", m::PARKED)) == 1
        },
    )
    .await;
    let summary = relay.shutdown().await.unwrap();
    assert_eq!((summary.published, summary.parked), (1_200, 1));

    assert_eq!(recorded.counter(&format!("{}{{}}", m::PUBLISHED)), 1_200);
    assert_eq!(recorded.counter(&format!("{}{{}}", m::PARKED)), 1);
    assert_eq!(
        errors(&recorded, "rejected"),
        1,
        "one batch held the poison"
    );
    assert_eq!(errors(&recorded, "broker_unavailable"), 0);
    assert_eq!(errors(&recorded, "database"), 0);

    let sizes = recorded.values(m::BATCH_SIZE);
    assert_eq!(sizes.len() as u64, summary.batches, "one per batch");
    // Rows held back behind a batch in flight (40 keys: every batch has all
    // of them) are claimed again, but not over and over.
    let claimed: f64 = sizes.iter().sum();
    assert!(
        (1_201.0..=2_402.0).contains(&claimed),
        "every row claimed at least once, at most twice: {claimed} in {sizes:?}"
    );
    assert!(
        sizes.iter().all(|&s| (1.0..=500.0).contains(&s)),
        "{sizes:?}"
    );
    // Every claim statement counted, by what it found.
    let claims_with_rows = recorded.counter(&format!("{}{{result=rows}}", m::CLAIMS));
    let empty_claims = recorded.counter(&format!("{}{{result=empty}}", m::CLAIMS));
    assert_eq!(claims_with_rows + empty_claims, summary.claims);
    assert_eq!(empty_claims, summary.empty_claims);
    assert!(
        claims_with_rows >= summary.batches && claims_with_rows as f64 <= claimed,
        "{claims_with_rows} claims found rows, {} batches, {claimed} rows claimed",
        summary.batches
    );
    let durations = recorded.values(m::BATCH_DURATION);
    assert_eq!(durations.len() as u64, summary.batches);
    assert!(
        durations.iter().all(|&d| d > 0.0 && d < 20.0),
        "{durations:?}"
    );

    // The first refresh ran before the first claim.
    let backlog = recorded.values(m::BACKLOG);
    assert_eq!(backlog.first(), Some(&1_201.0), "{backlog:?}");
    let age = recorded.values(m::OLDEST_UNPUBLISHED_AGE);
    assert!(age[0] >= 90.0 && age[0] < 150.0, "{age:?}");
    assert_eq!(age.last(), Some(&0.0), "the parked row does not count");
    assert_eq!(recorded.values(m::LANES_OWNED).last(), Some(&64.0));

    // Broker unreachable: counted, nothing published.
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    insert(&pool, &[NewEvent::new(&topic, "late", 0)]).await;
    let relay = Relay::builder(pool.clone(), kafka_config(&closed.to_string()))
        .delivery_timeout(Duration::from_millis(500))
        .error_backoff(Backoff::new(
            Duration::from_millis(100),
            Duration::from_millis(200),
        ))
        .spawn()
        .unwrap();
    eventually(
        "broker_unavailable counted",
        Duration::from_secs(15),
        || async { errors(&recorded, "broker_unavailable") >= 1 },
    )
    .await;
    relay.shutdown().await.unwrap();
    assert_eq!(recorded.counter(&format!("{}{{}}", m::PUBLISHED)), 1_200);

    // The database connection is killed under a running relay: counted, and
    // the relay reconnects and publishes the waiting row.
    let relay = Relay::builder(pool.clone(), kafka_config(&brokers))
        .error_backoff(Backoff::new(
            Duration::from_millis(100),
            Duration::from_millis(200),
        ))
        .spawn()
        .unwrap();
    all_published_but_parked(&pool).await;
    insert(&pool, &[NewEvent::new(&topic, "late", 1)]).await;
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .execute(&pool)
    .await
    .unwrap();
    insert(&pool, &[NewEvent::new(&topic, "late", 2)]).await;
    eventually(
        "database error counted",
        Duration::from_secs(15),
        || async { errors(&recorded, "database") >= 1 },
    )
    .await;
    all_published_but_parked(&pool).await;
    let summary = relay.shutdown().await.unwrap();
    assert_eq!(summary.published, 3);
    assert_eq!(recorded.counter(&format!("{}{{}}", m::PUBLISHED)), 1_203);
}

async fn all_published_but_parked(pool: &PgPool) {
    eventually(
        "all but the parked row published",
        Duration::from_secs(15),
        || async { unpublished(pool).await == 1 },
    )
    .await;
}
