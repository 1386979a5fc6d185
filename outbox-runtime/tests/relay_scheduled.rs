//! Scheduled delivery: events recorded with `record_after` / `record_at`
//! wait in `outbox_scheduled` and are published by the relay not before
//! their due time, soon after it; cancelled ones never; a rolled-back
//! transaction schedules nothing; per-key order holds among due messages;
//! a restarted relay publishes what became due while it was down; two
//! relays move each scheduled message exactly once.
#![allow(missing_docs)]

mod relay_support;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use relay_support::*;
use sqlx::PgPool;
use txoutbox_core::Backoff;
use txoutbox_core::{Events, cancel_scheduled, insert_events, transaction};
use txoutbox_runtime::relay::{Relay, RelayHandle};
use uuid::Uuid;

// A fixed topic (the derive needs a literal): the tests below that use it
// look their events up by event id in the database, never read the topic.
txoutbox_testkit::test_event!(Reminder, "relay-test.scheduled.reminders", "Reminder");

const TYPED_TOPIC: &str = "relay-test.scheduled.reminders";

fn relay(pool: &PgPool) -> RelayHandle {
    Relay::builder(pool.clone(), kafka_config(&brokers()))
        .poll_interval(Duration::from_millis(100))
        .schedule_poll_interval(Duration::from_millis(100))
        .spawn()
        .unwrap()
}

/// Schedules `events` in one statement (the relay side of the feature, on a
/// topic of the test's own), each due `due_in_ms[i]` after the database's
/// `now()`; returns their event ids, in recording order.
async fn schedule(pool: &PgPool, events: &[NewEvent], due_in_ms: &[i64]) -> Vec<Uuid> {
    assert_eq!(events.len(), due_in_ms.len());
    let ids: Vec<Uuid> = events.iter().map(|_| Uuid::now_v7()).collect();
    let payloads: Vec<serde_json::Value> = events
        .iter()
        .zip(&ids)
        .map(|(e, id)| serde_json::json!({"event_id": id.to_string(), "key": e.key, "seq": e.seq}))
        .collect();
    let topics: Vec<&str> = events.iter().map(|e| e.topic.as_str()).collect();
    let keys: Vec<&str> = events.iter().map(|e| e.key.as_str()).collect();
    sqlx::query(
        "INSERT INTO outbox_scheduled (event_id, aggregate_type, aggregate_id, event_type, payload,
                                       topic, partition_key, deliver_after)
         SELECT e.id, 'Order', e.key, 'OrderReminder', e.payload, e.topic, e.key,
                now() + e.due_ms * interval '1 millisecond'
         FROM unnest($1::uuid[], $2::jsonb[], $3::text[], $4::text[], $5::bigint[])
              WITH ORDINALITY AS e(id, payload, topic, key, due_ms, n)
         ORDER BY e.n",
    )
    .bind(&ids)
    .bind(&payloads)
    .bind(&topics)
    .bind(&keys)
    .bind(due_in_ms)
    .execute(pool)
    .await
    .unwrap();
    ids
}

async fn still_scheduled(pool: &PgPool) -> i64 {
    txoutbox_testkit::count(pool, "SELECT count(*) FROM outbox_scheduled").await
}

/// The outbox row of `event_id`: (published, published_at >= deliver_after,
/// lateness in seconds), or `None` if it is not in `outbox_event`.
async fn outbox_row(pool: &PgPool, event_id: Uuid) -> Option<(bool, Option<bool>, Option<f64>)> {
    sqlx::query_as(
        "SELECT published_at IS NOT NULL, published_at >= deliver_after,
                EXTRACT(EPOCH FROM published_at - deliver_after)::float8
         FROM outbox_event WHERE event_id = $1",
    )
    .bind(event_id)
    .fetch_optional(pool)
    .await
    .unwrap()
}

async fn is_published(pool: &PgPool, event_id: Uuid) -> bool {
    outbox_row(pool, event_id)
        .await
        .is_some_and(|(published, ..)| published)
}

