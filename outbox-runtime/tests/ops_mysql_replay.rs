//! Replay (`txoutbox_runtime::ops::replay`) on MariaDB (feature `mysql`),
//! against the machine's server (`MYSQL_URL`; each test creates and drops
//! its own database) and the real broker at `KAFKA_BROKERS_TEST`, the
//! bodies of `ops_replay.rs` (PostgreSQL): a republish run sends exactly
//! the selected rows, once each, in id order, with the key, value and
//! headers MariaDB's relay sent for them plus the run's `replay` header,
//! and records the run; the header settings of the service's relay apply;
//! a failed run is recorded with its error; a rebuild reads one InnoDB
//! snapshot taken after the end offsets (late commits stay out), takes
//! the rows the relay has not marked yet, records and commits its
//! hand-over, refuses a missing or live target; and a projection rebuilt
//! while writers, a relay and the live projection keep going sees every
//! event once, each key in order, across the hand-over.
#![allow(missing_docs)] // the test events' generated items

mod consumer_support;
mod ops_mysql_support;
mod ops_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use ops_support::{Received, brokers, new_topic, read_back};
use rdkafka::ClientConfig;
use rdkafka::producer::FutureProducer;
use serde_json::json;
use sqlx::{MySql, MySqlPool, QueryBuilder, Transaction};
use txoutbox_core::DomainEvent;
use txoutbox_core::wire::HEADER_REPLAY;
use txoutbox_runtime::consumer::{
    Consumer, ConsumerHandle, EventHandler, EventMeta, event_handler,
};
use txoutbox_runtime::ops::OpsError;
use txoutbox_runtime::ops::replay::{self, Handover, Replay, ReplayFilter};
use txoutbox_runtime::relay::{CloudEvents, HeaderNames, Relay, RelayHandle};
use txoutbox_testkit::broker::client_config;
use txoutbox_testkit::mysql::MySqlScratch;
use txoutbox_testkit::{eventually, init_tracing};
use uuid::Uuid;

async fn scratch(connections: u32) -> MySqlScratch {
    init_tracing();
    let scratch = MySqlScratch::create(connections).await;
    txoutbox_runtime::migrations::run(&scratch.pool)
        .await
        .unwrap();
    scratch
}

/// An idempotent producer, as `outbox replay` makes one.
fn producer() -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .create()
        .unwrap()
}

/// A relay on MariaDB that polls often.
fn relay(pool: &MySqlPool) -> RelayHandle {
    Relay::builder(pool.clone(), client_config(&brokers()))
        .poll_interval(Duration::from_millis(50))
        .spawn()
        .unwrap()
}

/// An outbox row to insert as a service writes one; ages are seconds
/// before the database's clock.
#[derive(Debug, Clone)]
struct OutboxRow {
    topic: String,
    key: String,
    event_type: &'static str,
    created_ago: i64,
    published_ago: Option<i64>,
    parked_ago: Option<i64>,
    discarded_ago: Option<i64>,
    traceparent: Option<&'static str>,
    headers: Option<serde_json::Value>,
}

impl OutboxRow {
    fn new(topic: &str, key: &str) -> Self {
        Self {
            topic: topic.to_owned(),
            key: key.to_owned(),
            event_type: "OrderCreated",
            created_ago: 0,
            published_ago: None,
            parked_ago: None,
            discarded_ago: None,
            traceparent: None,
            headers: None,
        }
    }

    fn created(mut self, ago: i64) -> Self {
        self.created_ago = ago;
        self
    }

    fn published(mut self, created_ago: i64, published_ago: i64) -> Self {
        self.created_ago = created_ago;
        self.published_ago = Some(published_ago);
        self
    }

    fn parked(mut self, ago: i64) -> Self {
        self.parked_ago = Some(ago);
        self
    }

    /// Inserts the row; returns `(id, event_id)`.
    async fn insert(&self, pool: &MySqlPool) -> (i64, Uuid) {
        let event_id = Uuid::now_v7();
        let payload = json!({ "event_id": event_id, "aggregate_id": self.key, "n": 1 });
        let done = sqlx::query(
            "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type,
                 payload, topic, partition_key, created_at, published_at, parked_at,
                 discarded_at, attempts, last_error, traceparent, headers)
             VALUES (?, 'Order', ?, ?, ?, ?, ?,
                 UTC_TIMESTAMP(6) - INTERVAL ? SECOND,
                 UTC_TIMESTAMP(6) - INTERVAL ? SECOND,
                 UTC_TIMESTAMP(6) - INTERVAL ? SECOND,
                 UTC_TIMESTAMP(6) - INTERVAL ? SECOND,
                 IF(? IS NULL, 0, 10), IF(? IS NULL, NULL, 'refused'), ?, ?)",
        )
        .bind(event_id)
        .bind(&self.key)
        .bind(self.event_type)
        .bind(payload.to_string())
        .bind(&self.topic)
        .bind(&self.key)
        .bind(self.created_ago)
        .bind(self.published_ago)
        .bind(self.parked_ago)
        .bind(self.discarded_ago)
        .bind(self.parked_ago)
        .bind(self.parked_ago)
        .bind(self.traceparent)
        .bind(self.headers.as_ref().map(ToString::to_string))
        .execute(pool)
        .await
        .unwrap();
        (done.last_insert_id() as i64, event_id)
    }
}

