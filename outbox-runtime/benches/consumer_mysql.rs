//! The consumer on MariaDB, next to the consumer on PostgreSQL and a
//! per-message baseline on MariaDB, in the same run (issue 26): dedup mode,
//! inbox mode handling idle keys on receipt (its default), and inbox mode
//! with every row stored pending and handled by the processors.
//!
//! ```text
//! scripts/services.sh up
//! cargo bench -p txoutbox-runtime --features mysql --bench consumer_mysql
//! ```
//!
//! `CONSUMER_MYSQL_EVENTS` [50000] events (one key per event, 4
//! partitions) are produced once; each of `CONSUMER_MYSQL_ROUNDS` [3] rounds
//! then drains them from the start with a fresh group, back to back: each
//! mode on MariaDB and on PostgreSQL, and the baseline on MariaDB over the
//! first `CONSUMER_MYSQL_BASELINE_EVENTS`
//! [5000]: what a competent user of sqlx and rdkafka writes without the
//! framework, one transaction per message (`INSERT IGNORE` of the dedup row,
//! the effect, `COMMIT`, then the offset stored), at the server's default
//! isolation. Every variant's handler runs the same effect, one `INSERT`.
//! Elapsed time is from the first effect to the last by the database's
//! clock, so the group join is not counted. Min / median / max over rounds of
//! every rate and of the ratios taken within a round.
#![allow(missing_docs)]

mod support;

use std::time::{Duration, Instant};

use rdkafka::consumer::{CommitMode, Consumer as _, StreamConsumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use sqlx::{MySql, MySqlPool, PgPool, Postgres, Transaction};
use txoutbox_core::DomainEvent;
use txoutbox_runtime::consumer::{
    Consumer, ConsumerBuilder, ConsumerDatabase, Mode, event_handler,
};
use txoutbox_testkit::broker::{brokers, client_config, create_topic};
use txoutbox_testkit::mysql::MySqlScratch;
use uuid::Uuid;

#[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, DomainEvent)]
#[event(topic = "bench.consumer-mysql.paid", aggregate = "Order")]
struct BenchPaid {
    event_id: Uuid,
    #[partition_key]
    order_id: Uuid,
    amount: i64,
}

const PARTITIONS: i32 = 4;

#[event_handler]
async fn on_paid_mariadb(
    tx: &mut Transaction<'_, MySql>,
    event: BenchPaid,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO effect (event_id, amount, variant) VALUES (?, ?, 'consumer')")
        .bind(event.event_id)
        .bind(event.amount)
        .execute(&mut **tx)
        .await
        .map(drop)
}

#[event_handler]
async fn on_paid_postgres(
    tx: &mut Transaction<'_, Postgres>,
    event: BenchPaid,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO effect (event_id, amount, variant) VALUES ($1, $2, 'consumer')")
        .bind(event.event_id)
        .bind(event.amount)
        .execute(&mut **tx)
        .await
        .map(drop)
}

fn kafka() -> ClientConfig {
    let mut config = client_config(&brokers());
    config
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500");
    config
}

fn watermarks() -> Vec<i64> {
    let probe: StreamConsumer = kafka().set("group.id", "bench-probe").create().unwrap();
    (0..PARTITIONS)
        .map(|p| {
            probe
                .fetch_watermarks(BenchPaid::TOPIC, p, Duration::from_secs(10))
                .unwrap()
                .1
        })
        .collect()
}

/// Commits `offsets` for `group`, so it starts there.
fn start_group(group: &str, offsets: &[i64]) {
    let consumer: StreamConsumer = kafka().set("group.id", group).create().unwrap();
    let mut tpl = TopicPartitionList::new();
    for (p, o) in offsets.iter().enumerate() {
        tpl.add_partition_offset(BenchPaid::TOPIC, p as i32, Offset::Offset(*o))
            .unwrap();
    }
    consumer.commit(&tpl, CommitMode::Sync).unwrap();
}

async fn produce(n: usize) {
    let producer: FutureProducer = kafka()
        .set("linger.ms", "20")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .unwrap();
    let mut pending = Vec::with_capacity(n);
    for i in 0..n {
        let event = BenchPaid {
            event_id: Uuid::new_v4(),
            order_id: Uuid::new_v4(),
            amount: i as i64,
        };
        let value = serde_json::to_vec(&event).unwrap();
        let key = event.partition_key();
        let headers = rdkafka::message::OwnedHeaders::new().insert(rdkafka::message::Header {
            key: txoutbox_core::wire::HEADER_EVENT_TYPE,
            value: Some(BenchPaid::EVENT_TYPE),
        });
        let record = FutureRecord::to(BenchPaid::TOPIC)
            .key(&key)
            .payload(&value)
            .headers(headers);
        pending.push(producer.send_result(record).map_err(|(e, _)| e).unwrap());
    }
    for delivery in pending {
        delivery.await.unwrap().map_err(|(e, _)| e).unwrap();
    }
}

/// The two databases of a round, each with its effect table.
struct Databases {
    mariadb: MySqlScratch,
    postgres: PgPool,
    postgres_name: String,
}

impl Databases {
    async fn create() -> Self {
        let mariadb = MySqlScratch::create(8).await;
        txoutbox_runtime::migrations::run(&mariadb.pool)
            .await
            .unwrap();
        sqlx::raw_sql(
            "CREATE TABLE effect (event_id BINARY(16) NOT NULL, amount BIGINT NOT NULL,
                                  variant VARCHAR(16) NOT NULL,
                                  at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))",
        )
        .execute(&mariadb.pool)
        .await
        .unwrap();
        let (postgres, postgres_name) =
            support::scratch_database("outbox_bench_consumer_mysql", 8).await;
        sqlx::raw_sql(
            "CREATE TABLE effect (event_id uuid NOT NULL, amount bigint NOT NULL, variant text NOT NULL,
                                  at timestamptz NOT NULL DEFAULT clock_timestamp())",
        )
        .execute(&postgres)
        .await
        .unwrap();
        Self {
            mariadb,
            postgres,
            postgres_name,
        }
    }

    async fn mariadb_effects(&self, variant: &str) -> (i64, f64) {
        sqlx::query_as(
            "SELECT count(*), COALESCE(CAST(TIMESTAMPDIFF(MICROSECOND, min(at), max(at)) AS DOUBLE) / 1e6, 0)
             FROM effect WHERE variant = ?",
        )
        .bind(variant)
        .fetch_one(&self.mariadb.pool)
        .await
        .unwrap()
    }

    async fn postgres_effects(&self) -> (i64, f64) {
        sqlx::query_as(
            "SELECT count(*), coalesce(extract(epoch FROM max(at) - min(at))::float8, 0)
             FROM effect WHERE variant = 'consumer'",
        )
        .fetch_one(&self.postgres)
        .await
        .unwrap()
    }

    /// Empties both effect tables between two drains.
    async fn clear(&self) {
        sqlx::query("DELETE FROM effect")
            .execute(&self.mariadb.pool)
            .await
            .unwrap();
        sqlx::query("DELETE FROM effect")
            .execute(&self.postgres)
            .await
            .unwrap();
    }

    async fn drop(self) {
        self.postgres.close().await;
        support::drop_database(&self.postgres_name).await;
        self.mariadb.drop().await;
    }
}

