//! Replay against real PostgreSQL and the real broker at KAFKA_BROKERS_TEST:
//! exactly the selected events arrive again, with their key, value and
//! headers; failures and the rate limit are recorded and honoured; a
//! projection rebuilt while live traffic flows sees each key in order with a
//! rebuild run, and out of order from a replay into the live topic.

#![allow(missing_docs)] // the test events' generated items

mod consumer_support;
mod ops_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chrono::{TimeDelta, Utc};
use ops_support::{OutboxRow, brokers, new_topic, read_back};
use rdkafka::ClientConfig;
use sqlx::{PgPool, Postgres, Transaction};
use txoutbox_core::wire::HEADER_REPLAY;
use txoutbox_runtime::consumer::{
    Consumer, ConsumerHandle, EventHandler, EventMeta, event_handler,
};
use txoutbox_runtime::ops::OpsError;
use txoutbox_runtime::ops::replay::{self, Replay, ReplayFilter};
use txoutbox_runtime::relay::{CloudEvents, HeaderNames, Relay};

#[sqlx::test(migrations = false)]
async fn replay_of_a_filtered_range_delivers_exactly_the_selected_events(pool: PgPool) {
    txoutbox_runtime::migrations::run(&pool).await.unwrap();
    let topic: &'static str = Box::leak(new_topic().await.into_boxed_str());
    let row = |created_min: i64, event_type: &'static str, aggregate: &str, published: bool| {
        let mut row = OutboxRow::new(topic);
        row.created_ago = created_min * 60;
        row.published_ago = published.then_some(created_min * 60 - 5);
        row.event_type = event_type;
        row.aggregate_id = aggregate.into();
        row
    };
    row(60, "OrderCreated", "0", true).insert(&pool).await; // before the range
    let mut traced = row(40, "OrderCreated", "1", true);
    traced.traceparent = Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
    let (_, e1) = traced.insert(&pool).await;
    row(30, "OrderPaid", "1", true).insert(&pool).await; // other type
    let (_, e2) = row(30, "OrderCreated", "2", true).insert(&pool).await;
    row(20, "OrderCreated", "9", false).insert(&pool).await; // unpublished
    let (_, e3) = row(20, "OrderCreated", "3", true).insert(&pool).await;
    row(5, "OrderCreated", "4", true).insert(&pool).await; // after the range
    let mut elsewhere = OutboxRow::new("cli-replay-other-topic").published(1_800, 1_700);
    elsewhere.event_type = "OrderCreated";
    elsewhere.insert(&pool).await;
    let before: Vec<(i64, Option<chrono::DateTime<Utc>>)> =
        sqlx::query_as("SELECT id, published_at FROM outbox_event ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();

    let now = Utc::now();
    let filter = ReplayFilter {
        from: Some(now - TimeDelta::minutes(50)),
        to: Some(now - TimeDelta::minutes(10)),
        topic: Some(topic.to_owned()),
        event_type: Some("OrderCreated".into()),
        ..Default::default()
    };
    assert_eq!(replay::count(&pool, &filter).await.unwrap(), 3);
    let producer = producer();
    let mut progress = Vec::new();
    let report = Replay::new(filter.clone())
        .batch_size(2)
        .run(&pool, &producer, |n| progress.push(n))
        .await
        .unwrap();
    assert_eq!((report.selected, report.published), (3, 3));
    assert_eq!(progress, [2, 1], "pipelined in batches of two");

    let received = read_back(topic).await;
    assert_eq!(received.len(), 3);
    // The value is byte for byte what the relay sends: the row's jsonb as
    // text, named by its event type as its first field (these rows were
    // stored without it).
    let stored: Vec<(uuid::Uuid, String, String)> = sqlx::query_as(
        "SELECT event_id, partition_key,
                '{\"event_type\": \"' || event_type || '\", ' || substr(payload::text, 2)
         FROM outbox_event WHERE event_id = ANY($1) ORDER BY id",
    )
    .bind(vec![e1, e2, e3])
    .fetch_all(&pool)
    .await
    .unwrap();
    for (got, (event_id, key, payload)) in received.iter().zip(&stored) {
        assert_eq!(&got.key, key);
        assert_eq!(&got.payload, payload);
        let h = &got.headers;
        assert_eq!(h["event_id"], event_id.to_string());
        assert_eq!(h["event_type"], "OrderCreated");
        assert_eq!(h["aggregate_type"], "Order");
        assert_eq!(h["aggregate_id"], *key);
        assert_eq!(h["content-type"], "application/json");
        assert_eq!(h[HEADER_REPLAY], report.run_id.to_string());
    }
    assert_eq!(
        received[0].headers.get("traceparent").map(String::as_str),
        traced.traceparent
    );
    assert!(!received[1].headers.contains_key("traceparent"));

    // The audit trail: outbox rows untouched, the run recorded.
    let after: Vec<(i64, Option<chrono::DateTime<Utc>>)> =
        sqlx::query_as("SELECT id, published_at FROM outbox_event ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(before, after);
    let (filter_json, selected, published, finished, error): (
        serde_json::Value,
        i64,
        i64,
        bool,
        Option<String>,
    ) = sqlx::query_as(
        "SELECT filter, selected, published, finished_at IS NOT NULL, error
         FROM outbox_replay_run WHERE id = $1",
    )
    .bind(report.run_id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((selected, published, finished, error), (3, 3, true, None));
    assert_eq!(filter_json["topic"], topic);
    assert_eq!(filter_json["event_type"], "OrderCreated");
    assert!(filter_json.get("aggregate_id").is_none());
}

#[sqlx::test(migrations = false)]
async fn replay_honours_the_rate_and_the_target_topic(pool: PgPool) {
    txoutbox_runtime::migrations::run(&pool).await.unwrap();
    let target = new_topic().await;
    for i in 0..15 {
        let mut row = OutboxRow::new("cli-replay-source").published(60, 30);
        row.aggregate_id = i.to_string();
        row.insert(&pool).await;
    }
    let filter = ReplayFilter {
        topic: Some("cli-replay-source".into()),
        ..Default::default()
    };
    let producer = producer();
    let started = Instant::now();
    let report = Replay::new(filter)
        .target_topic(target.clone())
        .rate(10.0)
        .run(&pool, &producer, |_| {})
        .await
        .unwrap();
    let elapsed = started.elapsed();
    assert_eq!(report.published, 15);
    // 10 events go at once, the next 5 only after the first second.
    assert!(elapsed >= Duration::from_millis(950), "took {elapsed:?}");
    let received = read_back(&target).await;
    let keys: Vec<_> = received.iter().map(|r| r.key.as_str()).collect();
    let expected: Vec<String> = (0..15).map(|i| i.to_string()).collect();
    assert_eq!(keys, expected, "id order");
}

/// A replay sends the headers the service's relay sends: its header names
/// (Debezium's here) and CloudEvents' binary mode; bad settings are refused
/// before anything is sent.
#[sqlx::test(migrations = false)]
async fn a_replay_takes_the_header_settings_of_the_services_relay(pool: PgPool) {
    txoutbox_runtime::migrations::run(&pool).await.unwrap();
    let (_, event_id) = OutboxRow::new("cli-replay-headers")
        .published(60, 30)
        .insert(&pool)
        .await;
    let replay = Replay::new(ReplayFilter {
        topic: Some("cli-replay-headers".into()),
        ..Default::default()
    });
    let replayed = |configured: Replay| {
        let pool = pool.clone();
        async move {
            let target = new_topic().await;
            configured
                .target_topic(target.clone())
                .run(&pool, &producer(), |_| {})
                .await?;
            let received = read_back(&target).await;
            assert_eq!(received.len(), 1);
            Ok::<_, OpsError>(received[0].headers.clone())
        }
    };
    let refused = replayed(
        replay
            .clone()
            .header_names(HeaderNames::debezium().event_type("")),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&refused, OpsError::HeaderNames(problem) if problem.contains("empty")),
        "{refused}"
    );
    let refused = replayed(replay.clone().cloudevents(CloudEvents::binary().source("")))
        .await
        .unwrap_err();
    assert!(matches!(&refused, OpsError::CloudEvents(_)), "{refused}");

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
    let database: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(headers["ce_id"], event_id.to_string());
    assert_eq!(headers["ce_type"], "OrderCreated");
    assert_eq!(headers["ce_specversion"], "1.0");
    assert_eq!(headers["ce_source"], format!("/txoutbox/{database}"));
    assert_eq!(headers["event_id"], event_id.to_string(), "next to ours");
    assert!(headers.contains_key("ce_time"));
}

#[sqlx::test(migrations = false)]
async fn a_failed_replay_is_recorded_with_its_error(pool: PgPool) {
    txoutbox_runtime::migrations::run(&pool).await.unwrap();
    OutboxRow::new("cli-replay-unreachable")
        .published(60, 30)
        .insert(&pool)
        .await;
    // Nothing listens on port 1: the delivery times out quickly.
    let producer = ClientConfig::new()
        .set("bootstrap.servers", "127.0.0.1:1")
        .set("enable.idempotence", "true")
        .set("message.timeout.ms", "1500")
        .create()
        .unwrap();
    let filter = ReplayFilter {
        topic: Some("cli-replay-unreachable".into()),
        ..Default::default()
    };
    let error = Replay::new(filter)
        .run(&pool, &producer, |_| {})
        .await
        .unwrap_err();
    let OpsError::ReplayFailed {
        run_id, published, ..
    } = &error
    else {
        panic!("unexpected error {error}");
    };
    assert_eq!(*published, 0);
    let (finished, recorded): (bool, Option<String>) = sqlx::query_as(
        "SELECT finished_at IS NOT NULL, error FROM outbox_replay_run WHERE id = $1",
    )
    .bind(run_id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(finished);
    assert!(recorded.unwrap().contains("kafka"), "{error}");
}

/// An idempotent producer, as `outbox replay` makes one.
fn producer() -> rdkafka::producer::FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .create()
        .unwrap()
}

// ---------------------------------------------------------------------------
// Rebuilding a projection while live traffic flows.
// ---------------------------------------------------------------------------

txoutbox_testkit::test_event!(Versioned, "ops-replay.rebuild.orders", "Versioned");
// The same events as the rebuild topic carries them: the consumer routes by
// (topic, event type), so the rebuilding group's first consumer registers
// the projection for this topic.
txoutbox_testkit::test_event!(
    VersionedReplayed,
    "ops-replay.rebuild.orders.replay",
    "Versioned"
);

/// Keys (orders) of the rebuild scenario.
const KEYS: usize = 8;
/// Versions of each key written (and published) before the rebuild starts.
const HISTORY: i64 = 25;
/// Versions of each key written while the rebuild runs, at least.
const LIVE: i64 = 15;
/// Rounds of new versions written after the rebuilding group runs on its own.
const AFTER_REBUILD: i64 = 3;

/// The projection's tables: the state (last version per key) and the log of
/// every call in handling order, with the version the fold found before.
async fn projection_tables(pool: &PgPool) {
    sqlx::raw_sql(
        "CREATE TABLE projection (
             projection text NOT NULL, order_id uuid NOT NULL, version bigint NOT NULL,
             PRIMARY KEY (projection, order_id));
         CREATE TABLE projection_log (
             n bigserial PRIMARY KEY, projection text NOT NULL, event_id uuid NOT NULL,
             order_id uuid NOT NULL, version bigint NOT NULL, previous bigint NOT NULL,
             topic text NOT NULL, handled_at timestamptz NOT NULL DEFAULT clock_timestamp())",
    )
    .execute(pool)
    .await
    .unwrap();
}

