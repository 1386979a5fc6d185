//! The operator operations (`txoutbox_runtime::ops`) on MariaDB (feature
//! `mysql`), against the machine's server (`MYSQL_URL`, default
//! `mysql://root@127.0.0.1:3306/test`; each test creates and drops its own
//! database) and, for the relays, the real broker: status of an empty and
//! a filled outbox, its thresholds, the live relays with the lanes each
//! holds; dead letters listed, retried and discarded; retention deleting
//! only published (and discarded) rows older than the cutoff, in batches,
//! past rows others hold; and the consumer tables refused.
#![allow(missing_docs)]

use std::time::{Duration, Instant};

use chrono::{TimeDelta, Utc};
use sqlx::MySqlPool;
use txoutbox_runtime::ops::cleanup::{self, Purge, Target};
use txoutbox_runtime::ops::dead_letters::{self, Selection, Table};
use txoutbox_runtime::ops::status::{self, Status, Thresholds};
use txoutbox_runtime::ops::{Database, OpsError};
use txoutbox_runtime::relay::{Relay, RelayHandle};
use txoutbox_testkit::broker::{brokers, client_config, create_topic, unique_topic};
use txoutbox_testkit::mysql::MySqlScratch;
use txoutbox_testkit::{eventually, init_tracing};
use uuid::Uuid;

mod ops_mysql_support;

use ops_mysql_support::{Row, count, lock_row, release};

const CONSUMER_TABLES: [&str; 4] = [
    "inbox_event",
    "processed_event",
    "saga_state",
    "consumer_dead_letter",
];

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

fn assert_postgres_only<T: std::fmt::Debug>(result: Result<T, OpsError>, table: &str) {
    let error = result.unwrap_err();
    assert!(
        matches!(&error, OpsError::PostgresOnly { table: t } if *t == table),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.starts_with(&format!("{table} is not on this database"))
            && message.contains("consumer tables")
            && message.contains("PostgreSQL-only so far"),
        "{message}"
    );
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
        [("outbox_event", 0, false), ("outbox_scheduled", 0, false)]
    );
    assert!(empty.tables.iter().all(|t| t.total_bytes > 0));
    // The consumer side is named as missing, not measured.
    assert_eq!(empty.not_on_this_database, CONSUMER_TABLES);
    assert_eq!((empty.inbox.pending, empty.inbox.parked), (0, 0));
    assert!(empty.sagas.is_empty() && empty.inbox_unclaimed.is_empty());
    assert_eq!(empty.consumer_dead_letters.unpublished, 0);
    let json = serde_json::to_value(&empty).unwrap();
    assert_eq!(
        json["not_on_this_database"],
        serde_json::json!(CONSUMER_TABLES)
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
        tables,
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
        // Parts this database does not have are never exceeded.
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
    cleanup::check(pool, Target::PublishedOutbox).unwrap();
    cleanup::check(pool, Target::DiscardedOutbox).unwrap();

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

#[tokio::test]
async fn the_consumer_tables_are_refused() {
    let db = scratch(2).await;
    let pool = &db.pool;
    let cutoff = Utc::now();
    for (target, table) in [
        (Target::ProcessedEvent, "processed_event"),
        (Target::ProcessedInbox, "inbox_event"),
        (Target::DiscardedInbox, "inbox_event"),
        (Target::FinishedSaga, "saga_state"),
    ] {
        assert_postgres_only(cleanup::check(pool, target), table);
        assert_postgres_only(cleanup::count(pool, target, cutoff).await, table);
        let mut purge = Purge::new(target, cutoff);
        assert_postgres_only(purge.step(pool).await, table);
        assert_postgres_only(purge.run(pool, |_| {}).await, table);
    }
    let all = Selection::All;
    assert_postgres_only(
        dead_letters::list(pool, Table::Inbox, &all, 10).await,
        "inbox_event",
    );
    assert_postgres_only(
        dead_letters::count(pool, Table::Inbox, &all).await,
        "inbox_event",
    );
    assert_postgres_only(
        dead_letters::retry(pool, Table::Inbox, &all).await,
        "inbox_event",
    );
    assert_postgres_only(
        dead_letters::discard(pool, Table::Inbox, &Selection::Ids(vec![1])).await,
        "inbox_event",
    );
    assert_postgres_only(
        dead_letters::topic_exists(pool, Table::Inbox, "orders").await,
        "inbox_event",
    );
    db.drop().await;
}