/// `(id, published_at)` of every outbox row, in id order.
async fn outbox_rows(pool: &MySqlPool) -> Vec<(i64, Option<DateTime<Utc>>)> {
    sqlx::query_as("SELECT id, published_at FROM outbox_event ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// One row of `outbox_replay_run`.
#[derive(Debug, sqlx::FromRow)]
struct RunRecord {
    filter: String,
    target_topic: Option<String>,
    selected: i64,
    published: i64,
    finished: bool,
    error: Option<String>,
    mode: String,
    rebuild_group: Option<String>,
    handover: Option<String>,
    started_before_finished: bool,
}

async fn run_record(pool: &MySqlPool, run_id: i64) -> RunRecord {
    sqlx::query_as(
        "SELECT filter, target_topic, selected, published, finished_at IS NOT NULL AS finished,
                error, mode, rebuild_group, handover,
                COALESCE(started_at <= finished_at, FALSE) AS started_before_finished
         FROM outbox_replay_run WHERE id = ?",
    )
    .bind(run_id)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The headers of a record without the replay's own and the trace context
/// (the relay's is its publish span's when OpenTelemetry is on).
fn wire_headers(record: &Received) -> Vec<(String, String)> {
    let mut headers: Vec<(String, String)> = record
        .headers
        .iter()
        .filter(|(name, _)| *name != HEADER_REPLAY && *name != "traceparent")
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    headers.sort();
    headers
}

/// A republish run over a filtered range: the rows MariaDB's relay
/// published (user headers, a trace context, other types and times among
/// them), then replayed into a topic of their own. Exactly the selected
/// rows arrive, once each, in id order, each with the key, value and
/// headers the relay sent plus the run's `replay` header; unpublished and
/// parked rows stay out; outbox rows are untouched and the run is
/// recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_republish_sends_the_selected_rows_once_as_the_relay_sent_them() {
    let db = scratch(6).await;
    let pool = &db.pool;
    let live = new_topic().await;
    let target = new_topic().await;
    let minute = 60;
    let row = |created_min: i64, event_type: &'static str, key: &str| {
        let mut row = OutboxRow::new(&live, key).created(created_min * minute);
        row.event_type = event_type;
        row
    };
    row(60, "OrderCreated", "0").insert(pool).await; // before the range
    let mut traced = row(40, "OrderCreated", "1");
    traced.traceparent = Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
    traced.headers = Some(json!({ "tenant": "acme", "x-retry": 1 }));
    traced.insert(pool).await;
    row(30, "OrderPaid", "1").insert(pool).await; // other type
    row(30, "OrderCreated", "2").insert(pool).await;
    row(20, "OrderCreated", "3").insert(pool).await;
    row(5, "OrderCreated", "4").insert(pool).await; // after the range
    let relay = relay(pool);
    eventually(
        "the relay published every row",
        Duration::from_secs(30),
        || async {
            ops_mysql_support::count(
                pool,
                "SELECT COUNT(*) FROM outbox_event WHERE published_at IS NULL",
            )
            .await
                == 0
        },
    )
    .await;
    relay.shutdown().await.unwrap();
    let relayed = read_back(&live).await;
    assert_eq!(relayed.len(), 6);
    // In the range but not published: never replayed.
    row(20, "OrderCreated", "9").insert(pool).await;
    row(20, "OrderCreated", "p").parked(60).insert(pool).await;
    let before = outbox_rows(pool).await;

    let now = Utc::now();
    let filter = ReplayFilter {
        from: Some(now - TimeDelta::minutes(50)),
        to: Some(now - TimeDelta::minutes(10)),
        topic: Some(live.clone()),
        event_type: Some("OrderCreated".into()),
        ..Default::default()
    };
    assert_eq!(replay::count(pool, &filter).await.unwrap(), 3);
    let republish = Replay::new(filter.clone())
        .target_topic(&target)
        .batch_size(2);
    assert_eq!(republish.count(pool).await.unwrap(), 3);
    let mut progress = Vec::new();
    let report = republish
        .run(pool, &producer(), |n| progress.push(n))
        .await
        .unwrap();
    assert_eq!((report.selected, report.published), (3, 3));
    assert!(report.handover.is_none());
    assert_eq!(progress, [2, 1], "pipelined in batches of two");

    let received = read_back(&target).await;
    let keys: Vec<&str> = received.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["1", "2", "3"], "once each, in id order");
    for got in &received {
        let event_id = &got.headers["event_id"];
        let sent = relayed
            .iter()
            .find(|r| &r.headers["event_id"] == event_id)
            .expect("the relay sent it");
        assert_eq!(got.key, sent.key);
        assert_eq!(got.payload, sent.payload, "the value byte for byte");
        assert_eq!(wire_headers(got), wire_headers(sent));
        assert_eq!(got.headers[HEADER_REPLAY], report.run_id.to_string());
        assert!(!sent.headers.contains_key(HEADER_REPLAY));
    }
    let value: serde_json::Value = serde_json::from_str(&received[0].payload).unwrap();
    assert_eq!(value["event_type"], "OrderCreated", "named by its type");
    assert_eq!(
        received[0].headers.get("traceparent").map(String::as_str),
        traced.traceparent,
        "the stored trace context"
    );
    assert_eq!(received[0].headers["tenant"], "acme");
    assert_eq!(received[0].headers["x-retry"], "1");
    assert!(!received[1].headers.contains_key("traceparent"));

    // The audit trail: outbox rows untouched, the run recorded.
    assert_eq!(outbox_rows(pool).await, before);
    let run = run_record(pool, report.run_id).await;
    assert_eq!(
        (
            run.selected,
            run.published,
            run.finished,
            run.error.as_deref()
        ),
        (3, 3, true, None)
    );
    assert!(run.started_before_finished);
    assert_eq!(
        (run.mode.as_str(), run.target_topic.as_deref()),
        ("republish", Some(target.as_str()))
    );
    assert_eq!((run.rebuild_group, run.handover), (None, None));
    let filter_json: serde_json::Value = serde_json::from_str(&run.filter).unwrap();
    assert_eq!(filter_json["topic"], live);
    assert_eq!(filter_json["event_type"], "OrderCreated");
    assert!(filter_json.get("aggregate_id").is_none());
    assert_eq!(
        Handover::load(pool, report.run_id).await.unwrap(),
        None,
        "a republish run has no hand-over"
    );

    // Into each row's own topic (the live one: after the relay's six
    // records and the end marker read_back appended), by aggregate id.
    let one = ReplayFilter {
        aggregate_id: Some("4".into()),
        ..Default::default()
    };
    let report = Replay::new(one)
        .run(pool, &producer(), |_| {})
        .await
        .unwrap();
    assert_eq!((report.selected, report.published), (1, 1));
    let again =
        consumer_support::read_until(&live, 7, Duration::from_secs(20), |read| !read.is_empty())
            .await;
    assert_eq!(
        rdkafka::Message::key(&again[0]),
        Some(&b"4"[..]),
        "the row's own topic"
    );
    assert_eq!(
        consumer_support::header(&again[0], HEADER_REPLAY),
        Some(report.run_id.to_string())
    );
    db.drop().await;
}

