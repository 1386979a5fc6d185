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
use txoutbox_runtime::consumer::{Consumer, ConsumerBuilder, Mode, event_handler};
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
test_event!(Slow, "consumer-test.misbehaving.slow", "Slow");
test_event!(
    SlowInbox,
    "consumer-test.misbehaving.slow-inbox",
    "SlowInbox"
);
test_event!(
    SlowShutdown,
    "consumer-test.misbehaving.slow-shutdown",
    "SlowShutdown"
);
test_event!(
    SlowRebalance,
    "consumer-test.misbehaving.slow-rebalance",
    "SlowRebalance"
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

/// How long the slow handler takes for the culprit: well within the handler
/// timeout, so the call succeeds, late.
const SLOW: Duration = Duration::from_millis(2_500);

/// How long the culprit's handler takes in the shutdown test: long enough
/// for the healthy event to be handled and the shutdown to start meanwhile,
/// however loaded the machine.
const SLOW_AT_SHUTDOWN: Duration = Duration::from_secs(6);

/// Takes `slow` for the culprit, then records; records the others at once.
async fn slow_or_record(
    tx: &mut Transaction<'_, Postgres>,
    event_id: Uuid,
    amount: i64,
    slow: Duration,
) -> Result<(), sqlx::Error> {
    if amount == CULPRIT {
        tokio::time::sleep(slow).await;
    }
    insert_effect(tx, event_id, amount).await
}

#[event_handler]
async fn on_slow(tx: &mut Transaction<'_, Postgres>, event: Slow) -> Result<(), sqlx::Error> {
    slow_or_record(tx, event.event_id, event.amount, SLOW).await
}

#[event_handler]
async fn on_slow_inbox(
    tx: &mut Transaction<'_, Postgres>,
    event: SlowInbox,
) -> Result<(), sqlx::Error> {
    slow_or_record(tx, event.event_id, event.amount, SLOW).await
}

#[event_handler]
async fn on_slow_shutdown(
    tx: &mut Transaction<'_, Postgres>,
    event: SlowShutdown,
) -> Result<(), sqlx::Error> {
    slow_or_record(tx, event.event_id, event.amount, SLOW_AT_SHUTDOWN).await
}

#[event_handler]
async fn on_slow_rebalance(
    tx: &mut Transaction<'_, Postgres>,
    event: SlowRebalance,
) -> Result<(), sqlx::Error> {
    slow_or_record(tx, event.event_id, event.amount, SLOW).await
}

/// A fresh group on `topic` (two partitions, created unless it exists),
/// starting at its end.
async fn slow_topic_group(topic: &str, tag: &str) -> String {
    create_topic(topic, 2).await;
    let group = unique_group(tag);
    start_group_at(&group, topic, 2, true).await;
    group
}

/// Produces `event` to partition 1 and waits until it took effect: the
/// consumer has joined its group and handles. Returns its offset.
async fn warm_up<E: DomainEvent>(
    pool: &PgPool,
    producer: &FutureProducer,
    event: &E,
    event_id: Uuid,
) -> i64 {
    let offset = produce_to(producer, event, 1).await;
    eventually(
        "the warm-up event handled",
        Duration::from_secs(30),
        || async { effect_counts(pool, &[event_id]).await == [1] },
    )
    .await;
    offset
}

/// What [`one_slow_partition`] saw.
struct SlowPartition {
    /// The longest a healthy event of partition 1 took from its produce to
    /// its effect, while partition 0's handler was slow.
    worst_healthy: Duration,
    /// Partition 0's committed offset while its slow event was in flight.
    committed_while_slow: i64,
    /// The slow event's offset.
    culprit_offset: i64,
}

/// Events produced behind the slow one on its partition: more than the
/// consumer's `batch_size` ([`SLOW_BATCH`]), so that they fill what may
/// wait for the slow batch and the partition is paused.
const BEHIND: i64 = 60;

/// The consumers' `batch_size` in the slow-handler tests.
const SLOW_BATCH: usize = 20;

/// A consumer of a two-partition topic whose handler takes [`SLOW`] for one
/// event of partition 0, followed there by [`BEHIND`] events; while it runs,
/// healthy events go to partition 1. Checks that partition 0's events took
/// effect in offset order, every event exactly once, and that the group's
/// offsets reach the end of both partitions; reports what the healthy
/// events waited.
async fn one_slow_partition<E: DomainEvent>(
    pool: &PgPool,
    consumer: ConsumerBuilder,
    group: &str,
    make: impl Fn(i64) -> (E, Uuid),
) -> SlowPartition {
    let running = consumer.batch_size(SLOW_BATCH).build().unwrap().spawn();
    let producer = producer();
    let (first, warm_up_id) = make(1);
    warm_up(pool, &producer, &first, warm_up_id).await;
    let (culprit, culprit_id) = make(CULPRIT);
    let culprit_offset = produce_to(&producer, &culprit, 0).await;
    // Partition 0 after the culprit: these wait for it, in order.
    let behind: Vec<(E, Uuid)> = (0..BEHIND).map(|i| make(2_000 + i)).collect();
    let mut end = [0, 0];
    for (event, _) in &behind {
        end[0] = produce_to(&producer, event, 0).await + 1;
    }
    let healthy = produce_healthy(&producer, &make, Duration::from_millis(150)).await;
    end[1] = healthy.end;
    // The culprit's handler is still running (about 1.2 s of its 2.5 s went
    // by): nothing of partition 0 may be committed past it.
    let committed_while_slow = committed(group, E::TOPIC, 2).await[0];
    let mut partition_0 = vec![culprit_id];
    partition_0.extend(behind.iter().map(|(_, id)| *id));
    until_each_took_effect(
        pool,
        "the events behind the culprit handled",
        &partition_0,
        Duration::from_secs(30),
    )
    .await;
    // Past the last event of each partition (not `start` plus the events
    // sent: tansu's offsets may leave gaps).
    eventually("the offsets committed", Duration::from_secs(15), || async {
        committed(group, E::TOPIC, 2).await == end
    })
    .await;
    assert!(running.is_running());
    running.shutdown().await.unwrap();
    let mut all = vec![warm_up_id];
    all.extend(&partition_0);
    all.extend(&healthy.ids);
    assert_once_in_order(pool, &all, &partition_0).await;
    let worst_healthy = worst_delay(pool, &healthy.ids, &healthy.produced_at).await;
    SlowPartition {
        worst_healthy,
        committed_while_slow,
        culprit_offset,
    }
}

/// A slow handler (not hung: it returns within the handler timeout) holds
/// its own partition only: batches of different partitions run at once,
/// each in its own transaction, and the slow partition's backlog (more
/// than a batch) waits paused instead of stopping the receive loop. One
/// batch at a time, as before, the healthy partition waits for the slow
/// call; the contrast shows the scenario tells the two apart.
#[sqlx::test(migrations = false)]
async fn dedup_a_slow_handler_holds_only_its_own_partition(pool: PgPool) {
    prepare(&pool).await;
    let make = |amount| {
        let event = Slow::new(amount);
        let id = event.event_id;
        (event, id)
    };
    let mut worst = Vec::new();
    for concurrent in [1, 4] {
        let group = slow_topic_group(Slow::TOPIC, "slow").await;
        let consumer = Consumer::builder(pool.clone(), kafka_config(), &group)
            .handler(on_slow)
            .concurrent_batches(concurrent);
        let seen = one_slow_partition(&pool, consumer, &group, make).await;
        assert!(
            seen.committed_while_slow <= seen.culprit_offset,
            "partition 0 committed at {} past its slow event at {}",
            seen.committed_while_slow,
            seen.culprit_offset
        );
        worst.push(seen.worst_healthy);
    }
    println!(
        "[slow] dedup: worst delay of partition 1 while partition 0's handler took {SLOW:?}: \
         {:?} one batch at a time, {:?} with 4 batches at once",
        worst[0], worst[1]
    );
    assert!(
        worst[0] >= Duration::from_secs(1),
        "one batch at a time, the healthy partition waited only {:?}: the scenario does not hold it",
        worst[0]
    );
    assert!(
        worst[1] < Duration::from_secs(1),
        "a healthy partition waited {:?} behind another partition's slow handler",
        worst[1]
    );
}

/// The same in inbox mode, whose store handles on receipt: a slow handler
/// holds the store of its own partition only.
#[sqlx::test(migrations = false)]
async fn inbox_a_slow_handler_on_receipt_holds_only_its_own_partition(pool: PgPool) {
    prepare(&pool).await;
    let group = slow_topic_group(SlowInbox::TOPIC, "slow-inbox").await;
    let consumer = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_slow_inbox)
        .mode(Mode::Inbox);
    let seen = one_slow_partition(&pool, consumer, &group, |amount| {
        let event = SlowInbox::new(amount);
        let id = event.event_id;
        (event, id)
    })
    .await;
    println!(
        "[slow] inbox: worst delay of partition 1 while partition 0's handler took {SLOW:?}: {:?}",
        seen.worst_healthy
    );
    assert!(seen.committed_while_slow <= seen.culprit_offset);
    assert!(
        seen.worst_healthy < Duration::from_secs(1),
        "a healthy partition waited {:?} behind another partition's slow handler",
        seen.worst_healthy
    );
}

