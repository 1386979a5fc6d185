//! The consumer's memory under large records (issue 22, item 12), measured
//! as this process's peak resident set (`VmHWM`), which is why this binary
//! holds one test only.
//!
//! 32 records of about 1 MB each, every one a JSON array of 500,000 small
//! numbers: as a `serde_json::Value` such a record is about 16 times its
//! size. Before the fix every record of a batch of up to 500 was parsed into
//! one, and an inbox processor read up to 500 rows as such trees; now a
//! batch, and a processor's claim, stops at `batch_max_bytes` (16 MiB), and
//! payloads are decoded straight into the handler's type.
//!
//! The records go through a tansu broker of the test's own (memory storage),
//! stopped at the end, so that their 64 MB do not stay in the shared one.
#![allow(missing_docs)]

use std::process::Child;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::{PgPool, Postgres, Transaction};
use txoutbox_core::DomainEvent;
use txoutbox_runtime::consumer::{Consumer, Mode, event_handler};
use txoutbox_testkit::broker::{
    client_config, create_topics, free_port, spawn_tansu, wait_listening_async,
};
use txoutbox_testkit::eventually;
use uuid::Uuid;

/// A tansu broker of this test's own, stopped when dropped.
struct OwnBroker {
    child: Child,
    address: String,
}

impl OwnBroker {
    async fn start() -> Self {
        let port = free_port();
        let address = format!("127.0.0.1:{port}");
        let child = spawn_tansu(port, &address);
        wait_listening_async(port).await;
        Self { child, address }
    }

    fn consumer_config(&self) -> ClientConfig {
        let mut config = client_config(&self.address);
        config
            .set("session.timeout.ms", "6000")
            .set("heartbeat.interval.ms", "500")
            .set("fetch.wait.max.ms", "50");
        config
    }
}

impl Drop for OwnBroker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Produces one event of type `E` with `readings` (JSON text of the array),
/// the way the relay does: its JSON value, keyed, with the event type
/// header. The value is written as text, so that producing costs this
/// process no JSON tree of its own.
async fn produce_readings<E: DomainEvent>(producer: &FutureProducer, readings: &str) {
    let (event_id, meter_id) = (Uuid::new_v4(), Uuid::new_v4());
    let value =
        format!(r#"{{"event_id":"{event_id}","meter_id":"{meter_id}","readings":{readings}}}"#);
    let headers = OwnedHeaders::new().insert(Header {
        key: txoutbox_core::wire::HEADER_EVENT_TYPE,
        value: Some(E::EVENT_TYPE),
    });
    let key = meter_id.to_string();
    producer
        .send(
            FutureRecord::to(E::TOPIC)
                .key(&key)
                .payload(&value)
                .headers(headers),
            Duration::from_secs(30),
        )
        .await
        .map_err(|(e, _)| e)
        .expect("produce");
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, DomainEvent)]
#[event(
    topic = "consumer-test.memory.readings",
    event_type = "Readings",
    aggregate = "Meter"
)]
struct Readings {
    event_id: Uuid,
    #[partition_key]
    meter_id: Uuid,
    readings: Vec<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, DomainEvent)]
#[event(
    topic = "consumer-test.memory.readings-inbox",
    event_type = "InboxReadings",
    aggregate = "Meter"
)]
struct InboxReadings {
    event_id: Uuid,
    #[partition_key]
    meter_id: Uuid,
    readings: Vec<u32>,
}

/// Records, per event, the sum of its readings.
async fn record_sum(
    tx: &mut Transaction<'_, Postgres>,
    event_id: Uuid,
    readings: &[u32],
) -> Result<(), sqlx::Error> {
    let sum: i64 = readings.iter().map(|r| i64::from(*r)).sum();
    sqlx::query("INSERT INTO effect (event_id, amount) VALUES ($1, $2)")
        .bind(event_id)
        .bind(sum)
        .execute(&mut **tx)
        .await
        .map(drop)
}

#[event_handler]
async fn on_readings(
    tx: &mut Transaction<'_, Postgres>,
    event: Readings,
) -> Result<(), sqlx::Error> {
    record_sum(tx, event.event_id, &event.readings).await
}