/// A replay sends the headers the service's relay sends: its header names
/// (Debezium's here) and CloudEvents' binary mode, whose default source
/// names the MariaDB database; bad settings are refused before anything is
/// sent or recorded.
#[tokio::test]
async fn a_replay_takes_the_header_settings_of_the_services_relay() {
    let db = scratch(4).await;
    let pool = &db.pool;
    let source = new_topic().await;
    let (_, event_id) = OutboxRow::new(&source, "k")
        .published(60, 30)
        .insert(pool)
        .await;
    let replay = Replay::new(ReplayFilter {
        topic: Some(source.clone()),
        ..Default::default()
    });
    let replayed = |configured: Replay| async move {
        let target = new_topic().await;
        configured
            .target_topic(target.clone())
            .run(pool, &producer(), |_| {})
            .await?;
        let received = read_back(&target).await;
        assert_eq!(received.len(), 1);
        Ok::<_, OpsError>(received[0].headers.clone())
    };
    let refused = replayed(
        replay
            .clone()
            .header_names(HeaderNames::debezium().event_type("")),
    )
    .await
    .unwrap_err();
    assert!(matches!(&refused, OpsError::HeaderNames(_)), "{refused}");
    let refused = replayed(replay.clone().cloudevents(CloudEvents::binary().source("")))
        .await
        .unwrap_err();
    assert!(matches!(&refused, OpsError::CloudEvents(_)), "{refused}");
    assert_eq!(
        ops_mysql_support::count(pool, "SELECT COUNT(*) FROM outbox_replay_run").await,
        0
    );

    let headers = replayed(replay.clone().header_names(HeaderNames::debezium()))
        .await
        .unwrap();
    assert_eq!(headers["id"], event_id.to_string());
    assert_eq!(headers["eventType"], "OrderCreated");
    assert!(!headers.contains_key("event_id") && !headers.contains_key("event_type"));
    assert!(headers.contains_key(HEADER_REPLAY));

    let headers = replayed(replay.cloudevents(CloudEvents::binary()))
        .await
        .unwrap();
    assert_eq!(headers["ce_id"], event_id.to_string());
    assert_eq!(headers["ce_type"], "OrderCreated");
    assert_eq!(headers["ce_source"], format!("/txoutbox/{}", db.name));
    assert!(headers.contains_key("ce_time"));
    db.drop().await;
}