#[sqlx::test(migrations = false)]
async fn a_delayed_event_is_published_not_before_its_time_and_soon_after(pool: PgPool) {
    migrated(&pool).await;
    create_topic(&brokers(), TYPED_TOPIC, 1).await;
    let relay = relay(&pool);

    let (now, later) = (Reminder::new(1), Reminder::new(2));
    let (now_id, later_id) = (now.event_id, later.event_id);
    let recorded_due = transaction(&pool)
        .run(async |_tx, events| {
            events.record(now.clone());
            events.record_after(later.clone(), Duration::from_millis(300));
            Ok::<_, txoutbox_core::Error>(events.scheduled()[0].deliver_after)
        })
        .await
        .unwrap();

    // Committed: the delayed event waits in its own table (due in 300 ms;
    // the commit was a moment ago), the immediate one goes out at once.
    let stored_due: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT deliver_after FROM outbox_scheduled WHERE event_id = $1")
            .bind(later_id)
            .fetch_one(&pool)
            .await
            .expect("still scheduled right after the commit");
    assert_eq!(
        stored_due.timestamp_micros(),
        recorded_due.timestamp_micros(),
        "stored as recorded"
    );
    eventually(
        "the immediate event published",
        Duration::from_secs(10),
        || is_published(&pool, now_id),
    )
    .await;

    eventually(
        "the delayed event published",
        Duration::from_secs(10),
        || is_published(&pool, later_id),
    )
    .await;
    let (_, not_early, lateness) = outbox_row(&pool, later_id).await.unwrap();
    let lateness = lateness.unwrap();
    assert_eq!(
        not_early,
        Some(true),
        "published {lateness} s after its due time"
    );
    assert!(lateness < 2.0, "published {lateness} s late");
    let (immediate_due,): (Option<chrono::DateTime<chrono::Utc>>,) =
        sqlx::query_as("SELECT deliver_after FROM outbox_event WHERE event_id = $1")
            .bind(now_id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(immediate_due, None, "only moved rows carry a due time");
    assert_eq!(still_scheduled(&pool).await, 0);

    let summary = relay.shutdown().await.unwrap();
    assert_eq!((summary.published, summary.scheduled_moved), (2, 1));
}

#[sqlx::test(migrations = false)]
async fn an_event_cancelled_before_its_time_is_never_published(pool: PgPool) {
    migrated(&pool).await;
    create_topic(&brokers(), TYPED_TOPIC, 1).await;
    let relay = relay(&pool);

    let (kept, cancelled) = (Reminder::new(1), Reminder::new(2));
    let (kept_id, cancelled_id) = (kept.event_id, cancelled.event_id);
    let due = chrono::Utc::now() + chrono::TimeDelta::milliseconds(600);
    transaction(&pool)
        .run(async |_tx, events| {
            events.record_at(kept.clone(), due);
            events.record_at(cancelled.clone(), due);
            Ok::<_, txoutbox_core::Error>(())
        })
        .await
        .unwrap();

    let mut tx = pool.begin().await.unwrap();
    assert!(cancel_scheduled(&mut tx, cancelled_id).await.unwrap());
    tx.commit().await.unwrap();

    eventually("the other event published", Duration::from_secs(10), || {
        is_published(&pool, kept_id)
    })
    .await;
    // A few more scheduler passes: nothing else comes.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(outbox_row(&pool, cancelled_id).await, None);
    assert_eq!(still_scheduled(&pool).await, 0);

    let mut conn = pool.acquire().await.unwrap();
    assert!(
        !cancel_scheduled(&mut conn, cancelled_id).await.unwrap(),
        "cancelled already"
    );
    assert!(
        !cancel_scheduled(&mut conn, kept_id).await.unwrap(),
        "moved into the outbox and published: too late"
    );
    assert!(!cancel_scheduled(&mut conn, Uuid::new_v4()).await.unwrap());
    drop(conn);

    let summary = relay.shutdown().await.unwrap();
    assert_eq!((summary.published, summary.scheduled_moved), (1, 1));
}

#[derive(Debug, thiserror::Error)]
#[error("rejected")]
struct Rejected;

impl From<txoutbox_core::Error> for Rejected {
    fn from(_: txoutbox_core::Error) -> Self {
        Self
    }
}

#[sqlx::test(migrations = false)]
async fn a_rolled_back_transaction_schedules_nothing(pool: PgPool) {
    migrated(&pool).await;
    let result = transaction(&pool)
        .run(async |_tx, events| {
            events.record_after(Reminder::new(1), Duration::ZERO);
            events.record_at(Reminder::new(2), chrono::Utc::now());
            Err::<(), _>(Rejected)
        })
        .await;
    assert!(result.is_err());

    // By hand: inserted, then rolled back.
    let mut events = Events::new();
    events.record_after(Reminder::new(3), Duration::ZERO);
    events.record(Reminder::new(4));
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(insert_events(&mut tx, &events).await.unwrap(), 2);
    tx.rollback().await.unwrap();

    // The test helper rolls back too, and reports what was scheduled.
    let run = txoutbox_core::testing::record_events(&pool, async |_tx, events| {
        events.record_after(Reminder::new(5), Duration::from_secs(60));
    })
    .await
    .unwrap();
    assert_eq!(run.scheduled().len(), 1);
    assert_eq!(run.assert_count::<Reminder>(1)[0].amount, 5);

    assert_eq!(still_scheduled(&pool).await, 0);
    assert_eq!(unpublished(&pool).await, 0);
}

#[sqlx::test(migrations = false)]
async fn per_key_order_holds_among_due_messages(pool: PgPool) {
    migrated(&pool).await;
    let brokers = brokers();
    let topic = unique_topic("scheduled-order");
    create_topic(&brokers, &topic, 3).await;

    // Key "k": one scheduled message due in 1.5 s, then immediate messages
    // of the same key. They are not held back by the future one.
    let future = schedule(&pool, &[NewEvent::new(&topic, "k", 100)], &[1_500]).await;
    let immediate = insert(
        &pool,
        &(0..3)
            .map(|i| NewEvent::new(&topic, "k", i))
            .collect::<Vec<_>>(),
    )
    .await;
    // 2,500 messages of 5 keys all due at the same time (more than one move
    // batch): they go out in recording order within each key.
    let same_time: Vec<NewEvent> = (0..2_500)
        .map(|i| NewEvent::new(&topic, format!("s{}", i % 5), i))
        .collect();
    let same_time_ids = schedule(&pool, &same_time, &vec![300; same_time.len()]).await;

    let relay = relay(&pool);
    eventually(
        "the immediate messages published",
        Duration::from_secs(10),
        || async {
            let mut all = true;
            for id in &immediate {
                all &= is_published(&pool, *id).await;
            }
            all
        },
    )
    .await;
    assert!(
        !is_published(&pool, future[0]).await,
        "the future message is not due yet"
    );
    eventually("everything published", Duration::from_secs(30), || async {
        still_scheduled(&pool).await == 0 && unpublished(&pool).await == 0
    })
    .await;
    let summary = relay.shutdown().await.unwrap();
    assert_eq!(summary.scheduled_moved, 2_501);

    let received = read_topic(&brokers, &topic, 2_504, Duration::from_secs(30)).await;
    let mut seqs_by_key: HashMap<String, Vec<i64>> = HashMap::new();
    for record in &received {
        seqs_by_key
            .entry(record.key.clone())
            .or_default()
            .push(record.value["seq"].as_i64().unwrap());
    }
    assert_eq!(
        seqs_by_key["k"],
        [0, 1, 2, 100],
        "the scheduled message takes its place at its due time"
    );
    for key in 0..5 {
        let seqs = &seqs_by_key[&format!("s{key}")];
        let expected: Vec<i64> = (0..2_500).filter(|i| i % 5 == key).collect();
        assert_eq!(seqs, &expected, "key s{key} in recording order");
    }
    let published: HashSet<Uuid> = received.iter().map(|r| r.event_id()).collect();
    assert!(same_time_ids.iter().all(|id| published.contains(id)));
}

#[sqlx::test(migrations = false)]
async fn a_restarted_relay_publishes_what_became_due_while_it_was_down(pool: PgPool) {
    migrated(&pool).await;
    let topic = unique_topic("scheduled-restart");
    create_topic(&brokers(), &topic, 2).await;
    let events: Vec<NewEvent> = (0..20)
        .map(|i| NewEvent::new(&topic, format!("k{}", i % 4), i))
        .collect();
    let ids = schedule(&pool, &events, &[400; 20]).await;

    let first = relay(&pool);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let summary = first.shutdown().await.unwrap();
    assert_eq!(summary.scheduled_moved, 0, "stopped before the due time");
    let status = txoutbox_runtime::ops::status::collect(&pool, 1)
        .await
        .unwrap();
    let waiting = status
        .tables
        .iter()
        .find(|t| t.table == "outbox_scheduled")
        .expect("outbox status lists the scheduled events");
    assert_eq!(waiting.rows, 20);

    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        still_scheduled(&pool).await,
        20,
        "nobody moved them meanwhile"
    );

    let second = relay(&pool);
    eventually(
        "published after the restart",
        Duration::from_secs(10),
        || async { still_scheduled(&pool).await == 0 && unpublished(&pool).await == 0 },
    )
    .await;
    let summary = second.shutdown().await.unwrap();
    assert_eq!((summary.scheduled_moved, summary.published), (20, 20));
    for id in ids {
        let (published, not_early, _) = outbox_row(&pool, id).await.unwrap();
        assert!(published && not_early == Some(true));
    }
}