/// Shutdown while a batch is in flight waits for it: the slow event
/// commits, its offset is committed, and a consumer started afterwards
/// handles what waited behind it, once.
#[sqlx::test(migrations = false)]
async fn dedup_shutdown_waits_for_the_batches_in_flight(pool: PgPool) {
    prepare(&pool).await;
    let group = slow_topic_group(SlowShutdown::TOPIC, "slow-shutdown").await;
    let consumer = || {
        Consumer::builder(pool.clone(), kafka_config(), &group)
            .handler(on_slow_shutdown)
            .build()
            .unwrap()
            .spawn()
    };
    let running = consumer();
    let producer = producer();
    let first = SlowShutdown::new(1);
    warm_up(&pool, &producer, &first, first.event_id).await;
    let culprit = SlowShutdown::new(CULPRIT);
    let behind = SlowShutdown::new(2);
    let healthy = SlowShutdown::new(3);
    let culprit_offset = produce_to(&producer, &culprit, 0).await;
    let slow_from = Instant::now();
    let behind_offset = produce_to(&producer, &behind, 0).await;
    let healthy_offset = produce_to(&producer, &healthy, 1).await;
    eventually(
        "the healthy event handled while the slow one runs",
        Duration::from_secs(30),
        || async { effect_counts(&pool, &[healthy.event_id]).await == [1] },
    )
    .await;
    assert_eq!(
        effect_counts(&pool, &[culprit.event_id]).await,
        [0],
        "the slow event committed before the healthy one was handled"
    );
    let summary = running.shutdown().await.unwrap();
    assert!(
        slow_from.elapsed() >= SLOW_AT_SHUTDOWN,
        "shutdown returned before the batch in flight ended"
    );
    assert!(summary.clean);
    assert_eq!(effect_counts(&pool, &[culprit.event_id]).await, [1]);
    // The slow event's offset is committed (the one behind it too if it
    // came in the same fetch, and so in the same batch; otherwise it waited
    // for that batch, was never taken, and comes again after the restart).
    let offsets = committed(&group, SlowShutdown::TOPIC, 2).await;
    assert!(
        offsets[0] == culprit_offset + 1 || offsets[0] == behind_offset + 1,
        "partition 0 committed at {}: the slow event is at {culprit_offset}",
        offsets[0]
    );
    assert_eq!(offsets[1], healthy_offset + 1);
    let again = consumer();
    eventually(
        "the event behind handled after the restart",
        Duration::from_secs(30),
        || async { effect_counts(&pool, &[behind.event_id]).await == [1] },
    )
    .await;
    again.shutdown().await.unwrap();
    assert_eq!(
        effect_counts(
            &pool,
            &[
                first.event_id,
                culprit.event_id,
                behind.event_id,
                healthy.event_id
            ]
        )
        .await,
        [1, 1, 1, 1]
    );
}

