//! The relay on both backends (feature `mysql`): one test body, run once
//! on PostgreSQL and once on MariaDB (each test creates and drops its own
//! database on the machine's servers), against the real broker. Every row
//! is published and marked, per-key order holds with four relays while
//! lanes move and while relay sessions are ended from outside, a poison row
//! is parked without holding anything else back, a broker outage loses
//! nothing and counts no attempt, scheduled rows go out when due, and a
//! relay with another lane count is refused. MariaDB's own: lock names are
//! per database, and `listen_notify` is refused.
#![allow(missing_docs)]

mod relay_support;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use relay_support::*;
use sqlx::{MySqlPool, PgPool};
use txoutbox_core::Backoff;
use txoutbox_runtime::lifecycle::Stopped;
use txoutbox_runtime::relay::{BuildError, Database, Relay, RelayBuilder, RelayHandle};
use txoutbox_testkit::db::{connect, create_database, drop_databases, unique_name};
use txoutbox_testkit::mysql::MySqlScratch;
use uuid::Uuid;

/// A scratch database of either backend, migrated.
enum Db {
    Postgres { pool: PgPool, name: String },
    MariaDb(Box<MySqlScratch>),
}

impl Db {
    async fn postgres() -> Self {
        init_tracing();
        let name = unique_name("relay_backends");
        create_database(&name).await;
        let pool = connect(&name, 8).await;
        txoutbox_runtime::migrations::run(&pool).await.unwrap();
        Self::Postgres { pool, name }
    }

    async fn mariadb() -> Self {
        init_tracing();
        let scratch = MySqlScratch::create(8).await;
        txoutbox_runtime::migrations::run(&scratch.pool)
            .await
            .unwrap();
        Self::MariaDb(Box::new(scratch))
    }

    fn database(&self) -> Database {
        match self {
            Self::Postgres { pool, .. } => pool.clone().into(),
            Self::MariaDb(scratch) => scratch.pool.clone().into(),
        }
    }

    fn relay(&self, brokers: &str) -> RelayBuilder {
        Relay::builder(self.database(), kafka_config(brokers))
    }

    /// Inserts the events in order (one statement per 200) and returns
    /// their event ids.
    async fn insert(&self, events: &[NewEvent]) -> Vec<Uuid> {
        let mysql = match self {
            Self::Postgres { pool, .. } => {
                let mut ids = Vec::new();
                for chunk in events.chunks(200) {
                    ids.extend(insert(pool, chunk).await);
                }
                return ids;
            }
            Self::MariaDb(scratch) => &scratch.pool,
        };
        let mut ids = Vec::new();
        for chunk in events.chunks(200) {
            let mut insert = sqlx::QueryBuilder::new(
                "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type, \
                 payload, topic, partition_key, traceparent) ",
            );
            insert.push_values(chunk, |mut row, event| {
                let id = Uuid::now_v7();
                ids.push(id);
                row.push_bind(id)
                    .push_bind("Order")
                    .push_bind(event.key.clone())
                    .push_bind("OrderCreated")
                    .push_bind(payload(id, event))
                    .push_bind(event.topic.clone())
                    .push_bind(event.key.clone())
                    .push_bind(event.traceparent.clone());
            });
            insert.build().execute(mysql).await.unwrap();
        }
        txoutbox_core::__private::wakeup::notify_committed();
        ids
    }

