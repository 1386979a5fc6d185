//! The operator operations (`txoutbox_runtime::ops`) on MariaDB (feature
//! `mysql`), against the machine's server (`MYSQL_URL`, default
//! `mysql://root@127.0.0.1:3306/test`; each test creates and drops its own
//! database) and, for the relays and the inbox consumer, the real broker:
//! status of an empty and a filled outbox, its thresholds, the live relays
//! with the lanes each holds; the inbox's status (backlog, failing, parked,
//! discarded rows, keys no processor claims), the dedup table and the
//! consumers' refused dead letters, and a schema migrated before the
//! consumer tables; dead letters listed, retried and discarded, outbox and
//! inbox, a retried inbox row's key moved back to it (a real inbox consumer
//! then processes it), waiting for a processor at its key's head; retention
//! deleting only published (and discarded) rows, dedup rows and processed
//! (and discarded) inbox rows older than the cutoff, in batches, past rows
//! others hold, an event id in two groups on a batch boundary. The saga
//! operations on MariaDB are in `ops_mysql_sagas.rs`, replay in
//! `ops_mysql_replay.rs`.
#![allow(missing_docs)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chrono::{TimeDelta, Utc};
use consumer_support::{kafka_config, produce, producer, start_group_at};
use rdkafka::producer::FutureProducer;
use sqlx::{MySql, MySqlPool, Transaction};
use txoutbox_core::{Backoff, DomainEvent};
use txoutbox_runtime::consumer::{Consumer, ConsumerHandle, HandlerError, Mode, event_handler};
use txoutbox_runtime::ops::cleanup::{self, Purge, Target};
use txoutbox_runtime::ops::dead_letters::{self, Selection, Table};
use txoutbox_runtime::ops::status::{self, Status, Thresholds};
use txoutbox_runtime::ops::{Database, OpsError};
use txoutbox_runtime::relay::{Relay, RelayHandle};
use txoutbox_testkit::broker::{brokers, client_config, create_topic, unique_group, unique_topic};
use txoutbox_testkit::mysql::MySqlScratch;
use txoutbox_testkit::{eventually, init_tracing, test_event};
use uuid::Uuid;

mod consumer_support;
mod ops_mysql_support;

use ops_mysql_support::{
    InboxRow, Row, count, key_entries, lock_row, lock_where, rebuild_keys, release,
};

/// What a migrated MariaDB does not have: nothing.
const NOT_ON_MARIADB: [&str; 0] = [];

async fn scratch(connections: u32) -> MySqlScratch {
    init_tracing();
    let scratch = MySqlScratch::create(connections).await;
    txoutbox_runtime::migrations::run(&scratch.pool)
        .await
        .unwrap();
    scratch
}

/// Runs `op` and fails if it takes longer than `limit`: nothing here may
/// wait for a lock a relay holds (InnoDB would wait 50 s).
async fn quick<T>(what: &str, limit: Duration, op: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, op)
        .await
        .unwrap_or_else(|_| panic!("{what} waited for a lock"))
}

#[tokio::test]
async fn status_of_an_empty_and_a_filled_outbox_and_its_thresholds() {
    let db = scratch(4).await;
    let pool = &db.pool;

    let empty = status::collect(pool, 5).await.unwrap();
    let outbox = &empty.outbox;
    assert_eq!(
        (
            outbox.pending,
            outbox.failing,
            outbox.parked,
            outbox.discarded
        ),
        (0, 0, 0, 0)
    );
    assert!(outbox.oldest_pending_at.is_none() && outbox.oldest_pending_age_secs.is_none());
    assert!(outbox.topics.is_empty() && outbox.parked_rows.is_empty());
    assert!(empty.relays.is_empty());
    let tables: Vec<(&str, i64, bool)> = empty
        .tables
        .iter()
        .map(|t| (t.table.as_str(), t.rows, t.estimated))
        .collect();
    assert_eq!(
        tables,
        [
            ("outbox_event", 0, false),
            ("outbox_scheduled", 0, false),
            ("inbox_event", 0, false),
            ("processed_event", 0, false)
        ]
    );
    assert!(empty.tables.iter().all(|t| t.total_bytes > 0));
    // Every part is measured.
    assert_eq!(empty.not_on_this_database, NOT_ON_MARIADB);
    assert_eq!((empty.inbox.pending, empty.inbox.parked), (0, 0));
    assert!(empty.sagas.is_empty() && empty.inbox_unclaimed.is_empty());
    assert_eq!(empty.consumer_dead_letters.unpublished, 0);
    let json = serde_json::to_value(&empty).unwrap();
    assert!(
        json.get("not_on_this_database").is_none(),
        "left out, as on PostgreSQL: {json}"
    );
    let strict = Thresholds {
        max_backlog: Some(0),
        max_age: Some(Duration::from_secs(1)),
        max_parked: Some(0),
        max_inbox_backlog: Some(0),
        max_inbox_age: Some(Duration::ZERO),
        max_saga_age: Some(Duration::ZERO),
    };
    assert!(
        strict.check(&empty).is_empty(),
        "an empty outbox is healthy"
    );

    // Three pending rows (one failing), one parked, one discarded, two
    // published; two events scheduled for tomorrow.
    let (_, oldest) = Row::new("orders").created(3_600).insert(pool).await;
    let (failing_id, _) = Row::new("orders")
        .created(60)
        .failing(2, "broker transport failure")
        .insert(pool)
        .await;
    Row::new("payments").insert(pool).await;
    let (parked_id, parked_event) = Row::new("orders")
        .created(120)
        .parked(30, 10, "message too large")
        .insert(pool)
        .await;
    Row::new("orders")
        .created(7_200)
        .parked(600, 10, "unknown topic")
        .discarded(5)
        .insert(pool)
        .await;
    for _ in 0..2 {
        Row::new("orders").published(100, 90).insert(pool).await;
    }
    for _ in 0..2 {
        sqlx::query(
            "INSERT INTO outbox_scheduled (event_id, aggregate_type, aggregate_id, event_type,
                 payload, topic, partition_key, deliver_after)
             VALUES (?, 'Order', 'k', 'OrderTimedOut', '{}', 'orders', 'k',
                     UTC_TIMESTAMP(6) + INTERVAL 1 DAY)",
        )
        .bind(Uuid::now_v7())
        .execute(pool)
        .await
        .unwrap();
    }

    let filled = status::collect(pool, 10).await.unwrap();
    let outbox = &filled.outbox;
    assert_eq!(
        outbox.pending, 3,
        "published, parked and discarded rows do not count"
    );
    let topics: Vec<_> = outbox
        .topics
        .iter()
        .map(|t| (t.topic.as_deref().unwrap(), t.pending))
        .collect();
    assert_eq!(topics, [("orders", 2), ("payments", 1)]);
    let age = outbox.oldest_pending_age_secs.unwrap();
    assert!((3_600.0..3_700.0).contains(&age), "age {age}");
    let oldest_at: chrono::DateTime<Utc> =
        sqlx::query_scalar("SELECT created_at FROM outbox_event WHERE event_id = ?")
            .bind(oldest)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(outbox.oldest_pending_at, Some(oldest_at));
    assert_eq!(outbox.failing, 1);
    assert_eq!(outbox.failing_rows.len(), 1);
    assert_eq!(outbox.failing_rows[0].id, Some(failing_id));
    assert_eq!(outbox.failing_rows[0].attempts, 2);
    assert_eq!(
        outbox.failing_rows[0].last_error.as_deref(),
        Some("broker transport failure")
    );
    assert_eq!((outbox.parked, outbox.discarded), (1, 1));
    let parked = &outbox.parked_rows[0];
    assert_eq!(outbox.parked_rows.len(), 1);
    assert_eq!(
        (parked.id, parked.event_id, parked.attempts),
        (Some(parked_id), parked_event, 10)
    );
    assert_eq!(parked.last_error.as_deref(), Some("message too large"));
    assert!(parked.parked_at.is_some() && parked.topic.as_deref() == Some("orders"));
    let tables: Vec<(&str, i64, bool)> = filled
        .tables
        .iter()
        .map(|t| (t.table.as_str(), t.rows, t.estimated))
        .collect();
    assert_eq!(
        tables[..2],
        [("outbox_event", 7, false), ("outbox_scheduled", 2, false)],
        "the scheduled events not due yet are counted"
    );
    let sampled = status::collect(pool, 0).await.unwrap();
    assert!(sampled.outbox.parked_rows.is_empty() && sampled.outbox.failing_rows.is_empty());
    assert_eq!(sampled.outbox.parked, 1);

    assert!(Thresholds::default().check(&filled).is_empty());
    let within = Thresholds {
        max_backlog: Some(3),
        max_age: Some(Duration::from_secs(7_200)),
        max_parked: Some(1),
        ..Thresholds::default()
    };
    assert!(within.check(&filled).is_empty(), "limits are inclusive");
    let exceeded = Thresholds {
        max_backlog: Some(2),
        max_age: Some(Duration::from_secs(1_800)),
        max_parked: Some(0),
        // An empty inbox is within its limits; sagas, which this
        // database does not have, are never exceeded.
        max_inbox_backlog: Some(0),
        max_inbox_age: Some(Duration::ZERO),
        max_saga_age: Some(Duration::ZERO),
    };
    let breaches = exceeded.check(&filled);
    let names: Vec<_> = breaches.iter().map(|b| b.threshold).collect();
    assert_eq!(names, ["max-backlog", "max-parked", "max-age"]);
    assert_eq!(
        breaches[0].to_string(),
        "max-backlog exceeded: 3 unpublished events (limit 2)"
    );
    assert_eq!(
        breaches[1].to_string(),
        "max-parked exceeded: 1 parked events (limit 0)"
    );
    assert!(
        breaches[2]
            .to_string()
            .starts_with("max-age exceeded: oldest unpublished event is 36"),
        "{}",
        breaches[2]
    );
    db.drop().await;
}

