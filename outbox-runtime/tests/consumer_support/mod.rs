//! Shared helpers of the consumer tests: consumer-side broker access (group
//! offsets, producing, reading back) and the effect table; the broker
//! address, topics, test events, waiting and counting come from
//! `txoutbox-testkit`.
#![allow(dead_code, missing_docs)]

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::{Header, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use sqlx::{PgPool, Postgres, Transaction};
use txoutbox_testkit::broker::{client_config, create_topics};
use uuid::Uuid;

#[allow(unused_imports)] // each test binary uses a different subset
pub(crate) use txoutbox_testkit::broker::{brokers, unique_group};
#[allow(unused_imports)]
pub(crate) use txoutbox_testkit::{count, eventually, test_event};

/// Consumer settings tuned so group joins and commits are quick in tests.
pub(crate) fn kafka_config() -> ClientConfig {
    let mut config = client_config(&brokers());
    config
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
        .set("fetch.wait.max.ms", "50")
        .set("auto.commit.interval.ms", "200")
        .set("topic.metadata.refresh.interval.ms", "1000");
    config
}

/// Creates `topic` (and its dead-letter topic) unless it exists.
pub(crate) async fn create_topic(topic: &str, partitions: i32) {
    let dlq = format!("{topic}.dlq");
    create_topics(&brokers(), &[(topic, partitions), (&dlq, 1)]).await;
}

/// Commits the end of every partition of `topic` for `group`, so a consumer of
/// that group starts after everything earlier runs left in the shared broker.
pub(crate) async fn start_group_at(group: &str, topic: &str, partitions: i32, at_end: bool) {
    let (group, topic) = (group.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = kafka_config()
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .create()
            .expect("consumer");
        let mut tpl = TopicPartitionList::new();
        for partition in 0..partitions {
            let offset = if at_end {
                let (_, high) = consumer
                    .fetch_watermarks(&topic, partition, Duration::from_secs(10))
                    .expect("watermarks");
                high
            } else {
                0
            };
            tpl.add_partition_offset(&topic, partition, Offset::Offset(offset))
                .unwrap();
        }
        consumer
            .commit(&tpl, CommitMode::Sync)
            .expect("commit start offsets");
    })
    .await
    .unwrap();
}

/// The end offsets of `topic`'s partitions.
pub(crate) async fn high_watermarks(topic: &str, partitions: i32) -> Vec<i64> {
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = kafka_config().create().expect("consumer");
        (0..partitions)
            .map(|p| {
                consumer
                    .fetch_watermarks(&topic, p, Duration::from_secs(10))
                    .expect("watermarks")
                    .1
            })
            .collect()
    })
    .await
    .unwrap()
}

/// The offsets `group` committed on `topic` (negative when none).
pub(crate) async fn committed(group: &str, topic: &str, partitions: i32) -> Vec<i64> {
    let (group, topic) = (group.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = kafka_config()
            .set("group.id", &group)
            .create()
            .expect("consumer");
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition(&topic, p);
        }
        let tpl = consumer
            .committed_offsets(tpl, Duration::from_secs(10))
            .expect("committed offsets");
        tpl.elements()
            .iter()
            .map(|e| e.offset().to_raw().unwrap_or(-1))
            .collect()
    })
    .await
    .unwrap()
}

pub(crate) fn producer() -> FutureProducer {
    client_config(&brokers())
        .set("message.max.bytes", "2000000")
        .create()
        .expect("producer")
}

/// Produces one record; `headers` as (name, value).
pub(crate) async fn produce(
    producer: &FutureProducer,
    topic: &str,
    key: Option<&str>,
    value: &[u8],
    headers: &[(&str, &str)],
) {
    let mut owned = OwnedHeaders::new();
    for (key, value) in headers {
        owned = owned.insert(Header {
            key,
            value: Some(*value),
        });
    }
    let mut record: FutureRecord<'_, str, [u8]> =
        FutureRecord::to(topic).payload(value).headers(owned);
    if let Some(key) = key {
        record = record.key(key);
    }
    producer
        .send(record, Duration::from_secs(10))
        .await
        .map_err(|(e, _)| e)
        .expect("produce");
}