#[event_handler]
async fn on_inbox_readings(
    tx: &mut Transaction<'_, Postgres>,
    event: InboxReadings,
) -> Result<(), sqlx::Error> {
    record_sum(tx, event.event_id, &event.readings).await
}

const RECORDS: usize = 32;
/// 500,000 readings of one digit and a comma: about 1 MB of JSON.
const READINGS: usize = 500_000;

/// The peak resident set of this process since the last reset, in MiB.
fn peak_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kib / 1024.0
}

/// Resets the peak resident set to the current one (Linux >= 4.0).
fn reset_peak() {
    std::fs::write("/proc/self/clear_refs", "5").expect("reset VmHWM");
}

fn resident_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kib / 1024.0
}

/// What consuming the records may add to the process's resident set: a
/// batch's bytes (at most 16 MiB) and their decoded events (4 bytes a
/// reading, twice the text), what librdkafka prefetches (here all 32 MB,
/// under its 64 MiB queue), allocator slack. Before the fix each record of
/// a batch was also a `serde_json::Value` of about 16 times its size.
const BOUND_MIB: f64 = 256.0;

#[sqlx::test(migrations = false)]
async fn large_records_stay_within_a_memory_bound(pool: PgPool) {
    txoutbox_runtime::migrations::run(&pool).await.unwrap();
    sqlx::raw_sql("CREATE TABLE effect (event_id uuid NOT NULL, amount bigint NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let broker = OwnBroker::start().await;
    let mut report = Vec::new();
    for mode in [Mode::Dedup, Mode::Inbox] {
        let topic = match mode {
            Mode::Dedup => Readings::TOPIC,
            Mode::Inbox => InboxReadings::TOPIC,
        };
        let dlq = format!("{topic}.dlq");
        create_topics(&broker.address, &[(topic, 1), (&dlq, 1)]).await;
        sqlx::query("DELETE FROM effect")
            .execute(&pool)
            .await
            .unwrap();
        {
            let producer: FutureProducer = client_config(&broker.address)
                .set("message.max.bytes", "2000000")
                .create()
                .expect("producer");
            let digits: Vec<String> = (0..READINGS).map(|i| (i % 10).to_string()).collect();
            let readings = format!("[{}]", digits.join(","));
            for _ in 0..RECORDS {
                match mode {
                    Mode::Dedup => produce_readings::<Readings>(&producer, &readings).await,
                    Mode::Inbox => produce_readings::<InboxReadings>(&producer, &readings).await,
                }
            }
        }
        // Let the producer's buffers go before measuring.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let before = resident_mib();
        reset_peak();
        let started = Instant::now();
        let builder = Consumer::builder(
            pool.clone(),
            broker.consumer_config(),
            format!("memory-{mode:?}"),
        )
        .mode(mode)
        // Inbox mode: every row stored pending and claimed by a processor,
        // the path whose batch is read back from the table.
        .handle_on_receipt(false)
        .processor_poll_interval(Duration::from_millis(20));
        let builder = match mode {
            Mode::Dedup => builder.handler(on_readings),
            Mode::Inbox => builder.handler(on_inbox_readings),
        };
        let running = builder.build().unwrap().spawn();
        let expected: i64 = (0..READINGS as i64).map(|i| i % 10).sum();
        eventually(
            &format!("{mode:?}: every record handled"),
            Duration::from_secs(180),
            || async {
                let handled: i64 =
                    sqlx::query_scalar("SELECT count(*) FROM effect WHERE amount = $1")
                        .bind(expected)
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                handled == RECORDS as i64
            },
        )
        .await;
        let took = started.elapsed();
        running.shutdown().await.unwrap();
        let grew = peak_mib() - before;
        println!("[memory] {mode:?}: resident {before:.0} MiB before, peak +{grew:.0} MiB");
        report.push(format!(
            "{mode:?}: {RECORDS} records of {:.1} MB in {took:.1?}: resident {before:.0} MiB before, peak +{grew:.0} MiB",
            (READINGS * 2) as f64 / 1e6
        ));
        assert!(
            grew < BOUND_MIB,
            "{mode:?}: consuming grew the resident set by {grew:.0} MiB (bound {BOUND_MIB} MiB)"
        );
    }
    for line in report {
        println!("[memory] {line}");
    }
}