    /// Schedules the events `delay` from now (the database's clock).
    async fn schedule(&self, events: &[NewEvent], delay: Duration) -> Vec<Uuid> {
        let ids: Vec<Uuid> = events.iter().map(|_| Uuid::now_v7()).collect();
        let micros = delay.as_micros() as i64;
        for (id, event) in ids.iter().zip(events) {
            match self {
                Self::Postgres { pool, .. } => {
                    sqlx::query(
                        "INSERT INTO outbox_scheduled (event_id, aggregate_type, aggregate_id,
                             event_type, payload, topic, partition_key, deliver_after)
                         VALUES ($1, 'Order', $2, 'OrderCreated', $3::jsonb, $4, $2,
                                 now() + $5 * interval '1 microsecond')",
                    )
                    .bind(id)
                    .bind(&event.key)
                    .bind(payload(*id, event))
                    .bind(&event.topic)
                    .bind(micros)
                    .execute(pool)
                    .await
                    .unwrap();
                }
                Self::MariaDb(scratch) => {
                    sqlx::query(
                        "INSERT INTO outbox_scheduled (event_id, aggregate_type, aggregate_id,
                             event_type, payload, topic, partition_key, deliver_after)
                         VALUES (?, 'Order', ?, 'OrderCreated', ?, ?, ?,
                                 UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)",
                    )
                    .bind(id)
                    .bind(&event.key)
                    .bind(payload(*id, event))
                    .bind(&event.topic)
                    .bind(&event.key)
                    .bind(micros)
                    .execute(&scratch.pool)
                    .await
                    .unwrap();
                }
            }
        }
        ids
    }

    /// A count; the query is written for both backends.
    async fn count(&self, sql: &str) -> i64 {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match self {
            Self::Postgres { pool, .. } => sqlx::query_scalar(sql).fetch_one(pool).await,
            Self::MariaDb(scratch) => sqlx::query_scalar(sql).fetch_one(&scratch.pool).await,
        }
        .unwrap()
    }

    async fn unpublished(&self) -> i64 {
        self.count("SELECT COUNT(*) FROM outbox_event WHERE published_at IS NULL")
            .await
    }

    async fn all_published(&self, timeout: Duration) {
        eventually("every outbox row published", timeout, || async {
            self.unpublished().await == 0
        })
        .await;
    }

    /// `(event_id, attempts, last_error)` of the parked rows.
    async fn parked(&self) -> Vec<(Uuid, i32, String)> {
        let sql = "SELECT event_id, attempts, COALESCE(last_error, '') FROM outbox_event
                   WHERE parked_at IS NOT NULL ORDER BY id";
        match self {
            Self::Postgres { pool, .. } => sqlx::query_as(sql).fetch_all(pool).await,
            Self::MariaDb(scratch) => sqlx::query_as(sql).fetch_all(&scratch.pool).await,
        }
        .unwrap()
    }

    /// Whether row `later` was published no earlier than row `earlier` was
    /// parked.
    async fn published_after_parked(&self, later: Uuid, earlier: Uuid) -> bool {
        let sql = "SELECT s.published_at >= p.parked_at FROM outbox_event s, outbox_event p
                   WHERE s.event_id = ? AND p.event_id = ?";
        match self {
            Self::Postgres { pool, .. } => sqlx::query_scalar(sqlx::AssertSqlSafe(
                sql.replacen('?', "$1", 1).replacen('?', "$2", 1),
            ))
            .bind(later)
            .bind(earlier)
            .fetch_one(pool)
            .await
            .unwrap(),
            Self::MariaDb(scratch) => {
                let yes: i64 = sqlx::query_scalar(sql)
                    .bind(later)
                    .bind(earlier)
                    .fetch_one(&scratch.pool)
                    .await
                    .unwrap();
                yes == 1
            }
        }
    }

    /// Ends the database sessions of every relay member, as a crashed host
    /// or a database failover would; returns how many it ended.
    async fn end_relay_sessions(&self) -> usize {
        match self {
            Self::Postgres { pool, .. } => {
                let ended: Vec<bool> = sqlx::query_scalar(
                    "SELECT pg_terminate_backend(backend_pid) FROM outbox_relay_member",
                )
                .fetch_all(pool)
                .await
                .unwrap();
                ended.len()
            }
            Self::MariaDb(scratch) => {
                let ids: Vec<i64> =
                    sqlx::query_scalar("SELECT backend_pid FROM outbox_relay_member")
                        .fetch_all(&scratch.pool)
                        .await
                        .unwrap();
                for id in &ids {
                    let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!("KILL CONNECTION {id}")))
                        .execute(&scratch.pool)
                        .await;
                }
                ids.len()
            }
        }
    }

    async fn drop(self) {
        match self {
            Self::Postgres { pool, name } => {
                pool.close().await;
                drop_databases(&[name]).await.unwrap();
            }
            Self::MariaDb(scratch) => (*scratch).drop().await,
        }
    }
}

fn payload(id: Uuid, event: &NewEvent) -> String {
    serde_json::json!({
        "event_id": id.to_string(),
        "key": event.key,
        "seq": event.seq,
        "filler": "x".repeat(event.filler),
    })
    .to_string()
}