/// A rebalance while a slow batch is in flight: a second consumer joins the
/// group while the first one's handler runs. Whoever gets partition 0 takes
/// the slow event again (its offset was never stored) and finds it done or
/// waits for the first transaction's row; what the first batch decided is
/// not applied to the partition's new state. Every event takes effect once,
/// the group's offsets reach the end, and both consumers stop cleanly.
#[sqlx::test(migrations = false)]
async fn dedup_a_rebalance_during_a_slow_batch_loses_and_repeats_nothing(pool: PgPool) {
    prepare(&pool).await;
    let group = slow_topic_group(SlowRebalance::TOPIC, "slow-rebalance").await;
    let consumer = || {
        Consumer::builder(pool.clone(), kafka_config(), &group)
            .handler(on_slow_rebalance)
            .build()
            .unwrap()
            .spawn()
    };
    let first = consumer();
    let producer = producer();
    let early = SlowRebalance::new(1);
    let mut end = [
        0,
        warm_up(&pool, &producer, &early, early.event_id).await + 1,
    ];
    let mut ids = vec![early.event_id];
    let culprit = SlowRebalance::new(CULPRIT);
    end[0] = produce_to(&producer, &culprit, 0).await + 1;
    ids.push(culprit.event_id);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = consumer();
    // Events on both partitions through the rebalance.
    for i in 0..20 {
        let event = SlowRebalance::new(100 + i);
        let partition = i % 2;
        end[partition as usize] = produce_to(&producer, &event, partition as i32).await + 1;
        ids.push(event.event_id);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eventually("every event handled", Duration::from_secs(40), || async {
        effect_counts(&pool, &ids).await.iter().all(|&n| n >= 1)
    })
    .await;
    eventually("the offsets committed", Duration::from_secs(20), || async {
        committed(&group, SlowRebalance::TOPIC, 2).await == end
    })
    .await;
    let (a, b) = (
        first.shutdown().await.unwrap(),
        second.shutdown().await.unwrap(),
    );
    assert!(a.clean && b.clean);
    assert_eq!(effect_counts(&pool, &ids).await, vec![1; ids.len()]);
    println!(
        "[slow] rebalance during a slow batch: first consumer handled {}, second {}, duplicates {}",
        a.handled,
        b.handled,
        a.duplicates + b.duplicates
    );
}