fn relay(pool: &MySqlPool, lanes: u32) -> RelayHandle {
    Relay::builder(pool.clone(), client_config(&brokers()))
        .lanes(lanes)
        .rebalance_interval(Duration::from_millis(100))
        .poll_interval(Duration::from_millis(50))
        .spawn()
        .unwrap()
}

/// `(backend pid, lanes owned)` of each listed relay, oldest member first.
fn owned(status: &Status) -> Vec<(i64, i64)> {
    status
        .relays
        .iter()
        .map(|r| (r.backend_pid, r.lanes_owned))
        .collect()
}

#[tokio::test]
async fn status_lists_the_live_relays_and_the_lanes_each_holds() {
    let db = scratch(8).await;
    let pool = &db.pool;
    // Lock names carry the database's name, shortened and hashed beyond 40
    // characters: the scratch database's name takes that path, so finding
    // the relays below shows that status names the locks as the relay does.
    assert!(db.name.len() > 40, "{}", db.name);
    let topic = unique_topic("ops-mysql-relays");
    create_topic(&brokers(), &topic, 3).await;
    for key in 0..40 {
        let mut row = Row::new(&topic).created(30);
        row.key = format!("key-{}", key % 10);
        row.insert(pool).await;
    }
    // A row of a session that ended without leaving: not a live member.
    sqlx::query(
        "INSERT INTO outbox_relay_member (backend_pid, session_id, lanes, lease_ms, host,
             process_id, joined_at, heartbeat_at)
         VALUES (2147483000, ?, 8, 10000, 'gone', 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
    )
    .bind(Uuid::new_v4())
    .execute(pool)
    .await
    .unwrap();
    assert!(
        status::collect(pool, 5).await.unwrap().relays.is_empty(),
        "a member whose session holds no member lock is not live"
    );

    let first = relay(pool, 8);
    eventually(
        "one relay holding all 8 lanes, every row published",
        Duration::from_secs(30),
        || async {
            let status = status::collect(pool, 5).await.unwrap();
            owned(&status).len() == 1
                && status.relays[0].lanes_owned == 8
                && status.outbox.pending == 0
        },
    )
    .await;
    let status = status::collect(pool, 5).await.unwrap();
    let member = &status.relays[0];
    let backend_pid: i64 =
        sqlx::query_scalar("SELECT backend_pid FROM outbox_relay_member WHERE host <> 'gone'")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(member.backend_pid, backend_pid);
    assert_eq!(member.process_id, i64::from(std::process::id()));
    assert!(!member.host.is_empty() && member.host != "gone");
    assert_eq!((member.lanes, member.lease_secs), (8, 10.0));
    assert!(
        (0.0..10.0).contains(&member.renewed_secs_ago),
        "{}",
        member.renewed_secs_ago
    );
    assert!(!member.lease_expired);
    assert!(member.broker_failing_since.is_none() && member.held_topics.is_empty());
    assert_eq!(
        count(
            pool,
            "SELECT COUNT(*) FROM outbox_event WHERE published_at IS NULL"
        )
        .await,
        0,
        "the relay published to the broker"
    );
    let healthy = Thresholds {
        max_backlog: Some(0),
        max_age: Some(Duration::from_secs(1)),
        max_parked: Some(0),
        ..Thresholds::default()
    };
    assert!(healthy.check(&status).is_empty());

    // A second relay: the lanes are shared, four each.
    let second = relay(pool, 8);
    eventually(
        "two relays holding four lanes each",
        Duration::from_secs(30),
        || async {
            let lanes = owned(&status::collect(pool, 5).await.unwrap());
            lanes.len() == 2 && lanes.iter().all(|(_, owned)| *owned == 4)
        },
    )
    .await;
    let both = status::collect(pool, 5).await.unwrap();
    assert_ne!(both.relays[0].backend_pid, both.relays[1].backend_pid);
    assert_eq!(
        both.relays[0].backend_pid, member.backend_pid,
        "the oldest member first"
    );

    // The second leaves: the first takes its lanes back.
    let summary = second.shutdown().await.unwrap();
    assert!(summary.clean);
    eventually(
        "the first relay alone again, with all 8 lanes",
        Duration::from_secs(30),
        || async {
            let status = status::collect(pool, 5).await.unwrap();
            owned(&status) == [(member.backend_pid, 8)]
        },
    )
    .await;
    assert!(first.shutdown().await.unwrap().clean);
    assert!(status::collect(pool, 5).await.unwrap().relays.is_empty());
    db.drop().await;
}