/// The sequence numbers per key, in the order each event first arrived
/// (a republished event arrives again later: receivers dedup it).
fn first_arrivals(received: &mut [Received]) -> HashMap<String, Vec<i64>> {
    received.sort_by_key(|r| (r.partition, r.offset));
    let mut seen = HashSet::new();
    let mut per_key: HashMap<String, Vec<i64>> = HashMap::new();
    for record in received.iter() {
        if seen.insert(record.event_id()) {
            per_key
                .entry(record.key.clone())
                .or_default()
                .push(record.value["seq"].as_i64().unwrap());
        }
    }
    per_key
}

fn assert_in_order(per_key: &HashMap<String, Vec<i64>>, keys: usize, per: i64) {
    assert_eq!(per_key.len(), keys, "every key arrived");
    for (key, seqs) in per_key {
        let expected: Vec<i64> = (0..per).collect();
        assert_eq!(
            seqs, &expected,
            "key {key} arrived out of order or incomplete"
        );
    }
}

async fn publishes_every_row_in_key_order_and_marks_it(db: Db) {
    let brokers = brokers();
    let topic = unique_topic("backends-basic");
    create_topic(&brokers, &topic, 3).await;
    const KEYS: i64 = 40;
    const PER_KEY: i64 = 15;
    let events: Vec<NewEvent> = (0..PER_KEY)
        .flat_map(|seq| (0..KEYS).map(move |k| (k, seq)))
        .map(|(k, seq)| NewEvent::new(&topic, format!("key-{k}"), seq))
        .collect();
    let relay = db.relay(&brokers).batch_size(100).spawn().unwrap();
    let ids = db.insert(&events).await;
    db.all_published(Duration::from_secs(20)).await;
    let summary = relay.shutdown().await.unwrap();
    assert!(summary.clean);
    assert_eq!(summary.published, events.len() as u64);
    assert_eq!(
        db.count("SELECT COUNT(*) FROM outbox_event WHERE published_at < created_at")
            .await,
        0,
        "published after written"
    );

    let mut received = read_topic(&brokers, &topic, events.len(), Duration::from_secs(20)).await;
    assert_eq!(received.len(), events.len(), "each row published once");
    let got: HashSet<Uuid> = received.iter().map(Received::event_id).collect();
    assert_eq!(got, ids.iter().copied().collect::<HashSet<_>>());
    for record in &received {
        assert_eq!(
            record.value["event_type"], "OrderCreated",
            "{:?}",
            record.value
        );
        assert_eq!(record.headers["event_type"], "OrderCreated");
        assert_eq!(record.headers["aggregate_id"], record.key);
    }
    assert_in_order(&first_arrivals(&mut received), KEYS as usize, PER_KEY);
    db.drop().await;
}