/// A run whose deliveries fail is recorded, finished, with the error.
#[tokio::test]
async fn a_failed_replay_is_recorded_with_its_error() {
    let db = scratch(4).await;
    let pool = &db.pool;
    OutboxRow::new("ops-mysql-replay-unreachable", "k")
        .published(60, 30)
        .insert(pool)
        .await;
    // Nothing listens on port 1: the delivery times out quickly.
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", "127.0.0.1:1")
        .set("enable.idempotence", "true")
        .set("message.timeout.ms", "1500")
        .create()
        .unwrap();
    let error = Replay::new(ReplayFilter {
        topic: Some("ops-mysql-replay-unreachable".into()),
        ..Default::default()
    })
    .run(pool, &producer, |_| {})
    .await
    .unwrap_err();
    let OpsError::ReplayFailed {
        run_id, published, ..
    } = &error
    else {
        panic!("unexpected error {error}");
    };
    assert_eq!(*published, 0);
    let run = run_record(pool, *run_id).await;
    assert!(run.finished);
    assert_eq!((run.selected, run.published), (1, 0));
    assert!(run.error.unwrap().contains("kafka"), "{error}");
    db.drop().await;
}

// ---------------------------------------------------------------------------
// Rebuild runs.
// ---------------------------------------------------------------------------

/// Inserts an outbox row of `topic` for `key` on `conn` (a transaction,
/// say); returns its id. The payload carries `n`.
async fn insert_row(conn: &mut sqlx::MySqlConnection, topic: &str, key: &str, n: i64) -> i64 {
    sqlx::query(
        "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type, payload,
                                   topic, partition_key)
         VALUES (?, 'Order', ?, 'OrderCreated', JSON_OBJECT('n', ?), ?, ?)",
    )
    .bind(Uuid::now_v7())
    .bind(key)
    .bind(n)
    .bind(topic)
    .bind(key)
    .execute(conn)
    .await
    .unwrap()
    .last_insert_id() as i64
}

/// `(key, n)` of each record read back.
fn keys_and_numbers(received: &[Received]) -> Vec<(String, i64)> {
    received
        .iter()
        .map(|r| {
            let value: serde_json::Value = serde_json::from_str(&r.payload).unwrap();
            (r.key.clone(), value["n"].as_i64().unwrap())
        })
        .collect()
}

/// Commit order is not id order: rows whose transactions commit after the
/// run started stay out of the replay (the relay publishes them to the
/// live topic after the hand-over offsets), even where a later page could
/// see them. The run's one InnoDB read view is taken when it starts; with
/// a read view per page, key `k`'s third version (read by a later page)
/// would be replayed while its second (its page read before the commit)
/// would not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_reads_one_snapshot_so_late_commits_come_only_from_the_live_topic() {
    let db = scratch(6).await;
    let pool = &db.pool;
    let live = new_topic().await;
    let replay_topic = new_topic().await;
    let mut conn = pool.acquire().await.unwrap();
    insert_row(&mut conn, &live, "k", 1).await;
    // Ids in this order: k1 < k2 < d < k3 < c; k2 and k3 commit late.
    let mut late_k2: Transaction<'_, MySql> = pool.begin().await.unwrap();
    insert_row(&mut late_k2, &live, "k", 2).await;
    insert_row(&mut conn, &live, "d", 1).await;
    let mut late_k3: Transaction<'_, MySql> = pool.begin().await.unwrap();
    insert_row(&mut late_k3, &live, "k", 3).await;
    let last = insert_row(&mut conn, &live, "c", 1).await;
    drop(conn);

    let filter = ReplayFilter {
        topic: Some(live.clone()),
        ..Default::default()
    };
    // Pages of one row, 200 ms apart; both late transactions commit once
    // the second page (row d) is delivered, before the third page is read.
    let replay = Replay::new(filter)
        .rebuild(&replay_topic)
        .batch_size(1)
        .rate(5.0);
    let (second_page, on_second_page) = tokio::sync::oneshot::channel();
    let mut second_page = Some(second_page);
    let mut delivered = 0;
    let producer = producer();
    let run = replay.run(pool, &producer, |n| {
        delivered += n;
        if delivered == 2
            && let Some(signal) = second_page.take()
        {
            let _ = signal.send(());
        }
    });
    let (report, ()) = tokio::join!(run, async {
        on_second_page.await.unwrap();
        late_k2.commit().await.unwrap();
        late_k3.commit().await.unwrap();
    });
    let report = report.unwrap();

    let received = read_back(&replay_topic).await;
    assert_eq!(
        keys_and_numbers(&received),
        [("k".into(), 1), ("d".into(), 1), ("c".into(), 1)],
        "only the rows committed before the snapshot, in id order"
    );
    assert_eq!((report.selected, report.published), (3, 3));
    let handover = report.handover.unwrap();
    assert_eq!(handover.snapshot_max_id, last);
    assert_eq!(handover.replay_end.unwrap()[0].offset, 3);
    // Both late rows are there now, for the relay (and the live topic).
    assert_eq!(
        ops_mysql_support::count(pool, "SELECT COUNT(*) FROM outbox_event").await,
        5
    );
    // The snapshot's connection is closed (in the background, once
    // dropped), not returned to the pool with its transaction: no
    // connection to this database keeps one open.
    eventually(
        "no transaction left open",
        Duration::from_secs(10),
        || async {
            let open: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM information_schema.INNODB_TRX t
                  JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id
             WHERE p.DB = DATABASE() AND p.ID <> CONNECTION_ID()",
            )
            .fetch_one(pool)
            .await
            .unwrap();
            open == 0
        },
    )
    .await;
    db.drop().await;
}

