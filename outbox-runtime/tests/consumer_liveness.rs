//! Liveness of the consumer against real PostgreSQL and the real broker:
//! while one key, one handler or one event is broken, every other event keeps
//! flowing, and the broken thing is visible.
#![allow(missing_docs)]

mod consumer_support;

use std::time::{Duration, Instant};

use consumer_support::*;
use sqlx::{PgPool, Postgres, Transaction};
use txoutbox_core::Backoff;
use txoutbox_core::DomainEvent;
use txoutbox_runtime::consumer::{Consumer, Mode, event_handler};
use uuid::Uuid;

test_event!(StuckKey, "consumer-test.liveness.stuck", "StuckKey");
test_event!(Panicky, "consumer-test.liveness.panicky", "Panicky");
test_event!(
    PanickyInbox,
    "consumer-test.liveness.panicky-inbox",
    "PanickyInbox"
);

/// Effects of these events.
async fn effects_of(pool: &PgPool, ids: &[Uuid]) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM effect WHERE event_id = ANY($1)")
        .bind(ids)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Parked inbox rows of these events.
async fn parked_of(pool: &PgPool, ids: &[Uuid]) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM inbox_event WHERE parked_at IS NOT NULL AND event_id = ANY($1)",
    )
    .bind(ids)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Produces every event at once (many sends in flight), in order per key.
async fn produce_all<E: DomainEvent>(events: &[E]) {
    let producer = producer();
    futures::future::join_all(events.iter().map(|e| produce_event(&producer, e))).await;
}

/// Fails for every event with a negative amount (the blocked key), records
/// the others with their key.
#[event_handler]
async fn on_stuck_key(tx: &mut Transaction<'_, Postgres>, event: StuckKey) -> Result<(), String> {
    if event.amount < 0 {
        return Err("the downstream of this key is down".into());
    }
    sqlx::query("INSERT INTO effect (event_id, amount, note) VALUES ($1, $2, $3)")
        .bind(event.event_id)
        .bind(event.amount)
        .bind(event.order_id.to_string())
        .execute(&mut **tx)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Issue 12, item 1: a key that cannot go, with a backlog far larger than a
/// claim looks at, queued ahead of healthy keys. Before the fix the claim
/// only looked for key heads among the oldest pending rows, all of the
/// blocked key, and the healthy keys waited until the blocked one was parked.
#[sqlx::test(migrations = false)]
async fn inbox_a_key_that_keeps_failing_does_not_hold_back_other_keys(pool: PgPool) {
    prepare_db(&pool).await;
    create_topic(StuckKey::TOPIC, 1).await;
    let group = unique_group("liveness-stuck");
    start_group_at(&group, StuckKey::TOPIC, 1, true).await;
    let stuck = Uuid::new_v4();
    let mut events: Vec<StuckKey> = (0..5_000)
        .map(|n| StuckKey {
            event_id: Uuid::new_v4(),
            order_id: stuck,
            amount: -1 - n,
        })
        .collect();
    let healthy: Vec<Uuid> = (0..20).map(|_| Uuid::new_v4()).collect();
    for sequence in 0..10 {
        for key in &healthy {
            events.push(StuckKey {
                event_id: Uuid::new_v4(),
                order_id: *key,
                amount: sequence,
            });
        }
    }
    // Stored first, processed afterwards: the whole backlog of the blocked
    // key is ahead of every healthy row.
    let storing = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_stuck_key)
        .mode(Mode::Inbox)
        .processors(0)
        .build()
        .unwrap()
        .spawn();
    produce_all(&events).await;
    let ids: Vec<Uuid> = events.iter().map(|e| e.event_id).collect();
    eventually("every event stored", Duration::from_secs(60), || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM inbox_event WHERE event_id = ANY($1)")
            .bind(&ids)
            .fetch_one(&pool)
            .await
            .unwrap()
            == 5_200
    })
    .await;
    storing.shutdown().await.unwrap();

    let started = Instant::now();
    let running = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_stuck_key)
        .mode(Mode::Inbox)
        .processors(2)
        .processor_batch_size(100)
        .max_attempts(1_000)
        .backoff(Backoff::new(
            Duration::from_millis(50),
            Duration::from_millis(500),
        ))
        .processor_poll_interval(Duration::from_millis(20))
        .build()
        .unwrap()
        .spawn();
    eventually(
        "every healthy event handled",
        Duration::from_secs(30),
        || async {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM effect WHERE note = ANY($1)")
                .bind(healthy.iter().map(Uuid::to_string).collect::<Vec<_>>())
                .fetch_one(&pool)
                .await
                .unwrap()
                == 200
        },
    )
    .await;
    let waited = started.elapsed();
    // The blocked key is visible: its head keeps failing and says why.
    let (attempts, last_error): (i32, Option<String>) = sqlx::query_as(
        "SELECT attempts, last_error FROM inbox_event
         WHERE partition_key = $1 AND NOT processed ORDER BY seq LIMIT 1",
    )
    .bind(stuck.to_string())
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(running.is_running());
    running.shutdown().await.unwrap();
    println!(
        "[liveness] 200 healthy events behind a blocked key of 5,000 rows handled in {waited:?}; \
         the blocked head: {attempts} attempts"
    );
    assert!(attempts >= 1, "the blocked head was tried");
    assert!(
        last_error.is_some_and(|e| e.contains("downstream of this key is down")),
        "the blocked head says why"
    );
    // The blocked key did not move past its head, and nothing was parked.
    assert_eq!(
        count(&pool, "SELECT count(*) FROM effect WHERE amount < 0").await,
        0
    );
    assert_eq!(parked_of(&pool, &ids).await, 0);
    // Healthy keys in order.
    for key in &healthy {
        let amounts: Vec<i64> =
            sqlx::query_scalar("SELECT amount FROM effect WHERE note = $1 ORDER BY at")
                .bind(key.to_string())
                .fetch_all(&pool)
                .await
                .unwrap();
        assert_eq!(amounts, (0..10).collect::<Vec<_>>(), "order of {key}");
    }
}

