//! Capacity planning: what one published event costs PostgreSQL over its whole
//! life (the handler's insert, the relay's claim and mark, the retention
//! delete), and how 1, 2 and 4 relays on one database share a backlog.
//!
//! ```text
//! scripts/services.sh up
//! cargo bench -p txoutbox-runtime --bench capacity
//! CAPACITY_EVENTS=20000 CAPACITY_RELAYS=1,2,4 cargo bench -p txoutbox-runtime --bench capacity
//! ```
//!
//! Per-statement figures need `pg_stat_statements` preloaded (see
//! `profile`); without it the bench still reports WAL bytes (the server's
//! WAL position, so run it on a quiet server), tuples written and index
//! growth per event. Events are about 250 bytes of JSON over 1,000 keys, one
//! event per writer transaction (a command that records one event), written
//! by 4 concurrent writers.
#![allow(missing_docs)]

mod charts;
mod profile;
mod support;

use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use sqlx::PgPool;
use txoutbox_core::OutboxRecord;
use txoutbox_runtime::ops::cleanup::{Purge, Target};
use txoutbox_runtime::relay::Relay;
use uuid::Uuid;

const KEYS: usize = 1_000;
const WRITERS: usize = 4;
const PARTITIONS: i32 = 8;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn kafka() -> ClientConfig {
    let brokers = std::env::var("KAFKA_BROKERS_TEST").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", brokers);
    config
}

async fn topic() -> String {
    let topic = format!("bench-capacity-{}", Uuid::new_v4().simple());
    let admin: AdminClient<_> = kafka().create().unwrap();
    admin
        .create_topics(
            &[NewTopic::new(
                &topic,
                PARTITIONS,
                TopicReplication::Fixed(1),
            )],
            &AdminOptions::new(),
        )
        .await
        .unwrap();
    topic
}

fn record(topic: &str, i: usize) -> OutboxRecord {
    let event_id = Uuid::now_v7();
    let order = format!("order-{}", i % KEYS);
    OutboxRecord {
        event_id,
        aggregate_type: "Order".into(),
        aggregate_id: order.clone(),
        event_type: "OrderCreated".into(),
        payload: serde_json::json!({
            "event_id": event_id, "order_id": order, "amount": i,
            "currency": "EUR", "note": "x".repeat(140),
        }),
        topic: topic.into(),
        partition_key: order,
        traceparent: None,
    }
}