#[tokio::test]
async fn dead_letters_list_retry_and_discard_parked_rows() {
    let db = scratch(4).await;
    let pool = &db.pool;
    let (first, first_event) = Row::new("orders")
        .created(600)
        .parked(300, 10, "message too large")
        .insert(pool)
        .await;
    let (second, second_event) = Row::new("orders")
        .created(500)
        .parked(200, 9, "invalid record")
        .insert(pool)
        .await;
    let (_, third_event) = Row::new("orders")
        .created(400)
        .parked(100, 10, "message too large")
        .insert(pool)
        .await;
    let (_, payments_event) = Row::new("payments")
        .created(300)
        .parked(50, 10, "unknown topic")
        .insert(pool)
        .await;
    let (pending, _) = Row::new("orders").insert(pool).await;
    Row::new("orders").published(60, 50).insert(pool).await;

    let all = dead_letters::list(pool, Table::Outbox, &Selection::All, 100)
        .await
        .unwrap();
    let listed: Vec<Uuid> = all.iter().map(|r| r.event_id).collect();
    assert_eq!(
        listed,
        [first_event, second_event, third_event, payments_event],
        "parked rows only, the longest parked first"
    );
    assert_eq!(all[0].id, Some(first));
    assert_eq!(all[0].attempts, 10);
    assert_eq!(all[0].last_error.as_deref(), Some("message too large"));
    assert!(all.iter().all(|r| r.parked_at.is_some()));
    let limited = dead_letters::list(pool, Table::Outbox, &Selection::All, 2)
        .await
        .unwrap();
    assert_eq!(limited.len(), 2);
    let by_topic = Selection::Topic("orders".into());
    assert_eq!(
        dead_letters::count(pool, Table::Outbox, &by_topic)
            .await
            .unwrap(),
        3
    );
    assert_eq!(
        dead_letters::count(pool, Table::Outbox, &Selection::Ids(vec![second, pending]))
            .await
            .unwrap(),
        1,
        "a pending row is no dead letter"
    );
    assert_eq!(
        dead_letters::count(pool, Table::Outbox, &Selection::Ids(Vec::new()))
            .await
            .unwrap(),
        0
    );
    let by_event = dead_letters::list(
        pool,
        Table::Outbox,
        &Selection::EventIds(vec![payments_event, third_event]),
        100,
    )
    .await
    .unwrap();
    assert_eq!(
        by_event.iter().map(|r| r.event_id).collect::<Vec<_>>(),
        [third_event, payments_event]
    );
    assert!(
        dead_letters::topic_exists(pool, Table::Outbox, "payments")
            .await
            .unwrap()
    );
    assert!(
        !dead_letters::topic_exists(pool, Table::Outbox, "paymnets")
            .await
            .unwrap()
    );

    // A relay holds the pending row (its claim, its settlement): retry and
    // discard never wait for it, as they read it without locking.
    let relay_lock = lock_row(&db, pending).await;
    let limit = Duration::from_secs(5);
    let retried = quick(
        "retry",
        limit,
        dead_letters::retry(
            pool,
            Table::Outbox,
            &Selection::EventIds(vec![second_event]),
        ),
    )
    .await
    .unwrap();
    assert_eq!(retried, [second_event]);
    type Time = Option<chrono::DateTime<Utc>>;
    let (parked_at, attempts, next_attempt_at, last_error): (Time, i32, Time, Option<String>) =
        sqlx::query_as(
            "SELECT parked_at, attempts, next_attempt_at, last_error FROM outbox_event
             WHERE id = ?",
        )
        .bind(second)
        .fetch_one(pool)
        .await
        .unwrap();
    assert!(parked_at.is_none() && next_attempt_at.is_none());
    assert_eq!(attempts, 0, "attempts start again");
    assert_eq!(
        last_error.as_deref(),
        Some("invalid record"),
        "why it was parked stays until the next attempt"
    );

    let discarded = quick(
        "discard",
        limit,
        dead_letters::discard(pool, Table::Outbox, &Selection::Ids(vec![first])),
    )
    .await
    .unwrap();
    assert_eq!(discarded, [first_event]);
    let (parked, discarded_recently): (i64, i64) = sqlx::query_as(
        "SELECT parked_at IS NOT NULL,
                discarded_at BETWEEN UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE AND UTC_TIMESTAMP(6)
         FROM outbox_event WHERE id = ?",
    )
    .bind(first)
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(
        (parked, discarded_recently),
        (1, 1),
        "a discarded row stays parked, by the database clock"
    );
    assert_eq!(
        count(
            pool,
            "SELECT COUNT(*) FROM outbox_event WHERE published_at IS NOT NULL"
        )
        .await,
        1,
        "discarding publishes nothing"
    );
    let again = quick(
        "retry of a discarded row",
        limit,
        dead_letters::retry(pool, Table::Outbox, &Selection::Ids(vec![first, second])),
    )
    .await
    .unwrap();
    assert!(
        again.is_empty(),
        "discarded and retried rows are no dead letters"
    );
    let left = dead_letters::list(pool, Table::Outbox, &Selection::All, 100)
        .await
        .unwrap();
    assert_eq!(
        left.iter().map(|r| r.event_id).collect::<Vec<_>>(),
        [third_event, payments_event]
    );
    let by_topic_retried = quick(
        "retry by topic",
        limit,
        dead_letters::retry(pool, Table::Outbox, &Selection::Topic("payments".into())),
    )
    .await
    .unwrap();
    assert_eq!(by_topic_retried, [payments_event]);
    release(relay_lock).await;

    let status = status::collect(pool, 5).await.unwrap();
    assert_eq!(
        (
            status.outbox.parked,
            status.outbox.discarded,
            status.outbox.pending
        ),
        (1, 1, 3)
    );
    db.drop().await;
}

#[tokio::test]
async fn cleanup_deletes_only_published_rows_older_than_the_cutoff() {
    let db = scratch(4).await;
    let pool = &db.pool;
    // 25 rows published nine days ago, all at the same instant: the walk's
    // keyset, (published_at, id), must break the ties by id.
    let published_at: chrono::DateTime<Utc> =
        sqlx::query_scalar("SELECT UTC_TIMESTAMP(6) - INTERVAL 9 DAY")
            .fetch_one(pool)
            .await
            .unwrap();
    let mut old = Vec::new();
    for _ in 0..25 {
        let (id, _) = Row::new("orders").created(10 * 86_400).insert(pool).await;
        old.push(id);
    }
    let ids = serde_json::to_string(&old).unwrap();
    sqlx::query(
        "UPDATE outbox_event SET published_at = ?
         WHERE id IN (SELECT j.id FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT PATH '$')) j)",
    )
    .bind(published_at)
    .bind(&ids)
    .execute(pool)
    .await
    .unwrap();
    // Kept: published recently, unpublished however old, parked however
    // old, discarded recently.
    for _ in 0..3 {
        Row::new("orders")
            .published(7_200, 3_600)
            .insert(pool)
            .await;
    }
    let mut unpublished = Vec::new();
    for _ in 0..4 {
        unpublished.push(Row::new("orders").created(30 * 86_400).insert(pool).await.0);
    }
    for _ in 0..2 {
        Row::new("orders")
            .created(30 * 86_400)
            .parked(20 * 86_400, 10, "message too large")
            .insert(pool)
            .await;
    }
    Row::new("orders")
        .created(30 * 86_400)
        .parked(20 * 86_400, 10, "message too large")
        .discarded(3_600)
        .insert(pool)
        .await;
    // Deleted by the discarded target: discarded nine days ago.
    for _ in 0..2 {
        Row::new("orders")
            .created(30 * 86_400)
            .parked(20 * 86_400, 10, "unknown topic")
            .discarded(9 * 86_400)
            .insert(pool)
            .await;
    }
    assert_eq!(count(pool, "SELECT COUNT(*) FROM outbox_event").await, 37);

    let now = Database::from(pool).now().await.unwrap();
    let skew = (Utc::now() - now).num_seconds().abs();
    assert!(skew < 5, "the database clock, in UTC: {now} ({skew}s off)");
    let cutoff = now - TimeDelta::days(7);
    assert_eq!(
        cleanup::count(pool, Target::PublishedOutbox, cutoff)
            .await
            .unwrap(),
        25
    );
    assert_eq!(
        cleanup::count(pool, Target::DiscardedOutbox, cutoff)
            .await
            .unwrap(),
        2
    );

    // A row someone else holds is skipped, not waited for; so is every
    // unpublished row a relay holds.
    let held = lock_row(&db, old[7]).await;
    let relay_lock = lock_row(&db, unpublished[0]).await;
    let mut batches = Vec::new();
    let started = Instant::now();
    let mut purge = Purge::new(Target::PublishedOutbox, cutoff).batch_size(4);
    let deleted = quick(
        "a purge",
        Duration::from_secs(5),
        purge.run(pool, |batch| batches.push(batch)),
    )
    .await
    .unwrap();
    let took = started.elapsed();
    assert!(purge.is_done());
    assert_eq!(deleted, 24, "every eligible row but the held one");
    assert_eq!(
        batches,
        [4, 3, 4, 4, 4, 4, 1],
        "batches of four, the held row skipped in the second"
    );
    assert_eq!(
        purge.step(pool).await.unwrap(),
        0,
        "a finished pass stays done"
    );
    release(held).await;
    release(relay_lock).await;
    let mut again = Purge::new(Target::PublishedOutbox, cutoff).batch_size(4);
    assert_eq!(
        again.run(pool, |_| {}).await.unwrap(),
        1,
        "the next run takes it"
    );

    let mut discarded = Purge::new(Target::DiscardedOutbox, cutoff);
    assert_eq!(discarded.run(pool, |_| {}).await.unwrap(), 2);

    let left: Vec<(i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT CAST(SUM(published_at IS NOT NULL) AS SIGNED),
                CAST(SUM(published_at IS NULL AND parked_at IS NULL) AS SIGNED),
                CAST(SUM(parked_at IS NOT NULL AND discarded_at IS NULL) AS SIGNED),
                CAST(SUM(discarded_at IS NOT NULL) AS SIGNED)
         FROM outbox_event",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(
        left,
        [(3, 4, 2, 1)],
        "kept: 3 published recently, 4 unpublished, 2 parked, 1 discarded recently"
    );
    eprintln!("purged 24 rows in 7 batches of at most 4 in {took:?}");
    db.drop().await;
}