/// Panics on amount 13, records every other event.
#[event_handler]
async fn on_panicky(tx: &mut Transaction<'_, Postgres>, event: Panicky) -> Result<(), sqlx::Error> {
    assert!(event.amount != 13, "a bug in the handler for amount 13");
    sqlx::query("INSERT INTO effect (event_id, amount) VALUES ($1, $2)")
        .bind(event.event_id)
        .bind(event.amount)
        .execute(&mut **tx)
        .await
        .map(drop)
}

/// Issue 12, item 2, dedup mode: before the fix the panic ended the
/// consumer's task silently and none of the events after it was handled.
#[sqlx::test(migrations = false)]
async fn dedup_a_panicking_handler_counts_as_failed_attempts_and_the_consumer_goes_on(
    pool: PgPool,
) {
    prepare_db(&pool).await;
    create_topic(Panicky::TOPIC, 1).await;
    let group = unique_group("liveness-panic");
    start_group_at(&group, Panicky::TOPIC, 1, true).await;
    let dlq_from = high_watermarks(&format!("{}.dlq", Panicky::TOPIC), 1).await[0];
    let events: Vec<Panicky> = (0..=20).map(|n| Panicky::new(n + 3)).collect();
    let ids: Vec<Uuid> = events.iter().map(|e| e.event_id).collect();
    let producer = producer();
    for event in &events {
        produce_event(&producer, event).await;
    }
    let running = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_panicky)
        .max_attempts(3)
        .backoff(Backoff::new(
            Duration::from_millis(10),
            Duration::from_millis(50),
        ))
        .build()
        .unwrap()
        .spawn();
    eventually(
        "the 20 other events handled",
        Duration::from_secs(30),
        || async { effects_of(&pool, &ids).await == 20 },
    )
    .await;
    let dead = read_until(
        &format!("{}.dlq", Panicky::TOPIC),
        dlq_from,
        Duration::from_secs(20),
        |read| !read.is_empty(),
    )
    .await;
    assert!(
        running.is_running(),
        "a handler panic never stops the consumer"
    );
    running.shutdown().await.unwrap();
    assert_eq!(
        header(&dead[0], "dlq_reason").as_deref(),
        Some("handler_failed")
    );
    let error = header(&dead[0], "dlq_error").unwrap_or_default();
    assert!(
        error.contains("failed 3 times") && error.contains("panicked"),
        "{error}"
    );
    assert!(
        error.contains("a bug in the handler for amount 13"),
        "{error}"
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM effect WHERE amount = 13").await,
        0
    );
}

