//! Dedup mode against real PostgreSQL and the real broker: redelivered events
//! change nothing, a crash between the database commit and the offset commit
//! does not apply an effect twice, the trace continues, failing handlers are
//! retried then dead-lettered, and a database outage pauses without skipping.

#![allow(missing_docs)]

mod consumer_support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use consumer_support::*;
use sqlx::{PgPool, Postgres, Transaction};
use txoutbox_core::Backoff;
use txoutbox_core::DomainEvent;
use txoutbox_runtime::consumer::{Consumer, EventMeta, event_handler};

test_event!(DedupPaid, "consumer-test.dedup.paid", "DedupPaid");
test_event!(CrashPaid, "consumer-test.dedup.crash", "CrashPaid");
test_event!(FlakyPaid, "consumer-test.dedup.flaky", "FlakyPaid");
test_event!(OutagePaid, "consumer-test.dedup.outage", "OutagePaid");

async fn record(
    tx: &mut Transaction<'_, Postgres>,
    event_id: uuid::Uuid,
    amount: i64,
    note: Option<String>,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO effect (event_id, amount, note) VALUES ($1, $2, $3)")
        .bind(event_id)
        .bind(amount)
        .bind(note)
        .execute(&mut **tx)
        .await
        .map(drop)
}

/// Records the event and the trace context it ran in.
#[event_handler]
async fn on_dedup_paid(
    tx: &mut Transaction<'_, Postgres>,
    event: DedupPaid,
    meta: &EventMeta,
) -> Result<(), sqlx::Error> {
    assert_eq!(meta.event_id, event.event_id);
    let trace = txoutbox_core::trace::current_traceparent();
    record(tx, event.event_id, event.amount, trace).await
}

#[sqlx::test(migrations = false)]
async fn the_same_event_twice_is_handled_once_in_the_producers_trace(pool: PgPool) {
    prepare_db(&pool).await;
    create_topic(DedupPaid::TOPIC, 1).await;
    let group = unique_group("dedup");
    start_group_at(&group, DedupPaid::TOPIC, 1, true).await;
    let producer = producer();
    let first = DedupPaid::new(1);
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let second = txoutbox_core::trace::with_traceparent(Some(traceparent.into()), async {
        DedupPaid::new(2)
    })
    .await;
    produce_event(&producer, &first).await;
    produce_event(&producer, &first).await;
    txoutbox_core::trace::with_traceparent(
        Some(traceparent.into()),
        produce_event(&producer, &second),
    )
    .await;
    produce_event(&producer, &first).await;
    let end = high_watermarks(DedupPaid::TOPIC, 1).await;

    let running = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_dedup_paid)
        .build()
        .unwrap()
        .spawn();
    eventually(
        "offsets committed past all four",
        Duration::from_secs(20),
        || async { committed(&group, DedupPaid::TOPIC, 1).await == end },
    )
    .await;
    running.shutdown().await.unwrap();

    let effects: Vec<(uuid::Uuid, i64, Option<String>)> =
        sqlx::query_as("SELECT event_id, amount, note FROM effect ORDER BY amount")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        effects,
        vec![
            (first.event_id, 1, None),
            (second.event_id, 2, Some(traceparent.to_owned()))
        ]
    );
    let dedup_rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM processed_event WHERE consumer_group = $1")
            .bind(&group)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(dedup_rows, 2);
}

#[event_handler]
async fn on_crash_paid(
    tx: &mut Transaction<'_, Postgres>,
    event: CrashPaid,
) -> Result<(), sqlx::Error> {
    record(tx, event.event_id, event.amount, None).await
}

/// The state a crash after the database commit and before the offset commit
/// leaves behind (effect and dedup row committed, group offset still before
/// the message) is reproduced by rewinding the group's committed offset after
/// a clean run; the restarted consumer must not apply the effect again.
#[sqlx::test(migrations = false)]
async fn a_crash_before_the_offset_commit_does_not_apply_the_effect_twice(pool: PgPool) {
    prepare_db(&pool).await;
    create_topic(CrashPaid::TOPIC, 1).await;
    let group = unique_group("crash");
    start_group_at(&group, CrashPaid::TOPIC, 1, true).await;
    let start = high_watermarks(CrashPaid::TOPIC, 1).await[0];
    let producer = producer();
    let event = CrashPaid::new(7);
    produce_event(&producer, &event).await;

    let consumer = || {
        Consumer::builder(pool.clone(), kafka_config(), &group)
            .handler(on_crash_paid)
            .build()
            .unwrap()
            .spawn()
    };
    let running = consumer();
    eventually("effect applied", Duration::from_secs(20), || async {
        count(&pool, "SELECT count(*) FROM effect").await == 1
    })
    .await;
    running.shutdown().await.unwrap();

    // "Crash": the offset commit is lost, the database commit is not.
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(CrashPaid::TOPIC, 0, rdkafka::Offset::Offset(start))
        .unwrap();
    rewind(&group, tpl).await;

    let later = CrashPaid::new(8);
    produce_event(&producer, &later).await;
    let running = consumer();
    eventually(
        "the later event handled",
        Duration::from_secs(20),
        || async { count(&pool, "SELECT count(*) FROM effect WHERE amount = 8").await == 1 },
    )
    .await;
    running.shutdown().await.unwrap();
    assert_eq!(
        count(&pool, "SELECT count(*) FROM effect WHERE amount = 7").await,
        1,
        "the redelivered event was applied again"
    );
    assert_eq!(
        committed(&group, CrashPaid::TOPIC, 1).await,
        vec![start + 2]
    );
}