async fn four_relays_keep_per_key_order_while_lanes_move(db: Db) {
    const KEYS: i64 = 300;
    const ROUNDS: i64 = 6;
    let brokers = brokers();
    let topic = unique_topic("backends-order");
    create_topic(&brokers, &topic, 4).await;
    let relay = |db: &Db| -> RelayHandle {
        db.relay(&brokers)
            .batch_size(100)
            .lanes(32)
            .rebalance_interval(Duration::from_millis(100))
            .spawn()
            .unwrap()
    };
    let mut relays = vec![relay(&db), relay(&db)];
    for round in 0..ROUNDS {
        let mut events: Vec<NewEvent> = (0..KEYS)
            .map(|k| NewEvent::new(&topic, format!("key-{k}"), round))
            .collect();
        events.rotate_left((round * 137 % KEYS) as usize);
        db.insert(&events).await;
        match round {
            1 | 2 => relays.push(relay(&db)),
            4 => {
                let summary = relays.remove(0).shutdown().await.unwrap();
                assert!(summary.clean);
                relays.push(relay(&db));
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert_eq!(relays.len(), 4);
    db.all_published(Duration::from_secs(30)).await;
    let mut published_by_each = Vec::new();
    for relay in relays {
        let summary = relay.shutdown().await.unwrap();
        assert!(summary.clean);
        published_by_each.push(summary.published);
    }
    assert!(
        published_by_each.iter().filter(|&&n| n > 0).count() >= 3,
        "work was shared: {published_by_each:?}"
    );
    let total = (KEYS * ROUNDS) as usize;
    let mut received = read_topic(&brokers, &topic, total, Duration::from_secs(25)).await;
    assert_in_order(&first_arrivals(&mut received), KEYS as usize, ROUNDS);
    db.drop().await;
}

async fn relays_whose_sessions_end_rejoin_and_lose_nothing(db: Db) {
    const KEYS: i64 = 50;
    const ROUNDS: i64 = 8;
    let brokers = brokers();
    let topic = unique_topic("backends-sessions");
    create_topic(&brokers, &topic, 2).await;
    let relay = |db: &Db| -> RelayHandle {
        db.relay(&brokers)
            .batch_size(20)
            .lanes(16)
            .rebalance_interval(Duration::from_millis(100))
            .error_backoff(Backoff::new(
                Duration::from_millis(20),
                Duration::from_millis(200),
            ))
            .spawn()
            .unwrap()
    };
    let relays = [relay(&db), relay(&db)];
    let mut ended = 0;
    for round in 0..ROUNDS {
        let events: Vec<NewEvent> = (0..KEYS)
            .map(|k| NewEvent::new(&topic, format!("key-{k}"), round))
            .collect();
        db.insert(&events).await;
        if round % 2 == 1 {
            // Sessions end while batches are in flight: their rows cannot be
            // marked, and the lanes' next owners publish them again.
            ended += db.end_relay_sessions().await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ended >= 2, "relay sessions were ended ({ended})");
    db.all_published(Duration::from_secs(30)).await;
    eventually(
        "both relays joined again",
        Duration::from_secs(10),
        || async { db.count("SELECT COUNT(*) FROM outbox_relay_member").await == 2 },
    )
    .await;
    for relay in relays {
        assert!(relay.is_running(), "a lost session does not stop a relay");
        let summary = relay.shutdown().await.unwrap();
        assert!(summary.clean);
    }
    let total = (KEYS * ROUNDS) as usize;
    let mut received = read_topic(&brokers, &topic, total, Duration::from_secs(25)).await;
    assert_in_order(&first_arrivals(&mut received), KEYS as usize, ROUNDS);
    db.drop().await;
}

async fn a_poison_row_is_parked_and_every_other_row_flows(db: Db) {
    let brokers = brokers();
    let topic = unique_topic("backends-poison");
    create_topic(&brokers, &topic, 2).await;
    let mut events = vec![NewEvent {
        filler: 30_000,
        ..NewEvent::new(&topic, "poison", 0)
    }];
    events.push(NewEvent::new(&topic, "poison", 1)); // same key: waits for the first
    events.extend((0..300).map(|i| NewEvent::new(&topic, format!("ok-{}", i % 30), i)));
    let ids = db.insert(&events).await;

    // This producer refuses messages over 20 kB: the first row is poison.
    let mut kafka = kafka_config(&brokers);
    kafka.set("message.max.bytes", "20000");
    let relay = Relay::builder(db.database(), kafka)
        .max_attempts(3)
        .retry_backoff(Backoff::new(
            Duration::from_millis(300),
            Duration::from_secs(300),
        ))
        .spawn()
        .unwrap();
    eventually("other keys published", Duration::from_secs(10), || async {
        db.unpublished().await == 2
    })
    .await;
    eventually(
        "poison parked, its successor published",
        Duration::from_secs(15),
        || async { db.unpublished().await == 1 },
    )
    .await;
    let summary = relay.shutdown().await.unwrap();
    assert_eq!(summary.parked, 1);
    let parked = db.parked().await;
    assert_eq!(parked.len(), 1);
    let (event_id, attempts, error) = &parked[0];
    assert_eq!((*event_id, *attempts), (ids[0], 3));
    assert!(error.to_lowercase().contains("too large"), "{error}");
    assert!(
        db.published_after_parked(ids[1], ids[0]).await,
        "the key's next row went out only after its predecessor was parked"
    );
    db.drop().await;
}

async fn a_broker_outage_loses_nothing(db: Db) {
    let mut broker = OwnBroker::start();
    let address = broker.address();
    let topic = unique_topic("backends-outage");
    create_topic(&address, &topic, 1).await;
    let relay = db
        .relay(&address)
        .delivery_timeout(Duration::from_secs(2))
        .error_backoff(Backoff::new(
            Duration::from_millis(100),
            Duration::from_millis(500),
        ))
        .spawn()
        .unwrap();
    db.insert(
        &(0..100)
            .map(|i| NewEvent::new(&topic, "k", i))
            .collect::<Vec<_>>(),
    )
    .await;
    db.all_published(Duration::from_secs(10)).await;

    broker.stop();
    let during: Vec<NewEvent> = (100..600)
        .map(|i| NewEvent::new(&topic, format!("k{}", i % 20), i))
        .collect();
    let during_ids = db.insert(&during).await;
    tokio::time::sleep(Duration::from_secs(4)).await; // at least one delivery timeout
    assert_eq!(db.unpublished().await, 500, "kept while the broker is down");
    assert_eq!(
        db.count("SELECT COUNT(*) FROM outbox_event WHERE attempts > 0 OR parked_at IS NOT NULL")
            .await,
        0,
        "an outage is not the messages' fault"
    );
    broker.restart();
    create_topic(&address, &topic, 1).await;
    db.all_published(Duration::from_secs(20)).await;
    let summary = relay.shutdown().await.unwrap();
    assert!(summary.errors > 0 && summary.clean);
    let received = read_topic(&address, &topic, during.len(), Duration::from_secs(15)).await;
    let got: HashSet<_> = received.iter().map(Received::event_id).collect();
    for id in &during_ids {
        assert!(
            got.contains(id),
            "event {id} written during the outage is missing"
        );
    }
    db.drop().await;
}

async fn scheduled_rows_go_out_when_due(db: Db) {
    let brokers = brokers();
    let topic = unique_topic("backends-scheduled");
    create_topic(&brokers, &topic, 1).await;
    let due_now = db
        .schedule(&[NewEvent::new(&topic, "now", 0)], Duration::ZERO)
        .await;
    let later: Vec<NewEvent> = (0..20)
        .map(|i| NewEvent::new(&topic, format!("later-{}", i % 4), i))
        .collect();
    let later_ids = db.schedule(&later, Duration::from_millis(1500)).await;
    let relay = db
        .relay(&brokers)
        .schedule_poll_interval(Duration::from_millis(50))
        .spawn()
        .unwrap();
    eventually("the due row published", Duration::from_secs(5), || async {
        db.count("SELECT COUNT(*) FROM outbox_event WHERE published_at IS NOT NULL")
            .await
            == 1
    })
    .await;
    assert_eq!(db.count("SELECT COUNT(*) FROM outbox_scheduled").await, 20);
    eventually(
        "the later rows published",
        Duration::from_secs(10),
        || async {
            db.count("SELECT COUNT(*) FROM outbox_event WHERE published_at IS NOT NULL")
                .await
                == 21
        },
    )
    .await;
    assert_eq!(db.count("SELECT COUNT(*) FROM outbox_scheduled").await, 0);
    assert_eq!(
        db.count(
            "SELECT COUNT(*) FROM outbox_event
             WHERE deliver_after IS NOT NULL AND published_at < deliver_after"
        )
        .await,
        0,
        "nothing went out before it was due"
    );
    let summary = relay.shutdown().await.unwrap();
    assert_eq!(summary.scheduled_moved, 21);
    let received = read_topic(&brokers, &topic, 21, Duration::from_secs(15)).await;
    let got: HashSet<_> = received.iter().map(Received::event_id).collect();
    assert!(got.contains(&due_now[0]));
    assert!(later_ids.iter().all(|id| got.contains(id)));
    let mut received = received;
    let per_key = first_arrivals(&mut received);
    for i in 0..4 {
        let seqs = &per_key[&format!("later-{i}")];
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "due order kept: {seqs:?}"
        );
    }
    db.drop().await;
}

async fn a_relay_with_another_lane_count_is_refused(db: Db) {
    let brokers = brokers();
    let topic = unique_topic("backends-lanes");
    create_topic(&brokers, &topic, 1).await;
    let first = db.relay(&brokers).lanes(32).spawn().unwrap();
    eventually(
        "the first relay joined",
        Duration::from_secs(10),
        || async { db.count("SELECT COUNT(*) FROM outbox_relay_member").await == 1 },
    )
    .await;
    let second = db.relay(&brokers).lanes(16).spawn().unwrap();
    let stopped = tokio::time::timeout(Duration::from_secs(10), second.stopped())
        .await
        .expect("the second relay stops");
    let Stopped::Failed(reason) = stopped else {
        panic!("refused, not {stopped:?}")
    };
    assert!(
        reason.contains("32 lanes") && reason.contains("16 lanes"),
        "{reason}"
    );
    db.insert(&[NewEvent::new(&topic, "k", 0)]).await;
    db.all_published(Duration::from_secs(10)).await;
    assert!(first.shutdown().await.unwrap().clean);
    db.drop().await;
}

macro_rules! on_both_backends {
    ($($body:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $body() {
                    super::$body(super::Db::postgres().await).await;
                }
            )*
        }
        mod mariadb {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $body() {
                    super::$body(super::Db::mariadb().await).await;
                }
            )*
        }
    };
}

on_both_backends!(
    publishes_every_row_in_key_order_and_marks_it,
    four_relays_keep_per_key_order_while_lanes_move,
    relays_whose_sessions_end_rejoin_and_lose_nothing,
    a_poison_row_is_parked_and_every_other_row_flows,
    a_broker_outage_loses_nothing,
    scheduled_rows_go_out_when_due,
    a_relay_with_another_lane_count_is_refused,
);

/// Named locks are server-wide: two services' databases on one server each
/// get every lane (a relay of one database never holds the other's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_databases_on_one_server_have_lanes_of_their_own() {
    let brokers = brokers();
    let topic = unique_topic("backends-two-dbs");
    create_topic(&brokers, &topic, 2).await;
    let (one, two) = (Db::mariadb().await, Db::mariadb().await);
    let relays = [
        one.relay(&brokers).lanes(8).spawn().unwrap(),
        two.relay(&brokers).lanes(8).spawn().unwrap(),
    ];
    for db in [&one, &two] {
        db.insert(
            &(0..40)
                .map(|i| NewEvent::new(&topic, format!("k{}", i % 8), i))
                .collect::<Vec<_>>(),
        )
        .await;
    }
    one.all_published(Duration::from_secs(15)).await;
    two.all_published(Duration::from_secs(15)).await;
    for relay in relays {
        let summary = relay.shutdown().await.unwrap();
        assert_eq!(
            summary.published, 40,
            "each relay published its own database"
        );
    }
    one.drop().await;
    two.drop().await;
}