/// Panics on amount 13, records every other event.
#[event_handler]
async fn on_panicky_inbox(
    tx: &mut Transaction<'_, Postgres>,
    event: PanickyInbox,
) -> Result<(), sqlx::Error> {
    if event.amount == 13 {
        panic!("a bug in the handler for amount 13");
    }
    sqlx::query("INSERT INTO effect (event_id, amount) VALUES ($1, $2)")
        .bind(event.event_id)
        .bind(event.amount)
        .execute(&mut **tx)
        .await
        .map(drop)
}

/// Issue 12, item 2, inbox mode: before the fix a panic ended the processor
/// task, which was only joined at shutdown.
#[sqlx::test(migrations = false)]
async fn inbox_a_panicking_handler_is_parked_after_its_attempts_and_processing_goes_on(
    pool: PgPool,
) {
    prepare_db(&pool).await;
    create_topic(PanickyInbox::TOPIC, 1).await;
    let group = unique_group("liveness-panic-inbox");
    start_group_at(&group, PanickyInbox::TOPIC, 1, true).await;
    let events: Vec<PanickyInbox> = (0..=20).map(|n| PanickyInbox::new(n + 3)).collect();
    let ids: Vec<Uuid> = events.iter().map(|e| e.event_id).collect();
    produce_all(&events).await;
    let running = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_panicky_inbox)
        .mode(Mode::Inbox)
        .processors(1)
        .max_attempts(3)
        .backoff(Backoff::new(
            Duration::from_millis(10),
            Duration::from_millis(50),
        ))
        .processor_poll_interval(Duration::from_millis(20))
        .build()
        .unwrap()
        .spawn();
    eventually(
        "the 20 other events handled and the panicking one parked",
        Duration::from_secs(30),
        || async { effects_of(&pool, &ids).await == 20 && parked_of(&pool, &ids).await == 1 },
    )
    .await;
    assert!(
        running.is_running(),
        "a handler panic never stops a processor"
    );
    running.shutdown().await.unwrap();
    let (attempts, last_error): (i32, String) = sqlx::query_as(
        "SELECT attempts, last_error FROM inbox_event WHERE parked_at IS NOT NULL AND event_id = ANY($1)",
    )
    .bind(&ids)
    .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(attempts, 3);
    assert!(
        last_error.contains("panicked: a bug in the handler for amount 13"),
        "{last_error}"
    );
}

test_event!(RollOld, "consumer-test.liveness.rolling", "RollOld");
test_event!(RollNew, "consumer-test.liveness.rolling", "RollNew");

/// Records key and sequence (the amount) of any rolling-deploy event.
async fn record_rolling(
    tx: &mut Transaction<'_, Postgres>,
    event_id: Uuid,
    key: Uuid,
    sequence: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO effect (event_id, amount, note) VALUES ($1, $2, $3)")
        .bind(event_id)
        .bind(sequence)
        .bind(key.to_string())
        .execute(&mut **tx)
        .await
        .map(drop)
}

#[event_handler]
async fn on_roll_old(
    tx: &mut Transaction<'_, Postgres>,
    event: RollOld,
) -> Result<(), sqlx::Error> {
    record_rolling(tx, event.event_id, event.order_id, event.amount).await
}

#[event_handler]
async fn on_roll_new(
    tx: &mut Transaction<'_, Postgres>,
    event: RollNew,
) -> Result<(), sqlx::Error> {
    record_rolling(tx, event.event_id, event.order_id, event.amount).await
}