/// "Last version wins", and the log of what the fold saw.
async fn fold(
    tx: &mut Transaction<'_, Postgres>,
    projection: &str,
    (event_id, order_id, version): (uuid::Uuid, uuid::Uuid, i64),
    meta: &EventMeta,
) -> Result<(), sqlx::Error> {
    let previous: Option<i64> = sqlx::query_scalar(
        "SELECT version FROM projection WHERE projection = $1 AND order_id = $2 FOR UPDATE",
    )
    .bind(projection)
    .bind(order_id)
    .fetch_optional(&mut **tx)
    .await?;
    sqlx::query(
        "INSERT INTO projection_log (projection, event_id, order_id, version, previous, topic)
         VALUES ($1, $2, $3, $4, $5, $6)",
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
        "INSERT INTO projection (projection, order_id, version) VALUES ($1, $2, $3)
         ON CONFLICT (projection, order_id) DO UPDATE SET version = EXCLUDED.version",
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
    tx: &mut Transaction<'_, Postgres>,
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

/// The projection being rebuilt (its own consumer group), on the live topic.
#[event_handler]
async fn rebuilt_projection(
    tx: &mut Transaction<'_, Postgres>,
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
    tx: &mut Transaction<'_, Postgres>,
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

/// Writes version `version` of every key, as one transaction (`amount` is the
/// version), and wakes the relay.
async fn write_versions(pool: &PgPool, keys: &[uuid::Uuid], version: i64) {
    let ids: Vec<uuid::Uuid> = keys.iter().map(|_| uuid::Uuid::now_v7()).collect();
    let payloads: Vec<serde_json::Value> = keys
        .iter()
        .zip(&ids)
        .map(|(key, id)| serde_json::json!({ "event_id": id, "order_id": key, "amount": version }))
        .collect();
    let keys: Vec<String> = keys.iter().map(ToString::to_string).collect();
    sqlx::query(
        "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type, payload,
                                   topic, partition_key)
         SELECT e.id, 'Order', e.key, 'Versioned', e.payload, $4, e.key
         FROM unnest($1::uuid[], $2::jsonb[], $3::text[]) WITH ORDINALITY AS e(id, payload, key, n)
         ORDER BY e.n",
    )
    .bind(&ids)
    .bind(&payloads)
    .bind(&keys)
    .bind(<Versioned as txoutbox_core::DomainEvent>::TOPIC)
    .execute(pool)
    .await
    .unwrap();
    txoutbox_core::__private::wakeup::notify_committed();
}

fn consumer(pool: &PgPool, group: &str, handler: impl EventHandler) -> ConsumerHandle {
    Consumer::builder(pool.clone(), consumer_support::kafka_config(), group)
        .handler(handler)
        .build()
        .unwrap()
        .spawn()
}

/// What one projection's log shows: handled events, calls whose version was
/// not the one after the previous (out of order), and keys whose final
/// version is not the last one written.
#[derive(Debug, PartialEq)]
struct Fold {
    handled: i64,
    out_of_order: i64,
    wrong_final: i64,
}

/// Only `keys` count: the shared broker's topics keep the records of earlier
/// runs (other keys), and a group started "at the end" may see a few of them
/// (tansu reports a partition's end as its last batch's first offset + 1).
async fn fold_of(pool: &PgPool, projection: &str, keys: &[uuid::Uuid], last: i64) -> Fold {
    let (handled, out_of_order): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE version <> previous + 1)
         FROM projection_log WHERE projection = $1 AND order_id = ANY($2)",
    )
    .bind(projection)
    .bind(keys)
    .fetch_one(pool)
    .await
    .unwrap();
    let right: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM projection
         WHERE projection = $1 AND order_id = ANY($2) AND version = $3",
    )
    .bind(projection)
    .bind(keys)
    .bind(last)
    .fetch_one(pool)
    .await
    .unwrap();
    Fold {
        handled,
        out_of_order,
        wrong_final: KEYS as i64 - right,
    }
}

