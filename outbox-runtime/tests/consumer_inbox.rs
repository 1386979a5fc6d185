//! Inbox mode against real PostgreSQL and the real broker: messages land in
//! `inbox_event` once, parallel processors handle each row once, and a failing
//! handler backs off and is parked.
#![allow(missing_docs)]

mod consumer_support;

use std::time::Duration;

use consumer_support::*;
use sqlx::{PgPool, Postgres, Transaction};
use txoutbox_core::Backoff;
use txoutbox_core::DomainEvent;
use txoutbox_runtime::consumer::{Consumer, EventMeta, Mode, event_handler};

test_event!(InboxPaid, "consumer-test.inbox.paid", "InboxPaid");
test_event!(InboxFlaky, "consumer-test.inbox.flaky", "InboxFlaky");
test_event!(InboxReceipt, "consumer-test.inbox.receipt", "InboxReceipt");

/// Records the event, with the trace it ran in, after a short pause so that
/// processors overlap.
#[event_handler]
async fn on_inbox_paid(
    tx: &mut Transaction<'_, Postgres>,
    event: InboxPaid,
    meta: &EventMeta,
) -> Result<(), sqlx::Error> {
    assert!(meta.partition.is_none(), "replayed from the table");
    sqlx::query("INSERT INTO effect (event_id, amount, note) VALUES ($1, $2, $3)")
        .bind(event.event_id)
        .bind(event.amount)
        .bind(txoutbox_core::trace::current_traceparent())
        .execute(&mut **tx)
        .await?;
    tokio::time::sleep(Duration::from_millis(2)).await;
    Ok(())
}

under_every_isolation! {
async fn duplicates_are_stored_once_and_two_processors_handle_each_row_once(pool: PgPool) {
    prepare_db(&pool).await;
    create_topic(InboxPaid::TOPIC, 2).await;
    let group = unique_group("inbox");
    start_group_at(&group, InboxPaid::TOPIC, 2, true).await;
    let producer = producer();
    let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let events: Vec<InboxPaid> = (0..200).map(InboxPaid::new).collect();
    for (i, event) in events.iter().enumerate() {
        let produce = produce_event(&producer, event);
        if i == 0 {
            txoutbox_core::trace::with_traceparent(Some(traceparent.into()), produce).await;
        } else {
            produce.await;
        }
        // Every tenth event is delivered twice.
        if i % 10 == 0 {
            produce_event(&producer, event).await;
        }
    }
    let end = high_watermarks(InboxPaid::TOPIC, 2).await;

    let running = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_inbox_paid)
        .mode(Mode::Inbox)
        // Every row goes through the processors (what this test is about).
        .handle_on_receipt(false)
        .processors(2)
        .processor_batch_size(7)
        .batch_size(50)
        .build()
        .unwrap()
        .spawn();
    eventually("all rows processed", Duration::from_secs(25), || async {
        count(&pool, "SELECT count(*) FROM inbox_event WHERE processed").await == 200
    })
    .await;
    eventually("offsets committed", Duration::from_secs(10), || async {
        committed(&group, InboxPaid::TOPIC, 2).await == end
    })
    .await;
    running.shutdown().await.unwrap();

    assert_eq!(count(&pool, "SELECT count(*) FROM inbox_event").await, 200);
    assert_eq!(count(&pool, "SELECT count(*) FROM effect").await, 200);
    assert_eq!(
        count(&pool, "SELECT count(DISTINCT event_id) FROM effect").await,
        200
    );
    let stored: (String, String, serde_json::Value) =
        sqlx::query_as("SELECT event_type, topic, headers FROM inbox_event WHERE event_id = $1")
            .bind(events[0].event_id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(stored.0, "InboxPaid");
    assert_eq!(stored.1, InboxPaid::TOPIC);
    assert_eq!(stored.2["traceparent"], traceparent);
    let note: Option<String> = sqlx::query_scalar("SELECT note FROM effect WHERE event_id = $1")
        .bind(events[0].event_id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        note.as_deref(),
        Some(traceparent),
        "the trace continues from the inbox"
    );
}
}