/// Applied sequence numbers of `key`, in the order applied.
async fn applied(pool: &PgPool, key: Uuid) -> Vec<i64> {
    sqlx::query_scalar("SELECT amount FROM effect WHERE note = $1 ORDER BY at")
        .bind(key.to_string())
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Issue 12, item 3: during a rolling deploy that adds a handler, rows of the
/// new event type (stored by a new process) must not be parked by an old
/// process's processors; they wait, holding back their key, until a processor
/// that handles them runs, and the wait shows in `outbox status`. Before the
/// fix, the old processor parked them as `unknown_event_type`.
///
/// The rows are written as a newer process would have stored them, without a
/// group, as rows from before inbox groups: the consumer adopts them.
#[sqlx::test(migrations = false)]
async fn inbox_rows_of_an_event_type_without_a_handler_wait_for_a_processor_that_has_one(
    pool: PgPool,
) {
    prepare_db(&pool).await;
    create_topic(RollOld::TOPIC, 1).await;
    let group = unique_group("liveness-rolling");
    start_group_at(&group, RollOld::TOPIC, 1, true).await;
    // Keys 0-2: old, new, old. Key 3: old, old.
    let keys: Vec<Uuid> = (0..4).map(|_| Uuid::new_v4()).collect();
    for sequence in 0..3i64 {
        for (k, key) in keys.iter().enumerate() {
            let new = k < 3 && sequence == 1;
            if k == 3 && sequence == 2 {
                continue;
            }
            let event_type = if new { "RollNew" } else { "RollOld" };
            let payload = serde_json::json!({
                "event_id": Uuid::new_v4(), "order_id": key, "amount": sequence,
            });
            sqlx::query(
                "INSERT INTO inbox_event (event_id, payload, event_type, topic, partition_key)
                 VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(Uuid::parse_str(payload["event_id"].as_str().unwrap()).unwrap())
            .bind(&payload)
            .bind(event_type)
            .bind(RollOld::TOPIC)
            .bind(key.to_string())
            .execute(&pool)
            .await
            .unwrap();
        }
    }
    let old = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_roll_old)
        .mode(Mode::Inbox)
        .processors(2)
        .processor_poll_interval(Duration::from_millis(20))
        .build()
        .unwrap()
        .spawn();
    eventually(
        "the old process handled what it can",
        Duration::from_secs(20),
        || async { count(&pool, "SELECT count(*) FROM effect").await == 5 },
    )
    .await;
    // Give it time to do something wrong.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(count(&pool, "SELECT count(*) FROM effect").await, 5);
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM inbox_event WHERE parked_at IS NOT NULL"
        )
        .await,
        0,
        "nothing parked for lack of a handler"
    );
    for key in &keys[..3] {
        assert_eq!(
            applied(&pool, *key).await,
            [0],
            "the new type holds back its key"
        );
    }
    assert_eq!(applied(&pool, keys[3]).await, [0, 1]);
    // Visible: the status names the event type nobody running handles.
    let waiting = unclaimed(&pool, &group).await;
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    assert_eq!(waiting[0].event_type.as_deref(), Some("RollNew"));
    assert_eq!((waiting[0].keys, waiting[0].rows), (3, 6));

    // The new version starts beside the old one: everything goes through, in order.
    let new = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_roll_old)
        .handler(on_roll_new)
        .mode(Mode::Inbox)
        .processors(2)
        .processor_poll_interval(Duration::from_millis(20))
        .build()
        .unwrap()
        .spawn();
    eventually("everything handled", Duration::from_secs(20), || async {
        count(&pool, "SELECT count(*) FROM effect").await == 11
    })
    .await;
    for key in &keys[..3] {
        assert_eq!(applied(&pool, *key).await, [0, 1, 2]);
    }
    assert!(unclaimed(&pool, &group).await.is_empty());
    assert_eq!(
        count(&pool, "SELECT count(*) FROM inbox_key").await,
        0,
        "no key entry left behind"
    );
    old.shutdown().await.unwrap();
    new.shutdown().await.unwrap();
    assert_eq!(
        count(&pool, "SELECT count(*) FROM inbox_processor").await,
        0,
        "processors leave the registry on shutdown"
    );
}

test_event!(SharedPaid, "consumer-test.liveness.shared", "SharedPaid");

#[event_handler]
async fn on_shared_paid(
    tx: &mut Transaction<'_, Postgres>,
    event: SharedPaid,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO effect (event_id, amount) VALUES ($1, $2)")
        .bind(event.event_id)
        .bind(event.amount)
        .execute(&mut **tx)
        .await
        .map(drop)
}