async fn rewind(group: &str, tpl: rdkafka::TopicPartitionList) {
    use rdkafka::consumer::Consumer as _;
    let group = group.to_owned();
    tokio::task::spawn_blocking(move || {
        let consumer: rdkafka::consumer::BaseConsumer =
            kafka_config().set("group.id", &group).create().unwrap();
        consumer
            .commit(&tpl, rdkafka::consumer::CommitMode::Sync)
            .unwrap();
    })
    .await
    .unwrap();
}

static FLAKY_CALLS: AtomicUsize = AtomicUsize::new(0);

/// Fails for negative amounts; records the rest.
#[event_handler]
async fn on_flaky_paid(tx: &mut Transaction<'_, Postgres>, event: FlakyPaid) -> Result<(), String> {
    if event.amount < 0 {
        FLAKY_CALLS.fetch_add(1, Ordering::SeqCst);
        return Err(format!("refusing amount {}", event.amount));
    }
    record(tx, event.event_id, event.amount, None)
        .await
        .map_err(|e| e.to_string())
}

#[sqlx::test(migrations = false)]
async fn a_failing_handler_is_retried_then_dead_lettered_and_the_partition_moves_on(pool: PgPool) {
    prepare_db(&pool).await;
    create_topic(FlakyPaid::TOPIC, 1).await;
    let group = unique_group("flaky");
    start_group_at(&group, FlakyPaid::TOPIC, 1, true).await;
    let dlq = format!("{}.dlq", FlakyPaid::TOPIC);
    let dlq_start = high_watermarks(&dlq, 1).await[0];
    let producer = producer();
    let ok_before = FlakyPaid::new(1);
    let poison = FlakyPaid::new(-1);
    let ok_after = FlakyPaid::new(2);
    for event in [&ok_before, &poison, &ok_after] {
        produce_event(&producer, event).await;
    }
    let running = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_flaky_paid)
        .max_attempts(3)
        .backoff(Backoff::new(
            Duration::from_millis(10),
            Duration::from_millis(50),
        ))
        .build()
        .unwrap()
        .spawn();
    let dead = read_until(&dlq, dlq_start, Duration::from_secs(20), |m| !m.is_empty()).await;
    eventually(
        "the good events handled",
        Duration::from_secs(20),
        || async { count(&pool, "SELECT count(*) FROM effect").await == 2 },
    )
    .await;
    running.shutdown().await.unwrap();

    // The optimistic batch attempt is not counted; the per-event retries are.
    assert!(FLAKY_CALLS.load(Ordering::SeqCst) >= 3);
    let message = &dead[0];
    assert_eq!(
        header(message, "dlq_reason").as_deref(),
        Some("handler_failed")
    );
    let error = header(message, "dlq_error").unwrap();
    assert!(
        error.contains("failed 3 times") && error.contains("refusing amount -1"),
        "{error}"
    );
    assert_eq!(header(message, "dlq_consumer_group"), Some(group.clone()));
    assert_eq!(header(message, "event_type").as_deref(), Some("FlakyPaid"));
    let value: serde_json::Value =
        serde_json::from_slice(rdkafka::Message::payload(message).unwrap()).unwrap();
    assert_eq!(value["event_id"], poison.event_id.to_string());
    let key = rdkafka::Message::key(message).map(|k| String::from_utf8_lossy(k).into_owned());
    assert_eq!(key, Some(poison.order_id.to_string()));
    // A dead-lettered event leaves no dedup row: replaying it from the DLQ works.
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM processed_event WHERE event_id = $1")
        .bind(poison.event_id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 0);
}

#[event_handler]
async fn on_outage_paid(
    tx: &mut Transaction<'_, Postgres>,
    event: OutagePaid,
) -> Result<(), sqlx::Error> {
    record(tx, event.event_id, event.amount, None).await
}

