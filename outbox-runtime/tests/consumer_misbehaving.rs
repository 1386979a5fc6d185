//! Handlers that misbehave, against real PostgreSQL and the real broker
//! (issue 22): one that swallows a database error, one that never returns,
//! one that keeps failing; and a dead letter the broker never takes. In
//! each case nothing is lost, the culprit alone is charged, every healthy
//! event keeps flowing, and the broken thing is visible.
#![allow(missing_docs)]

mod consumer_support;

use std::time::{Duration, Instant};

use consumer_support::*;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use sqlx::{PgPool, Postgres, Transaction};
use txoutbox_core::DomainEvent;
use txoutbox_runtime::consumer::{Consumer, Mode, event_handler};
use uuid::Uuid;

test_event!(Swallowed, "consumer-test.misbehaving.swallow", "Swallowed");
test_event!(
    SwallowedInbox,
    "consumer-test.misbehaving.swallow-inbox",
    "SwallowedInbox"
);
test_event!(Backoff, "consumer-test.misbehaving.backoff", "Backoff");
test_event!(Hanging, "consumer-test.misbehaving.hanging", "Hanging");
test_event!(
    HangingInbox,
    "consumer-test.misbehaving.hanging-inbox",
    "HangingInbox"
);
test_event!(
    Undeliverable,
    "consumer-test.misbehaving.undeliverable",
    "Undeliverable"
);

/// The amount that makes a handler misbehave.
const CULPRIT: i64 = 13;

/// Migrations, the effect table, and a table with one row to collide with.
async fn prepare(pool: &PgPool) {
    prepare_db(pool).await;
    sqlx::raw_sql("CREATE TABLE seen (id int PRIMARY KEY); INSERT INTO seen VALUES (1);")
        .execute(pool)
        .await
        .unwrap();
}

async fn insert_effect(
    tx: &mut Transaction<'_, Postgres>,
    event_id: Uuid,
    amount: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO effect (event_id, amount, note) VALUES ($1, $2, $3)")
        .bind(event_id)
        .bind(amount)
        .bind(format!("{amount}"))
        .execute(&mut **tx)
        .await
        .map(drop)
}

/// The idiom gone wrong: "a unique violation means it was done already",
/// so the error is dropped and the handler reports success. PostgreSQL has
/// aborted the transaction at the failed insert.
async fn record_or_swallow(
    tx: &mut Transaction<'_, Postgres>,
    event_id: Uuid,
    amount: i64,
) -> Result<(), sqlx::Error> {
    if amount == CULPRIT {
        let _ = sqlx::query("INSERT INTO seen VALUES (1)")
            .execute(&mut **tx)
            .await;
        return Ok(());
    }
    insert_effect(tx, event_id, amount).await
}

#[event_handler]
async fn on_swallowed(
    tx: &mut Transaction<'_, Postgres>,
    event: Swallowed,
) -> Result<(), sqlx::Error> {
    record_or_swallow(tx, event.event_id, event.amount).await
}

#[event_handler]
async fn on_swallowed_inbox(
    tx: &mut Transaction<'_, Postgres>,
    event: SwallowedInbox,
) -> Result<(), sqlx::Error> {
    record_or_swallow(tx, event.event_id, event.amount).await
}

async fn effects(pool: &PgPool) -> i64 {
    count(pool, "SELECT count(*) FROM effect").await
}

/// Produces `events` and waits until the broker has them all, so that the
/// consumer, started afterwards, takes them in as few batches as it can.
async fn produce_before_start<E: DomainEvent>(events: &[E]) {
    let producer = producer();
    for event in events {
        produce_event(&producer, event).await;
    }
}

/// Events of amounts `0..n`, with the culprit at `position`.
fn with_culprit_at<E>(n: i64, position: i64, new: impl Fn(i64) -> E) -> Vec<E> {
    (0..n)
        .map(|i| new(if i == position { CULPRIT } else { 100 + i }))
        .collect()
}