/// Fails for negative amounts.
#[event_handler]
async fn on_inbox_flaky(
    tx: &mut Transaction<'_, Postgres>,
    event: InboxFlaky,
) -> Result<(), String> {
    if event.amount < 0 {
        return Err(format!("refusing amount {}", event.amount));
    }
    sqlx::query("INSERT INTO effect (event_id, amount) VALUES ($1, $2)")
        .bind(event.event_id)
        .bind(event.amount)
        .execute(&mut **tx)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

under_every_isolation! {
async fn a_failing_handler_backs_off_and_its_row_is_parked(pool: PgPool) {
    prepare_db(&pool).await;
    create_topic(InboxFlaky::TOPIC, 1).await;
    let group = unique_group("inbox-flaky");
    start_group_at(&group, InboxFlaky::TOPIC, 1, true).await;
    let producer = producer();
    let poison = InboxFlaky::new(-5);
    let good: Vec<_> = (1..=20).map(InboxFlaky::new).collect();
    produce_event(&producer, &poison).await;
    for event in &good {
        produce_event(&producer, event).await;
    }
    let running = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_inbox_flaky)
        .mode(Mode::Inbox)
        .max_attempts(3)
        .backoff(Backoff::new(Duration::from_millis(20), Duration::from_millis(100)))
        .processor_poll_interval(Duration::from_millis(20))
        .build()
        .unwrap()
        .spawn();
    eventually("the poison row parked", Duration::from_secs(25), || async {
        count(
            &pool,
            "SELECT count(*) FROM inbox_event WHERE parked_at IS NOT NULL",
        )
        .await
            == 1
    })
    .await;
    eventually(
        "the good rows processed",
        Duration::from_secs(10),
        || async { count(&pool, "SELECT count(*) FROM inbox_event WHERE processed").await == 20 },
    )
    .await;
    running.shutdown().await.unwrap();

    let (attempts, last_error, processed): (i32, String, bool) = sqlx::query_as(
        "SELECT attempts, last_error, processed FROM inbox_event WHERE event_id = $1",
    )
    .bind(poison.event_id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(attempts, 3);
    assert!(last_error.contains("refusing amount -5"), "{last_error}");
    assert!(!processed);
    assert_eq!(count(&pool, "SELECT count(*) FROM effect").await, 20);
    assert_eq!(
        count(&pool, "SELECT count(*) FROM effect WHERE amount < 0").await,
        0
    );
}
}

/// Records who handled the event (`receipt`: the receiving loop, which knows
/// the partition; `processor`: replayed from the table) and in which order;
/// fails while the event's key is in `blocked`.
#[event_handler]
async fn on_inbox_receipt(
    tx: &mut Transaction<'_, Postgres>,
    event: InboxReceipt,
    meta: &EventMeta,
) -> Result<(), String> {
    let blocked: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM blocked WHERE order_id = $1)")
            .bind(event.order_id)
            .fetch_one(&mut **tx)
            .await
            .map_err(|e| e.to_string())?;
    if blocked {
        return Err(format!("key {} is blocked", event.order_id));
    }
    let by = if meta.partition.is_some() {
        "receipt"
    } else {
        "processor"
    };
    sqlx::query("INSERT INTO effect (event_id, amount, note) VALUES ($1, $2, $3)")
        .bind(event.event_id)
        .bind(event.amount)
        .bind(format!("{by} {}", event.order_id))
        .execute(&mut **tx)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

under_every_isolation! {
async fn idle_keys_are_handled_on_receipt_and_a_key_with_pending_rows_waits_its_turn(pool: PgPool) {
    prepare_db(&pool).await;
    sqlx::raw_sql("CREATE TABLE blocked (order_id uuid PRIMARY KEY)")
        .execute(&pool)
        .await
        .unwrap();
    create_topic(InboxReceipt::TOPIC, 2).await;
    let group = unique_group("inbox-receipt");
    start_group_at(&group, InboxReceipt::TOPIC, 2, true).await;
    let producer = producer();
    let running = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_inbox_receipt)
        .mode(Mode::Inbox)
        .max_attempts(1_000)
        .backoff(Backoff::new(Duration::from_millis(20), Duration::from_millis(50)))
        .processor_poll_interval(Duration::from_millis(20))
        .build()
        .unwrap()
        .spawn();

    // A key whose first event fails: its batch is rolled back to storing,
    // and the row backs off in the table.
    let head = InboxReceipt::new(0);
    sqlx::query("INSERT INTO blocked VALUES ($1)")
        .bind(head.order_id)
        .execute(&pool)
        .await
        .unwrap();
    produce_event(&producer, &head).await;
    eventually(
        "the failing head backs off",
        Duration::from_secs(20),
        || async {
            count(
                &pool,
                "SELECT count(*) FROM inbox_event WHERE attempts > 0 AND NOT processed",
            )
            .await
                == 1
        },
    )
    .await;

    // Its key's next events, and 30 events of idle keys (each twice).
    let behind: Vec<InboxReceipt> = (1..=3)
        .map(|amount| InboxReceipt {
            amount,
            ..InboxReceipt::new(0)
        })
        .map(|event| InboxReceipt {
            order_id: head.order_id,
            ..event
        })
        .collect();
    let idle: Vec<InboxReceipt> = (100..130).map(InboxReceipt::new).collect();
    for event in &behind {
        produce_event(&producer, event).await;
    }
    for event in idle.iter().chain(&idle) {
        produce_event(&producer, event).await;
    }
    eventually("the idle keys handled", Duration::from_secs(20), || async {
        count(&pool, "SELECT count(*) FROM effect WHERE amount >= 100").await == 30
    })
    .await;
    // Handled on receipt, once each, rows stored already processed.
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM effect WHERE amount >= 100 AND note LIKE 'receipt %'"
        )
        .await,
        30,
        "events of keys with nothing pending are handled by the receiving loop"
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM inbox_event WHERE processed AND processed_at IS NOT NULL"
        )
        .await,
        30
    );
    // The blocked key's later events wait behind its head, unhandled.
    assert_eq!(
        count(&pool, "SELECT count(*) FROM effect WHERE amount < 100").await,
        0
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM inbox_event WHERE NOT processed AND parked_at IS NULL"
        )
        .await,
        4,
        "the head and the three events behind it are pending"
    );

    // Unblocked, the processors take the key in order.
    sqlx::query("DELETE FROM blocked")
        .execute(&pool)
        .await
        .unwrap();
    eventually(
        "the blocked key drained",
        Duration::from_secs(20),
        || async { count(&pool, "SELECT count(*) FROM effect WHERE amount < 100").await == 4 },
    )
    .await;
    running.shutdown().await.unwrap();
    let order: Vec<(i64, String)> =
        sqlx::query_as("SELECT amount, note FROM effect WHERE amount < 100 ORDER BY at")
            .fetch_all(&pool)
            .await
            .unwrap();
    let amounts: Vec<i64> = order.iter().map(|(amount, _)| *amount).collect();
    assert_eq!(amounts, [0, 1, 2, 3], "per-key order");
    assert!(
        order.iter().all(|(_, note)| note.starts_with("processor ")),
        "{order:?}"
    );
    assert_eq!(count(&pool, "SELECT count(*) FROM effect").await, 34);
    assert_eq!(
        count(&pool, "SELECT count(*) FROM inbox_event WHERE processed").await,
        34
    );
    assert_eq!(count(&pool, "SELECT count(*) FROM inbox_key").await, 0);
}
}