/// `n` events, one per transaction, from `WRITERS` concurrent writers.
async fn write(pool: &PgPool, topic: &str, n: usize) -> f64 {
    let started = Instant::now();
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (pool, topic) = (pool.clone(), topic.to_owned());
            tokio::spawn(async move {
                for i in (w..n).step_by(WRITERS) {
                    let mut tx = pool.begin().await.unwrap();
                    txoutbox_core::insert_records(&mut tx, &[record(&topic, i)])
                        .await
                        .unwrap();
                    tx.commit().await.unwrap();
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
    n as f64 / started.elapsed().as_secs_f64()
}

/// The same rows in one statement: a quick backlog for the relay runs.
async fn backlog(pool: &PgPool, topic: &str, n: usize) {
    sqlx::query(
        "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type, payload,
                                   topic, partition_key)
         SELECT id, 'Order', k, 'OrderCreated',
                jsonb_build_object('event_id', id, 'order_id', k, 'amount', g,
                                   'currency', 'EUR', 'note', repeat('x', 140)),
                $2, k
         FROM (SELECT gen_random_uuid() AS id, 'order-' || (g % $3) AS k, g
               FROM generate_series(1, $1) AS g) s",
    )
    .bind(n as i64)
    .bind(topic)
    .bind(KEYS as i64)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("VACUUM ANALYZE outbox_event")
        .execute(pool)
        .await
        .unwrap();
}

async fn unpublished(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox_event WHERE published_at IS NULL")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The server's WAL position, in bytes.
async fn wal_lsn(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::int8")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Bytes of `outbox_event`'s table and of its indexes.
async fn sizes(pool: &PgPool) -> (i64, i64) {
    sqlx::query_as(
        "SELECT pg_table_size('outbox_event')::int8, pg_indexes_size('outbox_event')::int8",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Advisory locks (relay lanes) held, per backend.
async fn lanes_per_relay(pool: &PgPool) -> Vec<i64> {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks
         WHERE locktype = 'advisory' AND granted AND database = (
             SELECT oid FROM pg_database WHERE datname = current_database())
         GROUP BY pid ORDER BY 1 DESC",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// One phase of an event's life, measured.
struct Phase {
    name: &'static str,
    wal: i64,
    seconds: f64,
}

async fn measured<F: std::future::Future<Output = ()>>(
    pool: &PgPool,
    name: &'static str,
    events: usize,
    statements: bool,
    run: F,
) -> Phase {
    if statements {
        profile::reset(pool).await;
    }
    let wal = wal_lsn(pool).await;
    let started = Instant::now();
    run.await;
    let seconds = started.elapsed().as_secs_f64();
    let wal = wal_lsn(pool).await - wal;
    if statements {
        profile::report(pool, name, events as u64).await;
    }
    Phase { name, wal, seconds }
}

#[tokio::main]
async fn main() {
    let n = env_usize("CAPACITY_EVENTS", 20_000);
    let relays: Vec<usize> = std::env::var("CAPACITY_RELAYS")
        .unwrap_or_else(|_| "1,2,4".into())
        .split(',')
        .filter_map(|k| k.trim().parse().ok())
        .collect();
    let (mut pool, db) = support::scratch_database("outbox_bench_capacity", 16).await;
    let statements = profile::available(&pool).await;
    if statements {
        profile::prepare(&pool, &db).await;
        pool.close().await;
        pool = support::connect(&db, 16).await;
    } else {
        println!(
            "pg_stat_statements is not preloaded: statement figures skipped \
             (see benches/profile/mod.rs to enable them)"
        );
    }
    println!(
        "capacity: {n} events over {KEYS} keys, commit {}",
        charts::commit()
    );

    // 1. One event's life: written, published, deleted by retention.
    let topic = topic().await;
    let (table0, index0) = sizes(&pool).await;
    let mut phases = Vec::new();
    phases.push(
        measured(
            &pool,
            "write: one event per transaction",
            n,
            statements,
            async {
                let rate = write(&pool, &topic, n).await;
                println!("written at {rate:.0} events/s ({WRITERS} writers)");
            },
        )
        .await,
    );
    let (table1, index1) = sizes(&pool).await;
    phases.push(
        measured(&pool, "relay: claim, publish, mark", n, statements, async {
            let relay = Relay::builder(pool.clone(), kafka()).spawn().unwrap();
            while unpublished(&pool).await > 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            relay.shutdown().await;
        })
        .await,
    );
    let (table2, index2) = sizes(&pool).await;
    phases.push(
        measured(
            &pool,
            "retention: delete published rows",
            n,
            statements,
            async {
                let mut purge = Purge::new(Target::PublishedOutbox, chrono::Utc::now());
                let deleted = purge.run(&pool, |_| {}).await.unwrap();
                assert_eq!(deleted as usize, n, "retention deletes every published row");
            },
        )
        .await,
    );
    let sample = record(&topic, 1);
    let record_bytes =
        serde_json::to_vec(&sample.payload).unwrap().len() + sample.partition_key.len();

    println!("\n| phase | seconds | WAL bytes/event |");
    println!("|---|---:|---:|");
    let mut wal_total = 0;
    for phase in &phases {
        wal_total += phase.wal;
        println!(
            "| {} | {:.2} | {:.0} |",
            phase.name,
            phase.seconds,
            phase.wal as f64 / n as f64
        );
    }
    println!("| whole life | | {:.0} |", wal_total as f64 / n as f64);
    println!(
        "\ntable growth {:.0} bytes/event, index growth {:.0} bytes/event while written; \
         index growth {:.0} bytes/event more while marked (the mark is not a HOT update); \
         table {:.0} bytes/event more while marked",
        (table1 - table0) as f64 / n as f64,
        (index1 - index0) as f64 / n as f64,
        (index2 - index1) as f64 / n as f64,
        (table2 - table1) as f64 / n as f64,
    );
    println!(
        "broker: {record_bytes} bytes of key and value per record, plus the event-type, \
         content-type and event-id headers and the record batch framing"
    );

    // 2. Several relays on one database.
    println!(
        "\n| relays | drain events/s | lanes per relay when balanced | balanced after | published per relay | hand-over: lanes of a stopped relay taken after |"
    );
    println!("|---:|---:|---|---:|---|---:|");
    for k in relays {
        let topic = self::topic().await;
        backlog(&pool, &topic, n).await;
        let started = Instant::now();
        let handles: Vec<_> = (0..k)
            .map(|_| Relay::builder(pool.clone(), kafka()).spawn().unwrap())
            .collect();
        let mut balanced = None;
        let mut lanes = Vec::new();
        loop {
            let held = lanes_per_relay(&pool).await;
            if balanced.is_none()
                && held.len() == k
                && held.iter().sum::<i64>() == 64
                && held[0] - held[held.len() - 1] <= 1
            {
                balanced = Some(started.elapsed());
                lanes = held;
            }
            if unpublished(&pool).await == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let drained = started.elapsed();
        let mut handles = handles.into_iter();
        let first = handles.next().unwrap();
        let rest: Vec<_> = handles.collect();
        let mut shares = vec![first.summary().published];
        shares.extend(rest.iter().map(|r| r.summary().published));
        // Hand-over: stop one relay; the others take its lanes.
        let hand_over = if rest.is_empty() {
            None
        } else {
            first.shutdown().await;
            let stopped = Instant::now();
            loop {
                let held = lanes_per_relay(&pool).await;
                if held.len() == k - 1 && held.iter().sum::<i64>() == 64 {
                    break Some(stopped.elapsed());
                }
                if stopped.elapsed() > Duration::from_secs(60) {
                    break None;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        for relay in rest {
            relay.shutdown().await;
        }
        println!(
            "| {k} | {:.0} | {:?} | {} | {:?} | {} |",
            n as f64 / drained.as_secs_f64(),
            lanes,
            balanced.map_or("not balanced".into(), |b| format!(
                "{:.2} s",
                b.as_secs_f64()
            )),
            shares,
            hand_over.map_or("-".into(), |h| format!("{:.2} s", h.as_secs_f64())),
        );
        sqlx::query("DELETE FROM outbox_event")
            .execute(&pool)
            .await
            .unwrap();
    }
    pool.close().await;
    support::drop_database(&db).await;
}