/// Produces `event` the way the relay does: JSON value plus the wire headers.
pub(crate) async fn produce_event<E: txoutbox_core::DomainEvent>(
    producer: &FutureProducer,
    event: &E,
) {
    let record = txoutbox_core::OutboxRecord::from_event(event).unwrap();
    let value = serde_json::to_vec(&record.payload).unwrap();
    let event_id = record.event_id.to_string();
    let mut headers = vec![
        (txoutbox_core::wire::HEADER_EVENT_ID, event_id.as_str()),
        (txoutbox_core::wire::HEADER_EVENT_TYPE, E::EVENT_TYPE),
        (
            txoutbox_core::wire::HEADER_CONTENT_TYPE,
            txoutbox_core::wire::CONTENT_TYPE_JSON,
        ),
    ];
    if let Some(tp) = &record.traceparent {
        headers.push((txoutbox_core::wire::HEADER_TRACEPARENT, tp));
    }
    produce(
        producer,
        E::TOPIC,
        Some(&record.partition_key),
        &value,
        &headers,
    )
    .await;
}

/// Reads `topic` partition 0 from `from` until `done` accepts what was read.
pub(crate) async fn read_until(
    topic: &str,
    from: i64,
    timeout: Duration,
    done: impl Fn(&[OwnedMessage]) -> bool,
) -> Vec<OwnedMessage> {
    let consumer: rdkafka::consumer::StreamConsumer = kafka_config()
        .set("group.id", unique_group("reader"))
        .create()
        .expect("reader");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Offset(from))
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let deadline = Instant::now() + timeout;
    let mut read = Vec::new();
    while !done(&read) {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, consumer.recv()).await {
            Ok(Ok(message)) => read.push(message.detach()),
            Ok(Err(e)) => panic!("reading {topic}: {e}"),
            Err(_) => panic!("timed out reading {topic}; got {} messages", read.len()),
        }
    }
    read
}

pub(crate) fn header(message: &OwnedMessage, name: &str) -> Option<String> {
    use rdkafka::message::Headers;
    message
        .headers()?
        .iter()
        .find(|h| h.key == name)
        .map(|h| String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned())
}

/// Migrations plus the table the test handlers write their effects to
/// (no unique key: applying an effect twice shows as two rows).
pub(crate) async fn prepare_db(pool: &PgPool) {
    txoutbox_runtime::migrations::run(pool).await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE effect (
             event_id uuid NOT NULL, amount bigint NOT NULL, note text,
             at timestamptz NOT NULL DEFAULT clock_timestamp())",
    )
    .execute(pool)
    .await
    .unwrap();
}

/// A test handler's effect: one row of `effect` (`note` says which handler
/// ran, or what it saw).
pub(crate) async fn record_effect(
    tx: &mut Transaction<'_, Postgres>,
    event_id: Uuid,
    amount: i64,
    note: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO effect (event_id, amount, note) VALUES ($1, $2, $3)")
        .bind(event_id)
        .bind(amount)
        .bind(note)
        .execute(&mut **tx)
        .await
        .map(drop)
}

/// The effects of the events `ids` as (event id, amount, note), by amount:
/// a topic shared with earlier runs may bring other events to a new group.
pub(crate) async fn effects_of(pool: &PgPool, ids: &[Uuid]) -> Vec<(Uuid, i64, String)> {
    sqlx::query_as(
        "SELECT event_id, amount, note FROM effect WHERE event_id = ANY($1) ORDER BY amount",
    )
    .bind(ids)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// A pool on `pool`'s database whose sessions default to `level`
/// (`default_transaction_isolation`, set on the database): for tests that
/// must hold whatever isolation a database or role defaults to. Checks that
/// the setting took.
pub(crate) async fn defaulting_to(pool: &PgPool, level: &str) -> PgPool {
    let database: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(pool)
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "ALTER DATABASE \"{database}\" SET default_transaction_isolation = '{level}'"
    )))
    .execute(pool)
    .await
    .unwrap();
    let options = (*pool.connect_options()).clone();
    let isolated = sqlx::postgres::PgPoolOptions::new()
        .max_connections(20)
        .connect_with(options)
        .await
        .unwrap();
    let default: String = sqlx::query_scalar("SHOW default_transaction_isolation")
        .fetch_one(&isolated)
        .await
        .unwrap();
    assert_eq!(default, level, "the database default took");
    isolated
}