/// Produces `per_key` events for each of `keys` new keys, interleaved, the
/// amount numbering each key's events 0, 1, 2, ...; returns the keys.
async fn produce_numbered<E: txoutbox_core::DomainEvent>(
    keys: usize,
    per_key: i64,
    event: impl Fn(uuid::Uuid, i64) -> E,
) -> Vec<uuid::Uuid> {
    let producer = producer();
    let keys: Vec<uuid::Uuid> = (0..keys).map(|_| uuid::Uuid::new_v4()).collect();
    for sequence in 0..per_key {
        for key in &keys {
            produce_event(&producer, &event(*key, sequence)).await;
        }
    }
    keys
}

/// Every key's effects were applied once each, in order 0..per_key.
async fn assert_applied_in_order(pool: &PgPool, keys: &[uuid::Uuid], per_key: i64) {
    let applied: Vec<(String, i64)> =
        sqlx::query_as("SELECT note, amount FROM effect ORDER BY at, amount")
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(applied.len() as i64, keys.len() as i64 * per_key);
    for key in keys {
        let sequence: Vec<i64> = applied
            .iter()
            .filter(|(note, _)| *note == key.to_string())
            .map(|(_, amount)| *amount)
            .collect();
        assert_eq!(
            sequence,
            (0..per_key).collect::<Vec<_>>(),
            "order of key {key}"
        );
    }
}

test_event!(InboxOrdered, "consumer-test.inbox.ordered", "InboxOrdered");

/// Records the key and the per-key sequence number (the amount), slowly, so
/// that processors overlap.
#[event_handler]
async fn on_inbox_ordered(
    tx: &mut Transaction<'_, Postgres>,
    event: InboxOrdered,
) -> Result<(), sqlx::Error> {
    tokio::time::sleep(Duration::from_millis(1)).await;
    sqlx::query("INSERT INTO effect (event_id, amount, note) VALUES ($1, $2, $3)")
        .bind(event.event_id)
        .bind(event.amount)
        .bind(event.order_id.to_string())
        .execute(&mut **tx)
        .await
        .map(drop)
}