/// MySQL has no `LISTEN`: the setting is refused when the relay is built.
#[tokio::test]
async fn mariadb_refuses_listen_notify() {
    let pool = MySqlPool::connect_lazy("mysql://root@127.0.0.1:1/none").unwrap();
    let refused = Relay::builder(pool, kafka_config("127.0.0.1:1"))
        .listen_notify(true)
        .build()
        .unwrap_err();
    assert!(
        matches!(refused, BuildError::InvalidConfig(m) if m.contains("poll_interval")),
        "refused with a hint"
    );
}

/// Every object of MariaDB's `ANALYZE FORMAT=JSON` output that reads
/// `table`.
#[cfg(feature = "test-hooks")]
fn table_reads<'a>(plan: &'a serde_json::Value, table: &str, out: &mut Vec<&'a serde_json::Value>) {
    match plan {
        serde_json::Value::Object(fields) => {
            if fields.get("table_name").and_then(|name| name.as_str()) == Some(table) {
                out.push(plan);
            }
            fields
                .values()
                .for_each(|value| table_reads(value, table, out));
        }
        serde_json::Value::Array(items) => {
            items.iter().for_each(|item| table_reads(item, table, out))
        }
        _ => {}
    }
}

/// The claim's walk of the outbox (`outbox_event o`): the index it used and
/// the rows it read.
#[cfg(feature = "test-hooks")]
async fn mariadb_claim_walk(pool: &MySqlPool) -> (String, i64) {
    let mut conn = pool.acquire().await.unwrap();
    let plan = txoutbox_runtime::relay::explain_claim_mysql(&mut conn, 64, 1000)
        .await
        .unwrap();
    let mut reads = Vec::new();
    table_reads(&plan, "o", &mut reads);
    assert_eq!(reads.len(), 1, "one read of the claimed rows: {plan:#}");
    let key = reads[0]["key"].as_str().unwrap_or("(none)").to_owned();
    let rows = reads[0]["r_rows"].as_f64().unwrap() as i64;
    (key, rows)
}