/// How the projection is rebuilt.
#[derive(Debug, Clone, Copy, PartialEq)]
enum HowRebuilt {
    /// A republish replay into the live topic, the group starting at its end
    /// (all `outbox replay` offered before rebuild runs).
    IntoTheLiveTopic,
    /// A rebuild run into a topic of its own, then the live topic from the
    /// hand-over offsets.
    WithAHandover,
}

/// What the rebuild scenario ended with.
#[derive(Debug)]
struct Rebuilt {
    total: i64,
    live: Fold,
    rebuilt: Fold,
    /// The live projection's longest delay (commit to handled) for the
    /// events written during the rebuild.
    live_delay_ms: f64,
    /// Calls of the rebuilt projection per source topic.
    from_replay_topic: i64,
    from_live_topic: i64,
}

/// A projection is rebuilt from a replay (a consumer group of its own) while
/// the service keeps writing new versions of the same keys and the relay and
/// the live projection keep running; waits until both projections handled
/// every event.
async fn rebuild_while_live_traffic_flows(pool: PgPool, how: HowRebuilt) -> Rebuilt {
    txoutbox_testkit::init_tracing();
    txoutbox_runtime::migrations::run(&pool).await.unwrap();
    projection_tables(&pool).await;
    let live_topic = <Versioned as txoutbox_core::DomainEvent>::TOPIC;
    consumer_support::create_topic(live_topic, 2).await;
    let live_group = consumer_support::unique_group("ops-replay-live");
    consumer_support::start_group_at(&live_group, live_topic, 2, true).await;
    let relay = Relay::builder(
        pool.clone(),
        txoutbox_testkit::broker::client_config(&brokers()),
    )
    .spawn()
    .unwrap();
    let live = consumer(&pool, &live_group, live_projection);

    // The history: HISTORY versions of every key, published and projected.
    let keys: Vec<uuid::Uuid> = (0..KEYS).map(|_| uuid::Uuid::new_v4()).collect();
    for version in 1..=HISTORY {
        write_versions(&pool, &keys, version).await;
    }
    let history = KEYS as i64 * HISTORY;
    txoutbox_testkit::eventually("the history projected", Duration::from_secs(30), || async {
        fold_of(&pool, "live", &keys, HISTORY).await.handled == history
    })
    .await;

    // The rebuild, while new versions keep coming (one round every 60 ms).
    let rebuild_group = consumer_support::unique_group("ops-replay-rebuilt");
    // At least LIVE rounds, and at least AFTER_REBUILD of them after the
    // rebuilding group is on its own (however slow the machine), so that
    // both sources carry events.
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
    let rebuilt = match how {
        HowRebuilt::IntoTheLiveTopic => republish(&pool, live_topic, &rebuild_group).await,
        HowRebuilt::WithAHandover => rebuild(&pool, live_topic, &rebuild_group).await,
    };
    started.store(true, Ordering::SeqCst);
    let last = writer.await.unwrap();

    // Everything converges: both projections handled every event once.
    let total = KEYS as i64 * last;
    for projection in ["live", "rebuilt"] {
        txoutbox_testkit::eventually(projection, Duration::from_secs(30), || async {
            fold_of(&pool, projection, &keys, last).await.handled >= total
        })
        .await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await; // room for extra calls
    let live_fold = fold_of(&pool, "live", &keys, last).await;
    let rebuilt_fold = fold_of(&pool, "rebuilt", &keys, last).await;
    let live_delay_ms: f64 = sqlx::query_scalar(
        "SELECT (extract(epoch FROM max(l.handled_at - o.created_at)) * 1000)::float8
         FROM projection_log l JOIN outbox_event o USING (event_id)
         WHERE l.projection = 'live' AND l.version > $1",
    )
    .bind(HISTORY)
    .fetch_one(&pool)
    .await
    .unwrap();
    let first_key: Vec<i64> = sqlx::query_scalar(
        "SELECT version FROM projection_log WHERE projection = 'rebuilt' AND order_id = $1 ORDER BY n",
    )
    .bind(keys[0])
    .fetch_all(&pool)
    .await
    .unwrap();
    let (from_replay_topic, from_live_topic): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE topic = $2), count(*) FILTER (WHERE topic = $3)
         FROM projection_log WHERE projection = 'rebuilt' AND order_id = ANY($1)",
    )
    .bind(&keys)
    .bind(<VersionedReplayed as txoutbox_core::DomainEvent>::TOPIC)
    .bind(live_topic)
    .fetch_one(&pool)
    .await
    .unwrap();
    eprintln!(
        "{how:?}: live {live_fold:?}, rebuilt {rebuilt_fold:?} ({from_replay_topic} from the \
         replay topic, {from_live_topic} from the live topic), live delay during the rebuild \
         {live_delay_ms:.0} ms; the rebuilt projection saw key 0's versions {first_key:?}"
    );
    for handle in [live, rebuilt] {
        handle.shutdown().await.unwrap();
    }
    relay.shutdown().await.unwrap();
    Rebuilt {
        total,
        live: live_fold,
        rebuilt: rebuilt_fold,
        live_delay_ms,
        from_replay_topic,
        from_live_topic,
    }
}