/// Issue 12, item 3: several inbox consumer groups share one database. Before
/// the fix `inbox_event` was keyed by event id alone, so the second group's
/// copy of an event was dropped as a duplicate and never handled.
#[sqlx::test(migrations = false)]
async fn two_inbox_groups_in_one_database_each_handle_every_event(pool: PgPool) {
    prepare_db(&pool).await;
    create_topic(SharedPaid::TOPIC, 2).await;
    let groups = [unique_group("liveness-a"), unique_group("liveness-b")];
    for group in &groups {
        start_group_at(group, SharedPaid::TOPIC, 2, true).await;
    }
    let events: Vec<SharedPaid> = (0..50).map(SharedPaid::new).collect();
    let ids: Vec<Uuid> = events.iter().map(|e| e.event_id).collect();
    produce_all(&events).await;
    let running: Vec<_> = groups
        .iter()
        .map(|group| {
            Consumer::builder(pool.clone(), kafka_config(), group)
                .handler(on_shared_paid)
                .mode(Mode::Inbox)
                .processor_poll_interval(Duration::from_millis(20))
                .build()
                .unwrap()
                .spawn()
        })
        .collect();
    eventually(
        "both groups handled every event",
        Duration::from_secs(30),
        || async { effects_of(&pool, &ids).await == 100 },
    )
    .await;
    for consumer in running {
        consumer.shutdown().await.unwrap();
    }
    let per_group: Vec<(String, i64)> = sqlx::query_as(
        "SELECT consumer_group, count(*) FROM inbox_event
         WHERE processed AND event_id = ANY($1) GROUP BY 1 ORDER BY 1",
    )
    .bind(&ids)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        per_group,
        vec![(groups[0].clone(), 50), (groups[1].clone(), 50)]
    );
    assert_eq!(
        sqlx::query_scalar::<_, i64>(
            "SELECT count(DISTINCT event_id) FROM effect WHERE event_id = ANY($1)"
        )
        .bind(&ids)
        .fetch_one(&pool)
        .await
        .unwrap(),
        50
    );
}

/// `UnknownEventPolicy::Keep`: during a rolling deploy that adds a handler,
/// a process still on the old version stores the new type's messages it
/// receives (instead of skipping them), and the new version handles them in
/// order with their key.
#[sqlx::test(migrations = false)]
async fn inbox_keep_policy_stores_new_event_types_for_the_new_version(pool: PgPool) {
    use txoutbox_runtime::consumer::UnknownEventPolicy;
    prepare_db(&pool).await;
    create_topic(RollOld::TOPIC, 1).await;
    let group = unique_group("liveness-keep");
    start_group_at(&group, RollOld::TOPIC, 1, true).await;
    let old = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_roll_old)
        .mode(Mode::Inbox)
        .unknown_events(UnknownEventPolicy::Keep)
        .processor_poll_interval(Duration::from_millis(20))
        .build()
        .unwrap()
        .spawn();
    let key = Uuid::new_v4();
    let producer = producer();
    for sequence in 0..6 {
        let event_id = Uuid::new_v4();
        if sequence == 2 {
            let event = RollNew {
                event_id,
                order_id: key,
                amount: sequence,
            };
            produce_event(&producer, &event).await;
        } else {
            let event = RollOld {
                event_id,
                order_id: key,
                amount: sequence,
            };
            produce_event(&producer, &event).await;
        }
    }
    eventually("every message stored", Duration::from_secs(20), || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM inbox_event WHERE partition_key = $1")
            .bind(key.to_string())
            .fetch_one(&pool)
            .await
            .unwrap()
            == 6
    })
    .await;
    eventually(
        "the old version's part handled",
        Duration::from_secs(20),
        || async { applied(&pool, key).await == [0, 1] },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        applied(&pool, key).await,
        [0, 1],
        "the new type holds back its key"
    );
    let new = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_roll_old)
        .handler(on_roll_new)
        .mode(Mode::Inbox)
        .unknown_events(UnknownEventPolicy::Keep)
        .processor_poll_interval(Duration::from_millis(20))
        .build()
        .unwrap()
        .spawn();
    eventually(
        "everything handled in order",
        Duration::from_secs(20),
        || async { applied(&pool, key).await == [0, 1, 2, 3, 4, 5] },
    )
    .await;
    old.shutdown().await.unwrap();
    new.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_keep_policy_is_refused_in_dedup_mode() {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .connect_lazy("postgres://nobody@127.0.0.1:1/none")
        .unwrap();
    let error = Consumer::builder(pool, kafka_config(), "g")
        .handler(on_roll_old)
        .unknown_events(txoutbox_runtime::consumer::UnknownEventPolicy::Keep)
        .build()
        .expect_err("refused");
    assert!(error.to_string().contains("needs Mode::Inbox"), "{error}");
}