/// Dedup mode, issue 22 item 1: a handler that swallowed a database error
/// returned `Ok` on an aborted transaction. As the last handler of a batch,
/// the batch's `COMMIT` was answered with a rollback and the offsets stored:
/// every event of the batch lost for good. In the middle of a batch, the
/// next handler failed with "current transaction is aborted" and the batch
/// was retried for ever as if the database were down.
#[sqlx::test(migrations = false)]
async fn dedup_a_handler_that_swallows_a_database_error_is_charged_alone(pool: PgPool) {
    prepare(&pool).await;
    create_topic(Swallowed::TOPIC, 1).await;
    for (round, position) in [19, 10].into_iter().enumerate() {
        let group = unique_group(&format!("swallow-{round}"));
        start_group_at(&group, Swallowed::TOPIC, 1, true).await;
        let dlq_from = high_watermarks(&format!("{}.dlq", Swallowed::TOPIC), 1).await[0];
        sqlx::query("DELETE FROM effect")
            .execute(&pool)
            .await
            .unwrap();
        let events = with_culprit_at(20, position, Swallowed::new);
        produce_before_start(&events).await;
        let end = high_watermarks(Swallowed::TOPIC, 1).await;
        let running = Consumer::builder(pool.clone(), kafka_config(), &group)
            .handler(on_swallowed)
            .max_attempts(2)
            .backoff(txoutbox_core::Backoff::new(
                Duration::from_millis(10),
                Duration::from_millis(50),
            ))
            .build()
            .unwrap()
            .spawn();
        eventually(
            &format!("the 19 healthy events handled (culprit at {position})"),
            Duration::from_secs(30),
            || async { effects(&pool).await == 19 },
        )
        .await;
        let dead = read_until(
            &format!("{}.dlq", Swallowed::TOPIC),
            dlq_from,
            Duration::from_secs(20),
            |read| !read.is_empty(),
        )
        .await;
        eventually(
            "every offset committed",
            Duration::from_secs(20),
            || async { committed(&group, Swallowed::TOPIC, 1).await == end },
        )
        .await;
        let summary = running.summary();
        assert!(running.is_running());
        running.shutdown().await.unwrap();
        let error = header(&dead[0], "dlq_error").unwrap_or_default();
        assert_eq!(
            header(&dead[0], "dlq_reason").as_deref(),
            Some("handler_failed")
        );
        for hint in ["on_swallowed", "aborted", "savepoint", "ON CONFLICT"] {
            assert!(error.contains(hint), "{error:?} should mention {hint:?}");
        }
        assert_eq!(summary.handled, 19);
        assert_eq!(summary.dead_lettered, 1);
        assert_eq!(
            count(&pool, "SELECT count(*) FROM processed_event").await,
            19 * (round as i64 + 1),
            "one dedup row per handled event, none for the culprit"
        );
    }
}

