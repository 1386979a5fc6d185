//! The consumer's transaction for one record, without the broker: what a
//! hop's consumer does between receiving a record and its handler's writes
//! being committed, in dedup mode and in inbox mode (handled on receipt),
//! side by side in one run.
//!
//! ```text
//! scripts/services.sh up   # PostgreSQL
//! cargo bench -p txoutbox-runtime --features test-hooks --bench consumer_store
//! # the defaults: STORE_BENCH_BATCHES=2000 STORE_BENCH_ROUNDS=5 STORE_BENCH_RECORDS=1
//! # batches of 100 records (the store's throughput, not a hop's latency):
//! STORE_BENCH_RECORDS=100 STORE_BENCH_BATCHES=200 cargo bench ... --bench consumer_store
//! ```
//!
//! Each round takes `STORE_BENCH_BATCHES` batches of `STORE_BENCH_RECORDS`
//! records (one by default) with each
//! consumer, alternating one dedup batch and one inbox batch, by the
//! consumer loop's own step for a fetched batch (`Consumer::__take`, feature
//! `test-hooks`): dedup inserts the event's `processed_event` row, runs the
//! handler and commits; the inbox takes its store locks, reads which keys
//! have pending rows, inserts the row already processed, runs the handler
//! and commits. Every event has a key of its own, so nothing is pending and
//! every inbox record is handled on receipt, as in a hop. The handler writes
//! one row and records one event (an outbox insert), as a hop's does. The
//! summary gives each consumer's per-batch p50 / p99 and the inbox / dedup
//! ratio of the p50s, min / median / max over rounds, and with batches of
//! more than one record the records per second a consumer's p50 batch makes.
//!
//! Needs `DATABASE_URL` (a server the bench may create a scratch database
//! on). No broker: the consumers are built but never started.

mod support;

use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders, OwnedMessage, Timestamp};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::{Postgres, Transaction};
use txoutbox_core::{DomainEvent, Events};
use txoutbox_runtime::consumer::{Consumer, Mode, event_handler};
use uuid::Uuid;

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, DomainEvent)]
#[event(topic = "bench.store.paid", aggregate = "Order")]
struct StorePaid {
    event_id: Uuid,
    #[partition_key]
    order_id: Uuid,
    amount: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, DomainEvent)]
#[event(topic = "bench.store.next", aggregate = "Order")]
struct StoreNext {
    event_id: Uuid,
    #[partition_key]
    order_id: Uuid,
}

#[event_handler]
async fn on_store_paid(
    tx: &mut Transaction<'_, Postgres>,
    event: StorePaid,
    events: &mut Events,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO store_effect (event_id, amount) VALUES ($1, $2)")
        .bind(event.event_id)
        .bind(event.amount)
        .execute(&mut **tx)
        .await?;
    events.record(StoreNext {
        event_id: Uuid::new_v4(),
        order_id: event.order_id,
    });
    Ok(())
}

/// A new event of a key of its own, as the relay would have sent it.
fn record(offset: i64) -> OwnedMessage {
    let event = StorePaid {
        event_id: Uuid::new_v4(),
        order_id: Uuid::new_v4(),
        amount: offset,
    };
    let headers = OwnedHeaders::new()
        .insert(Header {
            key: txoutbox_core::wire::HEADER_EVENT_TYPE,
            value: Some(StorePaid::EVENT_TYPE),
        })
        .insert(Header {
            key: txoutbox_core::wire::HEADER_EVENT_ID,
            value: Some(event.event_id.to_string().as_bytes()),
        });
    OwnedMessage::new(
        Some(serde_json::to_vec(&event).unwrap()),
        Some(event.order_id.to_string().into_bytes()),
        StorePaid::TOPIC.to_owned(),
        Timestamp::NotAvailable,
        0,
        offset,
        Some(headers),
    )
}

/// The `q` quantile of `sorted`, in microseconds.
fn quantile(sorted: &[Duration], q: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[index].as_secs_f64() * 1e6
}

struct Round {
    dedup: (f64, f64),
    inbox: (f64, f64),
}