/// The database refuses connections for a while: the consumer stores no
/// offsets, keeps retrying, and handles every event exactly once afterwards.
#[sqlx::test(migrations = false)]
async fn a_database_outage_pauses_the_consumer_without_skipping(pool: PgPool) {
    prepare_db(&pool).await;
    create_topic(OutagePaid::TOPIC, 1).await;
    let group = unique_group("outage");
    start_group_at(&group, OutagePaid::TOPIC, 1, true).await;
    let start = high_watermarks(OutagePaid::TOPIC, 1).await[0];
    let database: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&pool)
        .await
        .unwrap();
    // The consumer's own pool, so that the test's pool stays usable.
    let options = (*pool.connect_options()).clone();
    let consumer_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(1))
        .connect_with(options)
        .await
        .unwrap();
    let running = Consumer::builder(consumer_pool.clone(), kafka_config(), &group)
        .handler(on_outage_paid)
        .backoff(Backoff::new(
            Duration::from_millis(50),
            Duration::from_millis(200),
        ))
        .build()
        .unwrap()
        .spawn();
    let producer = producer();
    produce_event(&producer, &OutagePaid::new(1)).await;
    eventually("first event handled", Duration::from_secs(20), || async {
        count(&pool, "SELECT count(*) FROM effect").await == 1
    })
    .await;

    // Outage: no new connections to this database, existing ones killed.
    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(
        &std::env::var("DATABASE_URL").expect("DATABASE_URL"),
    )
    .await
    .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "ALTER DATABASE \"{database}\" WITH ALLOW_CONNECTIONS false"
    )))
    .execute(&mut admin)
    .await
    .unwrap();
    sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1")
        .bind(&database)
        .execute(&mut admin)
        .await
        .unwrap();
    for amount in 2..=4 {
        produce_event(&producer, &OutagePaid::new(amount)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let during = committed(&group, OutagePaid::TOPIC, 1).await[0];
    assert!(
        during <= start + 1,
        "offset {during} committed during the outage"
    );

    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "ALTER DATABASE \"{database}\" WITH ALLOW_CONNECTIONS true"
    )))
    .execute(&mut admin)
    .await
    .unwrap();
    eventually(
        "events handled after the outage",
        Duration::from_secs(20),
        || async { count(&admin_pool(&pool).await, "SELECT count(*) FROM effect").await == 4 },
    )
    .await;
    eventually(
        "offsets committed after the outage",
        Duration::from_secs(20),
        || async { committed(&group, OutagePaid::TOPIC, 1).await[0] == start + 4 },
    )
    .await;
    running.shutdown().await.unwrap();
    let pool = admin_pool(&pool).await;
    assert_eq!(
        count(&pool, "SELECT count(DISTINCT event_id) FROM effect").await,
        count(&pool, "SELECT count(*) FROM effect").await
    );
}

/// A fresh pool to the test database (the outage killed the old connections).
async fn admin_pool(pool: &PgPool) -> PgPool {
    PgPool::connect_with((*pool.connect_options()).clone())
        .await
        .unwrap()
}

test_event!(StuckPaid, "consumer-test.dedup.stuck", "StuckPaid");

/// Always fails.
#[event_handler]
async fn on_stuck_paid(
    _tx: &mut Transaction<'_, Postgres>,
    _event: StuckPaid,
) -> Result<(), &'static str> {
    Err("downstream is down")
}

/// Shutting down while a handler is being retried is prompt and commits the
/// offsets of the messages before it, never its own.
#[sqlx::test(migrations = false)]
async fn shutdown_during_retries_commits_only_what_was_handled(pool: PgPool) {
    prepare_db(&pool).await;
    create_topic(StuckPaid::TOPIC, 1).await;
    let group = unique_group("stuck");
    start_group_at(&group, StuckPaid::TOPIC, 1, true).await;
    let start = high_watermarks(StuckPaid::TOPIC, 1).await[0];
    let producer = producer();
    // An unknown event type (skipped) first, then the event that keeps failing.
    let other = format!(
        r#"{{"event_id":"{}","order_id":"{}","amount":1}}"#,
        uuid::Uuid::new_v4(),
        uuid::Uuid::new_v4()
    );
    produce(
        &producer,
        StuckPaid::TOPIC,
        None,
        other.as_bytes(),
        &[("event_type", "Other")],
    )
    .await;
    produce_event(&producer, &StuckPaid::new(1)).await;
    let running = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_stuck_paid)
        .max_attempts(1000)
        .backoff(Backoff::new(
            Duration::from_millis(200),
            Duration::from_secs(1),
        ))
        // One message per batch, so the skipped one finishes on its own.
        .batch_size(1)
        .build()
        .unwrap()
        .spawn();
    eventually(
        "the first message committed",
        Duration::from_secs(20),
        || async { committed(&group, StuckPaid::TOPIC, 1).await == vec![start + 1] },
    )
    .await;
    let stopping = std::time::Instant::now();
    running.shutdown().await.unwrap();
    assert!(
        stopping.elapsed() < Duration::from_secs(5),
        "shutdown waited for retries"
    );
    assert_eq!(
        committed(&group, StuckPaid::TOPIC, 1).await,
        vec![start + 1]
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM processed_event").await,
        0
    );
}