#[sqlx::test(migrations = false)]
async fn two_relays_move_and_publish_each_scheduled_message_once(pool: PgPool) {
    migrated(&pool).await;
    let brokers = brokers();
    let topic = unique_topic("scheduled-two-relays");
    create_topic(&brokers, &topic, 4).await;
    // 3,000 messages of 30 keys, due over 1.5 s from 200 ms on.
    let n = 3_000;
    let events: Vec<NewEvent> = (0..n)
        .map(|i| NewEvent::new(&topic, format!("k{}", i % 30), i))
        .collect();
    let due: Vec<i64> = (0..n).map(|i| 200 + i / 2).collect();
    let ids = schedule(&pool, &events, &due).await;

    let (a, b) = (relay(&pool), relay(&pool));
    eventually("everything published", Duration::from_secs(30), || async {
        still_scheduled(&pool).await == 0 && unpublished(&pool).await == 0
    })
    .await;
    let (a, b) = (a.shutdown().await.unwrap(), b.shutdown().await.unwrap());
    assert_eq!(
        a.scheduled_moved + b.scheduled_moved,
        n as u64,
        "moved once in all: {a:?} {b:?}"
    );

    let (rows, distinct, early): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT event_id), count(*) FILTER (WHERE published_at < deliver_after)
         FROM outbox_event WHERE deliver_after IS NOT NULL",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((rows, distinct, early), (n, n, 0));

    let received = read_topic(&brokers, &topic, n as usize, Duration::from_secs(30)).await;
    let mut seen: HashMap<Uuid, usize> = HashMap::new();
    for record in &received {
        *seen.entry(record.event_id()).or_default() += 1;
    }
    assert!(
        ids.iter().all(|id| seen.get(id) == Some(&1)),
        "each once on the topic: {} of {n} missing, {} more than once",
        ids.iter().filter(|id| !seen.contains_key(id)).count(),
        seen.values().filter(|&&count| count > 1).count()
    );
    assert_eq!(received.len(), n as usize);
}

