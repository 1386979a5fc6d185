//! Relays sharing a database agree on the lane count: lanes of different
//! counts cover different keys, so two relays configured with different
//! `lanes` would both publish some keys, out of order. The second one is
//! refused with an error naming both counts, its handle reports it, and it
//! is counted as a failed task; a fleet restarted as a whole may change the
//! count.

mod relay_support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use relay_support::*;
use sqlx::PgPool;
use txoutbox_runtime::lifecycle::{Stopped, TASKS_FAILED};
use txoutbox_runtime::relay::{Relay, RelayError, RelayHandle};

fn relay(pool: &PgPool, brokers: &str, lanes: u32) -> RelayHandle {
    Relay::builder(pool.clone(), kafka_config(brokers))
        .lanes(lanes)
        .rebalance_interval(Duration::from_millis(200))
        .spawn()
        .unwrap()
}

/// Counters only, by name (labels ignored); this test's runtime is
/// single-threaded, so a thread-local recorder sees the relay's task.
#[derive(Default)]
struct Counters(Mutex<HashMap<String, Arc<AtomicU64>>>);

impl Counters {
    fn get(&self, name: &str) -> u64 {
        self.0
            .lock()
            .unwrap()
            .get(name)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }
}

impl Recorder for Counters {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let mut counters = self.0.lock().unwrap();
        let counter = counters.entry(key.name().to_owned()).or_default();
        Counter::from_arc(Arc::clone(counter))
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

async fn publish_round(pool: &PgPool, topic: &str, round: i64) {
    let events: Vec<NewEvent> = (0..50)
        .map(|k| NewEvent::new(topic, format!("key-{k}"), round))
        .collect();
    insert(pool, &events).await;
    all_published(pool, Duration::from_secs(20)).await;
}

#[sqlx::test(migrations = false)]
async fn a_relay_with_another_lane_count_is_refused_naming_both_counts(pool: PgPool) {
    let counters = Counters::default();
    let _recorder = metrics::set_default_local_recorder(&counters);
    migrated(&pool).await;
    let brokers = brokers();
    let topic = unique_topic("lanes");
    create_topic(&brokers, &topic, 2).await;

    let first = relay(&pool, &brokers, 64);
    publish_round(&pool, &topic, 0).await;

    let second = relay(&pool, &brokers, 32);
    let stopped = tokio::time::timeout(Duration::from_secs(10), second.stopped())
        .await
        .expect("a relay with another lane count must be refused within 10 s");
    let Stopped::Failed(reason) = stopped else {
        panic!("refused relay reported {stopped:?}");
    };
    println!("refused: {reason}");
    assert!(
        reason.contains("32") && reason.contains("64") && reason.contains("lanes"),
        "the error names both counts: {reason}"
    );
    assert!(!second.is_running());
    assert!(first.is_running());
    // `outbox status` shows the fleet: only the first relay, with every lane.
    let relays = txoutbox_runtime::ops::status::collect(&pool, 1)
        .await
        .unwrap()
        .relays;
    assert_eq!(relays.len(), 1, "{relays:?}");
    assert_eq!((relays[0].lanes, relays[0].lanes_owned), (64, 64));
    assert!(!relays[0].lease_expired && relays[0].broker_failing_since.is_none());
    assert_eq!(relays[0].process_id, i64::from(std::process::id()));
    assert_eq!(counters.get(TASKS_FAILED), 1, "counted as a failed task");
    // The refused relay never took a lane: the first one publishes everything.
    publish_round(&pool, &topic, 1).await;
    assert_eq!(second.summary().published, 0);
    let refused = second.shutdown().await.unwrap_err();
    assert!(
        matches!(
            refused,
            RelayError::LaneCountMismatch {
                configured: 32,
                running: 64,
                ..
            }
        ),
        "shutting down the refused relay returns why it stopped: {refused:?}"
    );
    let summary = first.shutdown().await.unwrap();
    assert_eq!(summary.published, 100);

    // Once no relay of the old count is left, the fleet may use a new one.
    let replacement = relay(&pool, &brokers, 32);
    publish_round(&pool, &topic, 2).await;
    assert!(replacement.is_running());
    assert_eq!(replacement.shutdown().await.unwrap().published, 50);
    assert_eq!(counters.get(TASKS_FAILED), 1);
}

/// A PgBouncer of the test's own in transaction mode (`pgbouncer` must be
/// installed; as root it runs as the `postgres` user); stopped on drop.
struct TransactionPooler {
    port: u16,
    dir: std::path::PathBuf,
}

impl TransactionPooler {
    fn start(pool_size: u32) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(format!("outbox-pgbouncer-{port}"));
        std::fs::create_dir_all(&dir).unwrap();
        let file = |name: &str| dir.join(name).display().to_string();
        std::fs::write(dir.join("users.txt"), "\"postgres\" \"\"\n").unwrap();
        std::fs::write(
            dir.join("pgbouncer.ini"),
            format!(
                "[databases]\n* = host=127.0.0.1 port=5432\n[pgbouncer]\n\
                 listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
                 auth_type = trust\nauth_file = {}\npool_mode = transaction\n\
                 default_pool_size = {pool_size}\nlogfile = {}\npidfile = {}\n\
                 ignore_startup_parameters = extra_float_digits,options\n",
                file("users.txt"),
                file("pgbouncer.log"),
                file("pgbouncer.pid"),
            ),
        )
        .unwrap();
        let status = std::process::Command::new("chown")
            .args(["-R", "postgres", &dir.display().to_string()])
            .status();
        assert!(
            status.is_ok_and(|s| s.success()),
            "chown the pooler's directory"
        );
        let status = std::process::Command::new("pgbouncer")
            .args(["-d", "-u", "postgres", &file("pgbouncer.ini")])
            .status()
            .expect("pgbouncer installed (apt install pgbouncer)");
        assert!(status.success());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "pgbouncer did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { port, dir }
    }
}

impl Drop for TransactionPooler {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.dir.join("pgbouncer.pid")) {
            let _ = std::process::Command::new("kill").arg(pid.trim()).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Behind a transaction-mode pooler the relay's lane locks would belong to
/// whichever client runs on that server session next: the relay notices
/// that its connection is not a session of its own and stops with an error
/// that says so. Two relays through one pooler, two server connections.
#[sqlx::test(migrations = false)]
#[ignore = "needs pgbouncer (apt install pgbouncer); run with --ignored"]
async fn relays_behind_a_transaction_mode_pooler_are_refused(pool: PgPool) {
    migrated(&pool).await;
    let pooler = TransactionPooler::start(2);
    let through_pooler = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_lazy_with((*pool.connect_options()).clone().port(pooler.port));
    let brokers = brokers();
    let relays = [
        relay(&through_pooler, &brokers, 8),
        relay(&through_pooler, &brokers, 8),
    ];
    for relay in &relays {
        let stopped = tokio::time::timeout(Duration::from_secs(20), relay.stopped())
            .await
            .expect("a relay behind a transaction-mode pooler must stop within 20 s");
        let Stopped::Failed(reason) = stopped else {
            panic!("{stopped:?}");
        };
        println!("stopped: {reason}");
        assert!(reason.contains("session of its own"), "{reason}");
    }
}