/// With a rebuild run and its hand-over, the rebuilt projection sees every
/// key's versions in order, each once, and ends equal to the live one; the
/// live projection does not wait for the rebuild.
#[sqlx::test(migrations = false)]
async fn a_projection_rebuilt_from_a_replay_sees_each_keys_events_in_order(pool: PgPool) {
    let outcome = rebuild_while_live_traffic_flows(pool, HowRebuilt::WithAHandover).await;
    let expected = Fold {
        handled: outcome.total,
        out_of_order: 0,
        wrong_final: 0,
    };
    assert_eq!(outcome.live, expected, "the live projection");
    assert_eq!(outcome.rebuilt, expected, "the rebuilt projection");
    assert!(outcome.live_delay_ms < 3_000.0, "{outcome:?}");
    // Both sources were used: the history from the replay, the events
    // committed after its snapshot from the live topic.
    assert!(
        outcome.from_replay_topic >= KEYS as i64 * HISTORY,
        "{outcome:?}"
    );
    assert!(outcome.from_live_topic > 0, "{outcome:?}");
}

/// What a group rebuilding from a replay into the live topic sees: the
/// replayed copies land between the live events, so a key's newer live
/// versions come before older replayed ones (whose later copies dedup
/// skips once handled). It handles every event once, out of order.
#[sqlx::test(migrations = false)]
async fn a_replay_into_the_live_topic_interleaves_a_keys_old_and_new_events(pool: PgPool) {
    let outcome = rebuild_while_live_traffic_flows(pool, HowRebuilt::IntoTheLiveTopic).await;
    assert_eq!(outcome.live.handled, outcome.total, "{outcome:?}");
    assert_eq!(outcome.rebuilt.handled, outcome.total, "{outcome:?}");
    assert!(outcome.rebuilt.out_of_order > 0, "{outcome:?}");
    assert_eq!(outcome.from_replay_topic, 0);
}