/// A dedup row of `group` processed `ago` seconds ago; returns its event id.
async fn processed_row(pool: &MySqlPool, group: &str, ago: i64) -> Uuid {
    let event_id = Uuid::now_v7();
    sqlx::query(
        "INSERT INTO processed_event (consumer_group, event_id, processed_at)
         VALUES (?, ?, UTC_TIMESTAMP(6) - INTERVAL ? SECOND)",
    )
    .bind(group.as_bytes())
    .bind(event_id)
    .bind(ago)
    .execute(pool)
    .await
    .unwrap();
    event_id
}

/// A message a consumer of `group` could not dead-letter, kept in
/// `consumer_dead_letter` (republished `republished` or not).
async fn refused_dead_letter(pool: &MySqlPool, group: &str, offset: i64, republished: bool) {
    sqlx::query(
        "INSERT INTO consumer_dead_letter (consumer_group, topic, `partition`, `offset`,
             record_key, record_value, headers, reason, error, dead_letter_topic,
             publish_error, parked_at, republished_at)
         VALUES (?, 'payments', 1, ?, 'k', 'not json', '[]', 'not_json', 'expected value',
                 'payments.dlq', 'Broker: Unknown topic or partition',
                 UTC_TIMESTAMP(6) - INTERVAL 90 SECOND,
                 IF(?, UTC_TIMESTAMP(6), NULL))",
    )
    .bind(group.as_bytes())
    .bind(offset)
    .bind(republished)
    .execute(pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn status_reads_the_inbox_the_dedup_table_and_the_refused_dead_letters() {
    let db = scratch(4).await;
    let pool = &db.pool;
    // Group billing on payments: two rows of k1, a failing row of k2, a
    // row without a key, a parked and a discarded row of k3, two processed.
    let (p1, _) = InboxRow::new("billing", "payments", Some("k1"))
        .received(120)
        .insert(pool)
        .await;
    InboxRow::new("billing", "payments", Some("k1"))
        .received(60)
        .insert(pool)
        .await;
    let (failing, _) = InboxRow::new("billing", "payments", Some("k2"))
        .received(30)
        .failing(2, "lock wait timeout", 60)
        .insert(pool)
        .await;
    InboxRow::new("billing", "payments", None)
        .received(10)
        .insert(pool)
        .await;
    let (parked, _) = InboxRow::new("billing", "payments", Some("k3"))
        .received(300)
        .parked(200, 3, "handler panicked")
        .insert(pool)
        .await;
    InboxRow::new("billing", "payments", Some("k3"))
        .received(400)
        .parked(350, 3, "handler panicked")
        .discarded(100)
        .insert(pool)
        .await;
    for ago in [50, 40] {
        InboxRow::new("billing", "payments", Some("k4"))
            .received(ago + 5)
            .processed(ago)
            .insert(pool)
            .await;
    }
    // Group audit on orders: one pending row of a type no running processor
    // handles, one processed.
    let (audit, _) = InboxRow::new("audit", "orders", Some("k1"))
        .event_type("OrderAudited")
        .received(600)
        .insert(pool)
        .await;
    InboxRow::new("audit", "orders", Some("k9"))
        .event_type("OrderAudited")
        .received(700)
        .processed(650)
        .insert(pool)
        .await;
    rebuild_keys(pool).await;
    assert_eq!(count(pool, "SELECT COUNT(*) FROM inbox_key").await, 4);
    // billing's processor runs and handles PaymentTaken; audit has none.
    sqlx::query(
        "INSERT INTO inbox_processor (consumer_group, instance_id, host, handled, heartbeat_ms)
         VALUES ('billing', ?, 'vm', '[[\"payments\", \"PaymentTaken\"]]', 5000)",
    )
    .bind(Uuid::new_v4())
    .execute(pool)
    .await
    .unwrap();
    for ago in [10, 20, 30] {
        processed_row(pool, "billing", ago).await;
    }
    refused_dead_letter(pool, "billing", 42, false).await;
    refused_dead_letter(pool, "billing", 43, true).await;

    let status = status::collect(pool, 10).await.unwrap();
    let inbox = &status.inbox;
    assert_eq!(
        inbox.pending, 5,
        "four of billing, one of audit; parked, discarded and processed rows do not count"
    );
    let topics: Vec<_> = inbox
        .topics
        .iter()
        .map(|t| (t.topic.as_deref().unwrap(), t.pending))
        .collect();
    assert_eq!(topics, [("orders", 1), ("payments", 4)]);
    let age = inbox.oldest_pending_age_secs.unwrap();
    assert!((600.0..700.0).contains(&age), "age {age}");
    let oldest: chrono::DateTime<Utc> =
        sqlx::query_scalar("SELECT received_at FROM inbox_event WHERE event_id = ?")
            .bind(audit)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(inbox.oldest_pending_at, Some(oldest));
    assert_eq!(
        inbox.topics[1].oldest_pending_at.map(|at| at < oldest),
        Some(false)
    );
    assert_eq!((inbox.failing, inbox.parked, inbox.discarded), (1, 1, 1));
    let row = &inbox.failing_rows[..];
    assert_eq!(row.len(), 1);
    assert_eq!(
        (row[0].id, row[0].event_id, row[0].attempts),
        (None, failing, 2)
    );
    assert_eq!(row[0].last_error.as_deref(), Some("lock wait timeout"));
    assert!(row[0].next_attempt_at.is_some() && row[0].parked_at.is_none());
    let row = &inbox.parked_rows[..];
    assert_eq!(row.len(), 1);
    assert_eq!(
        (row[0].id, row[0].event_id, row[0].attempts),
        (None, parked, 3)
    );
    assert_eq!(row[0].topic.as_deref(), Some("payments"));
    assert_eq!(row[0].event_type.as_deref(), Some("PaymentTaken"));
    assert_eq!(row[0].last_error.as_deref(), Some("handler panicked"));
    assert!(row[0].parked_at.is_some());
    assert_ne!(row[0].event_id, p1);

    // audit's key waits for a processor that handles its head's type.
    let unclaimed: Vec<_> = status
        .inbox_unclaimed
        .iter()
        .map(|u| {
            (
                u.consumer_group.as_str(),
                u.topic.as_str(),
                u.event_type.as_deref(),
                u.keys,
                u.rows,
            )
        })
        .collect();
    assert_eq!(unclaimed, [("audit", "orders", Some("OrderAudited"), 1, 1)]);
    assert_eq!(status.inbox_unclaimed[0].oldest_received_at, Some(oldest));

    let dead = &status.consumer_dead_letters;
    assert_eq!(dead.unpublished, 1, "the republished one does not count");
    assert_eq!(dead.rows.len(), 1);
    let kept = &dead.rows[0];
    assert_eq!(
        (
            kept.consumer_group.as_str(),
            kept.topic.as_str(),
            kept.partition,
            kept.offset
        ),
        ("billing", "payments", 1, 42)
    );
    assert_eq!(
        (kept.reason.as_str(), kept.dead_letter_topic.as_str()),
        ("not_json", "payments.dlq")
    );
    assert_eq!(kept.publish_error, "Broker: Unknown topic or partition");
    assert_eq!(dead.oldest_parked_at, Some(kept.parked_at));

    let tables: Vec<(&str, i64, bool)> = status
        .tables
        .iter()
        .map(|t| (t.table.as_str(), t.rows, t.estimated))
        .collect();
    assert_eq!(
        tables,
        [
            ("outbox_event", 0, false),
            ("outbox_scheduled", 0, false),
            ("inbox_event", 10, false),
            ("processed_event", 3, false),
            ("consumer_dead_letter", 2, false),
        ]
    );
    assert_eq!(status.not_on_this_database, NOT_ON_MARIADB);
    let sampled = status::collect(pool, 0).await.unwrap();
    assert!(sampled.inbox.failing_rows.is_empty() && sampled.inbox.parked_rows.is_empty());
    assert!(sampled.consumer_dead_letters.rows.is_empty());
    assert_eq!(sampled.consumer_dead_letters.unpublished, 1);

    let within = Thresholds {
        max_parked: Some(2),
        max_inbox_backlog: Some(5),
        max_inbox_age: Some(Duration::from_secs(900)),
        ..Thresholds::default()
    };
    assert!(within.check(&status).is_empty(), "limits are inclusive");
    let exceeded = Thresholds {
        max_parked: Some(1),
        max_inbox_backlog: Some(4),
        max_inbox_age: Some(Duration::from_secs(300)),
        ..Thresholds::default()
    };
    let breaches: Vec<String> = exceeded
        .check(&status)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(breaches.len(), 3, "{breaches:?}");
    assert_eq!(
        breaches[0], "max-parked exceeded: 2 parked events (limit 1)",
        "the inbox's parked row and the refused dead letter"
    );
    assert_eq!(
        breaches[1],
        "max-inbox-backlog exceeded: 5 unprocessed inbox events (limit 4)"
    );
    assert!(
        breaches[2].starts_with("max-inbox-age exceeded: oldest unprocessed inbox event is 6"),
        "{}",
        breaches[2]
    );

    // The dead letters of the inbox: the parked row, not the discarded one.
    let listed = dead_letters::list(pool, Table::Inbox, &Selection::All, 10)
        .await
        .unwrap();
    assert_eq!(
        listed.iter().map(|r| r.event_id).collect::<Vec<_>>(),
        [parked]
    );
    assert_eq!((listed[0].id, listed[0].attempts), (None, 3));
    for (selection, n) in [
        (Selection::All, 1),
        (Selection::Topic("payments".into()), 1),
        (Selection::Topic("orders".into()), 0),
        (Selection::EventIds(vec![parked, p1]), 1),
        (Selection::EventIds(Vec::new()), 0),
    ] {
        assert_eq!(
            dead_letters::count(pool, Table::Inbox, &selection)
                .await
                .unwrap(),
            n,
            "{selection:?}"
        );
    }
    for result in [
        dead_letters::count(pool, Table::Inbox, &Selection::Ids(vec![1])).await,
        dead_letters::retry(pool, Table::Inbox, &Selection::Ids(vec![1]))
            .await
            .map(|ids| ids.len() as i64),
    ] {
        let error = result.unwrap_err();
        assert!(matches!(error, OpsError::InboxRowsHaveNoId), "{error:?}");
    }
    assert!(
        dead_letters::topic_exists(pool, Table::Inbox, "orders")
            .await
            .unwrap()
    );
    assert!(
        !dead_letters::topic_exists(pool, Table::Inbox, "ordres")
            .await
            .unwrap()
    );
    db.drop().await;
}

#[tokio::test]
async fn status_of_a_schema_migrated_before_the_consumer_tables() {
    init_tracing();
    let db = MySqlScratch::create(2).await;
    let pool = &db.pool;
    // MySQL migrations 1 to 3: the outbox's tables only.
    for migration in &txoutbox_runtime::migrations::MYSQL_MIGRATIONS[..3] {
        sqlx::raw_sql(migration.sql).execute(pool).await.unwrap();
    }
    Row::new("orders").insert(pool).await;
    let status = status::collect(pool, 5).await.unwrap();
    assert_eq!(status.outbox.pending, 1);
    assert_eq!(
        status.not_on_this_database,
        [
            "inbox_event",
            "processed_event",
            "saga_state",
            "consumer_dead_letter"
        ],
        "named as missing, not measured"
    );
    assert_eq!((status.inbox.pending, status.inbox.parked), (0, 0));
    assert!(status.inbox_unclaimed.is_empty());
    assert_eq!(status.consumer_dead_letters.unpublished, 0);
    let tables: Vec<&str> = status.tables.iter().map(|t| t.table.as_str()).collect();
    assert_eq!(tables, ["outbox_event", "outbox_scheduled"]);
    // An operation on a missing table fails with the server's "doesn't
    // exist" (which the tool turns into "run `outbox migrate` first").
    let error = cleanup::count(pool, Target::ProcessedEvent, Utc::now())
        .await
        .unwrap_err();
    assert!(error.to_string().contains("doesn't exist"), "{error}");
    db.drop().await;
}

test_event!(RetryEvent, "ops-mysql.inbox-retry", "RetryEvent");

/// Whether the handler of [`RetryEvent`] refuses amount 13.
static REFUSING: AtomicBool = AtomicBool::new(true);

/// Records the event in `effect`; refuses amount 13 while [`REFUSING`].
#[event_handler]
async fn record_retried(
    tx: &mut Transaction<'_, MySql>,
    event: RetryEvent,
) -> Result<(), HandlerError> {
    if event.amount == 13 && REFUSING.load(Ordering::SeqCst) {
        return Err(HandlerError::new("amount 13 is refused"));
    }
    sqlx::query("INSERT INTO effect (event_id, order_id, amount) VALUES (?, ?, ?)")
        .bind(event.event_id)
        .bind(event.order_id)
        .bind(event.amount)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// An inbox consumer of `group` on MariaDB with [`record_retried`]: two
/// attempts, quick backoff and polls.
fn inbox_consumer(pool: &MySqlPool, group: &str) -> ConsumerHandle {
    Consumer::builder(pool.clone(), kafka_config(), group)
        .mode(Mode::Inbox)
        .max_attempts(2)
        .processors(2)
        .processor_poll_interval(Duration::from_millis(20))
        .backoff(Backoff::new(
            Duration::from_millis(10),
            Duration::from_millis(50),
        ))
        .handler(record_retried)
        .build()
        .unwrap()
        .spawn()
}

/// A [`RetryEvent`] of `amount` on the key `order_id`.
fn retry_event(order_id: Uuid, amount: i64) -> RetryEvent {
    RetryEvent {
        event_id: Uuid::new_v4(),
        order_id,
        amount,
    }
}

/// Produces `event` with its event type header, keyed by its order id or
/// (`keyed` false) without a key.
async fn produce_retry_event(producer: &FutureProducer, event: &RetryEvent, keyed: bool) {
    let record = txoutbox_core::OutboxRecord::from_event(event).unwrap();
    let value = serde_json::to_vec(&record.payload).unwrap();
    let key = keyed.then_some(record.partition_key.as_str());
    produce(
        producer,
        RetryEvent::TOPIC,
        key,
        &value,
        &[(
            txoutbox_core::wire::HEADER_EVENT_TYPE,
            RetryEvent::EVENT_TYPE,
        )],
    )
    .await;
}

/// The event ids with an effect, in the order they were applied.
async fn effects(pool: &MySqlPool) -> Vec<Uuid> {
    sqlx::query_scalar("SELECT event_id FROM effect ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// The `seq` of inbox row `event_id`.
async fn seq_of(pool: &MySqlPool, event_id: Uuid) -> i64 {
    sqlx::query_scalar("SELECT seq FROM inbox_event WHERE event_id = ?")
        .bind(event_id)
        .fetch_one(pool)
        .await
        .unwrap()
}

// Multi-threaded: the consumer runs while the test waits on the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_dead_letters_retried_go_back_to_their_keys_and_a_consumer_processes_them() {
    let db = scratch(8).await;
    let pool = &db.pool;
    sqlx::raw_sql(
        "CREATE TABLE effect (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
             event_id BINARY(16) NOT NULL, order_id BINARY(16), amount BIGINT NOT NULL)",
    )
    .execute(pool)
    .await
    .unwrap();
    consumer_support::create_topic(RetryEvent::TOPIC, 1).await;
    let group = unique_group("ops-mysql-inbox-retry");
    start_group_at(&group, RetryEvent::TOPIC, 1, true).await;
    REFUSING.store(true, Ordering::SeqCst);

    // Key a: its first row refused (parked), two rows behind it handled.
    // Key b: two refused rows. One refused row without a key. Key c: one
    // refused row, discarded below.
    let (a, b, c) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    let a1 = retry_event(a, 13);
    let behind = [retry_event(a, 1), retry_event(a, 2)];
    let (b1, b2) = (retry_event(b, 13), retry_event(b, 13));
    let keyless = retry_event(Uuid::new_v4(), 13);
    let c1 = retry_event(c, 13);
    let producer = producer();
    for event in [&a1, &behind[0], &behind[1], &b1, &b2, &c1] {
        produce_retry_event(&producer, event, true).await;
    }
    produce_retry_event(&producer, &keyless, false).await;

    let consumer = inbox_consumer(pool, &group);
    let parked_ids = [
        a1.event_id,
        b1.event_id,
        b2.event_id,
        keyless.event_id,
        c1.event_id,
    ];
    eventually(
        "five rows parked, the rows behind key a's handled, no key left",
        Duration::from_secs(60),
        || async {
            count(
                pool,
                "SELECT COUNT(*) FROM inbox_event WHERE parked_at IS NOT NULL",
            )
            .await
                == 5
                && effects(pool).await.len() == 2
                && count(pool, "SELECT COUNT(*) FROM inbox_key").await == 0
        },
    )
    .await;
    consumer.shutdown().await.unwrap();
    assert_eq!(
        effects(pool).await,
        [behind[0].event_id, behind[1].event_id],
        "a parked row holds back nothing behind it"
    );
    let status = status::collect(pool, 10).await.unwrap();
    assert_eq!((status.inbox.pending, status.inbox.parked), (0, 5));
    let listed = dead_letters::list(pool, Table::Inbox, &Selection::All, 10)
        .await
        .unwrap();
    let mut listed_ids: Vec<Uuid> = listed.iter().map(|r| r.event_id).collect();
    listed_ids.sort();
    let mut expected = parked_ids.to_vec();
    expected.sort();
    assert_eq!(listed_ids, expected);
    assert!(listed.iter().all(|r| {
        r.attempts == 2
            && r.last_error
                .as_deref()
                .is_some_and(|e| e.contains("amount 13 is refused"))
    }));

    // The handler is fixed; the consumer is stopped, so the entries stay as
    // the retries leave them.
    REFUSING.store(false, Ordering::SeqCst);
    let (sa1, sb1, sb2, skeyless) = (
        seq_of(pool, a1.event_id).await,
        seq_of(pool, b1.event_id).await,
        seq_of(pool, b2.event_id).await,
        seq_of(pool, keyless.event_id).await,
    );
    let retried = dead_letters::retry(pool, Table::Inbox, &Selection::EventIds(vec![a1.event_id]))
        .await
        .unwrap();
    assert_eq!(retried, [a1.event_id]);
    type Retried = (
        Option<chrono::DateTime<Utc>>,
        i32,
        Option<chrono::DateTime<Utc>>,
        Option<String>,
    );
    let (parked_at, attempts, next_attempt_at, last_error): Retried = sqlx::query_as(
        "SELECT parked_at, attempts, next_attempt_at, last_error FROM inbox_event
         WHERE event_id = ?",
    )
    .bind(a1.event_id)
    .fetch_one(pool)
    .await
    .unwrap();
    assert!(parked_at.is_none() && next_attempt_at.is_none());
    assert_eq!(attempts, 0);
    assert!(
        last_error.is_some_and(|e| e.contains("amount 13 is refused")),
        "kept"
    );
    let a_key = Some(a.to_string());
    let due = |key: &Option<String>, seq| (key.clone(), seq, Some("RetryEvent".to_owned()), false);
    assert_eq!(
        key_entries(pool, &group).await,
        [due(&a_key, sa1)],
        "key a has an entry again, at the retried row"
    );
    // Key b: its first row, then its second; the entry stays at the first,
    // the older of the two pending rows.
    let b_key = Some(b.to_string());
    assert!(sb1 < sb2);
    for (event, expected) in [(&b1, sb1), (&b2, sb1)] {
        let retried = dead_letters::retry(
            pool,
            Table::Inbox,
            &Selection::EventIds(vec![event.event_id]),
        )
        .await
        .unwrap();
        assert_eq!(retried, [event.event_id]);
        let entries = key_entries(pool, &group).await;
        assert!(entries.contains(&due(&b_key, expected)), "{entries:?}");
    }
    // The row without a key gets an entry of its own.
    let retried = dead_letters::retry(
        pool,
        Table::Inbox,
        &Selection::EventIds(vec![keyless.event_id]),
    )
    .await
    .unwrap();
    assert_eq!(retried, [keyless.event_id]);
    // Discarding changes no pending row: key c gets no entry.
    let discarded = dead_letters::discard(pool, Table::Inbox, &Selection::All)
        .await
        .unwrap();
    assert_eq!(discarded, [c1.event_id]);
    assert_eq!(
        key_entries(pool, &group).await,
        [due(&a_key, sa1), due(&b_key, sb1), due(&None, skeyless)]
    );
    let (still_parked, discarded_recently): (bool, bool) = sqlx::query_as(
        "SELECT parked_at IS NOT NULL,
                discarded_at BETWEEN UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE AND UTC_TIMESTAMP(6)
         FROM inbox_event WHERE event_id = ?",
    )
    .bind(c1.event_id)
    .fetch_one(pool)
    .await
    .unwrap();
    assert!(
        still_parked && discarded_recently,
        "a discarded row stays parked"
    );
    assert!(
        dead_letters::retry(
            pool,
            Table::Inbox,
            &Selection::EventIds(vec![c1.event_id, a1.event_id])
        )
        .await
        .unwrap()
        .is_empty(),
        "discarded and retried rows are no dead letters"
    );
    let status = status::collect(pool, 10).await.unwrap();
    assert_eq!(
        (
            status.inbox.pending,
            status.inbox.parked,
            status.inbox.discarded
        ),
        (4, 0, 1)
    );

    // A consumer of the group takes the retried rows up: each once, key b
    // in order, the discarded row never.
    let consumer = inbox_consumer(pool, &group);
    eventually(
        "the four retried rows handled, no key left",
        Duration::from_secs(60),
        || async {
            effects(pool).await.len() == 6
                && count(pool, "SELECT COUNT(*) FROM inbox_key").await == 0
        },
    )
    .await;
    consumer.shutdown().await.unwrap();
    let applied = effects(pool).await;
    let mut retried_applied = applied[2..].to_vec();
    retried_applied.sort();
    let mut expected = vec![a1.event_id, b1.event_id, b2.event_id, keyless.event_id];
    expected.sort();
    assert_eq!(
        retried_applied, expected,
        "each retried row once, the discarded one never"
    );
    let place = |id: Uuid| applied.iter().position(|e| *e == id).unwrap();
    assert!(
        place(b1.event_id) < place(b2.event_id),
        "key b in order: {applied:?}"
    );
    let status = status::collect(pool, 10).await.unwrap();
    assert_eq!(
        (
            status.inbox.pending,
            status.inbox.parked,
            status.inbox.discarded
        ),
        (0, 0, 1)
    );

    // Retention: the six processed rows, in batches of four, and the
    // discarded one.
    let cutoff = Database::from(pool).now().await.unwrap() + TimeDelta::seconds(1);
    assert_eq!(
        cleanup::count(pool, Target::ProcessedInbox, cutoff)
            .await
            .unwrap(),
        6
    );
    assert_eq!(
        cleanup::count(pool, Target::ProcessedInbox, cutoff - TimeDelta::days(1))
            .await
            .unwrap(),
        0
    );
    let mut batches = Vec::new();
    let deleted = Purge::new(Target::ProcessedInbox, cutoff)
        .batch_size(4)
        .run(pool, |batch| batches.push(batch))
        .await
        .unwrap();
    assert_eq!((deleted, batches), (6, vec![4, 2]));
    let deleted = Purge::new(Target::DiscardedInbox, cutoff)
        .run(pool, |_| {})
        .await
        .unwrap();
    assert_eq!(deleted, 1);
    assert_eq!(count(pool, "SELECT COUNT(*) FROM inbox_event").await, 0);
    db.drop().await;
}

#[tokio::test]
async fn an_inbox_retry_waits_for_the_processor_at_its_keys_head() {
    let db = scratch(4).await;
    let pool = &db.pool;
    // Key k: a parked row, then two pending rows; a processor is handling
    // the first of them (it holds the row, as its claim locked it).
    let (parked, parked_seq) = InboxRow::new("g", "t", Some("k"))
        .parked(60, 3, "handler failed")
        .insert(pool)
        .await;
    let (_, head) = InboxRow::new("g", "t", Some("k")).insert(pool).await;
    let (_, next) = InboxRow::new("g", "t", Some("k")).insert(pool).await;
    rebuild_keys(pool).await;
    let entry = |seq| {
        (
            Some("k".to_owned()),
            seq,
            Some("PaymentTaken".to_owned()),
            false,
        )
    };
    assert_eq!(key_entries(pool, "g").await, [entry(head)]);
    let mut processor = lock_where(
        &db,
        &format!("SELECT seq FROM inbox_event WHERE seq = {head}"),
    )
    .await;

    let retry = tokio::spawn({
        let pool = pool.clone();
        async move { dead_letters::retry(&pool, Table::Inbox, &Selection::EventIds(vec![parked])).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!retry.is_finished(), "the retry waits for the processor");

    // The processor settles its row and moves the head on from it, as its
    // record does (the entry locked, the oldest pending row at or after
    // its own), and commits.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "UPDATE inbox_event SET processed = TRUE, processed_at = NOW(6) WHERE seq = {head};
         SELECT head_seq FROM inbox_key WHERE consumer_group = 'g' FOR UPDATE;
         UPDATE inbox_key SET head_seq = {next} WHERE consumer_group = 'g';
         COMMIT"
    )))
    .execute(&mut processor)
    .await
    .unwrap();
    let retried = tokio::time::timeout(Duration::from_secs(10), retry)
        .await
        .expect("the retry goes on once the processor committed")
        .unwrap()
        .unwrap();
    assert_eq!(retried, [parked]);
    assert_eq!(
        key_entries(pool, "g").await,
        [entry(parked_seq)],
        "the head is the retried row, not the one the processor moved it to"
    );
    release(processor).await;
    db.drop().await;
}

#[tokio::test]
async fn cleanup_deletes_old_dedup_and_inbox_rows_in_batches_past_held_rows() {
    let db = scratch(6).await;
    let pool = &db.pool;
    let day = 86_400;
    // processed_event: eight rows nine days old in two groups (four of g1
    // at one instant: the walk's keyset breaks ties by group and event
    // id), and a recent one.
    let at: chrono::DateTime<Utc> = sqlx::query_scalar("SELECT UTC_TIMESTAMP(6) - INTERVAL 9 DAY")
        .fetch_one(pool)
        .await
        .unwrap();
    let mut old_dedup = Vec::new();
    for (group, n) in [("g1", 5), ("g2", 3)] {
        for _ in 0..n {
            old_dedup.push((group, processed_row(pool, group, 9 * day).await));
        }
    }
    sqlx::query("UPDATE processed_event SET processed_at = ? WHERE consumer_group = 'g1' LIMIT 4")
        .bind(at)
        .execute(pool)
        .await
        .unwrap();
    processed_row(pool, "g1", 60).await;
    // inbox_event: g1 has four rows processed nine days ago, one processed
    // recently, an old pending row, an old parked row, one discarded nine
    // days ago, one discarded recently, and one discarded nine days ago
    // then made pending again by hand (its key's entry points at it); g2
    // three processed nine days ago and one discarded nine days ago.
    let mut old_inbox = Vec::new();
    for (group, n) in [("g1", 4), ("g2", 3)] {
        for _ in 0..n {
            let (id, _) = InboxRow::new(group, "t", Some("k"))
                .received(10 * day)
                .processed(9 * day)
                .insert(pool)
                .await;
            old_inbox.push((group, id));
        }
    }
    InboxRow::new("g1", "t", Some("k"))
        .received(120)
        .processed(60)
        .insert(pool)
        .await;
    let (pending, _) = InboxRow::new("g1", "t", Some("k"))
        .received(30 * day)
        .insert(pool)
        .await;
    InboxRow::new("g1", "t", Some("p"))
        .received(30 * day)
        .parked(20 * day, 3, "boom")
        .insert(pool)
        .await;
    for (group, ago) in [("g1", 9 * day), ("g1", 60), ("g2", 9 * day)] {
        InboxRow::new(group, "t", Some("d"))
            .received(30 * day)
            .parked(20 * day, 3, "boom")
            .discarded(ago)
            .insert(pool)
            .await;
    }
    InboxRow::new("g1", "t", Some("u"))
        .received(30 * day)
        .discarded(9 * day)
        .insert(pool)
        .await;
    rebuild_keys(pool).await;
    assert_eq!(count(pool, "SELECT COUNT(*) FROM inbox_event").await, 14);
    assert_eq!(count(pool, "SELECT COUNT(*) FROM inbox_key").await, 2);

    let cutoff = Database::from(pool).now().await.unwrap() - TimeDelta::days(7);
    for (target, n) in [
        (Target::ProcessedEvent, 8),
        (Target::ProcessedInbox, 7),
        (Target::DiscardedInbox, 2),
    ] {
        assert_eq!(
            cleanup::count(pool, target, cutoff).await.unwrap(),
            n,
            "{target:?}"
        );
    }

    // A consumer holds one old dedup row, and a processor one old processed
    // inbox row of g2 and the pending row: skipped, never waited for.
    let hex = |id: Uuid| id.simple().to_string();
    let dedup_held = lock_where(
        &db,
        &format!(
            "SELECT 1 FROM processed_event WHERE consumer_group = 'g1'
             AND event_id = UNHEX('{}')",
            hex(old_dedup[4].1)
        ),
    )
    .await;
    let inbox_held = lock_where(
        &db,
        &format!(
            "SELECT 1 FROM inbox_event WHERE consumer_group = 'g2' AND event_id = UNHEX('{}')",
            hex(old_inbox[5].1)
        ),
    )
    .await;
    let claimed = lock_where(
        &db,
        &format!(
            "SELECT 1 FROM inbox_event WHERE consumer_group = 'g1' AND event_id = UNHEX('{}')",
            hex(pending)
        ),
    )
    .await;
    let limit = Duration::from_secs(5);
    let mut batches = Vec::new();
    let mut purge = Purge::new(Target::ProcessedEvent, cutoff).batch_size(3);
    let deleted = quick("a dedup purge", limit, purge.run(pool, |b| batches.push(b)))
        .await
        .unwrap();
    assert_eq!(deleted, 7, "every old dedup row but the held one");
    assert_eq!(batches.iter().sum::<u64>(), 7);
    assert_eq!(batches.len(), 3, "{batches:?}: eight chosen, three a batch");
    assert!(batches.iter().all(|b| *b <= 3), "{batches:?}");
    assert_eq!(
        purge.step(pool).await.unwrap(),
        0,
        "a finished pass stays done"
    );
    let mut batches = Vec::new();
    let deleted = quick(
        "an inbox purge",
        limit,
        Purge::new(Target::ProcessedInbox, cutoff)
            .batch_size(2)
            .run(pool, |b| batches.push(b)),
    )
    .await
    .unwrap();
    assert_eq!(deleted, 6, "every old processed row but the held one");
    assert_eq!(
        batches,
        [2, 2, 1, 1],
        "g1's four, then g2's three: the held one, second, skipped in the third batch"
    );
    let deleted = quick(
        "a purge of discarded rows",
        limit,
        Purge::new(Target::DiscardedInbox, cutoff)
            .batch_size(1)
            .run(pool, |_| {}),
    )
    .await
    .unwrap();
    assert_eq!(deleted, 2);
    release(dedup_held).await;
    release(inbox_held).await;
    release(claimed).await;
    for (target, n) in [(Target::ProcessedEvent, 1), (Target::ProcessedInbox, 1)] {
        let again = Purge::new(target, cutoff).run(pool, |_| {}).await.unwrap();
        assert_eq!(again, n, "{target:?}: the next run takes the held row");
    }

    assert_eq!(
        count(pool, "SELECT COUNT(*) FROM processed_event").await,
        1,
        "the recent dedup row is kept"
    );
    let left: Vec<(String, bool, bool, bool)> = sqlx::query_as(
        "SELECT CAST(consumer_group AS CHAR), processed, parked_at IS NOT NULL,
                discarded_at IS NOT NULL
         FROM inbox_event ORDER BY consumer_group, seq",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let g1 = |processed, parked, discarded| ("g1".to_owned(), processed, parked, discarded);
    assert_eq!(
        left,
        [
            g1(true, false, false),
            g1(false, false, false),
            g1(false, true, false),
            g1(false, true, true),
            g1(false, false, true),
        ],
        "kept: the recently processed, the pending, the parked, the recently discarded \
         and the discarded row made pending again"
    );
    assert_eq!(count(pool, "SELECT COUNT(*) FROM inbox_key").await, 2);
    db.drop().await;
}

/// Writes, for each group, a dedup row and a processed inbox row of every
/// event id of `processed` and a discarded inbox row of every event id of
/// `discarded`, all at the instant `at`.
async fn shared_event_ids(
    pool: &MySqlPool,
    groups: &[&str],
    processed: &[Uuid],
    discarded: &[Uuid],
    at: chrono::DateTime<Utc>,
) {
    for group in groups {
        for (event_id, is_discarded) in processed
            .iter()
            .map(|id| (id, false))
            .chain(discarded.iter().map(|id| (id, true)))
        {
            if !is_discarded {
                sqlx::query(
                    "INSERT INTO processed_event (consumer_group, event_id, processed_at)
                     VALUES (?, ?, ?)",
                )
                .bind(group.as_bytes())
                .bind(event_id)
                .bind(at)
                .execute(pool)
                .await
                .unwrap();
            }
            sqlx::query(
                "INSERT INTO inbox_event (consumer_group, event_id, received_at, payload,
                     payload_bytes, event_type, topic, partition_key, headers, processed,
                     processed_at, attempts, last_error, parked_at, discarded_at)
                 VALUES (?, ?, ?, '{}', 2, 'PaymentTaken', 't', NULL, '{}', ?,
                     IF(?, NULL, ?), IF(?, 3, 0), IF(?, 'boom', NULL),
                     IF(?, ?, NULL), IF(?, ?, NULL))",
            )
            .bind(group.as_bytes())
            .bind(event_id)
            .bind(at)
            .bind(!is_discarded)
            .bind(is_discarded)
            .bind(at)
            .bind(is_discarded)
            .bind(is_discarded)
            .bind(is_discarded)
            .bind(at)
            .bind(is_discarded)
            .bind(at)
            .execute(pool)
            .await
            .unwrap();
        }
    }
}

/// The same event ids in two consumer groups (an event every group
/// receives), every row at one instant: whatever the batch size, and so
/// wherever a boundary falls between the groups' rows, each target's walk
/// (`(processed_at, group, event id)` for dedup rows, group by group for
/// the inbox) deletes every row once, no batch more than its size; a row
/// of the second group held by another transaction is passed over without
/// waiting and deleted by the next run.
#[tokio::test]
async fn cleanup_walks_the_whole_key_of_groups_sharing_event_ids() {
    let db = scratch(4).await;
    let pool = &db.pool;
    let now = Database::from(pool).now().await.unwrap();
    let at = now - TimeDelta::days(9);
    let cutoff = now - TimeDelta::days(7);
    let groups = ["billing", "shipping"];
    for batch_size in 1..=5 {
        for target in [
            Target::ProcessedEvent,
            Target::ProcessedInbox,
            Target::DiscardedInbox,
        ] {
            let processed: Vec<Uuid> = (0..3).map(|_| Uuid::now_v7()).collect();
            let discarded: Vec<Uuid> = (0..3).map(|_| Uuid::now_v7()).collect();
            shared_event_ids(pool, &groups, &processed, &discarded, at).await;
            assert_eq!(
                cleanup::count(pool, target, cutoff).await.unwrap(),
                6,
                "{target:?}"
            );
            let mut batches = Vec::new();
            let deleted = quick(
                "the purge",
                Duration::from_secs(10),
                Purge::new(target, cutoff)
                    .batch_size(batch_size)
                    .run(pool, |b| batches.push(b)),
            )
            .await
            .unwrap();
            assert_eq!(
                deleted, 6,
                "{target:?}, batches of {batch_size}: {batches:?}"
            );
            assert!(
                batches.iter().all(|b| *b <= batch_size as u64),
                "{target:?}: {batches:?}"
            );
            assert_eq!(cleanup::count(pool, target, cutoff).await.unwrap(), 0);
            sqlx::raw_sql("DELETE FROM inbox_event; DELETE FROM processed_event")
                .execute(pool)
                .await
                .unwrap();
        }
    }

    // The second group's row of the middle event id held, as a consumer
    // holds the rows it works on.
    let processed: Vec<Uuid> = (0..3).map(|_| Uuid::now_v7()).collect();
    let discarded: Vec<Uuid> = (0..3).map(|_| Uuid::now_v7()).collect();
    shared_event_ids(pool, &groups, &processed, &discarded, at).await;
    for (target, table, held) in [
        (Target::ProcessedEvent, "processed_event", processed[1]),
        (Target::ProcessedInbox, "inbox_event", processed[1]),
        (Target::DiscardedInbox, "inbox_event", discarded[1]),
    ] {
        let holder = lock_where(
            &db,
            &format!(
                "SELECT event_id FROM {table}
                 WHERE consumer_group = 'shipping' AND event_id = UNHEX('{}')",
                held.simple()
            ),
        )
        .await;
        let mut batches = Vec::new();
        let deleted = quick(
            "the purge past a held row",
            Duration::from_secs(10),
            Purge::new(target, cutoff)
                .batch_size(2)
                .run(pool, |b| batches.push(b)),
        )
        .await
        .unwrap();
        assert_eq!(deleted, 5, "{target:?}: {batches:?}");
        release(holder).await;
        let next = Purge::new(target, cutoff).run(pool, |_| {}).await.unwrap();
        assert_eq!(next, 1, "{target:?}: the next run takes it");
    }
    assert_eq!(count(pool, "SELECT COUNT(*) FROM inbox_event").await, 0);
    assert_eq!(count(pool, "SELECT COUNT(*) FROM processed_event").await, 0);
    db.drop().await;
}