/// A rebuild selects rows the relay has not marked yet (one delivered
/// before the hand-over offsets but unmarked would otherwise be lost to
/// the rebuild), leaves parked and discarded rows out, starts the group
/// and records everything in `outbox_replay_run`.
#[tokio::test]
async fn a_rebuild_includes_unmarked_rows_and_records_its_hand_over() {
    let db = scratch(4).await;
    let pool = &db.pool;
    let live = new_topic().await;
    let replay_topic = new_topic().await;
    OutboxRow::new(&live, "published")
        .published(60, 50)
        .insert(pool)
        .await;
    // Delivered by a relay that has not marked it yet: on the live topic
    // before the hand-over offsets, `published_at` still NULL.
    OutboxRow::new(&live, "unmarked").insert(pool).await;
    let delivered: FutureProducer = client_config(&brokers()).create().unwrap();
    delivered
        .send(
            rdkafka::producer::FutureRecord::to(&live)
                .key("unmarked")
                .payload("{}"),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    OutboxRow::new(&live, "parked").parked(5).insert(pool).await;
    let mut discarded = OutboxRow::new(&live, "discarded").parked(5);
    discarded.discarded_ago = Some(5);
    discarded.insert(pool).await;
    OutboxRow::new(&live, "pending").insert(pool).await;

    let filter = ReplayFilter {
        topic: Some(live.clone()),
        ..Default::default()
    };
    let group = txoutbox_testkit::broker::unique_group("ops-mysql-replay-rebuild");
    let kafka = client_config(&brokers());
    let replay = Replay::new(filter)
        .rebuild(&replay_topic)
        .start_group(&group, kafka.clone());
    assert_eq!(replay.count(pool).await.unwrap(), 3);
    let report = replay.run(pool, &producer(), |_| {}).await.unwrap();
    assert_eq!((report.selected, report.published), (3, 3));
    let received = read_back(&replay_topic).await;
    let keys: Vec<&str> = received.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["published", "unmarked", "pending"]);

    let handover = report.handover.clone().unwrap();
    let at = |offsets: &[replay::PartitionOffset]| -> Vec<(i32, i64)> {
        offsets.iter().map(|p| (p.partition, p.offset)).collect()
    };
    // The unmarked row's record is before the live offsets: only the
    // replay brings it to the group.
    assert_eq!(at(&handover.live_offsets), [(0, 1)]);
    assert_eq!(at(&handover.replay_start), [(0, 0)]);
    assert_eq!(at(handover.replay_end.as_deref().unwrap()), [(0, 3)]);
    assert_eq!(handover.group.as_deref(), Some(group.as_str()));
    let max_id: i64 = sqlx::query_scalar("SELECT MAX(id) FROM outbox_event")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(handover.snapshot_max_id, max_id);
    // The group starts there, has read nothing yet, and cannot be started
    // twice.
    assert_eq!(
        consumer_support::committed(&group, &replay_topic, 1).await,
        [0]
    );
    assert_eq!(consumer_support::committed(&group, &live, 1).await, [1]);
    assert_eq!(handover.remaining(&kafka, &group).await.unwrap(), 3);
    let again = handover.start_group(&kafka, &group).await.unwrap_err();
    assert!(
        again.to_string().contains("already has a committed offset"),
        "{again}"
    );

    // The audit record.
    let run = run_record(pool, report.run_id).await;
    assert_eq!(run.mode, "rebuild");
    assert_eq!(run.rebuild_group.as_deref(), Some(group.as_str()));
    assert_eq!(run.target_topic.as_deref(), Some(replay_topic.as_str()));
    assert_eq!((run.selected, run.published, run.finished), (3, 3, true));
    let recorded: serde_json::Value = serde_json::from_str(&run.handover.unwrap()).unwrap();
    assert_eq!(recorded, serde_json::to_value(&handover).unwrap());
    assert_eq!(
        Handover::load(pool, report.run_id).await.unwrap(),
        Some(handover)
    );
    assert_eq!(Handover::load(pool, report.run_id + 1).await.unwrap(), None);
    db.drop().await;
}