/// Inbox mode, issue 22 item 1: the same through the processors (with
/// handling on receipt off) and handling on receipt (on). Before the fix the
/// processors' batch failed to record its outcomes ("current transaction is
/// aborted") and was retried for ever as an outage; on receipt, the batch's
/// rows were never stored while their offsets were.
#[sqlx::test(migrations = false)]
async fn inbox_a_handler_that_swallows_a_database_error_is_parked_alone(pool: PgPool) {
    prepare(&pool).await;
    create_topic(SwallowedInbox::TOPIC, 1).await;
    for on_receipt in [false, true] {
        let group = unique_group(&format!("swallow-inbox-{on_receipt}"));
        start_group_at(&group, SwallowedInbox::TOPIC, 1, true).await;
        sqlx::query("DELETE FROM effect")
            .execute(&pool)
            .await
            .unwrap();
        let events = with_culprit_at(20, 10, SwallowedInbox::new);
        let ids: Vec<Uuid> = events.iter().map(|e| e.event_id).collect();
        produce_before_start(&events).await;
        let running = Consumer::builder(pool.clone(), kafka_config(), &group)
            .handler(on_swallowed_inbox)
            .mode(Mode::Inbox)
            .processors(1)
            .handle_on_receipt(on_receipt)
            .max_attempts(2)
            .backoff(txoutbox_core::Backoff::new(
                Duration::from_millis(10),
                Duration::from_millis(50),
            ))
            .processor_poll_interval(Duration::from_millis(20))
            .build()
            .unwrap()
            .spawn();
        eventually(
            &format!("19 handled and the culprit parked (on receipt: {on_receipt})"),
            Duration::from_secs(30),
            || async {
                let parked: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM inbox_event WHERE event_id = ANY($1) AND parked_at IS NOT NULL",
                )
                .bind(&ids)
                .fetch_one(&pool)
                .await
                .unwrap();
                effects(&pool).await == 19 && parked == 1
            },
        )
        .await;
        assert!(running.is_running());
        running.shutdown().await.unwrap();
        let (attempts, error): (i32, String) = sqlx::query_as(
            "SELECT attempts, last_error FROM inbox_event WHERE event_id = ANY($1) AND parked_at IS NOT NULL",
        )
        .bind(&ids)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(attempts, 2);
        for hint in ["on_swallowed_inbox", "aborted", "savepoint"] {
            assert!(error.contains(hint), "{error:?} should mention {hint:?}");
        }
        let processed: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM inbox_event WHERE event_id = ANY($1) AND processed",
        )
        .bind(&ids)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(processed, 19);
    }
}

/// Produces `event` to `partition` (rather than by its key).
async fn produce_to<E: DomainEvent>(producer: &FutureProducer, event: &E, partition: i32) {
    let record = txoutbox_core::OutboxRecord::from_event(event).unwrap();
    let value = serde_json::to_vec(&record.payload).unwrap();
    let headers = OwnedHeaders::new().insert(Header {
        key: txoutbox_core::wire::HEADER_EVENT_TYPE,
        value: Some(E::EVENT_TYPE),
    });
    producer
        .send(
            FutureRecord::to(E::TOPIC)
                .partition(partition)
                .key(&record.partition_key)
                .payload(&value)
                .headers(headers),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)
        .expect("produce");
}

/// Fails every time for the culprit, records the others.
#[event_handler]
async fn on_backoff(tx: &mut Transaction<'_, Postgres>, event: Backoff) -> Result<(), String> {
    if event.amount == CULPRIT {
        return Err("the downstream of this event is down".into());
    }
    insert_effect(tx, event.event_id, event.amount)
        .await
        .map_err(|e| e.to_string())
}

/// When each of `ids` took effect (the database clock), if it did.
async fn effect_times(pool: &PgPool, ids: &[Uuid]) -> Vec<Option<chrono::DateTime<chrono::Utc>>> {
    let mut times = Vec::new();
    for id in ids {
        times.push(
            sqlx::query_scalar("SELECT at FROM effect WHERE event_id = $1")
                .bind(id)
                .fetch_optional(pool)
                .await
                .unwrap(),
        );
    }
    times
}