/// MySQL has no partial index. Until MySQL migration 0008 the claim walked
/// `(published_at, id)`, whose NULL head held the parked rows too, oldest
/// first: every claim read each dead letter before the rows it could
/// publish. Now `(published_at, parked_at, id)`, forced, puts the claimable
/// rows first: a claim reads them only, behind any number of published or
/// parked rows; a retried dead letter is claimable again, first; the relay
/// publishes the pending rows and leaves the parked ones. Checked on a schema upgraded from 0007, on the plan the
/// server ran.
#[cfg(feature = "test-hooks")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_claim_reads_no_parked_or_published_row() {
    init_tracing();
    let brokers = brokers();
    let topic = unique_topic("backends-claim-index");
    create_topic(&brokers, &topic, 2).await;
    let scratch = MySqlScratch::create(8).await;
    for migration in &txoutbox_runtime::migrations::MYSQL_MIGRATIONS[..7] {
        sqlx::raw_sql(migration.sql)
            .execute(&scratch.pool)
            .await
            .unwrap();
    }
    let pool = scratch.pool.clone();
    let db = Db::MariaDb(Box::new(scratch));
    let execute = |sql: &'static str| {
        let pool = pool.clone();
        async move { sqlx::query(sql).execute(&pool).await.unwrap() }
    };
    // History (published), then 3,000 dead letters, then 200 pending rows.
    db.insert(
        &(0..5000)
            .map(|i| NewEvent::new(&topic, format!("h{}", i % 50), i))
            .collect::<Vec<_>>(),
    )
    .await;
    execute("UPDATE outbox_event SET published_at = UTC_TIMESTAMP(6)").await;
    let parked = db
        .insert(
            &(0..3000)
                .map(|i| NewEvent::new(&topic, format!("p{}", i % 300), i))
                .collect::<Vec<_>>(),
        )
        .await;
    execute(
        "UPDATE outbox_event SET parked_at = UTC_TIMESTAMP(6), attempts = 10,
             last_error = 'refused'
         WHERE published_at IS NULL",
    )
    .await;
    db.insert(
        &(0..200)
            .map(|i| NewEvent::new(&topic, format!("k{}", i % 20), i))
            .collect::<Vec<_>>(),
    )
    .await;
    execute("ANALYZE TABLE outbox_event").await;

    let (_, before) = mariadb_claim_walk(&pool).await;
    assert!(
        before >= 3200,
        "before 0008 the claim reads every parked row first: {before} rows"
    );
    // The runner has no record of the migrations applied by hand: it
    // applies them again (each is idempotent), 0008 last.
    let applied = txoutbox_runtime::migrations::run(&pool).await.unwrap();
    assert_eq!(applied.last(), Some(&8));
    assert_eq!(
        mariadb_claim_walk(&pool).await,
        ("ix_outbox_event_unpublished".to_owned(), 200),
        "the claim reads the 200 pending rows and nothing else"
    );
    // The same once the statistics know the new index.
    execute("ANALYZE TABLE outbox_event").await;
    assert_eq!(
        mariadb_claim_walk(&pool).await,
        ("ix_outbox_event_unpublished".to_owned(), 200)
    );

    // An operator retries 100 dead letters: claimable again, and first.
    let retried = txoutbox_runtime::ops::dead_letters::retry(
        &pool,
        txoutbox_runtime::ops::dead_letters::Table::Outbox,
        &txoutbox_runtime::ops::dead_letters::Selection::EventIds(parked[..100].to_vec()),
    )
    .await
    .unwrap();
    assert_eq!(retried.len(), 100);
    assert_eq!(
        mariadb_claim_walk(&pool).await,
        ("ix_outbox_event_unpublished".to_owned(), 300)
    );
    let first: Vec<Uuid> = sqlx::query_scalar(
        "SELECT event_id FROM outbox_event WHERE published_at IS NULL AND parked_at IS NULL
         ORDER BY id LIMIT 100",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(first, parked[..100]);

    // The relay publishes the 300 and leaves the 2,900 dead letters.
    let relay = db.relay(&brokers).spawn().unwrap();
    eventually(
        "the pending rows published",
        Duration::from_secs(15),
        || async { db.unpublished().await == 2900 },
    )
    .await;
    let summary = relay.shutdown().await.unwrap();
    assert_eq!((summary.published, summary.parked), (300, 0));
    assert_eq!(
        db.count("SELECT COUNT(*) FROM outbox_event WHERE parked_at IS NOT NULL")
            .await,
        2900
    );
    db.drop().await;
}