/// A rebuild needs the live topic named, a topic of its own that exists;
/// it refuses before recording a run.
#[tokio::test]
async fn a_rebuild_refuses_a_missing_or_live_target_before_it_starts() {
    let db = scratch(4).await;
    let pool = &db.pool;
    let live = new_topic().await;
    OutboxRow::new(&live, "k")
        .published(60, 50)
        .insert(pool)
        .await;
    let producer = producer();
    let on = |topic: Option<&str>| ReplayFilter {
        topic: topic.map(str::to_owned),
        ..Default::default()
    };
    let missing = format!("{live}-never-created");
    for (replay, expected) in [
        (
            Replay::new(on(None)).rebuild("elsewhere"),
            "set the filter's topic",
        ),
        (
            Replay::new(on(Some(&live))).rebuild(&live),
            "not to the live topic",
        ),
        (
            Replay::new(on(Some(&live))).rebuild(&missing),
            "does not exist",
        ),
    ] {
        let error = replay.run(pool, &producer, |_| {}).await.unwrap_err();
        assert!(
            matches!(
                error,
                OpsError::RebuildWithoutTopic
                    | OpsError::RebuildIntoLiveTopic { .. }
                    | OpsError::TopicMissing { .. }
            ) && error.to_string().contains(expected),
            "{error}"
        );
    }
    assert_eq!(
        ops_mysql_support::count(pool, "SELECT COUNT(*) FROM outbox_replay_run").await,
        0
    );
    db.drop().await;
}

// ---------------------------------------------------------------------------
// Rebuilding a projection while live traffic flows.
// ---------------------------------------------------------------------------

txoutbox_testkit::test_event!(Versioned, "ops-mysql-replay.rebuild.orders", "Versioned");
// The same events as the rebuild topic carries them: the consumer routes by
// (topic, event type), so the rebuilding group's first consumer registers
// the projection for this topic.
txoutbox_testkit::test_event!(
    VersionedReplayed,
    "ops-mysql-replay.rebuild.orders.replay",
    "Versioned"
);

/// Keys (orders) of the rebuild scenario.
const KEYS: usize = 8;
/// Versions of each key written (and published) before the rebuild starts.
const HISTORY: i64 = 25;
/// Versions of each key written while the rebuild runs, at least.
const LIVE: i64 = 15;
/// Rounds of new versions written after the rebuilding group runs on its
/// own.
const AFTER_REBUILD: i64 = 3;

/// The projection's tables: the state (last version per key) and the log
/// of every call in handling order, with the version the fold found
/// before.
async fn projection_tables(pool: &MySqlPool) {
    sqlx::raw_sql(
        "CREATE TABLE projection (
             projection VARCHAR(16) NOT NULL, order_id BINARY(16) NOT NULL,
             version BIGINT NOT NULL, PRIMARY KEY (projection, order_id)) ENGINE = InnoDB;
         CREATE TABLE projection_log (
             n BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, projection VARCHAR(16) NOT NULL,
             event_id BINARY(16) NOT NULL, order_id BINARY(16) NOT NULL,
             version BIGINT NOT NULL, previous BIGINT NOT NULL, topic VARCHAR(249) NOT NULL,
             handled_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE = InnoDB",
    )
    .execute(pool)
    .await
    .unwrap();
}

/// "Last version wins", and the log of what the fold saw.
async fn fold(
    tx: &mut Transaction<'_, MySql>,
    projection: &str,
    (event_id, order_id, version): (Uuid, Uuid, i64),
    meta: &EventMeta,
) -> Result<(), sqlx::Error> {
    let previous: Option<i64> = sqlx::query_scalar(
        "SELECT version FROM projection WHERE projection = ? AND order_id = ? FOR UPDATE",
    )
    .bind(projection)
    .bind(order_id)
    .fetch_optional(&mut **tx)
    .await?;
    sqlx::query(
        "INSERT INTO projection_log (projection, event_id, order_id, version, previous, topic)
         VALUES (?, ?, ?, ?, ?, ?)",
    )
    .bind(projection)
    .bind(event_id)
    .bind(order_id)
    .bind(version)
    .bind(previous.unwrap_or(0))
    .bind(&meta.topic)
    .execute(&mut **tx)
    .await?;
    sqlx::query(
        "INSERT INTO projection (projection, order_id, version) VALUES (?, ?, ?)
         ON DUPLICATE KEY UPDATE version = VALUES(version)",
    )
    .bind(projection)
    .bind(order_id)
    .bind(version)
    .execute(&mut **tx)
    .await
    .map(drop)
}

/// The projection the service keeps up to date all along.
#[event_handler]
async fn live_projection(
    tx: &mut Transaction<'_, MySql>,
    event: Versioned,
    meta: &EventMeta,
) -> Result<(), sqlx::Error> {
    fold(
        tx,
        "live",
        (event.event_id, event.order_id, event.amount),
        meta,
    )
    .await
}

/// The projection being rebuilt (its own consumer group), on the live
/// topic.
#[event_handler]
async fn rebuilt_projection(
    tx: &mut Transaction<'_, MySql>,
    event: Versioned,
    meta: &EventMeta,
) -> Result<(), sqlx::Error> {
    fold(
        tx,
        "rebuilt",
        (event.event_id, event.order_id, event.amount),
        meta,
    )
    .await
}