/// Issue 22 item 4: while an event of partition 0 backs off between its
/// attempts, partition 1 keeps flowing. Before the fix the in-place retries
/// held every partition: the healthy events waited for the whole backoff.
#[sqlx::test(migrations = false)]
async fn dedup_a_backing_off_event_delays_only_its_own_partition(pool: PgPool) {
    prepare(&pool).await;
    create_topic(Backoff::TOPIC, 2).await;
    let group = unique_group("backoff");
    start_group_at(&group, Backoff::TOPIC, 2, true).await;
    let dlq_from = high_watermarks(&format!("{}.dlq", Backoff::TOPIC), 1).await[0];
    let running = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_backoff)
        .max_attempts(4)
        // 1 s, 2 s, 2 s between the attempts, each with jitter of up to
        // half: 2.5 to 5 s of backing off.
        .backoff(txoutbox_core::Backoff::new(
            Duration::from_secs(1),
            Duration::from_secs(2),
        ))
        .build()
        .unwrap()
        .spawn();
    let producer = producer();
    // Wait until the consumer has joined and handles.
    let warm_up = Backoff::new(1);
    produce_to(&producer, &warm_up, 1).await;
    eventually(
        "the warm-up event handled",
        Duration::from_secs(30),
        || async { effects(&pool).await == 1 },
    )
    .await;
    let culprit = Backoff::new(CULPRIT);
    let behind = Backoff::new(2); // same partition, after the culprit: waits for it
    let culprit_produced_at = chrono::Utc::now();
    produce_to(&producer, &culprit, 0).await;
    produce_to(&producer, &behind, 0).await;
    // Healthy events on partition 1, one every 250 ms while partition 0 backs off.
    let mut healthy = Vec::new();
    let mut produced_at = Vec::new();
    for i in 0..16 {
        let event = Backoff::new(1_000 + i);
        produced_at.push(chrono::Utc::now());
        produce_to(&producer, &event, 1).await;
        healthy.push(event.event_id);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eventually(
        "the culprit dead-lettered and the event behind it handled",
        Duration::from_secs(30),
        || async { effect_times(&pool, &[behind.event_id]).await[0].is_some() },
    )
    .await;
    let dead = read_until(
        &format!("{}.dlq", Backoff::TOPIC),
        dlq_from,
        Duration::from_secs(10),
        |read| !read.is_empty(),
    )
    .await;
    assert!(running.is_running());
    running.shutdown().await.unwrap();
    let times = effect_times(&pool, &healthy).await;
    let delays: Vec<Duration> = times
        .iter()
        .zip(&produced_at)
        .map(|(at, produced)| {
            let at = at.expect("every healthy event handled");
            (at - *produced).to_std().unwrap_or_default()
        })
        .collect();
    let worst = delays.iter().max().unwrap();
    println!(
        "[backoff] 16 events of partition 1 while partition 0 backed off 2.5-5 s: worst delay {worst:?}"
    );
    assert!(
        *worst < Duration::from_secs(1),
        "a healthy partition waited {worst:?} behind another partition's backoff: {delays:?}"
    );
    assert_eq!(
        header(&dead[0], "dlq_reason").as_deref(),
        Some("handler_failed")
    );
    assert!(
        header(&dead[0], "dlq_error")
            .unwrap()
            .contains("failed 4 times")
    );
    // The event behind the culprit waited for it, in offset order: its three
    // backoffs (1 s, 2 s, 2 s, each with jitter of up to half) take 2.5 to 5 s.
    let behind_at = effect_times(&pool, &[behind.event_id]).await[0].unwrap();
    let waited = (behind_at - culprit_produced_at)
        .to_std()
        .unwrap_or_default();
    assert!(
        waited >= Duration::from_millis(2_400),
        "the event behind the culprit went after {waited:?}, before the culprit's attempts ran out"
    );
    assert_eq!(effects(&pool).await, 1 + 1 + 16);
}

/// Never returns for the culprit (an awaited call without a timeout).
async fn hang_or_record(
    tx: &mut Transaction<'_, Postgres>,
    event_id: Uuid,
    amount: i64,
) -> Result<(), sqlx::Error> {
    if amount == CULPRIT {
        tokio::time::sleep(Duration::from_secs(3_600)).await;
    }
    insert_effect(tx, event_id, amount).await
}

#[event_handler]
async fn on_hanging(tx: &mut Transaction<'_, Postgres>, event: Hanging) -> Result<(), sqlx::Error> {
    hang_or_record(tx, event.event_id, event.amount).await
}