#[tokio::main]
async fn main() {
    let batches = support::env_usize("STORE_BENCH_BATCHES", 2000);
    let rounds = support::env_usize("STORE_BENCH_ROUNDS", 5);
    let records = support::env_usize("STORE_BENCH_RECORDS", 1).max(1);
    let (pool, database) = support::scratch_database("bench_store", 4).await;
    sqlx::raw_sql(
        "CREATE TABLE store_effect (event_id uuid PRIMARY KEY, amount bigint NOT NULL,
                                    at timestamptz NOT NULL DEFAULT clock_timestamp())",
    )
    .execute(&pool)
    .await
    .unwrap();
    // Never connected: the consumers are not started.
    let mut kafka = ClientConfig::new();
    kafka.set("bootstrap.servers", "127.0.0.1:1");
    let build = |mode: Mode, group: &str| {
        Consumer::builder(pool.clone(), kafka.clone(), group)
            .handler(on_store_paid)
            .mode(mode)
            .build()
            .unwrap()
    };
    let dedup = build(Mode::Dedup, "bench-store-dedup");
    let inbox = build(Mode::Inbox, "bench-store-inbox");
    println!(
        "commit {}; {rounds} rounds of {batches} batches of {records} records per consumer, \
         alternating",
        txoutbox_testkit::measured_commit()
    );
    let mut results = Vec::new();
    let mut offset = 0;
    for round in 1..=rounds {
        let mut times = [Vec::with_capacity(batches), Vec::with_capacity(batches)];
        for _ in 0..batches {
            for (slot, consumer) in [&dedup, &inbox].into_iter().enumerate() {
                let batch: Vec<OwnedMessage> = (0..records)
                    .map(|_| {
                        offset += 1;
                        record(offset)
                    })
                    .collect();
                let started = Instant::now();
                let done = consumer.__take(&batch).await;
                times[slot].push(started.elapsed());
                assert_eq!(done, records, "the batch was taken");
            }
        }
        let [dedup_times, inbox_times] = times.map(|mut times| {
            times.sort_unstable();
            (quantile(&times, 0.5), quantile(&times, 0.99))
        });
        println!(
            "round {round}: dedup p50 {:.0} p99 {:.0} us; inbox p50 {:.0} p99 {:.0} us; inbox / dedup p50 {:.2}",
            dedup_times.0,
            dedup_times.1,
            inbox_times.0,
            inbox_times.1,
            inbox_times.0 / dedup_times.0
        );
        results.push(Round {
            dedup: dedup_times,
            inbox: inbox_times,
        });
    }
    // Every event was handled once, on receipt in the inbox.
    let effects = txoutbox_testkit::count(&pool, "SELECT count(*) FROM store_effect").await;
    let pending = txoutbox_testkit::count(
        &pool,
        "SELECT count(*) FROM inbox_event WHERE NOT processed",
    )
    .await;
    assert_eq!(effects as usize, 2 * batches * rounds * records);
    assert_eq!(pending, 0, "every inbox record was handled on receipt");

    let column = |f: &dyn Fn(&Round) -> f64| {
        let values: Vec<f64> = results.iter().map(f).collect();
        let (min, median, max) = support::spread(&values);
        format!("{min:.0} / {median:.0} / {max:.0}")
    };
    let ratio = |f: &dyn Fn(&Round) -> f64| {
        let values: Vec<f64> = results.iter().map(f).collect();
        let (min, median, max) = support::spread(&values);
        format!("{min:.2} / {median:.2} / {max:.2}")
    };
    println!();
    println!(
        "## One batch's transaction, {records} records (us, min / median / max over {rounds} rounds)"
    );
    println!();
    println!("| consumer | p50 | p99 |");
    println!("|---|---|---|");
    println!(
        "| dedup | {} | {} |",
        column(&|r| r.dedup.0),
        column(&|r| r.dedup.1)
    );
    println!(
        "| inbox, handled on receipt | {} | {} |",
        column(&|r| r.inbox.0),
        column(&|r| r.inbox.1)
    );
    println!(
        "| inbox / dedup | {} | {} |",
        ratio(&|r| r.inbox.0 / r.dedup.0),
        ratio(&|r| r.inbox.1 / r.dedup.1)
    );
    if records > 1 {
        let rate = |p50: f64| records as f64 / p50 * 1e6;
        println!();
        println!(
            "records/s at the p50 batch: dedup {}, inbox {}",
            column(&|r| rate(r.dedup.0)),
            column(&|r| rate(r.inbox.0))
        );
    }
    drop(dedup);
    drop(inbox);
    pool.close().await;
    support::drop_database(&database).await;
}