/// The same projection, on the rebuild topic.
#[event_handler]
async fn rebuilt_from_replay(
    tx: &mut Transaction<'_, MySql>,
    event: VersionedReplayed,
    meta: &EventMeta,
) -> Result<(), sqlx::Error> {
    fold(
        tx,
        "rebuilt",
        (event.event_id, event.order_id, event.amount),
        meta,
    )
    .await
}

/// Writes version `version` of every key, as one transaction (`amount` is
/// the version, the rows in key order), and wakes the relay.
async fn write_versions(pool: &MySqlPool, keys: &[Uuid], version: i64) {
    let mut insert = QueryBuilder::<MySql>::new(
        "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type, payload,
                                   topic, partition_key) ",
    );
    insert.push_values(keys, |mut row, key| {
        let event_id = Uuid::now_v7();
        let payload = json!({ "event_id": event_id, "order_id": key, "amount": version });
        row.push_bind(event_id)
            .push_bind("Order")
            .push_bind(key.to_string())
            .push_bind("Versioned")
            .push_bind(payload.to_string())
            .push_bind(Versioned::TOPIC)
            .push_bind(key.to_string());
    });
    insert.build().execute(pool).await.unwrap();
    txoutbox_core::__private::wakeup::notify_committed();
}

fn consumer(pool: &MySqlPool, group: &str, handler: impl EventHandler<MySql>) -> ConsumerHandle {
    Consumer::builder(pool.clone(), consumer_support::kafka_config(), group)
        .handler(handler)
        .build()
        .unwrap()
        .spawn()
}

/// What one projection's log shows: handled events, calls whose version
/// was not the one after the previous (out of order), and keys whose final
/// version is not the last one written.
#[derive(Debug, PartialEq)]
struct Fold {
    handled: i64,
    out_of_order: i64,
    wrong_final: i64,
}

/// Pushes `<column> IN (<keys>)`, the keys bound.
fn push_keys(query: &mut QueryBuilder<MySql>, column: &str, keys: &[Uuid]) {
    query.push(format!("{column} IN ("));
    let mut list = query.separated(", ");
    for key in keys {
        list.push_bind(*key);
    }
    query.push(")");
}

/// Only `keys` count: the shared broker's topics keep the records of
/// earlier runs (other keys).
async fn fold_of(pool: &MySqlPool, projection: &str, keys: &[Uuid], last: i64) -> Fold {
    let mut query = QueryBuilder::<MySql>::new(
        "SELECT COUNT(*), CAST(COALESCE(SUM(version <> previous + 1), 0) AS SIGNED)
         FROM projection_log WHERE projection = ",
    );
    query.push_bind(projection).push(" AND ");
    push_keys(&mut query, "order_id", keys);
    let (handled, out_of_order): (i64, i64) = query.build_query_as().fetch_one(pool).await.unwrap();
    let mut query =
        QueryBuilder::<MySql>::new("SELECT COUNT(*) FROM projection WHERE projection = ");
    query
        .push_bind(projection)
        .push(" AND version = ")
        .push_bind(last)
        .push(" AND ");
    push_keys(&mut query, "order_id", keys);
    let right: i64 = query.build_query_scalar().fetch_one(pool).await.unwrap();
    Fold {
        handled,
        out_of_order,
        wrong_final: KEYS as i64 - right,
    }
}

/// The rebuild in order: a rebuild run into a topic of its own that
/// starts the group; the group's consumer reads that topic until
/// `Handover::remaining` is zero, then the group continues on the live
/// topic from the hand-over offsets (committed by the run).
async fn rebuild(pool: &MySqlPool, live_topic: &str, group: &str) -> (ConsumerHandle, Handover) {
    let replay_topic = VersionedReplayed::TOPIC;
    consumer_support::create_topic(replay_topic, 3).await;
    let filter = ReplayFilter {
        topic: Some(live_topic.to_owned()),
        ..Default::default()
    };
    let (started, on_start) = tokio::sync::oneshot::channel();
    let mut started = Some(started);
    let producer = producer();
    let replay = Replay::new(filter)
        .rebuild(replay_topic)
        .start_group(group, consumer_support::kafka_config())
        .batch_size(20)
        .rate(100.0);
    let run = replay.run(pool, &producer, |_| {
        if let Some(started) = started.take() {
            let _ = started.send(());
        }
    });
    // The group's offsets are committed before the first event is sent, so
    // its consumer may start on the replay topic while the run goes on.
    let (report, from_replay) = tokio::join!(run, async {
        on_start.await.unwrap();
        consumer(pool, group, rebuilt_from_replay)
    });
    let report = report.unwrap();
    let handover = report.handover.expect("a rebuild records its hand-over");
    assert_eq!(handover.live_topic, live_topic);
    let kafka = consumer_support::kafka_config();
    eventually("the replay read", Duration::from_secs(30), || async {
        handover.remaining(&kafka, group).await.unwrap() == 0
    })
    .await;
    from_replay.shutdown().await.unwrap();
    (consumer(pool, group, rebuilt_projection), handover)
}