#[event_handler]
async fn on_hanging_inbox(
    tx: &mut Transaction<'_, Postgres>,
    event: HangingInbox,
) -> Result<(), sqlx::Error> {
    hang_or_record(tx, event.event_id, event.amount).await
}

/// Issue 22 item 5, dedup mode: a handler that sleeps for an hour times out;
/// each timed-out call is a failed attempt, then the event is dead-lettered
/// and the events after it go on. Before the fix the receive loop waited for
/// the hour.
#[sqlx::test(migrations = false)]
async fn dedup_a_handler_that_never_returns_times_out_and_is_dead_lettered(pool: PgPool) {
    prepare(&pool).await;
    create_topic(Hanging::TOPIC, 1).await;
    let group = unique_group("hanging");
    start_group_at(&group, Hanging::TOPIC, 1, true).await;
    let dlq_from = high_watermarks(&format!("{}.dlq", Hanging::TOPIC), 1).await[0];
    let events = with_culprit_at(10, 4, Hanging::new);
    produce_before_start(&events).await;
    let started = Instant::now();
    let running = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_hanging)
        .handler_timeout(Duration::from_millis(500))
        .max_attempts(2)
        .backoff(txoutbox_core::Backoff::new(
            Duration::from_millis(10),
            Duration::from_millis(50),
        ))
        .build()
        .unwrap()
        .spawn();
    eventually(
        "the 9 other events handled",
        Duration::from_secs(30),
        || async { effects(&pool).await == 9 },
    )
    .await;
    let dead = read_until(
        &format!("{}.dlq", Hanging::TOPIC),
        dlq_from,
        Duration::from_secs(20),
        |read| !read.is_empty(),
    )
    .await;
    let took = started.elapsed();
    assert!(running.is_running());
    running.shutdown().await.unwrap();
    println!("[hanging] dedup: 9 events handled and the hanging one dead-lettered in {took:?}");
    let error = header(&dead[0], "dlq_error").unwrap_or_default();
    assert!(
        error.contains("did not return within 500ms") && error.contains("failed 2 times"),
        "{error}"
    );
}

/// Issue 22 item 5, inbox mode: the processor's timed-out call is a failed
/// attempt, the row backs off and is parked; the other keys go on.
#[sqlx::test(migrations = false)]
async fn inbox_a_handler_that_never_returns_times_out_and_is_parked(pool: PgPool) {
    prepare(&pool).await;
    create_topic(HangingInbox::TOPIC, 1).await;
    let group = unique_group("hanging-inbox");
    start_group_at(&group, HangingInbox::TOPIC, 1, true).await;
    let events = with_culprit_at(10, 4, HangingInbox::new);
    let ids: Vec<Uuid> = events.iter().map(|e| e.event_id).collect();
    produce_before_start(&events).await;
    let running = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_hanging_inbox)
        .mode(Mode::Inbox)
        .processors(1)
        .handler_timeout(Duration::from_millis(500))
        .max_attempts(2)
        .backoff(txoutbox_core::Backoff::new(
            Duration::from_millis(10),
            Duration::from_millis(50),
        ))
        .processor_poll_interval(Duration::from_millis(20))
        .build()
        .unwrap()
        .spawn();
    eventually(
        "the 9 other events handled and the hanging one parked",
        Duration::from_secs(30),
        || async {
            let parked: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM inbox_event WHERE event_id = ANY($1) AND parked_at IS NOT NULL",
            )
            .bind(&ids)
            .fetch_one(&pool)
            .await
            .unwrap();
            effects(&pool).await == 9 && parked == 1
        },
    )
    .await;
    assert!(running.is_running());
    running.shutdown().await.unwrap();
    let error: String = sqlx::query_scalar(
        "SELECT last_error FROM inbox_event WHERE event_id = ANY($1) AND parked_at IS NOT NULL",
    )
    .bind(&ids)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(error.contains("did not return within 500ms"), "{error}");
}