/// Declares a test three times: on the database's default isolation (`read
/// committed`), and with the database default set to `repeatable read` and
/// to `serializable` (issue 22 item 8: the framework states the isolation
/// its transactions need, so a database or role default must not matter).
/// The three share the test's topics, so they take turns.
#[allow(unused_macros)]
macro_rules! under_every_isolation {
    ($(#[$meta:meta])* async fn $name:ident($pool:ident: PgPool $(,)?) $body:block) => {
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

            async fn body($pool: PgPool) $body

            #[sqlx::test(migrations = false)]
            async fn read_committed(pool: PgPool) {
                let _turn = TURN.lock().await;
                body(pool).await;
            }

            #[sqlx::test(migrations = false)]
            async fn repeatable_read(pool: PgPool) {
                let _turn = TURN.lock().await;
                let isolated = defaulting_to(&pool, "repeatable read").await;
                body(isolated.clone()).await;
                isolated.close().await;
            }

            #[sqlx::test(migrations = false)]
            async fn serializable(pool: PgPool) {
                let _turn = TURN.lock().await;
                let isolated = defaulting_to(&pool, "serializable").await;
                body(isolated.clone()).await;
                isolated.close().await;
            }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use under_every_isolation;

/// Produces `event` to `partition` (rather than by its key) with its event
/// type header; returns the offset the broker gave it.
pub(crate) async fn produce_to<E: txoutbox_core::DomainEvent>(
    producer: &FutureProducer,
    event: &E,
    partition: i32,
) -> i64 {
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
        .expect("produce")
        .offset
}

/// How many effects each of `ids` has.
pub(crate) async fn effect_counts(pool: &PgPool, ids: &[Uuid]) -> Vec<i64> {
    let mut counts = Vec::new();
    for id in ids {
        counts.push(
            sqlx::query_scalar("SELECT count(*) FROM effect WHERE event_id = $1")
                .bind(id)
                .fetch_one(pool)
                .await
                .unwrap(),
        );
    }
    counts
}

/// When each of `ids` took effect (the database clock), if it did.
pub(crate) async fn effect_times(
    pool: &PgPool,
    ids: &[Uuid],
) -> Vec<Option<chrono::DateTime<chrono::Utc>>> {
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

/// Asserts that each of `all` took effect exactly once, and `ordered` (one
/// partition's events, in offset order) in that order.
pub(crate) async fn assert_once_in_order(pool: &PgPool, all: &[Uuid], ordered: &[Uuid]) {
    assert_eq!(effect_counts(pool, all).await, vec![1; all.len()]);
    let times: Vec<_> = effect_times(pool, ordered)
        .await
        .into_iter()
        .map(Option::unwrap)
        .collect();
    assert!(
        times.windows(2).all(|pair| pair[0] < pair[1]),
        "a partition took effect out of offset order"
    );
}

/// The longest any of `ids` took from its produce (`produced_at`, in the
/// same order) to its effect; each must have taken effect.
pub(crate) async fn worst_delay(
    pool: &PgPool,
    ids: &[Uuid],
    produced_at: &[chrono::DateTime<chrono::Utc>],
) -> Duration {
    effect_times(pool, ids)
        .await
        .iter()
        .zip(produced_at)
        .map(|(at, produced)| (at.unwrap() - *produced).to_std().unwrap_or_default())
        .max()
        .unwrap()
}

/// Events produced to partition 1 while another partition is held.
pub(crate) struct Healthy {
    pub(crate) ids: Vec<Uuid>,
    /// When each was produced.
    pub(crate) produced_at: Vec<chrono::DateTime<chrono::Utc>>,
    /// The offset after the last.
    pub(crate) end: i64,
}

/// Produces 8 events, `make(1_000 + i)`, to partition 1, `pause` apart.
pub(crate) async fn produce_healthy<E: txoutbox_core::DomainEvent>(
    producer: &FutureProducer,
    make: impl Fn(i64) -> (E, Uuid),
    pause: Duration,
) -> Healthy {
    let mut healthy = Healthy {
        ids: Vec::new(),
        produced_at: Vec::new(),
        end: 0,
    };
    for i in 0..8 {
        let (event, id) = make(1_000 + i);
        healthy.produced_at.push(chrono::Utc::now());
        healthy.end = produce_to(producer, &event, 1).await + 1;
        healthy.ids.push(id);
        tokio::time::sleep(pause).await;
    }
    healthy
}

/// Waits (up to `within`) until each of `ids` took effect once.
pub(crate) async fn until_each_took_effect(
    pool: &PgPool,
    what: &str,
    ids: &[Uuid],
    within: Duration,
) {
    eventually(what, within, || async {
        effect_counts(pool, ids).await.iter().all(|&n| n == 1)
    })
    .await;
}