/// Waits until `effects` reports `n`, then returns the events per second.
async fn rate<F, Fut>(n: usize, effects: F) -> f64
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = (i64, f64)>,
{
    let deadline = Instant::now() + Duration::from_secs(1800);
    loop {
        let (done, seconds) = effects().await;
        if done as usize >= n {
            return n as f64 / seconds.max(1e-6);
        }
        assert!(Instant::now() < deadline, "only {done}/{n} handled");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The baseline on MariaDB: per message, one transaction and its commit.
async fn baseline(pool: &MySqlPool, start: &[i64], n: usize) {
    let group = format!("bench-baseline-{}", Uuid::new_v4().simple());
    start_group(&group, start);
    let consumer: StreamConsumer = kafka()
        .set("group.id", &group)
        .set("enable.auto.offset.store", "false")
        .create()
        .unwrap();
    consumer.subscribe(&[BenchPaid::TOPIC]).unwrap();
    for _ in 0..n {
        let message = consumer.recv().await.unwrap();
        let event: BenchPaid = serde_json::from_slice(message.payload().unwrap()).unwrap();
        let mut tx = pool.begin().await.unwrap();
        let fresh = sqlx::query(
            "INSERT IGNORE INTO processed_event (consumer_group, event_id) VALUES (?, ?)",
        )
        .bind(group.as_bytes())
        .bind(event.event_id)
        .execute(&mut *tx)
        .await
        .unwrap()
        .rows_affected();
        if fresh == 1 {
            sqlx::query("INSERT INTO effect (event_id, amount, variant) VALUES (?, ?, 'baseline')")
                .bind(event.event_id)
                .bind(event.amount)
                .execute(&mut *tx)
                .await
                .unwrap();
        }
        tx.commit().await.unwrap();
        consumer.store_offset_from_message(&message).unwrap();
    }
}

fn spread(values: &[f64]) -> String {
    let (min, median, max) = support::spread(values);
    if max >= 100.0 {
        format!("{min:.0} / {median:.0} / {max:.0}")
    } else {
        format!("{min:.1} / {median:.1} / {max:.1}")
    }
}

#[tokio::main]
async fn main() {
    let n = support::env_usize("CONSUMER_MYSQL_EVENTS", 50_000);
    let rounds = support::env_usize("CONSUMER_MYSQL_ROUNDS", 3).max(1);
    let baseline_events = support::env_usize("CONSUMER_MYSQL_BASELINE_EVENTS", 5_000).min(n);
    create_topic(&brokers(), BenchPaid::TOPIC, PARTITIONS).await;
    let start = watermarks();
    let produced = Instant::now();
    produce(n).await;
    println!(
        "produced {n} events to {} ({PARTITIONS} partitions) in {:.1} s",
        BenchPaid::TOPIC,
        produced.elapsed().as_secs_f64()
    );
    // Per mode: the rates on MariaDB and on PostgreSQL, by round.
    let mut rates: Vec<(Vec<f64>, Vec<f64>)> =
        MODES.iter().map(|_| (Vec::new(), Vec::new())).collect();
    let mut base = Vec::new();
    for round in 0..rounds {
        let dbs = Databases::create().await;
        for (mode, (mariadb, postgres)) in MODES.iter().zip(&mut rates) {
            dbs.clear().await;
            let group = format!("bench-mariadb-{}", Uuid::new_v4().simple());
            start_group(&group, &start);
            let builder = Consumer::builder(dbs.mariadb.pool.clone(), kafka(), &group)
                .handler(on_paid_mariadb);
            let running = mode.apply(builder).spawn().unwrap();
            mariadb.push(rate(n, || dbs.mariadb_effects("consumer")).await);
            running.shutdown().await.unwrap();

            let group = format!("bench-postgres-{}", Uuid::new_v4().simple());
            start_group(&group, &start);
            let builder =
                Consumer::builder(dbs.postgres.clone(), kafka(), &group).handler(on_paid_postgres);
            let running = mode.apply(builder).spawn().unwrap();
            postgres.push(rate(n, || dbs.postgres_effects()).await);
            running.shutdown().await.unwrap();
            println!(
                "round {}, {}: MariaDB {:.0}/s, PostgreSQL {:.0}/s (MariaDB / PostgreSQL {:.2})",
                round + 1,
                mode.name,
                mariadb[round],
                postgres[round],
                mariadb[round] / postgres[round],
            );
        }

        baseline(&dbs.mariadb.pool, &start, baseline_events).await;
        base.push(rate(baseline_events, || dbs.mariadb_effects("baseline")).await);
        println!(
            "round {}: MariaDB baseline {:.0}/s (MariaDB dedup consumer / baseline {:.1}x)",
            round + 1,
            base[round],
            rates[0].0[round] / base[round],
        );
        dbs.drop().await;
    }
    let ratio = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(a, b)| a / b).collect::<Vec<_>>();
    println!(
        "\ncommit {}, {n} events per consumer drain ({baseline_events} for the baseline), {rounds} rounds\n",
        txoutbox_testkit::measured_commit()
    );
    println!("| figure | min / median / max |");
    println!("|---|---|");
    for (mode, (mariadb, postgres)) in MODES.iter().zip(&rates) {
        println!(
            "| MariaDB {} consumer, events/s | {} |",
            mode.name,
            spread(mariadb)
        );
        println!(
            "| PostgreSQL {} consumer, events/s | {} |",
            mode.name,
            spread(postgres)
        );
        println!(
            "| MariaDB / PostgreSQL, {} | {} |",
            mode.name,
            spread(&ratio(mariadb, postgres))
        );
    }
    println!(
        "| MariaDB baseline (a transaction per message), events/s | {} |",
        spread(&base)
    );
    println!(
        "| MariaDB dedup consumer / MariaDB baseline | {}x |",
        spread(&ratio(&rates[0].0, &base))
    );
}

/// A consumer mode the bench drains with.
struct BenchMode {
    name: &'static str,
    mode: Mode,
    handle_on_receipt: bool,
}

const MODES: &[BenchMode] = &[
    BenchMode {
        name: "dedup",
        mode: Mode::Dedup,
        handle_on_receipt: true,
    },
    BenchMode {
        name: "inbox (on receipt)",
        mode: Mode::Inbox,
        handle_on_receipt: true,
    },
    BenchMode {
        name: "inbox (processors)",
        mode: Mode::Inbox,
        handle_on_receipt: false,
    },
];

impl BenchMode {
    fn apply<DB: ConsumerDatabase>(&self, builder: ConsumerBuilder<DB>) -> ConsumerBuilder<DB> {
        builder
            .mode(self.mode)
            .handle_on_receipt(self.handle_on_receipt)
            .create_missing_dlq_topics(true)
    }
}