#[event_handler]
async fn on_undeliverable(
    tx: &mut Transaction<'_, Postgres>,
    event: Undeliverable,
) -> Result<(), sqlx::Error> {
    insert_effect(tx, event.event_id, event.amount).await
}

/// Issue 22 item 3: a record that must be dead-lettered, but whose headers
/// alone exceed what the dead-letter producer may send (so the broker never
/// takes it, with or without its value). Before the fix it was retried in
/// the receive loop until the broker accepted it, which it never does: every
/// partition waited. Now it is parked in `consumer_dead_letter` after a
/// bounded retry, its offset is stored, and both partitions go on.
#[sqlx::test(migrations = false)]
async fn a_dead_letter_the_broker_refuses_is_parked_and_nothing_waits(pool: PgPool) {
    prepare(&pool).await;
    create_topic(Undeliverable::TOPIC, 2).await;
    let group = unique_group("undeliverable");
    start_group_at(&group, Undeliverable::TOPIC, 2, true).await;
    let producer = producer();
    // Not JSON, so it is to be dead-lettered; 1.2 MB of headers.
    let huge = "h".repeat(1_200_000);
    let headers = OwnedHeaders::new()
        .insert(Header {
            key: "event_type",
            value: Some("Undeliverable"),
        })
        .insert(Header {
            key: "padding",
            value: Some(huge.as_str()),
        });
    producer
        .send(
            FutureRecord::<str, [u8]>::to(Undeliverable::TOPIC)
                .partition(0)
                .key("bad")
                .payload(b"not json {")
                .headers(headers),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)
        .expect("produce the bad record");
    let mut healthy = Vec::new();
    for i in 0..10 {
        let event = Undeliverable::new(i);
        produce_to(&producer, &event, (i % 2) as i32).await;
        healthy.push(event.event_id);
    }
    let started = Instant::now();
    let running = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_undeliverable)
        .backoff(txoutbox_core::Backoff::new(
            Duration::from_millis(10),
            Duration::from_millis(50),
        ))
        .build()
        .unwrap()
        .spawn();
    eventually(
        "the healthy events of both partitions handled",
        Duration::from_secs(30),
        || async { effects(&pool).await == 10 },
    )
    .await;
    // Later events, fetched while the bad record is being dealt with, flow
    // as well (before the fix, the receive loop never took another batch).
    for i in 10..20 {
        let event = Undeliverable::new(i);
        produce_to(&producer, &event, (i % 2) as i32).await;
        healthy.push(event.event_id);
    }
    let end = high_watermarks(Undeliverable::TOPIC, 2).await;
    eventually(
        "the events produced afterwards handled as well",
        Duration::from_secs(30),
        || async { effects(&pool).await == 20 },
    )
    .await;
    let healthy_done = started.elapsed();
    eventually(
        "the bad record parked and every offset committed",
        Duration::from_secs(60),
        || async {
            count(&pool, "SELECT count(*) FROM consumer_dead_letter").await == 1
                && committed(&group, Undeliverable::TOPIC, 2).await == end
        },
    )
    .await;
    let parked_at = started.elapsed();
    println!(
        "[undeliverable] 20 healthy events of both partitions handled {healthy_done:?} after the \
         start; the refused dead letter parked and every offset committed after {parked_at:?}"
    );
    assert!(running.is_running());
    running.shutdown().await.unwrap();
    let (reason, publish_error, value, partition): (String, String, Option<Vec<u8>>, i32) =
        sqlx::query_as(
            "SELECT reason, publish_error, record_value, partition FROM consumer_dead_letter",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(reason, "not_json");
    assert!(
        publish_error.to_lowercase().contains("too large"),
        "{publish_error}"
    );
    assert_eq!(value.as_deref(), Some(&b"not json {"[..]));
    assert_eq!(partition, 0);
    let status = txoutbox_runtime::ops::status::collect(&pool, 10)
        .await
        .unwrap();
    assert_eq!(status.consumer_dead_letters.unpublished, 1);
}