under_every_isolation! {
async fn parallel_processors_keep_per_key_order(pool: PgPool) {
    prepare_db(&pool).await;
    create_topic(InboxOrdered::TOPIC, 1).await;
    let group = unique_group("inbox-ordered");
    start_group_at(&group, InboxOrdered::TOPIC, 1, true).await;
    let keys = produce_numbered(5, 30, |order_id, amount| InboxOrdered {
        event_id: uuid::Uuid::new_v4(),
        order_id,
        amount,
    })
    .await;
    let running = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_inbox_ordered)
        .mode(Mode::Inbox)
        .processors(4)
        .processor_batch_size(3)
        .processor_poll_interval(Duration::from_millis(5))
        .build()
        .unwrap()
        .spawn();
    eventually("all rows processed", Duration::from_secs(30), || async {
        count(&pool, "SELECT count(*) FROM inbox_event WHERE processed").await == 150
    })
    .await;
    running.shutdown().await.unwrap();
    assert_applied_in_order(&pool, &keys, 30).await;
}
}

test_event!(InboxRun, "consumer-test.inbox.runs", "InboxRun");

/// Fails twice for sequence 7 of every key, then succeeds: once in the
/// claimed batch (which is then retried row by row) and once on its own, which
/// counts an attempt and backs off.
#[event_handler]
async fn on_inbox_run(tx: &mut Transaction<'_, Postgres>, event: InboxRun) -> Result<(), String> {
    static FAILURES: std::sync::Mutex<Vec<uuid::Uuid>> = std::sync::Mutex::new(Vec::new());
    if event.amount == 7 {
        let mut failures = FAILURES.lock().unwrap();
        if failures.iter().filter(|k| **k == event.order_id).count() < 2 {
            failures.push(event.order_id);
            return Err(format!("transient failure at 7 of {}", event.order_id));
        }
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

under_every_isolation! {
async fn hot_keys_are_drained_in_runs_and_a_failure_holds_back_the_rest_of_its_run(pool: PgPool) {
    prepare_db(&pool).await;
    create_topic(InboxRun::TOPIC, 1).await;
    let group = unique_group("inbox-runs");
    start_group_at(&group, InboxRun::TOPIC, 1, true).await;
    let keys = produce_numbered(2, 150, |order_id, amount| InboxRun {
        event_id: uuid::Uuid::new_v4(),
        order_id,
        amount,
    })
    .await;
    let running = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_inbox_run)
        .mode(Mode::Inbox)
        // Runs are what processors take: every row goes through them.
        .handle_on_receipt(false)
        // One processor, so that which call fails is deterministic; the test
        // above runs processors side by side.
        .processors(1)
        .processor_batch_size(50)
        .backoff(Backoff::new(Duration::from_millis(50), Duration::from_millis(200)))
        .processor_poll_interval(Duration::from_millis(5))
        .build()
        .unwrap()
        .spawn();
    eventually("all rows processed", Duration::from_secs(30), || async {
        count(&pool, "SELECT count(*) FROM inbox_event WHERE processed").await == 300
    })
    .await;
    running.shutdown().await.unwrap();

    // Per key, effects in sequence order although 7 failed: the rows after it
    // in its run waited for its retry.
    assert_applied_in_order(&pool, &keys, 150).await;
    // Two keys, 300 rows: whole runs per transaction. A row per key and
    // transaction would take at least 150; how many fewer depends on how the
    // rows trickle in from the topic (10 to 45 seen).
    let transactions = count(
        &pool,
        "SELECT count(DISTINCT processed_at) FROM inbox_event WHERE processed",
    )
    .await;
    assert!(
        transactions < 100,
        "{transactions} transactions for 300 rows of 2 keys"
    );
    // Each key's 7 failed on its own at least once (a recorded attempt and a
    // back-off: the case where the rest of its run must wait), and no other
    // row failed.
    let retried = count(
        &pool,
        "SELECT count(*) FILTER (WHERE (payload->>'amount')::int = 7) * 1000 + count(*)
         FROM inbox_event WHERE attempts > 0",
    )
    .await;
    assert_eq!(
        retried, 2_002,
        "rows with a recorded failure: both 7s, nothing else"
    );
}
}
