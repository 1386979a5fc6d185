//! Fault-injection service of the saga scenario (`FAULTS_SAGA_ROLE`):
//!
//! * `saga`: the saga service: a relay over its database (the `Reserve`,
//!   `Charge` and `Release` the sagas send, and their scheduled timeouts)
//!   and a dedup-mode consumer of `sagas.saga` running `FaultSaga`;
//! * `participant`: the participant: a relay over its database (its
//!   replies) and a dedup-mode consumer of `sagas.participant` applying
//!   reservations, charges and releases.
//!
//! Both run in one process, so a `kill -9` takes a service down whole, with
//! its relay's batches and its consumer's transactions in flight. Stops
//! gracefully on SIGTERM; exits 1 if the consumer stops on its own.
//!
//! Crash hook (`FAULTS_CRASH_AFTER_EFFECTS=n`): offsets are not auto-committed
//! in this process's lifetime, and it kills itself with SIGKILL once its
//! group has handled `n` messages since it started: everything it handled
//! is redelivered to its successor.

use std::time::Duration;

use outbox_tests::faults::env;
use outbox_tests::faults::saga::ROLE;
use outbox_tests::faults::saga::model::{
    self, FaultSaga, PARTICIPANT_GROUP, PROCESS_TAG, SAGA_GROUP,
};
use sqlx::postgres::PgPoolOptions;
use txoutbox_runtime::consumer::{Consumer, ConsumerHandle, Mode};
use txoutbox_runtime::relay::Relay;
use uuid::Uuid;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    env::init_logging();
    let role = env::required(ROLE);
    PROCESS_TAG
        .set(Uuid::new_v4().to_string())
        .expect("set once");
    let pool = PgPoolOptions::new()
        .max_connections(5)
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy(&env::required(env::SOURCE_URL))
        .expect("valid database url");
    let brokers = env::required(env::BROKERS);

    // librdkafka backs off reconnecting up to 10 s by default: after the
    // broker outage, that alone would keep a service away up to 10 s more.
    let reconnect_backoff_max_ms = "1000";
    let mut producer = rdkafka::ClientConfig::new();
    producer
        .set("bootstrap.servers", &brokers)
        .set("linger.ms", "5")
        .set("reconnect.backoff.max.ms", reconnect_backoff_max_ms);
    let relay = Relay::builder(pool.clone(), producer)
        .batch_size(env::get(env::BATCH, 100))
        .delivery_timeout(env::millis(env::DELIVERY_TIMEOUT_MS, 5_000))
        .poll_interval(Duration::from_millis(50))
        .rebalance_interval(Duration::from_millis(300))
        .retry_backoff(env::RELAY_RETRY_BACKOFF)
        .error_backoff(env::RELAY_ERROR_BACKOFF)
        .shutdown_timeout(Duration::from_secs(10))
        .spawn()
        .expect("relay starts");

    let crash_after: i64 = env::get(env::CRASH_AFTER_EFFECTS, 0);
    let mut kafka = rdkafka::ClientConfig::new();
    kafka
        .set("bootstrap.servers", &brokers)
        // A killed member holds its partitions until its session expires and
        // the group rebalances: keep both short, or a kill every few seconds
        // keeps the group rebalancing for good.
        .set("session.timeout.ms", "2000")
        .set("heartbeat.interval.ms", "200")
        .set("max.poll.interval.ms", "4000")
        .set("reconnect.backoff.max.ms", reconnect_backoff_max_ms);
    if crash_after > 0 {
        kafka.set("auto.commit.interval.ms", "3600000");
    }
    let (builder, group) = match role.as_str() {
        "saga" => (
            Consumer::builder(pool.clone(), kafka, SAGA_GROUP).saga::<FaultSaga>(),
            SAGA_GROUP,
        ),
        "participant" => (
            model::participant(Consumer::builder(pool.clone(), kafka, PARTICIPANT_GROUP)),
            PARTICIPANT_GROUP,
        ),
        other => panic!("{ROLE} must be saga or participant, not {other}"),
    };
    let consumer = builder
        .mode(Mode::Dedup)
        // A step that lost a race with a concurrent step of its saga (two
        // processes during a rebalance) is retried: never dead-letter.
        .max_attempts(1_000)
        .backoff(env::CONSUMER_BACKOFF)
        .batch_size(200)
        // tansu can serve a record before an earlier one is readable
        // (RELIABILITY.md).
        .refetch_offset_gaps(true)
        .spawn()
        .expect("consumer starts");

    if crash_after > 0 {
        tokio::spawn(crash_hook(pool.clone(), group, crash_after));
    }

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        stopped = consumer.stopped() => {
            eprintln!("consumer {stopped}");
            std::process::exit(1);
        }
        () = report(&consumer, &pool, group) => {}
    }
    let consumed = consumer.shutdown().await;
    let published = relay.shutdown().await;
    if let Err(error) = consumed {
        eprintln!("consumer stopped with an error: {error}");
        std::process::exit(1);
    }
    if let Err(error) = published {
        eprintln!("relay stopped with an error: {error}");
        std::process::exit(1);
    }
}

/// Writes what the consumer handled and the redelivered messages its dedup
/// absorbed into `process_report`, every 100 ms, for the checker (a kill
/// loses at most the last 100 ms).
async fn report(consumer: &ConsumerHandle, pool: &sqlx::PgPool, group: &str) {
    let process = PROCESS_TAG.get().expect("set at start");
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let summary = consumer.summary();
        let _ = sqlx::query(
            "INSERT INTO process_report (process, consumer_group, handled, duplicates)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (process) DO UPDATE SET handled = $3, duplicates = $4",
        )
        .bind(process)
        .bind(group)
        .bind(summary.handled as i64)
        .bind(summary.duplicates as i64)
        .execute(pool)
        .await;
    }
}

/// Kills this process with SIGKILL once `group` handled `after` messages
/// since it started.
async fn crash_hook(pool: sqlx::PgPool, group: &'static str, after: i64) {
    let since: chrono::DateTime<chrono::Utc> = loop {
        match sqlx::query_scalar("SELECT now()").fetch_one(&pool).await {
            Ok(now) => break now,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    loop {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let handled: Result<i64, _> = sqlx::query_scalar(
            "SELECT count(*) FROM processed_event WHERE consumer_group = $1 AND processed_at >= $2",
        )
        .bind(group)
        .bind(since)
        .fetch_one(&pool)
        .await;
        if handled.is_ok_and(|n| n >= after) {
            let pid = std::process::id().to_string();
            let _ = std::process::Command::new("kill")
                .args(["-9", &pid])
                .status();
        }
    }
}
