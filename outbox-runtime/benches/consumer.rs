//! Consumer throughput: dedup consumer and inbox consumer + processors against
//! a naive baseline that handles each message in its own transaction, all
//! reading the same topic in one run.
//!
//! ```text
//! scripts/services.sh up
//! cargo bench -p txoutbox-runtime --bench consumer            # 100,000 events
//! OUTBOX_BENCH_EVENTS=20000 cargo bench -p txoutbox-runtime --bench consumer
//! OUTBOX_BENCH_PROCESSORS=4 OUTBOX_BENCH_PROCESSOR_BATCH=500 cargo bench ...  # inbox tuning
//! OUTBOX_BENCH_KEYS=16 cargo bench ...  # 16 partition keys instead of one per event
//! OUTBOX_BENCH_ROUNDS=5 OUTBOX_BENCH_BASELINE_EVENTS=10000 ...     # the defaults
//! OUTBOX_BENCH_PROFILE=1 cargo bench ...  # where the database time goes (see `profile`)
//! OUTBOX_BENCH_KAFKA_fetch.wait.max.ms=500 cargo bench ...  # any librdkafka setting, every client
//! OUTBOX_BENCH_CONCURRENT_BATCHES=1 cargo bench ...  # one batch at a time (default: the consumer's, 4)
//! ```
//!
//! Each round drains the same events with the baseline (its first
//! `OUTBOX_BENCH_BASELINE_EVENTS`), the dedup consumer and the inbox consumer
//! (in alternating order), then empties the tables; the summary gives
//! min / median / max over the rounds and the inbox / dedup ratio per round.
//!
//! Needs `DATABASE_URL` (a database the bench may create scratch databases
//! from) and `KAFKA_BROKERS_TEST`. Each variant consumes the same N events with
//! its own consumer group and runs the same effect (one INSERT per event).
//! Elapsed time is from the first effect (or inbox row) to the last, measured
//! by the database clock, so consumer-group join time is not counted.
//!
//! Chart (`charts::dir()`, `target/bench-charts/` unless `BENCH_CHARTS_DIR` is
//! set): `consumer-drain.svg`, each variant's throughput over time.

mod charts;
mod profile;
mod support;

use std::time::{Duration, Instant};

use rdkafka::consumer::{CommitMode, Consumer as _, StreamConsumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use sqlx::{PgPool, Postgres, Transaction};
use txoutbox_core::DomainEvent;
use txoutbox_runtime::consumer::{Consumer, Mode, event_handler};
use txoutbox_testkit::broker::{brokers, client_config, create_topic};
use uuid::Uuid;

#[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, DomainEvent)]
#[event(topic = "bench.consumer.paid", aggregate = "Order")]
struct BenchPaid {
    event_id: Uuid,
    #[partition_key]
    order_id: Uuid,
    amount: i64,
}

const PARTITIONS: i32 = 4;

async fn effect(
    tx: &mut sqlx::PgConnection,
    event: &BenchPaid,
    variant: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO effect (event_id, amount, variant) VALUES ($1, $2, $3)")
        .bind(event.event_id)
        .bind(event.amount)
        .bind(variant)
        .execute(tx)
        .await
        .map(drop)
}

#[event_handler]
async fn on_paid_dedup(
    tx: &mut Transaction<'_, Postgres>,
    event: BenchPaid,
) -> Result<(), sqlx::Error> {
    effect(tx, &event, "dedup").await
}

#[event_handler]
async fn on_paid_inbox_pending(
    tx: &mut Transaction<'_, Postgres>,
    event: BenchPaid,
) -> Result<(), sqlx::Error> {
    effect(tx, &event, "inbox_pending").await
}

#[event_handler]
async fn on_paid_inbox(
    tx: &mut Transaction<'_, Postgres>,
    event: BenchPaid,
) -> Result<(), sqlx::Error> {
    effect(tx, &event, "inbox").await
}

fn kafka() -> ClientConfig {
    let mut c = client_config(&brokers());
    c.set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500");
    // Extra librdkafka settings, e.g. OUTBOX_BENCH_KAFKA_fetch.wait.max.ms=500
    for (key, value) in std::env::vars() {
        if let Some(key) = key.strip_prefix("OUTBOX_BENCH_KAFKA_") {
            c.set(key, value);
        }
    }
    c
}

async fn scratch_database() -> (PgPool, String) {
    let (mut pool, name) = support::scratch_database("outbox_bench_consumer", 8).await;
    if profile::enabled() {
        // The setting applies to sessions opened after it: open new ones.
        profile::prepare(&pool, &name).await;
        pool.close().await;
        pool = support::connect(&name, 8).await;
    }
    sqlx::raw_sql(
        "CREATE TABLE effect (event_id uuid NOT NULL, amount bigint NOT NULL, variant text NOT NULL,
                              at timestamptz NOT NULL DEFAULT clock_timestamp())",
    )
    .execute(&pool)
    .await
    .unwrap();
    (pool, name)
}