#[sqlx::test(migrations = false)]
async fn database_errors_do_not_stop_the_scheduler(pool: PgPool) {
    migrated(&pool).await;
    let topic = unique_topic("scheduled-db-errors");
    create_topic(&brokers(), &topic, 1).await;
    let ids = schedule(&pool, &[NewEvent::new(&topic, "k", 0)], &[500]).await;
    let relay = Relay::builder(pool.clone(), kafka_config(&brokers()))
        .schedule_poll_interval(Duration::from_millis(100))
        .database_timeout(Duration::from_secs(1))
        .error_backoff(Backoff::new(
            Duration::from_millis(100),
            Duration::from_millis(300),
        ))
        .spawn()
        .unwrap();

    // The scheduler's statements wait for this lock past database_timeout:
    // each pass fails, is counted, and is retried after a backoff.
    let mut blocker = pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE outbox_scheduled IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *blocker)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    assert!(relay.summary().errors >= 1, "{:?}", relay.summary());
    assert_eq!(relay.summary().scheduled_moved, 0);
    assert!(relay.is_running());
    blocker.rollback().await.unwrap();

    eventually(
        "published once the table is free",
        Duration::from_secs(10),
        || is_published(&pool, ids[0]),
    )
    .await;
    let summary = relay.shutdown().await.unwrap();
    assert_eq!((summary.scheduled_moved, summary.published), (1, 1));
}