/// An operator's retry of a parked inbox row (`outbox dead-letters retry
/// --table inbox`) puts its key back in line: the update trigger gives the
/// key an entry again, and a processor handles the row.
#[sqlx::test(migrations = false)]
async fn a_retried_parked_inbox_row_is_claimed_again(pool: PgPool) {
    use txoutbox_runtime::ops::dead_letters::{self, Selection, Table};
    prepare_db(&pool).await;
    create_topic(RollOld::TOPIC, 1).await;
    let group = unique_group("liveness-retry");
    start_group_at(&group, RollOld::TOPIC, 1, true).await;
    let key = Uuid::new_v4();
    let event_id = Uuid::new_v4();
    let payload = serde_json::json!({ "event_id": event_id, "order_id": key, "amount": 7 });
    sqlx::query(
        "INSERT INTO inbox_event
             (consumer_group, event_id, payload, event_type, topic, partition_key, attempts, parked_at)
         VALUES ($1, $2, $3, 'RollOld', $4, $5, 5, now())",
    )
    .bind(&group)
    .bind(event_id)
    .bind(&payload)
    .bind(RollOld::TOPIC)
    .bind(key.to_string())
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(count(&pool, "SELECT count(*) FROM inbox_key").await, 0);
    let retried = dead_letters::retry(&pool, Table::Inbox, &Selection::EventIds(vec![event_id]))
        .await
        .unwrap();
    assert_eq!(retried, [event_id]);
    assert_eq!(count(&pool, "SELECT count(*) FROM inbox_key").await, 1);
    let running = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_roll_old)
        .mode(Mode::Inbox)
        .processor_poll_interval(Duration::from_millis(20))
        .build()
        .unwrap()
        .spawn();
    eventually(
        "the retried row handled",
        Duration::from_secs(20),
        || async { applied(&pool, key).await == [7] },
    )
    .await;
    running.shutdown().await.unwrap();
    assert_eq!(count(&pool, "SELECT count(*) FROM inbox_key").await, 0);
}

test_event!(Transient, "consumer-test.liveness.transient", "Transient");

/// Fails the first two times it sees amount 50 (the batch's first pass and
/// its careful pass), then succeeds.
#[event_handler]
async fn on_transient(tx: &mut Transaction<'_, Postgres>, event: Transient) -> Result<(), String> {
    static FAILURES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    if event.amount == 50 && FAILURES.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 2 {
        return Err("a transient failure".into());
    }
    sqlx::query("INSERT INTO effect (event_id, amount) VALUES ($1, $2)")
        .bind(event.event_id)
        .bind(event.amount)
        .execute(&mut **tx)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Dedup mode: one failing event costs its batch one more pass, not a
/// transaction per event, and the events after it in its partition are
/// applied after it (offset order).
#[sqlx::test(migrations = false)]
async fn dedup_a_failing_event_costs_its_batch_one_more_pass(pool: PgPool) {
    prepare_db(&pool).await;
    create_topic(Transient::TOPIC, 1).await;
    let group = unique_group("liveness-transient");
    start_group_at(&group, Transient::TOPIC, 1, true).await;
    let key = Uuid::new_v4();
    let events: Vec<Transient> = (0..100)
        .map(|amount| Transient {
            event_id: Uuid::new_v4(),
            order_id: key,
            amount,
        })
        .collect();
    let ids: Vec<Uuid> = events.iter().map(|e| e.event_id).collect();
    // Stored before the consumer starts, so that one batch holds them all.
    produce_all(&events).await;
    let running = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_transient)
        .batch_size(500)
        .backoff(Backoff::new(
            Duration::from_millis(10),
            Duration::from_millis(50),
        ))
        .build()
        .unwrap()
        .spawn();
    eventually("every event applied", Duration::from_secs(30), || async {
        effects_of(&pool, &ids).await == 100
    })
    .await;
    running.shutdown().await.unwrap();
    let applied: Vec<i64> =
        sqlx::query_scalar("SELECT amount FROM effect WHERE event_id = ANY($1) ORDER BY at")
            .bind(&ids)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(applied, (0..100).collect::<Vec<_>>(), "offset order");
    // processed_at is the transaction's start: one value per transaction.
    let transactions: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT processed_at) FROM processed_event WHERE consumer_group = $1",
    )
    .bind(&group)
    .fetch_one(&pool)
    .await
    .unwrap();
    println!("[liveness] 100 events with one transient failure: {transactions} transactions");
    assert!(
        transactions <= 10,
        "{transactions} transactions: a transaction per event after the failure?"
    );
}

/// What `outbox status` reports as unclaimed inbox keys of `group`.
async fn unclaimed(
    pool: &PgPool,
    group: &str,
) -> Vec<txoutbox_runtime::ops::status::UnclaimedKeys> {
    let status = txoutbox_runtime::ops::status::collect(pool, 0)
        .await
        .unwrap();
    status
        .inbox_unclaimed
        .into_iter()
        .filter(|keys| keys.consumer_group == group)
        .collect()
}