fn watermarks(consumer: &StreamConsumer) -> Vec<i64> {
    (0..PARTITIONS)
        .map(|p| {
            consumer
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
    // One key per event by default; a few hot keys with OUTBOX_BENCH_KEYS
    // (the inbox keeps per-key order, so this is its harder case).
    let keys: Vec<Uuid> = (0..support::env_usize("OUTBOX_BENCH_KEYS", 0))
        .map(|_| Uuid::new_v4())
        .collect();
    for i in 0..n {
        let event = BenchPaid {
            event_id: Uuid::new_v4(),
            order_id: if keys.is_empty() {
                Uuid::new_v4()
            } else {
                keys[i % keys.len()]
            },
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

/// Seconds from the first to the last effect of `variant` (inbox: from the first stored row).
async fn elapsed(pool: &PgPool, variant: &str) -> f64 {
    let from = if variant.starts_with("inbox") {
        "(SELECT min(received_at) FROM inbox_event WHERE consumer_group LIKE 'bench-' || $1 || '-%')"
    } else {
        "min(at)"
    };
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT extract(epoch FROM max(at) - {from})::float8 FROM effect WHERE variant = $1"
    )))
    .bind(variant)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// `(seconds since the variant's start, effects so far)` in 10 ms steps,
/// from the same start as [`elapsed`].
async fn timeline(pool: &PgPool, variant: &str) -> Vec<(f64, f64)> {
    let from = if variant.starts_with("inbox") {
        "(SELECT min(received_at) FROM inbox_event WHERE consumer_group LIKE 'bench-' || $1 || '-%')"
    } else {
        "(SELECT min(at) FROM effect WHERE variant = $1)"
    };
    let steps: Vec<(f64, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT ceil(extract(epoch FROM at - {from}) * 100)::float8 / 100, count(*)
         FROM effect WHERE variant = $1 GROUP BY 1 ORDER BY 1"
    )))
    .bind(variant)
    .fetch_all(pool)
    .await
    .unwrap();
    let mut done = 0.0;
    let mut samples = vec![(0.0, 0.0)];
    for (at, count) in steps {
        done += count as f64;
        samples.push((at, done));
    }
    samples
}

async fn wait_effects(pool: &PgPool, variant: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(1800);
    loop {
        let done: i64 = sqlx::query_scalar("SELECT count(*) FROM effect WHERE variant = $1")
            .bind(variant)
            .fetch_one(pool)
            .await
            .unwrap();
        if done as usize >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{variant}: only {done}/{n} handled"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The baseline: per message, one transaction (dedup insert + effect) and commit.
async fn baseline(pool: &PgPool, start: &[i64], n: usize) {
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
            "INSERT INTO processed_event (consumer_group, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        )
        .bind(&group)
        .bind(event.event_id)
        .execute(&mut *tx)
        .await
        .unwrap()
        .rows_affected();
        if fresh == 1 {
            effect(&mut tx, &event, "baseline").await.unwrap();
        }
        tx.commit().await.unwrap();
        consumer.store_offset_from_message(&message).unwrap();
    }
}

/// One variant's drain in one round.
struct Drained {
    events: usize,
    seconds: f64,
}

impl Drained {
    fn rate(&self) -> f64 {
        self.events as f64 / self.seconds
    }
}

/// Runs the dedup or inbox consumer over the `n` events from `start` with a
/// group of its own, until every effect is in.
async fn drain(pool: &PgPool, variant: &str, start: &[i64], n: usize) -> Drained {
    let group = format!("bench-{variant}-{}", Uuid::new_v4().simple());
    start_group(&group, start);
    let mut builder =
        Consumer::builder(pool.clone(), kafka(), &group).create_missing_dlq_topics(true);
    if let Ok(batches) = std::env::var("OUTBOX_BENCH_CONCURRENT_BATCHES") {
        builder = builder.concurrent_batches(
            batches
                .parse()
                .expect("OUTBOX_BENCH_CONCURRENT_BATCHES: a number"),
        );
    }
    let inbox = |builder: txoutbox_runtime::consumer::ConsumerBuilder| {
        builder
            .mode(Mode::Inbox)
            .processor_batch_size(support::env_usize("OUTBOX_BENCH_PROCESSOR_BATCH", 500))
            .processors(support::env_usize("OUTBOX_BENCH_PROCESSORS", 2))
    };
    let builder = match variant {
        "inbox" => inbox(builder.handler(on_paid_inbox)),
        "inbox_pending" => inbox(builder.handler(on_paid_inbox_pending)).handle_on_receipt(false),
        _ => builder.handler(on_paid_dedup),
    };
    let running = builder.build().unwrap().spawn();
    wait_effects(pool, variant, n).await;
    running.shutdown().await.unwrap();
    Drained {
        events: n,
        seconds: elapsed(pool, variant).await,
    }
}

/// Empties what a round wrote, so every round starts from the same tables.
async fn clear(pool: &PgPool) {
    sqlx::raw_sql("TRUNCATE effect, processed_event, inbox_event, inbox_key")
        .execute(pool)
        .await
        .unwrap();
}

/// `min / median / max` of `values`.
fn spread(values: &[f64], digits: usize) -> String {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    format!(
        "{:.digits$} / {median:.digits$} / {:.digits$}",
        sorted[0],
        sorted[sorted.len() - 1]
    )
}

#[tokio::main]
async fn main() {
    let n = support::env_usize("OUTBOX_BENCH_EVENTS", 100_000);
    let rounds = support::env_usize("OUTBOX_BENCH_ROUNDS", 5).max(1);
    let baseline_events = support::env_usize("OUTBOX_BENCH_BASELINE_EVENTS", 10_000).min(n);
    create_topic(&brokers(), BenchPaid::TOPIC, PARTITIONS).await;
    let probe: StreamConsumer = kafka().set("group.id", "bench-probe").create().unwrap();
    let start = watermarks(&probe);
    let produced = Instant::now();
    produce(n).await;
    println!(
        "produced {n} events to {} ({PARTITIONS} partitions) in {:.1} s",
        BenchPaid::TOPIC,
        produced.elapsed().as_secs_f64()
    );
    println!(
        "commit {}; consumers' concurrent batches: {}",
        txoutbox_testkit::measured_commit(),
        std::env::var("OUTBOX_BENCH_CONCURRENT_BATCHES").unwrap_or_else(|_| "their default".into())
    );
    let (pool, db) = scratch_database().await;
    let inbox_label = format!(
        "inbox consumer + {} processors claiming {} rows",
        support::env_usize("OUTBOX_BENCH_PROCESSORS", 2),
        support::env_usize("OUTBOX_BENCH_PROCESSOR_BATCH", 500)
    );
    let keys = match support::env_usize("OUTBOX_BENCH_KEYS", 0) {
        0 => "one key per event".to_owned(),
        keys => format!("{keys} keys"),
    };

    let pending_label = format!("{inbox_label}, every event stored pending first");
    let variants: [(&str, &str); 3] = [
        ("dedup", "dedup consumer (default settings)"),
        ("inbox", inbox_label.as_str()),
        ("inbox_pending", pending_label.as_str()),
    ];
    let mut base = Vec::new();
    let mut drained: Vec<Vec<Drained>> = vec![Vec::new(), Vec::new(), Vec::new()];
    for round in 0..rounds {
        // The profile, if asked for, covers the first round's variants.
        let profiling = profile::enabled() && round == 0;
        if profiling {
            profile::reset(&pool).await;
        }
        baseline(&pool, &start, baseline_events).await;
        base.push(Drained {
            events: baseline_events,
            seconds: elapsed(&pool, "baseline").await,
        });
        if profiling {
            profile::report(
                &pool,
                "baseline: one transaction per message",
                baseline_events as u64,
            )
            .await;
        }
        // Rotate which consumer goes first, so none always meets a warmer
        // (or more loaded) machine.
        for step in 0..variants.len() {
            let which = (round + step) % variants.len();
            let (variant, label) = variants[which];
            if profiling {
                profile::reset(&pool).await;
            }
            drained[which].push(drain(&pool, variant, &start, n).await);
            if profiling {
                profile::report(&pool, label, n as u64).await;
            }
        }
        println!(
            "round {}: baseline {:.0}/s, dedup {:.0}/s, inbox {:.0}/s (inbox/dedup {:.0}%), inbox stored pending first {:.0}/s",
            round + 1,
            base[round].rate(),
            drained[0][round].rate(),
            drained[1][round].rate(),
            100.0 * drained[1][round].rate() / drained[0][round].rate(),
            drained[2][round].rate(),
        );
        if round == 0 {
            let mut drains = vec![(
                "baseline: one transaction per message".to_owned(),
                timeline(&pool, "baseline").await,
            )];
            for (variant, label) in variants {
                drains.push((label.to_owned(), timeline(&pool, variant).await));
            }
            let chart = charts::throughput(
                "consumer-drain.svg",
                &format!("Consumers draining {n} events: throughput over time"),
                &format!(
                    "commit {}, {PARTITIONS} partitions, {keys}, database clock; \
                     2-core machine shared with other work",
                    charts::commit()
                ),
                Duration::from_millis(250),
                &drains,
            );
            println!("chart: {}", chart.display());
        }
        clear(&pool).await;
    }
    pool.close().await;
    support::drop_database(&db).await;

    let rates = |drains: &[Drained]| drains.iter().map(Drained::rate).collect::<Vec<_>>();
    let base_median = {
        let mut r = rates(&base);
        r.sort_by(f64::total_cmp);
        r[r.len() / 2]
    };
    println!(
        "\ncommit {}, {keys}, {n} events per consumer drain ({baseline_events} for the baseline), {rounds} rounds\n",
        charts::commit()
    );
    println!("| variant | events/s min / median / max | median vs baseline median |");
    println!("|---|---|---:|");
    let mut rows = vec![("baseline: one transaction per message", &base)];
    rows.extend(
        variants
            .iter()
            .zip(&drained)
            .map(|((_, label), d)| (*label, d)),
    );
    for (name, drains) in rows {
        let mut r = rates(drains);
        r.sort_by(f64::total_cmp);
        println!(
            "| {name} | {} | {:.1}x |",
            spread(&r, 0),
            r[r.len() / 2] / base_median
        );
    }
    let ratios = |of: &[Drained]| -> Vec<f64> {
        of.iter()
            .zip(&drained[0])
            .map(|(i, d)| 100.0 * i.rate() / d.rate())
            .collect()
    };
    let inbox = ratios(&drained[1]);
    println!(
        "\ninbox / dedup, same round: {} % (target 80 %: met in {} of {rounds} rounds)",
        spread(&inbox, 1),
        inbox.iter().filter(|r| **r >= 80.0).count()
    );
    println!(
        "inbox with every event stored pending first / dedup, same round: {} %",
        spread(&ratios(&drained[2]), 1)
    );
}
