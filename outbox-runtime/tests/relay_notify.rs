//! Optional LISTEN/NOTIFY wake-ups: a relay that polls rarely publishes rows
//! written by another connection (as another process would, without the
//! in-process commit signal) at once when the trigger is installed, not
//! before, and again after its listening connection was killed.
//!
//! Only this file's tests run in this binary, so nothing else in the process
//! sends the in-process commit signal.

mod relay_support;

use std::time::{Duration, Instant};

use relay_support::*;
use sqlx::{Connection, PgConnection, PgPool};
use txoutbox_runtime::ops::notify;
use txoutbox_runtime::relay::Relay;

/// Inserts one row on a connection of its own, without the in-process
/// wake-up (which a writer in another process cannot send).
async fn insert_elsewhere(pool: &PgPool, topic: &str) -> i64 {
    let mut conn = PgConnection::connect_with(&pool.connect_options())
        .await
        .unwrap();
    let id = sqlx::query_scalar(
        "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type, payload,
                                   topic, partition_key)
         VALUES (gen_random_uuid(), 'Order', 'k', 'OrderCreated', '{}', $1, 'k')
         RETURNING id",
    )
    .bind(topic)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();
    id
}

async fn published(pool: &PgPool, id: i64) -> bool {
    sqlx::query_scalar("SELECT published_at IS NOT NULL FROM outbox_event WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// How long until row `id` is published, if within `limit`.
async fn published_within(pool: &PgPool, id: i64, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if published(pool, id).await {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// The relay's idle wait doubles from 5 ms while polls find nothing: after
/// 6 s without work it is in a wait of about 5 s (from ~5.1 s to ~10.2 s), so
/// a row inserted now is not found by a poll within the next 3 s.
const IDLE: Duration = Duration::from_secs(6);
const PROMPT: Duration = Duration::from_secs(1);

#[sqlx::test(migrations = false)]
async fn notifications_wake_a_relay_for_commits_of_other_processes(pool: PgPool) {
    migrated(&pool).await;
    let brokers = brokers();
    let topic = unique_topic("notify");
    create_topic(&brokers, &topic, 1).await;
    let relay = Relay::builder(pool.clone(), kafka_config(&brokers))
        .poll_interval(Duration::from_secs(60))
        .rebalance_interval(Duration::from_secs(120))
        .listen_notify(true)
        .spawn()
        .unwrap();

    // Without the trigger the relay sees the row only at its next poll.
    tokio::time::sleep(IDLE).await;
    let id = insert_elsewhere(&pool, &topic).await;
    assert_eq!(
        published_within(&pool, id, PROMPT).await,
        None,
        "no trigger: the row waits for the next poll"
    );
    eventually("the poll publishes it", Duration::from_secs(15), || {
        published(&pool, id)
    })
    .await;

    // With the trigger, a commit elsewhere wakes the relay at once.
    notify::enable(&pool).await.unwrap();
    assert!(notify::is_enabled(&pool).await.unwrap());
    tokio::time::sleep(IDLE).await;
    let id = insert_elsewhere(&pool, &topic).await;
    let took = published_within(&pool, id, PROMPT).await;
    assert!(took.is_some(), "notified: published within {PROMPT:?}");

    // The listening connection is killed: the relay reconnects and is
    // notified again.
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
         WHERE datname = current_database() AND query ILIKE 'LISTEN%'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(killed, 1, "one listening connection, the relay's");
    tokio::time::sleep(IDLE).await;
    let id = insert_elsewhere(&pool, &topic).await;
    let again = published_within(&pool, id, PROMPT).await;
    assert!(again.is_some(), "notified after reconnecting");

    let summary = relay.shutdown().await.unwrap();
    assert!(summary.clean);
    assert_eq!(summary.published, 3);
    eprintln!("notified publish took {took:?}, after reconnect {again:?}");
}

#[sqlx::test(migrations = false)]
async fn a_relay_without_listen_notify_ignores_the_trigger(pool: PgPool) {
    migrated(&pool).await;
    notify::enable(&pool).await.unwrap();
    let brokers = brokers();
    let topic = unique_topic("no-listen");
    create_topic(&brokers, &topic, 1).await;
    let relay = Relay::builder(pool.clone(), kafka_config(&brokers))
        .poll_interval(Duration::from_secs(60))
        .rebalance_interval(Duration::from_secs(120))
        .spawn()
        .unwrap();
    tokio::time::sleep(IDLE).await;
    let id = insert_elsewhere(&pool, &topic).await;
    assert_eq!(published_within(&pool, id, PROMPT).await, None);
    let listeners: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND query ILIKE 'LISTEN%'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(listeners, 0, "listen_notify is off by default");
    relay.shutdown().await.unwrap();
}