/// The rebuild as `outbox replay` offered it before rebuild runs: the
/// rebuilding group starts at the live topic's end, and the history is
/// replayed into the live topic.
async fn republish(pool: &PgPool, live_topic: &str, group: &str) -> ConsumerHandle {
    consumer_support::start_group_at(group, live_topic, 2, true).await;
    let rebuilt = consumer(pool, group, rebuilt_projection);
    let filter = ReplayFilter {
        topic: Some(live_topic.to_owned()),
        ..Default::default()
    };
    Replay::new(filter)
        .batch_size(20)
        .rate(100.0)
        .run(pool, &producer(), |_| {})
        .await
        .unwrap();
    rebuilt
}

/// The rebuild in order: a rebuild run into a topic of its own that starts
/// the group; the group's consumer reads that topic until
/// `Handover::remaining` is zero, then the group continues on the live topic
/// from the hand-over offsets (committed by the run).
async fn rebuild(pool: &PgPool, live_topic: &str, group: &str) -> ConsumerHandle {
    let replay_topic = <VersionedReplayed as txoutbox_core::DomainEvent>::TOPIC;
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
    txoutbox_testkit::eventually("the replay read", Duration::from_secs(30), || async {
        handover.remaining(&kafka, group).await.unwrap() == 0
    })
    .await;
    from_replay.shutdown().await.unwrap();
    consumer(pool, group, rebuilt_projection)
}