/// A projection is rebuilt with a rebuild run and its hand-over while the
/// service keeps writing new versions of the same keys (one round every
/// 60 ms, at least `AFTER_REBUILD` of them after the rebuilding group is on
/// the live topic) and the relay and the live projection keep running,
/// all on MariaDB: the rebuilt projection handles every event once, each
/// key's versions in order, ends on every key's last version, and reads
/// both the replay topic (the history, and what the snapshot saw) and the
/// live topic (what committed after it); the live projection is not held.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_projection_rebuilt_from_a_replay_sees_each_keys_events_in_order() {
    let db = scratch(20).await;
    let pool = &db.pool;
    projection_tables(pool).await;
    let live_topic = Versioned::TOPIC;
    consumer_support::create_topic(live_topic, 2).await;
    let live_group = consumer_support::unique_group("ops-mysql-replay-live");
    consumer_support::start_group_at(&live_group, live_topic, 2, true).await;
    let relay = relay(pool);
    let live = consumer(pool, &live_group, live_projection);

    // The history: HISTORY versions of every key, published and projected.
    let keys: Vec<Uuid> = (0..KEYS).map(|_| Uuid::new_v4()).collect();
    for version in 1..=HISTORY {
        write_versions(pool, &keys, version).await;
    }
    let history = KEYS as i64 * HISTORY;
    eventually("the history projected", Duration::from_secs(60), || async {
        fold_of(pool, "live", &keys, HISTORY).await.handled == history
    })
    .await;

    let rebuild_group = consumer_support::unique_group("ops-mysql-replay-rebuilt");
    let started = Arc::new(AtomicBool::new(false));
    let writer = {
        let (pool, keys, started) = (pool.clone(), keys.clone(), Arc::clone(&started));
        tokio::spawn(async move {
            let mut version = HISTORY;
            let mut after_rebuild = 0;
            while version < HISTORY + LIVE || after_rebuild < AFTER_REBUILD {
                tokio::time::sleep(Duration::from_millis(60)).await;
                let rebuilding = started.load(Ordering::SeqCst);
                version += 1;
                write_versions(&pool, &keys, version).await;
                if rebuilding {
                    after_rebuild += 1;
                }
            }
            version
        })
    };
    let (rebuilt, handover) = rebuild(pool, live_topic, &rebuild_group).await;
    started.store(true, Ordering::SeqCst);
    let last = writer.await.unwrap();

    // Everything converges: both projections handled every event once.
    let total = KEYS as i64 * last;
    for projection in ["live", "rebuilt"] {
        eventually(projection, Duration::from_secs(60), || async {
            fold_of(pool, projection, &keys, last).await.handled >= total
        })
        .await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await; // room for extra calls
    let expected = Fold {
        handled: total,
        out_of_order: 0,
        wrong_final: 0,
    };
    let live_fold = fold_of(pool, "live", &keys, last).await;
    let rebuilt_fold = fold_of(pool, "rebuilt", &keys, last).await;
    let per_topic = |topic: &'static str| {
        let mut query = QueryBuilder::<MySql>::new(
            "SELECT COUNT(*) FROM projection_log WHERE projection = 'rebuilt' AND topic = ",
        );
        query.push_bind(topic).push(" AND ");
        push_keys(&mut query, "order_id", &keys);
        query
    };
    let from_replay_topic: i64 = per_topic(VersionedReplayed::TOPIC)
        .build_query_scalar()
        .fetch_one(pool)
        .await
        .unwrap();
    let from_live_topic: i64 = per_topic(Versioned::TOPIC)
        .build_query_scalar()
        .fetch_one(pool)
        .await
        .unwrap();
    let live_delay_ms: f64 = sqlx::query_scalar(
        "SELECT CAST(MAX(TIMESTAMPDIFF(MICROSECOND, o.created_at, l.handled_at)) AS DOUBLE) / 1000
         FROM projection_log l JOIN outbox_event o ON o.event_id = l.event_id
         WHERE l.projection = 'live' AND l.version > ?",
    )
    .bind(HISTORY)
    .fetch_one(pool)
    .await
    .unwrap();
    eprintln!(
        "rebuilt on MariaDB: live {live_fold:?}, rebuilt {rebuilt_fold:?} ({from_replay_topic} \
         from the replay topic, {from_live_topic} from the live topic; snapshot max id {}), \
         live delay during the rebuild {live_delay_ms:.0} ms",
        handover.snapshot_max_id
    );
    for handle in [live, rebuilt] {
        handle.shutdown().await.unwrap();
    }
    relay.shutdown().await.unwrap();
    assert_eq!(live_fold, expected, "the live projection");
    assert_eq!(rebuilt_fold, expected, "the rebuilt projection");
    assert!(live_delay_ms < 3_000.0, "{live_delay_ms}");
    // Both sources were used: the history from the replay, the events
    // committed after its snapshot from the live topic.
    assert!(
        from_replay_topic >= KEYS as i64 * HISTORY,
        "{from_replay_topic}"
    );
    assert!(from_live_topic > 0, "{from_live_topic}");
    assert_eq!(
        from_replay_topic + from_live_topic,
        total,
        "each event once"
    );
    db.drop().await;
}
