//! Capacity planning: what one published event costs PostgreSQL over its whole
//! life (the handler's insert, the relay's claim and mark, the retention
//! delete), and how 1, 2 and 4 relays on one database share a backlog.
//!
//! ```text
//! scripts/services.sh up
//! cargo bench -p txoutbox-runtime --bench capacity
//! CAPACITY_EVENTS=20000 CAPACITY_BACKLOG=50000 CAPACITY_RELAYS=1,2,4 \
//!     cargo bench -p txoutbox-runtime --bench capacity        # the defaults
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
use sqlx::PgPool;
use txoutbox_core::OutboxRecord;
use txoutbox_runtime::ops::cleanup::{Purge, Target};
use txoutbox_runtime::relay::Relay;
use txoutbox_testkit::broker::{brokers, client_config, new_topic};
use uuid::Uuid;

const KEYS: usize = 1_000;
const WRITERS: usize = 4;
const PARTITIONS: i32 = 8;

fn kafka() -> ClientConfig {
    client_config(&brokers())
}

async fn topic() -> String {
    new_topic(&brokers(), "bench-capacity", PARTITIONS).await
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
        headers: Vec::new(),
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
                    let mut events = txoutbox_core::Events::new();
                    events.record_prepared(record(&topic, i));
                    let mut tx = pool.begin().await.unwrap();
                    txoutbox_core::insert_events(&mut tx, &events)
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

/// Lanes held, per relay: the relay's lane locks are the advisory locks
/// `(0x6f62786c, lane)` of its session (`docs/relay.md`, "Lanes").
async fn lanes_per_relay(pool: &PgPool) -> Vec<i64> {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks
         WHERE locktype = 'advisory' AND granted AND objsubid = 2
           AND classid = 1868724332::oid AND database = (
             SELECT oid FROM pg_database WHERE datname = current_database())
         GROUP BY pid ORDER BY 1 DESC",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Polls `check` every 10 ms until it gives a value; panics after `limit`.
async fn until<T, F, Fut>(limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "not reached within {limit:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// One phase of an event's life, measured.
struct Phase {
    name: &'static str,
    wal: i64,
    seconds: f64,
    /// From `pg_stat_statements`, when it is loaded.
    statements: Option<profile::PerEvent>,
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
    let statements = if statements {
        Some(profile::report(pool, name, events as u64).await)
    } else {
        None
    };
    Phase {
        name,
        wal,
        seconds,
        statements,
    }
}

#[tokio::main]
async fn main() {
    let n = support::env_usize("CAPACITY_EVENTS", 20_000);
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
    // What autovacuum would have done by now on a production server (this
    // machine's runs without it): without statistics the claim is planned
    // about 6x slower (72 instead of about 12 µs per event).
    sqlx::query("ANALYZE outbox_event")
        .execute(&pool)
        .await
        .unwrap();
    phases.push(
        measured(&pool, "relay: claim, publish, mark", n, statements, async {
            // Progress from the relay's own counters: a polling query here
            // would count as the relay's database work.
            let relay = Relay::builder(pool.clone(), kafka()).spawn().unwrap();
            while relay.summary().published < n as u64 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            relay.shutdown().await.unwrap();
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

    println!(
        "\n| phase | seconds | WAL bytes/event (statements) | WAL bytes/event (server) | statements/event | execution µs/event |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let mut wal_total = 0;
    let mut life = profile::PerEvent::default();
    let cell =
        |v: Option<f64>, digits: usize| v.map_or("-".to_owned(), |v| format!("{v:.digits$}"));
    for phase in &phases {
        wal_total += phase.wal;
        if let Some(s) = phase.statements {
            life.statements += s.statements;
            life.exec_us += s.exec_us;
            life.wal_bytes += s.wal_bytes;
        }
        println!(
            "| {} | {:.2} | {} | {:.0} | {} | {} |",
            phase.name,
            phase.seconds,
            cell(phase.statements.map(|s| s.wal_bytes), 0),
            phase.wal as f64 / n as f64,
            cell(phase.statements.map(|s| s.statements), 3),
            cell(phase.statements.map(|s| s.exec_us), 1),
        );
    }
    let server_wal = wal_total as f64 / n as f64;
    let measured = phases.iter().all(|p| p.statements.is_some());
    // This database's own WAL when known; the server's counts every database.
    let wal_per_event = if measured { life.wal_bytes } else { server_wal };
    println!(
        "| whole life | | {} | {server_wal:.0} | {} | {} |",
        cell(measured.then_some(life.wal_bytes), 0),
        cell(measured.then_some(life.statements), 3),
        cell(measured.then_some(life.exec_us), 1),
    );
    println!(
        "\nmodel: {:.0} events/s per MB/s of WAL{}",
        1e6 / wal_per_event,
        if measured {
            format!(
                "; {:.0} events/s per PostgreSQL core busy only with statement execution \
                 (1 s / {:.1} µs)",
                1e6 / life.exec_us,
                life.exec_us
            )
        } else {
            String::new()
        }
    );
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

    // 2. Several relays on one database: they balance the lanes, share a
    // backlog, and take over the lanes of one that stops.
    let backlog_events = support::env_usize("CAPACITY_BACKLOG", 50_000);
    println!(
        "\n{backlog_events} events drained by 1 to 4 relays in one process, \
         each with its own producer and connections:\n"
    );
    println!(
        "| relays | balanced after | lanes per relay | drain events/s | published per relay | lanes of a stopped relay taken after |"
    );
    println!("|---:|---:|---|---:|---|---:|");
    for k in relays {
        let topic = self::topic().await;
        let started = Instant::now();
        let handles: Vec<_> = (0..k)
            .map(|_| Relay::builder(pool.clone(), kafka()).spawn().unwrap())
            .collect();
        let lanes = until(Duration::from_secs(60), || async {
            let held = lanes_per_relay(&pool).await;
            let balanced = held.len() == k
                && held.iter().sum::<i64>() == 64
                && held[0] - held[held.len() - 1] <= 1;
            balanced.then_some(held)
        })
        .await;
        let balanced = started.elapsed();
        support::outbox_backlog(&pool, &topic, backlog_events, KEYS).await;
        let drain = Instant::now();
        until(Duration::from_secs(600), || async {
            (unpublished(&pool).await == 0).then_some(())
        })
        .await;
        let drained = drain.elapsed();
        let shares: Vec<u64> = handles.iter().map(|r| r.summary().published).collect();
        let mut handles = handles.into_iter();
        let first = handles.next().unwrap();
        let rest: Vec<_> = handles.collect();
        // Hand-over: one relay stops; the others take its lanes.
        let hand_over = if rest.is_empty() {
            first.shutdown().await.unwrap();
            "-".to_owned()
        } else {
            first.shutdown().await.unwrap();
            let stopped = Instant::now();
            until(Duration::from_secs(60), || async {
                let held = lanes_per_relay(&pool).await;
                (held.len() == k - 1 && held.iter().sum::<i64>() == 64).then_some(())
            })
            .await;
            format!("{:.2} s", stopped.elapsed().as_secs_f64())
        };
        for relay in rest {
            relay.shutdown().await.unwrap();
        }
        println!(
            "| {k} | {:.2} s | {lanes:?} | {:.0} | {shares:?} | {hand_over} |",
            balanced.as_secs_f64(),
            backlog_events as f64 / drained.as_secs_f64(),
        );
        sqlx::query("DELETE FROM outbox_event")
            .execute(&pool)
            .await
            .unwrap();
    }
    pool.close().await;
    support::drop_database(&db).await;
}