/// Inserts an outbox row of `topic` for `key` on `conn` (a transaction, say);
/// returns its id. The payload carries `n`.
async fn insert_row(conn: &mut sqlx::PgConnection, topic: &str, key: &str, n: i64) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type, payload,
                                   topic, partition_key)
         VALUES (gen_random_uuid(), 'Order', $2, 'OrderCreated', jsonb_build_object('n', $3),
                 $1, $2)
         RETURNING id",
    )
    .bind(topic)
    .bind(key)
    .bind(n)
    .fetch_one(conn)
    .await
    .unwrap()
}

/// `(key, n)` of each record read back.
fn keys_and_numbers(received: &[ops_support::Received]) -> Vec<(String, i64)> {
    received
        .iter()
        .map(|r| {
            let value: serde_json::Value = serde_json::from_str(&r.payload).unwrap();
            (r.key.clone(), value["n"].as_i64().unwrap())
        })
        .collect()
}

/// Commit order is not id order: rows whose transactions commit after the
/// run started must all stay out of the replay (the relay publishes them to
/// the live topic after the hand-over offsets), even where a later page
/// could see them. With a snapshot per page, key `k`'s third version (read
/// by a later page) was replayed while its second (its page read before the
/// commit) was not: the rebuilding group would have seen 3 before 2.
#[sqlx::test(migrations = false)]
async fn a_rebuild_reads_one_snapshot_so_late_commits_come_only_from_the_live_topic(pool: PgPool) {
    txoutbox_runtime::migrations::run(&pool).await.unwrap();
    let live = new_topic().await;
    let replay_topic = new_topic().await;
    let mut conn = pool.acquire().await.unwrap();
    insert_row(&mut conn, &live, "k", 1).await;
    // Ids in this order: k1 < k2 < d < k3 < c; k2 and k3 commit late.
    let mut late_k2 = pool.begin().await.unwrap();
    insert_row(&mut late_k2, &live, "k", 2).await;
    insert_row(&mut conn, &live, "d", 1).await;
    let mut late_k3 = pool.begin().await.unwrap();
    insert_row(&mut late_k3, &live, "k", 3).await;
    let last = insert_row(&mut conn, &live, "c", 1).await;
    drop(conn);

    let filter = ReplayFilter {
        topic: Some(live.clone()),
        ..Default::default()
    };
    // Pages of one row, 200 ms apart; both late transactions commit once the
    // second page (row d) is delivered, before the third page is read.
    let replay = Replay::new(filter)
        .rebuild(&replay_topic)
        .batch_size(1)
        .rate(5.0);
    let (second_page, on_second_page) = tokio::sync::oneshot::channel();
    let mut second_page = Some(second_page);
    let mut delivered = 0;
    let producer = producer();
    let run = replay.run(&pool, &producer, |n| {
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
}

/// A rebuild selects rows the relay has not marked yet (one delivered before
/// the hand-over offsets but unmarked would otherwise be lost to the
/// rebuild), leaves parked and discarded rows out, starts the group and
/// records everything in `outbox_replay_run`.
#[sqlx::test(migrations = false)]
async fn a_rebuild_includes_unmarked_rows_and_records_its_hand_over(pool: PgPool) {
    txoutbox_runtime::migrations::run(&pool).await.unwrap();
    let live: &'static str = Box::leak(new_topic().await.into_boxed_str());
    let replay_topic = new_topic().await;
    let row = |key: &str| {
        let mut row = OutboxRow::new(live);
        row.aggregate_id = key.into();
        row
    };
    row("published").published(60, 50).insert(&pool).await;
    // Delivered by a relay that has not marked it yet: on the live topic
    // before the hand-over offsets, `published_at` still NULL.
    row("unmarked").insert(&pool).await;
    let delivered = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create::<rdkafka::producer::FutureProducer>()
        .unwrap();
    delivered
        .send(
            rdkafka::producer::FutureRecord::to(live)
                .key("unmarked")
                .payload("{}"),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    row("parked").parked(5, "refused").insert(&pool).await;
    let mut discarded = row("discarded").parked(5, "refused");
    discarded.discarded_ago = Some(5);
    discarded.insert(&pool).await;
    row("pending").insert(&pool).await;

    let filter = ReplayFilter {
        topic: Some(live.to_owned()),
        ..Default::default()
    };
    let group = txoutbox_testkit::broker::unique_group("ops-replay-rebuild");
    let kafka = txoutbox_testkit::broker::client_config(&brokers());
    let replay = Replay::new(filter)
        .rebuild(&replay_topic)
        .start_group(&group, kafka.clone());
    assert_eq!(replay.count(&pool).await.unwrap(), 3);
    let report = replay.run(&pool, &producer(), |_| {}).await.unwrap();
    assert_eq!((report.selected, report.published), (3, 3));
    let received = read_back(&replay_topic).await;
    let keys: Vec<&str> = received.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["published", "unmarked", "pending"]);

    let handover = report.handover.clone().unwrap();
    let at = |offsets: &[replay::PartitionOffset]| -> Vec<(i32, i64)> {
        offsets.iter().map(|p| (p.partition, p.offset)).collect()
    };
    // The unmarked row's record is before the live offsets: only the replay
    // brings it to the group.
    assert_eq!(at(&handover.live_offsets), [(0, 1)]);
    assert_eq!(at(&handover.replay_start), [(0, 0)]);
    assert_eq!(at(handover.replay_end.as_deref().unwrap()), [(0, 3)]);
    assert_eq!(handover.group.as_deref(), Some(group.as_str()));
    // The group starts there, has read nothing yet, and cannot be started twice.
    assert_eq!(
        consumer_support::committed(&group, &replay_topic, 1).await,
        [0]
    );
    assert_eq!(consumer_support::committed(&group, live, 1).await, [1]);
    assert_eq!(handover.remaining(&kafka, &group).await.unwrap(), 3);
    let again = handover.start_group(&kafka, &group).await.unwrap_err();
    assert!(
        again.to_string().contains("already has a committed offset"),
        "{again}"
    );

    // The audit record.
    let (mode, recorded_group, recorded, target): (
        String,
        Option<String>,
        serde_json::Value,
        String,
    ) = sqlx::query_as(
        "SELECT mode, rebuild_group, handover, target_topic FROM outbox_replay_run
             WHERE id = $1",
    )
    .bind(report.run_id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(mode, "rebuild");
    assert_eq!(recorded_group.as_deref(), Some(group.as_str()));
    assert_eq!(target, replay_topic);
    assert_eq!(recorded, serde_json::to_value(&handover).unwrap());
    assert_eq!(
        replay::Handover::load(&pool, report.run_id).await.unwrap(),
        Some(handover)
    );
}

/// A rebuild needs the live topic named, a topic of its own that exists; it
/// refuses before recording a run.
#[sqlx::test(migrations = false)]
async fn a_rebuild_refuses_a_missing_or_live_target_before_it_starts(pool: PgPool) {
    txoutbox_runtime::migrations::run(&pool).await.unwrap();
    let live: &'static str = Box::leak(new_topic().await.into_boxed_str());
    OutboxRow::new(live).published(60, 50).insert(&pool).await;
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
            Replay::new(on(Some(live))).rebuild(live),
            "not to the live topic",
        ),
        (
            Replay::new(on(Some(live))).rebuild(&missing),
            "does not exist",
        ),
    ] {
        let error = replay.run(&pool, &producer, |_| {}).await.unwrap_err();
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
    let runs = txoutbox_testkit::count(&pool, "SELECT count(*) FROM outbox_replay_run").await;
    assert_eq!(runs, 0);
}
