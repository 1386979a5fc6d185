//! Relay benchmark against the real PostgreSQL and the real broker. Every
//! figure is measured in the same run as the figures it is compared with.
//!
//! ```text
//! scripts/services.sh up
//! cargo bench -p txoutbox-runtime --bench relay
//! # quick run:
//! RELAY_BENCH_EVENTS=20000 RELAY_BENCH_PUBLISHED_ROWS=500000 RELAY_BENCH_LATENCY_SECS=5 \
//!     cargo bench -p txoutbox-runtime --bench relay
//! ```
//!
//! Environment (defaults in brackets): `DATABASE_URL`, `KAFKA_BROKERS_TEST`
//! [127.0.0.1:9092], `RELAY_BENCH_EVENTS` [100000] backlog drained,
//! `RELAY_BENCH_BASELINE_EVENTS` [2000] drained by the seed-style loop,
//! `RELAY_BENCH_BATCH` [1000], `RELAY_BENCH_PUBLISHED_ROWS` [5000000] already
//! published rows for the large-table run, `RELAY_BENCH_RATE` [1000] events/s
//! and `RELAY_BENCH_LATENCY_SECS` [10] for the latency run.
//!
//! `RELAY_BENCH_EVENT_IDS` [v7] makes event ids time-ordered like
//! `Uuid::now_v7()`, or random with `v4`.
//!
//! `RELAY_BENCH_ROUNDS` [3] rounds of the throughput figures; ratios are
//! taken within a round, and their medians printed.
//!
//! Latency under load (alone, `RELAY_BENCH_ONLY=latency`): commit-to-publish
//! and the broker floor at each rate of `RELAY_BENCH_RATES` [1000,5000,10000].
//!
//! Every latency run (the main one and each rate of the sweep) also prints
//! where commit-to-publish went, per event, from the relay's probe points
//! (`txoutbox_runtime::probe`): commit to claim, claim to produce, produce
//! to acknowledgement, acknowledgement to the mark's commit; p50 / p99 / max
//! of each, and its median among the slowest 1 % of events (what the tail is
//! made of). Beside them, over the same seconds, how late a thread that
//! sleeps 1 ms wakes up: the machine's scheduling delay. The broker floor
//! beside it sends with the relay's producer settings and headers, one
//! record per tick, or `RELAY_BENCH_FLOOR_BURST` [1] records at once every
//! as many ticks (as the relay hands librdkafka a claim's rows); with
//! `RELAY_BENCH_FLOOR_PARTITIONS=explicit` each record names its partition.
//! In the sweep, `RELAY_BENCH_FLOOR_ALONGSIDE=1` measures the floor during
//! the relay's run (another topic, same rate) instead of after it. Both print
//! their p99 in each second of the run (does the tail grow as the topic
//! does?), and the relay's the 100 ms windows of its slowest 1 % with the
//! worst writer's commit and scheduling delay in each (is the whole machine
//! slow then?). `RELAY_BENCH_TOPICS` [1] spreads the keys of a latency run
//! and of its floor over that many topics; `RELAY_BENCH_METRICS_INTERVAL_SECS`
//! [10] is the relay's `metrics_interval` (its backlog query);
//! `RELAY_BENCH_READER=0` (with `RELAY_BENCH_ONLY=latency` only) attaches no
//! reader to the relay's and the floor's topics, so the broker serves no
//! fetches while it acknowledges (commit to consumer is then not measured).
//!
//! Hot keys (after the figures above, or alone with `RELAY_BENCH_ONLY=keys`):
//! each round drains the same backlog over each of `RELAY_BENCH_KEYS`
//! [1000,10,1] keys, reads every topic back and checks each key's order;
//! then `RELAY_BENCH_LATENCY_ROUNDS` [3] rounds of commit-to-publish latency
//! at `RELAY_BENCH_RATE` over 100 and over 10 keys. Min / median / max of
//! each figure, and of the ratios within a round.
//!
//! Parked rows (after the hot keys, or alone with `RELAY_BENCH_ONLY=parked`):
//! each of `RELAY_BENCH_ROUNDS` rounds drains `RELAY_BENCH_PARKED_EVENTS`
//! [= `RELAY_BENCH_EVENTS`] fresh events once with `RELAY_BENCH_PARKED_ROWS`
//! [200000] parked rows (dead letters, with lower ids than the fresh rows,
//! as they would be) in the table and once without, back to back (which goes
//! first alternates); min / median / max of both rates and of their ratio
//! within a round.
//!
//! The benchmark works in its own databases `outbox_bench_relay`,
//! `outbox_bench_relay_large` and `outbox_bench_relay_parked` (dropped and
//! recreated when used, and dropped at the end).
//!
//! Charts (`charts::dir()`, `target/bench-charts/` unless `BENCH_CHARTS_DIR` is
//! set): `relay-latency.svg` (the latency distributions beside the broker
//! floor) and `relay-drain.svg` (throughput over time of every drain).
#![allow(missing_docs)]

mod charts;
mod support;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};
use txoutbox_runtime::probe::{self, Point, Stage};
use txoutbox_runtime::relay::{Relay, RelayHandle};
use txoutbox_testkit::broker::{new_topic, unique_group};
use uuid::Uuid;

const KEYS: i64 = 10_000;
const PARTITIONS: i32 = 8;

/// When a commit returned (monotonic, and wall clock), and how long the
/// writer's `INSERT` with its commit took.
type CommitTime = (Instant, SystemTime, Duration);

struct Latency {
    rate: f64,
    publish_p50: Duration,
    publish_p99: Duration,
    consumer_p50: Duration,
    consumer_p99: Duration,
    /// Every event's commit-to-publish and commit-to-consumer latency.
    publish: Vec<Duration>,
    consumer: Vec<Duration>,
    /// Where each event's commit-to-publish went, from the relay's probe
    /// points.
    stages: Stages,
}

/// The stages of commit-to-publish, per event, in milliseconds: from the
/// commit's return to the relay's claim, to the produce, to the broker's
/// acknowledgement, to the mark's commit. And, over the same seconds, how
/// late a thread that sleeps 1 ms wakes up: the machine's own scheduling
/// delay, which every stage above pays too.
struct Stages {
    per_event: Vec<Timed>,
    /// How late each 1 ms sleep woke (ms), with when it woke (microseconds
    /// since the epoch).
    oversleep: Vec<(i64, f64)>,
    /// The relay's claims that returned rows and its marks: how many, and
    /// their statements' time in all (ms).
    claims: (usize, f64),
    marks: (usize, f64),
}

/// One event's stages, with when it was committed (microseconds since the
/// epoch) and how long its writer's `INSERT` and commit took (ms).
struct Timed {
    stages: [f64; STAGE_NAMES.len()],
    committed_us: i64,
    writer_ms: f64,
}

impl Timed {
    fn total(&self) -> f64 {
        self.stages.iter().sum()
    }

    /// Commit to the broker's acknowledgement: the stages up to `Acked`.
    fn to_acknowledgement(&self) -> f64 {
        self.stages[..=stage_index(Stage::Acked)].iter().sum()
    }
}

const STAGE_NAMES: [&str; 7] = [
    "commit to the claim's start (wake-up; the relay's loop busy)",
    "the claim statement",
    "claim to produce",
    "produce to acknowledgement (the broker)",
    "acknowledgement to the batch's last acknowledgement",
    "the batch's last acknowledgement to the mark's start (the relay's loop busy)",
    "the mark statement (with its commit)",
];

/// The probe points that end each of [`STAGE_NAMES`] (`None`: the batch's
/// last acknowledgement, the latest `Acked` of the events marked together).
const STAGE_ENDS: [Option<Stage>; 7] = [
    Some(Stage::ClaimSent),
    Some(Stage::Claimed),
    Some(Stage::Sent),
    Some(Stage::Acked),
    None,
    Some(Stage::MarkSent),
    Some(Stage::Marked),
];

/// Where `stage` ends in [`STAGE_ENDS`].
fn stage_index(stage: Stage) -> usize {
    STAGE_ENDS
        .iter()
        .position(|end| *end == Some(stage))
        .expect("every recorded stage ends one of STAGE_NAMES")
}

struct Bench {
    pool: PgPool,
    brokers: String,
    batch: usize,
    /// `(seconds since spawn, rows published)` of each relay drain, for the chart.
    drains: Mutex<Vec<Vec<(f64, f64)>>>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let events = support::env_usize("RELAY_BENCH_EVENTS", 100_000);
    let baseline_events = support::env_usize("RELAY_BENCH_BASELINE_EVENTS", 2_000);
    let published_rows = support::env_usize("RELAY_BENCH_PUBLISHED_ROWS", 5_000_000);
    let rate = support::env_usize("RELAY_BENCH_RATE", 1_000);
    let latency_secs = support::env_usize("RELAY_BENCH_LATENCY_SECS", 10);
    let rounds = support::env_usize("RELAY_BENCH_ROUNDS", 3).max(1);
    let brokers = txoutbox_testkit::broker::brokers();
    let batch = support::env_usize("RELAY_BENCH_BATCH", 1_000);
    let bench = Bench {
        pool: bench_database("outbox_bench_relay").await,
        brokers: brokers.clone(),
        batch,
        drains: Mutex::default(),
    };
    let large = Bench {
        pool: bench_database("outbox_bench_relay_large").await,
        brokers,
        batch,
        drains: Mutex::default(),
    };
    println!(
        "relay benchmark: backlog {events}, baseline sample {baseline_events}, batch {batch}, \
         {published_rows} published rows, latency at {rate}/s for {latency_secs} s, \
         median of {rounds} rounds, event ids {}",
        if v7_event_ids() {
            "v7 (time-ordered)"
        } else {
            "v4 (random)"
        }
    );
    let only_latency = std::env::var("RELAY_BENCH_ONLY").is_ok_and(|only| only == "latency");
    assert!(
        reader_attached() || only_latency,
        "RELAY_BENCH_READER=0 is for RELAY_BENCH_ONLY=latency: the other sections time the consumer"
    );
    if std::env::var("RELAY_BENCH_ONLY").is_ok_and(|only| only == "keys") {
        key_sweep(&bench, events, rounds, rate, latency_secs).await;
        return;
    }
    if only_latency {
        latency_sweep(&bench, latency_secs).await;
        return;
    }
    if std::env::var("RELAY_BENCH_ONLY").is_ok_and(|only| only == "parked") {
        parked_sweep(&bench, events, rounds).await;
        return;
    }
    large.fill_published(published_rows).await;

    // The machine is shared: each round measures every contender back to
    // back, and the medians are compared.
    let (mut relay, mut relay_large, mut producer, mut sql) = (vec![], vec![], vec![], vec![]);
    let mut seed = vec![];
    for round in 1..=rounds {
        relay.push(bench.relay_drain(events).await);
        relay_large.push(large.relay_drain(events).await);
        producer.push(bench.raw_producer(events).await);
        sql.push(bench.bare_sql_loop(events).await);
        seed.push(bench.seed_style_drain(baseline_events).await);
        println!(
            "round {round}: relay {:.0}/s, relay over {published_rows} published rows {:.0}/s, \
             raw producer {:.0}/s, bare SQL {:.0}/s, seed-style loop {:.0}/s",
            relay[round - 1],
            relay_large[round - 1],
            producer[round - 1],
            sql[round - 1],
            seed[round - 1]
        );
    }
    // Ratios are taken within each round (same load), then the median.
    let per_round = |f: &dyn Fn(usize) -> f64| median((0..rounds).map(f).collect());
    let vs_lower = per_round(&|i| relay[i] / producer[i].min(sql[i]));
    let vs_shared = per_round(&|i| relay[i] * (1.0 / producer[i] + 1.0 / sql[i]));
    let large_vs_empty = per_round(&|i| relay_large[i] / relay[i]);
    let (relay_rate, large_rate) = (median(relay.clone()), median(relay_large.clone()));
    let (producer_rate, sql_rate) = (median(producer.clone()), median(sql.clone()));
    let seed_rate = median(seed.clone());
    println!("relay drain (empty table):        {relay_rate:>10.0} events/s");
    println!("seed-style loop (send_and_wait, linger 0): {seed_rate:>10.0} events/s");
    println!("raw producer, same config:        {producer_rate:>10.0} msgs/s");
    println!("bare SQL claim+mark loop:         {sql_rate:>10.0} rows/s");
    let bound = if sql_rate < producer_rate {
        "PostgreSQL (claim + mark)"
    } else {
        "the producer / broker"
    };
    // Each target as min / median / max of the per-round ratios, and how
    // many rounds met it: "met" only when the spread says so.
    let report = |name: &str, ratios: Vec<f64>, target: f64, unit: &str, scale: f64| {
        let (lo, mid, hi) = support::spread(&ratios);
        let met = ratios.iter().filter(|r| **r >= target).count();
        println!(
            "{name}: {:.1}{unit} / {:.1}{unit} / {:.1}{unit} (min / median / max over {} rounds; \
             target >= {:.0}{unit}: met in {met} of {})",
            lo * scale,
            mid * scale,
            hi * scale,
            ratios.len(),
            target * scale,
            ratios.len()
        );
    };
    report(
        "ratio relay / seed-style, per round",
        (0..rounds).map(|i| relay[i] / seed[i]).collect(),
        30.0,
        "x",
        1.0,
    );
    report(
        "ratio relay / machine limit, per round",
        (0..rounds)
            .map(|i| relay[i] / producer[i].min(sql[i]))
            .collect(),
        0.60,
        "%",
        100.0,
    );
    report(
        "ratio large table / empty table, per round",
        (0..rounds).map(|i| relay_large[i] / relay[i]).collect(),
        0.90,
        "%",
        100.0,
    );
    println!(
        "ratio relay / machine limit:      {:>10.0}%  (limit = lower of producer and SQL, mostly {bound}; target >= 60%)",
        100.0 * vs_lower
    );
    // The broker, librdkafka and PostgreSQL run on the same few cores: when
    // the CPU is the shared resource, their per-event costs add up.
    println!(
        "ratio relay / shared-CPU limit:   {:>10.0}%  (limit = 1 / (1/producer + 1/SQL))",
        100.0 * vs_shared
    );
    println!("relay drain ({published_rows} published rows): {large_rate:>10.0} events/s");
    println!(
        "ratio large table / empty table:  {:>10.0}%  (target >= 90%)",
        100.0 * large_vs_empty
    );

    let latency = bench.latency(rate, latency_secs).await;
    let floor = bench.broker_floor(rate, latency_secs).await;
    let (floor_p50, floor_p99) = (pick(&floor, 0.50), pick(&floor, 0.99));
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "commit-to-publish latency at {:.0}/s: p50 {:.1} ms, p99 {:.1} ms (target p99 <= 25 ms)",
        latency.rate,
        ms(latency.publish_p50),
        ms(latency.publish_p99)
    );
    println!(
        "commit-to-consumer latency (adds the consumer's fetch): p50 {:.1} ms, p99 {:.1} ms",
        ms(latency.consumer_p50),
        ms(latency.consumer_p99)
    );
    println!(
        "broker floor: send-to-ack of the same producer at {rate}/s: p50 {:.1} ms, p99 {:.1} ms; \
         the relay adds p50 {:+.1} ms, p99 {:+.1} ms",
        ms(floor_p50),
        ms(floor_p99),
        ms(latency.publish_p50) - ms(floor_p50),
        ms(latency.publish_p99) - ms(floor_p99)
    );
    latency.stages.print(latency.rate);

    let caption = format!(
        "commit {}, {events} events per drain, batch {batch}, {PARTITIONS} partitions, {KEYS} keys; \
         latency at {rate}/s for {latency_secs} s; 2-core machine shared with other work",
        charts::commit()
    );
    let latency_chart = charts::latency(
        "relay-latency.svg",
        &format!("Relay latency at {:.0} events/s", latency.rate),
        &caption,
        &[
            ("commit to publish (relay)", &latency.publish),
            ("broker floor: send to ack", &floor),
            ("commit to consumer", &latency.consumer),
        ],
    );
    let mut drains: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for (table, runs) in [
        ("empty table".to_owned(), &bench.drains),
        (format!("{published_rows} published rows"), &large.drains),
    ] {
        for (round, samples) in runs.lock().unwrap().iter().enumerate() {
            drains.push((format!("{table}, round {}", round + 1), samples.clone()));
        }
    }
    let drain_chart = charts::throughput(
        "relay-drain.svg",
        &format!("Relay drain of {events} events: throughput over time"),
        &caption,
        Duration::from_millis(100),
        &drains,
    );
    println!(
        "charts: {}, {}",
        latency_chart.display(),
        drain_chart.display()
    );
    key_sweep(&bench, events, rounds, rate, latency_secs).await;
    parked_sweep(&bench, events, rounds).await;
    // Nothing left behind (the large table's database holds millions of rows).
    bench.pool.close().await;
    large.pool.close().await;
    for name in DATABASES {
        support::drop_database(name).await;
    }
}

/// The databases the bench works in, dropped at its end (and, after a run
/// that did not end, again when a later run recreates them).
const DATABASES: [&str; 3] = [
    "outbox_bench_relay",
    "outbox_bench_relay_large",
    "outbox_bench_relay_parked",
];

/// Draining with dead letters in the table: each round drains the same
/// number of fresh events in `bench` (no parked row) and in a database
/// holding `RELAY_BENCH_PARKED_ROWS` [200000] parked rows older than every
/// fresh row, back to back, alternating which goes first. A claim walks the
/// relay's index in id order, so a parked row kept in that index would be
/// stepped over by every claim (migration 0010 keeps them out of it).
async fn parked_sweep(bench: &Bench, events: usize, rounds: usize) {
    let parked_rows = support::env_usize("RELAY_BENCH_PARKED_ROWS", 200_000);
    let n = support::env_usize("RELAY_BENCH_PARKED_EVENTS", events);
    let parked = Bench {
        pool: bench_database("outbox_bench_relay_parked").await,
        brokers: bench.brokers.clone(),
        batch: bench.batch,
        drains: Mutex::default(),
    };
    parked.fill_parked(parked_rows).await;
    let (mut without, mut with, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=rounds {
        let (none, some) = if round % 2 == 1 {
            let none = bench.relay_drain_keys(n, KEYS).await.0;
            (none, parked.relay_drain_keys(n, KEYS).await.0)
        } else {
            let some = parked.relay_drain_keys(n, KEYS).await.0;
            (bench.relay_drain_keys(n, KEYS).await.0, some)
        };
        let still_parked: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM outbox_event WHERE parked_at IS NOT NULL AND published_at IS NULL",
        )
        .fetch_one(&parked.pool)
        .await
        .unwrap();
        assert_eq!(
            still_parked as usize, parked_rows,
            "parked rows stay parked"
        );
        println!(
            "parked rows, round {round}: {n} events drained at {none:.0}/s with none parked, \
             {some:.0}/s with {parked_rows} parked: ratio {:.3}",
            some / none
        );
        without.push(none);
        with.push(some);
        ratios.push(some / none);
    }
    let (lo, mid, hi) = support::spread(&without);
    println!(
        "relay drain of {n} events, no parked row:        {lo:.0} / {mid:.0} / {hi:.0} events/s \
         (min / median / max over {rounds} rounds)"
    );
    let (lo, mid, hi) = support::spread(&with);
    println!(
        "relay drain of {n} events, {parked_rows} parked rows: {lo:.0} / {mid:.0} / {hi:.0} events/s"
    );
    let (lo, mid, hi) = support::spread(&ratios);
    let met = ratios.iter().filter(|r| **r >= 0.90).count();
    println!(
        "ratio with {parked_rows} parked / none, per round: {lo:.3} / {mid:.3} / {hi:.3} \
         (target >= 0.90: met in {met} of {rounds})"
    );
}

/// The key counts of the hot-key sweep, the first being the reference
/// (`RELAY_BENCH_KEYS`, comma-separated, [1000,10,1]).
fn key_counts() -> Vec<i64> {
    std::env::var("RELAY_BENCH_KEYS")
        .unwrap_or_else(|_| "1000,10,1".into())
        .split(',')
        .map(|k| k.trim().parse().expect("RELAY_BENCH_KEYS: key counts"))
        .collect()
}

/// A few keys carrying all the traffic: each round drains the same backlog
/// over each key count back to back (the topic read back and every key's
/// order checked), and the throughput of each is compared with the first
/// count's within the round. Then commit-to-publish latency at `rate` over
/// 100 and over 10 keys, `RELAY_BENCH_LATENCY_ROUNDS` [3] rounds.
async fn key_sweep(bench: &Bench, events: usize, rounds: usize, rate: usize, latency_secs: usize) {
    let counts = key_counts();
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); counts.len()];
    for round in 1..=rounds {
        let mut line = format!("hot keys, round {round}:");
        for (i, &keys) in counts.iter().enumerate() {
            let (drained, _, topic) = bench.relay_drain_keys(events, keys).await;
            bench.check_order(&topic, events, keys).await;
            rates[i].push(drained);
            line += &format!(" {keys} keys {drained:.0}/s,");
        }
        println!(
            "{} (every key read back in order, once)",
            line.trim_end_matches(',')
        );
    }
    for (i, &keys) in counts.iter().enumerate() {
        let (lo, mid, hi) = support::spread(&rates[i]);
        let ratios: Vec<f64> = (0..rounds)
            .map(|r| 100.0 * rates[i][r] / rates[0][r])
            .collect();
        let (rlo, rmid, rhi) = support::spread(&ratios);
        println!(
            "relay drain over {keys:>5} keys: {lo:.0} / {mid:.0} / {hi:.0} events/s (min / median / max); \
             vs {} keys in the same round: {rlo:.0}% / {rmid:.0}% / {rhi:.0}% (target >= 70%)",
            counts[0]
        );
    }
    let latency_rounds = support::env_usize("RELAY_BENCH_LATENCY_ROUNDS", 3).max(1);
    let key_sets = [100usize, 10];
    let mut p50s: Vec<Vec<f64>> = vec![Vec::new(); key_sets.len()];
    let mut p99s: Vec<Vec<f64>> = vec![Vec::new(); key_sets.len()];
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    for round in 1..=latency_rounds {
        let mut line = format!("latency round {round}:");
        // Alternate which goes first, so a drift of the machine's load
        // does not favour one.
        let order: Vec<usize> = if round % 2 == 1 {
            vec![0, 1]
        } else {
            vec![1, 0]
        };
        for i in order {
            let keys = key_sets[i];
            let latency = bench.latency_keys(rate, latency_secs, keys).await;
            p50s[i].push(ms(latency.publish_p50));
            p99s[i].push(ms(latency.publish_p99));
            line += &format!(
                " {keys} keys at {:.0}/s p50 {:.1} ms p99 {:.1} ms,",
                latency.rate,
                ms(latency.publish_p50),
                ms(latency.publish_p99)
            );
        }
        println!("{}", line.trim_end_matches(','));
    }
    for (i, keys) in key_sets.iter().enumerate() {
        let (lo50, mid50, hi50) = support::spread(&p50s[i]);
        let (lo99, mid99, hi99) = support::spread(&p99s[i]);
        println!(
            "commit-to-publish at {rate}/s over {keys:>3} keys: p50 {lo50:.1} / {mid50:.1} / {hi50:.1} ms, \
             p99 {lo99:.1} / {mid99:.1} / {hi99:.1} ms (min / median / max)"
        );
    }
    let ratios: Vec<f64> = (0..latency_rounds)
        .map(|r| p99s[1][r] / p99s[0][r])
        .collect();
    let (lo, mid, hi) = support::spread(&ratios);
    println!(
        "p99 over 10 keys / over 100 keys, same round: {lo:.2} / {mid:.2} / {hi:.2} (target <= 1, no worse)"
    );
}

impl Stages {
    /// Each published event's stages, from its commit time and the relay's
    /// probe points (an event the relay claimed or sent more than once, after
    /// a failed batch, is timed from its last claim).
    fn of(
        published: &[(i64, f64, Uuid)],
        committed: &[Option<CommitTime>],
        points: &[Point],
        oversleep: Vec<(i64, f64)>,
    ) -> Self {
        let mut at: HashMap<Uuid, [Option<i64>; STAGE_ENDS.len()]> = HashMap::new();
        for point in points {
            if let Some(index) = STAGE_ENDS.iter().position(|end| *end == Some(point.stage)) {
                at.entry(point.event_id).or_default()[index] = Some(point.at_us);
            }
        }
        // A batch is the events marked by one statement (one `MarkSent`
        // time); its last acknowledgement is when it could be marked.
        let acked = stage_index(Stage::Acked);
        let mark_sent = stage_index(Stage::MarkSent);
        let mut last_ack: HashMap<i64, i64> = HashMap::new();
        for points in at.values() {
            if let (Some(acked), Some(mark_sent)) = (points[acked], points[mark_sent]) {
                let last = last_ack.entry(mark_sent).or_insert(acked);
                *last = (*last).max(acked);
            }
        }
        let batch_acked = STAGE_ENDS.iter().position(Option::is_none).unwrap();
        for points in at.values_mut() {
            points[batch_acked] = points[mark_sent].and_then(|sent| last_ack.get(&sent).copied());
        }
        let per_event = published
            .iter()
            .filter_map(|(seq, _, event_id)| {
                let (_, wall, writer) = committed[*seq as usize]?;
                let committed_us = wall.duration_since(UNIX_EPOCH).ok()?.as_micros() as i64;
                let points = at.get(event_id)?;
                let mut stages = [0.0; STAGE_NAMES.len()];
                let mut previous = committed_us;
                for (stage, point) in stages.iter_mut().zip(points) {
                    let point = (*point)?;
                    *stage = (point - previous).max(0) as f64 / 1e3;
                    previous = point.max(previous);
                }
                Some(Timed {
                    stages,
                    committed_us,
                    writer_ms: writer.as_secs_f64() * 1e3,
                })
            })
            .collect();
        // One statement per distinct start time: its rows share it.
        let statements = |sent: Stage, done: Stage| {
            let mut spans: HashMap<i64, i64> = HashMap::new();
            for times in at.values() {
                if let (Some(from), Some(to)) = (times[stage_index(sent)], times[stage_index(done)])
                {
                    spans.insert(from, to - from);
                }
            }
            (spans.len(), spans.values().sum::<i64>() as f64 / 1e3)
        };
        Self {
            per_event,
            oversleep,
            claims: statements(Stage::ClaimSent, Stage::Claimed),
            marks: statements(Stage::MarkSent, Stage::Marked),
        }
    }

    /// A table of each stage's p50 / p99 / max, and its median among the
    /// events whose commit to mark was in the slowest 1 %: which stage the
    /// tail is made of.
    fn print(&self, rate: f64) {
        if self.per_event.is_empty() {
            println!("(no probe points: no stage breakdown)");
            return;
        }
        let mut by_total: Vec<&Timed> = self.per_event.iter().collect();
        by_total.sort_by(|a, b| a.total().total_cmp(&b.total()));
        let tail = &by_total[(by_total.len() * 99 / 100).min(by_total.len() - 1)..];
        let quantiles = |mut values: Vec<f64>| {
            values.sort_by(f64::total_cmp);
            let at = |q: f64| values[((values.len() as f64 * q) as usize).min(values.len() - 1)];
            (at(0.5), at(0.99), values[values.len() - 1])
        };
        // Whether the tail is spread over the run or made of a few moments:
        // the 100 ms windows its commits fall in.
        let mut windows: Vec<i64> = tail.iter().map(|t| t.committed_us / 100_000).collect();
        windows.sort_unstable();
        windows.dedup();
        println!(
            "where commit-to-publish goes at {rate:.0}/s ({} events; the slowest 1 %, {} events, \
             committed within {} windows of 100 ms), ms:",
            by_total.len(),
            tail.len(),
            windows.len()
        );
        println!("| stage | p50 | p99 | max | median in the slowest 1 % |");
        println!("| --- | --- | --- | --- | --- |");
        let row = |name: &str, value: &dyn Fn(&Timed) -> f64| {
            let (p50, p99, max) = quantiles(by_total.iter().map(|t| value(t)).collect());
            let (in_tail, _, _) = quantiles(tail.iter().map(|t| value(t)).collect());
            println!("| {name} | {p50:.1} | {p99:.1} | {max:.1} | {in_tail:.1} |");
        };
        for (index, name) in STAGE_NAMES.iter().enumerate() {
            row(name, &|t| t.stages[index]);
        }
        row(
            "commit to the broker's acknowledgement (the stages above it)",
            &Timed::to_acknowledgement,
        );
        row("commit to the mark's commit (published_at)", &|t| t.total());
        row(
            "beside them: the writer's INSERT and its commit (synchronous_commit on)",
            &|t| t.writer_ms,
        );
        if !self.oversleep.is_empty() {
            let (p50, p99, max) = quantiles(self.oversleep.iter().map(|(_, late)| *late).collect());
            println!(
                "| beside them: a 1 ms sleep wakes late by ({} samples) | {p50:.1} | {p99:.1} | {max:.1} | - |",
                self.oversleep.len()
            );
        }
        // The run's first and last commits (microseconds since the epoch).
        let (first, last) = self
            .per_event
            .iter()
            .map(|t| t.committed_us)
            .fold(None, |span: Option<(i64, i64)>, at| {
                Some(span.map_or((at, at), |(first, last)| (first.min(at), last.max(at))))
            })
            .unwrap_or((0, 0));
        let run_ms = ((last - first) as f64 / 1e3).max(1.0);
        println!(
            "the relay's loop over the run's {:.1} s: {} claims that found rows, {:.0} ms in the \
             statement ({:.0} % of the run); {} marks, {:.0} ms ({:.0} %); {:.1} events per claim",
            run_ms / 1e3,
            self.claims.0,
            self.claims.1,
            100.0 * self.claims.1 / run_ms,
            self.marks.0,
            self.marks.1,
            100.0 * self.marks.1 / run_ms,
            by_total.len() as f64 / self.claims.0.max(1) as f64,
        );
        self.print_tail_windows(tail, first);
        self.print_p99_per_second(first);
    }

    /// Commit to acknowledgement, p99 in each second of the run (by commit
    /// time, from `first`): whether the tail grows as the run goes on.
    fn print_p99_per_second(&self, first: i64) {
        let mut by_second: BTreeMap<i64, Vec<f64>> = BTreeMap::new();
        for timed in &self.per_event {
            by_second
                .entry((timed.committed_us - first).div_euclid(1_000_000))
                .or_default()
                .push(timed.to_acknowledgement());
        }
        print_p99_per_second("commit to acknowledgement", by_second.into_values());
    }

    /// The 100 ms windows the slowest 1 % were committed in, each with the
    /// worst writer's commit and the worst late wake-up of a 1 ms sleep
    /// within it, against the median window's: whether those moments are
    /// slow for the whole machine (every process waits) or for the broker
    /// alone. `first`: the run's first commit.
    fn print_tail_windows(&self, tail: &[&Timed], first: i64) {
        const WINDOW_US: i64 = 100_000;
        let window = |us: i64| (us - first).div_euclid(WINDOW_US);
        let mut worst_commit: BTreeMap<i64, f64> = BTreeMap::new();
        for timed in &self.per_event {
            let worst = worst_commit.entry(window(timed.committed_us)).or_default();
            *worst = worst.max(timed.writer_ms);
        }
        let mut worst_late: BTreeMap<i64, f64> = BTreeMap::new();
        for (woke, late) in &self.oversleep {
            if worst_commit.contains_key(&window(*woke)) {
                let worst = worst_late.entry(window(*woke)).or_default();
                *worst = worst.max(*late);
            }
        }
        let mut in_tail: BTreeMap<i64, usize> = BTreeMap::new();
        for timed in tail {
            *in_tail.entry(window(timed.committed_us)).or_default() += 1;
        }
        let listed: Vec<String> = in_tail
            .iter()
            .map(|(at, events)| {
                format!(
                    "{:.1} s ({events}, {:.1}, {:.1})",
                    *at as f64 * WINDOW_US as f64 / 1e6,
                    worst_commit.get(at).copied().unwrap_or(0.0),
                    worst_late.get(at).copied().unwrap_or(0.0),
                )
            })
            .collect();
        println!(
            "the slowest 1 %'s windows, from the first commit (its events there, the worst \
             writer's commit ms, the worst late wake-up of a 1 ms sleep ms): {}",
            listed.join(", ")
        );
        println!(
            "the median window of the run: the worst writer's commit {:.1} ms, the worst late \
             wake-up {:.1} ms",
            median(worst_commit.values().copied().collect()),
            if worst_late.is_empty() {
                0.0
            } else {
                median(worst_late.values().copied().collect())
            },
        );
    }
}

/// A thread that sleeps 1 ms in a loop and notes how late it wakes: when
/// the machine's cores are all busy, every thread waits this long for one,
/// the relay's included.
struct Oversleep {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<(i64, f64)>>,
}

impl Oversleep {
    fn start() -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut late = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let started = Instant::now();
                    std::thread::sleep(Duration::from_millis(1));
                    let slept = started.elapsed().as_secs_f64() * 1e3;
                    let woke = SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .map_or(0, |since| since.as_micros() as i64);
                    late.push((woke, (slept - 1.0).max(0.0)));
                }
                late
            })
        };
        Self { stop, thread }
    }

    fn stop(self) -> Vec<(i64, f64)> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// The p99 of each second's values (ms), the seconds in order: whether a
/// run's tail grows as it goes on.
fn print_p99_per_second(what: &str, seconds: impl IntoIterator<Item = Vec<f64>>) {
    let per_second: Vec<String> = seconds
        .into_iter()
        .filter(|values| !values.is_empty())
        .map(|mut values| {
            values.sort_by(f64::total_cmp);
            format!("{:.1}", pick(&values, 0.99))
        })
        .collect();
    println!(
        "{what}, p99 in each second of the run, ms: {}",
        per_second.join(", ")
    );
}

/// The value at quantile `q` of sorted `values`.
fn pick<T: Copy>(values: &[T], q: f64) -> T {
    values[((values.len() as f64 * q) as usize).min(values.len() - 1)]
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

async fn bench_database(name: &'static str) -> PgPool {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let admin_options: PgConnectOptions = url.parse().expect("DATABASE_URL");
    let mut admin = PgConnection::connect_with(&admin_options).await.unwrap();
    // Names are constants of this file: no injection possible.
    let drop = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
    sqlx::raw_sql(sqlx::AssertSqlSafe(drop))
        .execute(&mut admin)
        .await
        .unwrap();
    let create = format!("CREATE DATABASE {name}");
    sqlx::raw_sql(sqlx::AssertSqlSafe(create))
        .execute(&mut admin)
        .await
        .unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect_with(admin_options.database(name))
        .await
        .unwrap();
    txoutbox_runtime::migrations::run(&pool).await.unwrap();
    // Event ids as the write path makes them: `Uuid::now_v7()` (time-ordered,
    // what the README recommends) unless RELAY_BENCH_EVENT_IDS=v4. A v7 id of
    // millisecond `ms` with the 12-bit counter `seq`; random otherwise.
    sqlx::raw_sql(
        "CREATE FUNCTION bench_event_id(ms bigint, seq bigint, v7 boolean) RETURNS uuid
         LANGUAGE sql VOLATILE AS $$
           SELECT CASE WHEN v7 THEN
             (lpad(to_hex(ms), 12, '0') || '7' || lpad(to_hex(seq & 4095), 3, '0') || '8'
              || substr(md5(random()::text), 1, 15))::uuid
           ELSE gen_random_uuid() END
         $$",
    )
    .execute(&pool)
    .await
    .unwrap();
    pool
}

/// Commit-to-publish latency at each rate of `RELAY_BENCH_RATES` [1000,
/// 5000, 10000] events/s (100 keys), each with the broker floor measured
/// right after it: what a user sees as the load grows. A rate the machine
/// cannot sustain shows as a lower achieved rate and a growing latency.
async fn latency_sweep(bench: &Bench, secs: usize) {
    let rates: Vec<usize> = std::env::var("RELAY_BENCH_RATES")
        .unwrap_or_else(|_| "1000,5000,10000".into())
        .split(',')
        .map(|r| r.trim().parse().expect("RELAY_BENCH_RATES: numbers"))
        .collect();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut rows = Vec::new();
    // `RELAY_BENCH_FLOOR_ALONGSIDE=1` measures the floor during the relay's
    // run (another topic, the same rate: twice the broker's load) rather
    // than after it: both then see the same machine.
    let alongside = std::env::var("RELAY_BENCH_FLOOR_ALONGSIDE").is_ok_and(|v| v == "1");
    if !reader_attached() {
        println!("no reader on the relay's and the floor's topics (RELAY_BENCH_READER=0)");
    }
    for rate in rates {
        let (latency, floor) = if alongside {
            let floor = async {
                // Starts as the relay's writers do (after its 2 s settle).
                tokio::time::sleep(Duration::from_secs(2)).await;
                bench.broker_floor(rate, secs).await
            };
            tokio::join!(bench.latency(rate, secs), floor)
        } else {
            let latency = bench.latency(rate, secs).await;
            (latency, bench.broker_floor(rate, secs).await)
        };
        latency.stages.print(latency.rate);
        rows.push(format!(
            "| {rate}/s | {:.0}/s | {:.1} / {:.1} ms | {:.1} / {:.1} ms |",
            latency.rate,
            ms(latency.publish_p50),
            ms(latency.publish_p99),
            ms(pick(&floor, 0.50)),
            ms(pick(&floor, 0.99)),
        ));
    }
    println!("| target rate | achieved | commit-to-publish p50 / p99 | broker floor p50 / p99 |");
    println!("| --- | --- | --- | --- |");
    for row in rows {
        println!("{row}");
    }
}

/// Whether the latency runs and their floors read their topics back
/// (`RELAY_BENCH_READER`, default yes).
fn reader_attached() -> bool {
    std::env::var("RELAY_BENCH_READER").map_or(true, |v| v != "0")
}

/// Whether event ids are time-ordered (v7, default) or random (v4).
fn v7_event_ids() -> bool {
    std::env::var("RELAY_BENCH_EVENT_IDS").map_or(true, |v| v != "v4")
}

fn kafka(brokers: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", brokers);
    for (key, value) in std::env::vars() {
        // Extra librdkafka settings for relay and raw producer alike, e.g.
        // RELAY_BENCH_KAFKA_linger.ms=1
        if let Some(key) = key.strip_prefix("RELAY_BENCH_KAFKA_") {
            config.set(key, value);
        }
    }
    config
}

impl Bench {
    async fn topic(&self, name: &str) -> String {
        new_topic(&self.brokers, &format!("bench-{name}"), PARTITIONS).await
    }

    /// `RELAY_BENCH_TOPICS` [1] new topics for a latency run or its floor,
    /// key `k` on topic `k % n`: the same records, and the same rate, kept
    /// in smaller topics (tansu's memory storage slows as a topic grows).
    async fn latency_topics(&self, name: &str) -> Vec<String> {
        let mut topics = Vec::new();
        for _ in 0..support::env_usize("RELAY_BENCH_TOPICS", 1).max(1) {
            topics.push(self.topic(name).await);
        }
        topics
    }

    /// Empties the outbox but for the already-published history rows and
    /// the parked rows of the parked-rows scenario.
    async fn truncate(&self) {
        sqlx::query("DELETE FROM outbox_event WHERE topic NOT IN ('history', 'parked')")
            .execute(&self.pool)
            .await
            .unwrap();
    }

    /// Inserts `n` unpublished events (about 250 bytes of JSON each) over
    /// `KEYS` keys, with `published` true for already-published filler rows.
    async fn insert(&self, topic: &str, n: usize, published: bool) {
        self.insert_keys(topic, n, published, KEYS).await;
    }

    /// [`insert`](Self::insert) over `keys` keys: event `g` (1..=n, in id
    /// order) has key `order-{g % keys}` and `amount` `g`.
    async fn insert_keys(&self, topic: &str, n: usize, published: bool, keys: i64) {
        // In chunks, so a 5M-row fill does not become one giant transaction.
        // Ten events per millisecond: history rows end now, a backlog starts
        // now, so ids grow in insertion order as they would in production.
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let first_ms = if published {
            now_ms - (n / 10) as i64
        } else {
            now_ms
        };
        let mut done = 0;
        while done < n {
            let chunk = (n - done).min(500_000);
            sqlx::query(
                "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type,
                                           payload, topic, partition_key, published_at)
                 SELECT s.id, 'Order', s.k, 'OrderCreated',
                        jsonb_build_object('event_id', s.id, 'order_id', s.k, 'amount', s.g,
                                           'currency', 'EUR', 'note', repeat('x', 140)),
                        $2, s.k, CASE WHEN $4 THEN now() END
                 FROM (SELECT bench_event_id($6 + (g / 10), g % 10, $5) AS id,
                              'order-' || (g % $3) AS k, g
                       FROM generate_series(1, $1) AS g) AS s",
            )
            .bind(chunk as i64)
            .bind(topic)
            .bind(keys)
            .bind(published)
            .bind(v7_event_ids())
            .bind(first_ms + (done / 10) as i64)
            .execute(&self.pool)
            .await
            .unwrap();
            done += chunk;
        }
        sqlx::query("VACUUM ANALYZE outbox_event")
            .execute(&self.pool)
            .await
            .unwrap();
        // A bulk load leaves PostgreSQL's (cluster-wide) buffer pool full of
        // dirty pages, which a running database's checkpoints would long have
        // written: without this, the next reads each evict and write a dirty
        // page and every contender is measured against the setup's debris.
        sqlx::query("CHECKPOINT").execute(&self.pool).await.unwrap();
    }

    fn relay(&self) -> RelayHandle {
        Relay::builder(self.pool.clone(), kafka(&self.brokers))
            .batch_size(self.batch)
            .spawn()
            .unwrap()
    }

    /// Spawns a relay over a backlog of `n` events and times until all are marked.
    async fn relay_drain(&self, n: usize) -> f64 {
        let (rate, samples, _) = self.relay_drain_keys(n, KEYS).await;
        self.drains.lock().unwrap().push(samples);
        rate
    }

    /// [`relay_drain`](Self::relay_drain) over `keys` keys; also returns the
    /// throughput samples and the topic.
    async fn relay_drain_keys(&self, n: usize, keys: i64) -> (f64, Vec<(f64, f64)>, String) {
        self.truncate().await;
        let topic = self.topic("drain").await;
        self.insert_keys(&topic, n, false, keys).await;
        let started = Instant::now();
        let relay = self.relay();
        let mut samples = vec![(0.0, 0.0)];
        loop {
            let published = relay.summary().published;
            let at = started.elapsed().as_secs_f64();
            if published >= n as u64 || at - samples.last().unwrap().0 >= 0.02 {
                samples.push((at, published as f64));
            }
            if published >= n as u64 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let elapsed = started.elapsed();
        relay.shutdown().await.unwrap();
        (n as f64 / elapsed.as_secs_f64(), samples, topic)
    }

    /// The seed's loop: claim a batch, then for each row send-and-wait and
    /// UPDATE that row, commit per batch. Its producer is configured as a
    /// competent user of the seed's stack runs it: aiokafka sends at once
    /// (`linger_ms=0`), with idempotence and `acks=all` as the seed requires.
    async fn seed_style_drain(&self, n: usize) -> f64 {
        self.truncate().await;
        let topic = self.topic("seed").await;
        self.insert(&topic, n, false).await;
        let mut config = idempotent(&self.brokers);
        config.set("linger.ms", "0");
        let producer: FutureProducer = config.create().unwrap();
        let started = Instant::now();
        let mut conn = self.pool.acquire().await.unwrap();
        loop {
            let mut tx = conn.begin().await.unwrap();
            let rows: Vec<(i64, String, String, String)> = sqlx::query_as(
                "SELECT id, topic, partition_key, payload::text FROM outbox_event
                 WHERE published_at IS NULL ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED",
            )
            .fetch_all(&mut *tx)
            .await
            .unwrap();
            if rows.is_empty() {
                break;
            }
            for (id, topic, key, payload) in rows {
                producer
                    .send(
                        FutureRecord::to(&topic).key(&key).payload(&payload),
                        Duration::from_secs(30),
                    )
                    .await
                    .unwrap();
                sqlx::query("UPDATE outbox_event SET published_at = now() WHERE id = $1")
                    .bind(id)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
            }
            tx.commit().await.unwrap();
        }
        n as f64 / started.elapsed().as_secs_f64()
    }

    /// The same librdkafka configuration producing `n` messages of the same
    /// shape (key, ~250-byte JSON value, headers) as fast as it can.
    async fn raw_producer(&self, n: usize) -> f64 {
        let topic = self.topic("raw").await;
        let producer: FutureProducer = idempotent(&self.brokers).create().unwrap();
        let messages: Vec<(String, String, String)> = (0..n)
            .map(|g| {
                let id = Uuid::new_v4().to_string();
                let key = format!("order-{}", g as i64 % KEYS);
                let value = serde_json::json!({"event_id": id, "order_id": key, "amount": g,
                    "currency": "EUR", "note": "x".repeat(140)})
                .to_string();
                (id, key, value)
            })
            .collect();
        let started = Instant::now();
        let mut pending = Vec::with_capacity(n);
        for (id, key, value) in &messages {
            let headers = relay_headers(id, key);
            let mut record = FutureRecord::to(&topic)
                .key(key)
                .payload(value)
                .headers(headers);
            loop {
                match producer.send_result(record) {
                    Ok(delivery) => break pending.push(delivery),
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                        record = back;
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    Err((error, _)) => panic!("{error}"),
                }
            }
        }
        for delivery in futures::future::join_all(pending).await {
            delivery.unwrap().map_err(|(e, _)| e).unwrap();
        }
        n as f64 / started.elapsed().as_secs_f64()
    }

    /// The relay's database work alone: claim and mark batches of the same
    /// size with the relay's own statements, no publishing.
    async fn bare_sql_loop(&self, n: usize) -> f64 {
        self.truncate().await;
        self.insert("unused", n, false).await;
        let mut conn = PgConnection::connect_with(&self.pool.connect_options())
            .await
            .unwrap();
        txoutbox_runtime::relay::configure_connection(&mut conn)
            .await
            .unwrap();
        let lanes: Vec<i32> = (0..64).collect();
        let started = Instant::now();
        let mut total = 0;
        loop {
            let done = txoutbox_runtime::relay::claim_and_mark_without_publishing(
                &mut conn, 64, &lanes, self.batch,
            )
            .await
            .unwrap();
            if done == 0 {
                break;
            }
            total += done;
        }
        assert_eq!(total, n);
        n as f64 / started.elapsed().as_secs_f64()
    }

    /// Writers commit one event per transaction at `rate`/s (each followed by
    /// the in-process wake-up, as the handler does); a consumer notes when each
    /// arrives.
    async fn latency(&self, rate: usize, secs: usize) -> Latency {
        self.latency_keys(rate, secs, 100).await
    }

    /// [`latency`](Self::latency) over `keys` keys.
    async fn latency_keys(&self, rate: usize, secs: usize, keys: usize) -> Latency {
        self.truncate().await;
        let topics = self.latency_topics("latency").await;
        let total = rate * secs;
        // When each commit returned: a monotonic instant (for the consumer
        // side) and the wall clock (to compare with published_at, which the
        // server on this same host takes from the same clock).
        let committed: Arc<Mutex<Vec<Option<CommitTime>>>> =
            Arc::new(Mutex::new(vec![None; total]));
        let reader = reader_attached();
        let consumer = reader.then(|| {
            let (brokers, topics) = (self.brokers.clone(), topics.clone());
            tokio::task::spawn_blocking(move || consume_arrivals(&brokers, &topics, total))
        });
        let relay = Relay::builder(self.pool.clone(), kafka(&self.brokers))
            .batch_size(self.batch)
            .metrics_interval(Duration::from_secs(support::env_usize(
                "RELAY_BENCH_METRICS_INTERVAL_SECS",
                10,
            ) as u64))
            .spawn()
            .unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await; // consumer and relay settled
        probe::enable();
        probe::take();
        let oversleep = Oversleep::start();

        const WRITERS: usize = 4;
        let started = Instant::now();
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let (pool, topics, committed) =
                    (self.pool.clone(), topics.clone(), Arc::clone(&committed));
                tokio::spawn(async move {
                    let per_writer = rate / WRITERS;
                    let mut tick =
                        tokio::time::interval(Duration::from_secs_f64(1.0 / per_writer as f64));
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                    for seq in (w..total).step_by(WRITERS) {
                        tick.tick().await;
                        let id = Uuid::now_v7();
                        let writing = Instant::now();
                        sqlx::query(
                            "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id,
                                 event_type, payload, topic, partition_key)
                             VALUES ($1, 'Order', $2, 'OrderCreated', $3, $4, $2)",
                        )
                        .bind(id)
                        .bind(format!("order-{}", seq % keys))
                        .bind(serde_json::json!({"event_id": id, "seq": seq}))
                        .bind(&topics[seq % keys % topics.len()])
                        .execute(&pool)
                        .await
                        .unwrap();
                        committed.lock().unwrap()[seq] =
                            Some((Instant::now(), SystemTime::now(), writing.elapsed()));
                        txoutbox_core::__private::wakeup::notify_committed();
                    }
                })
            })
            .collect();
        for writer in writers {
            writer.await.unwrap();
        }
        let achieved = total as f64 / started.elapsed().as_secs_f64();
        let arrivals = match consumer {
            Some(consumer) => consumer.await.unwrap(),
            None => {
                // No reader to wait for: wait until every row is published.
                let deadline = Instant::now() + Duration::from_secs(600);
                loop {
                    let unpublished: i64 = sqlx::query_scalar(
                        "SELECT count(*) FROM outbox_event
                         WHERE topic = ANY($1) AND published_at IS NULL",
                    )
                    .bind(&topics)
                    .fetch_one(&self.pool)
                    .await
                    .unwrap();
                    assert!(
                        Instant::now() < deadline,
                        "{unpublished} rows never published"
                    );
                    if unpublished == 0 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Vec::new()
            }
        };
        let oversleep = oversleep.stop();
        relay.shutdown().await.unwrap();
        let points = probe::take();
        probe::disable();
        // Commit to broker acknowledgement: published_at is set right after
        // the acknowledgements of the row's batch came in.
        let published: Vec<(i64, f64, Uuid)> = sqlx::query_as(
            "SELECT (payload->>'seq')::bigint, EXTRACT(EPOCH FROM published_at)::float8, event_id
             FROM outbox_event WHERE topic = ANY($1)",
        )
        .bind(&topics)
        .fetch_all(&self.pool)
        .await
        .unwrap();
        let committed = committed.lock().unwrap();
        let mut latencies: Vec<Duration> = arrivals
            .iter()
            .filter_map(|(seq, arrived)| {
                Some(arrived.saturating_duration_since(committed[*seq]?.0))
            })
            .collect();
        if reader {
            assert_eq!(latencies.len(), total, "every event arrived");
        }
        latencies.sort();
        let at = |q: f64| {
            if latencies.is_empty() {
                return Duration::ZERO;
            }
            pick(&latencies, q)
        };
        let stages = Stages::of(&published, &committed, &points, oversleep);
        let mut to_publish: Vec<Duration> = published
            .iter()
            .map(|(seq, published_at, _)| {
                let committed_at = committed[*seq as usize].unwrap().1;
                let committed_at = committed_at
                    .duration_since(UNIX_EPOCH)
                    .unwrap()
                    .as_secs_f64();
                Duration::from_secs_f64((published_at - committed_at).max(0.0))
            })
            .collect();
        assert_eq!(to_publish.len(), total);
        to_publish.sort();
        let pick =
            |q: f64| to_publish[((to_publish.len() as f64 * q) as usize).min(to_publish.len() - 1)];
        Latency {
            rate: achieved,
            publish_p50: pick(0.50),
            publish_p99: pick(0.99),
            consumer_p50: at(0.50),
            consumer_p99: at(0.99),
            publish: to_publish,
            consumer: latencies,
            stages,
        }
    }

    /// The broker's share of the latency: the relay's producer settings
    /// (`linger.ms` 0 among them, unless `RELAY_BENCH_KAFKA_linger.ms` says
    /// otherwise) sending one message per tick at `rate`/s over the latency
    /// run's keys, with the headers the relay sends, each timed from `send`
    /// to its acknowledgement. The relay cannot publish faster than this.
    /// Every message's latency, sorted.
    async fn broker_floor(&self, rate: usize, secs: usize) -> Vec<Duration> {
        let topics = self.latency_topics("floor").await;
        let producer: FutureProducer =
            txoutbox_runtime::relay::producer_settings_for_benchmark(&kafka(&self.brokers))
                .create()
                .unwrap();
        // Warm up as the relay is in the latency run: metadata fetched,
        // producer id assigned, connections open.
        for topic in &topics {
            for seq in 0..PARTITIONS {
                producer
                    .send(
                        FutureRecord::to(topic)
                            .key("warm-up")
                            .payload(r#"{"seq":0}"#)
                            .partition(seq),
                        Duration::from_secs(10),
                    )
                    .await
                    .map_err(|(e, _)| e)
                    .unwrap();
            }
        }
        let total = rate * secs;
        // The same reader as in the latency run, so the broker serves the
        // same fetches while it acknowledges.
        let consumer = reader_attached().then(|| {
            let (brokers, topics) = (self.brokers.clone(), topics.clone());
            tokio::task::spawn_blocking(move || consume_arrivals(&brokers, &topics, total))
        });
        let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let mut acks = Vec::with_capacity(total);
        // `RELAY_BENCH_FLOOR_BURST=n` sends n records at once every n ticks
        // (the same rate), as the relay hands librdkafka a claim's rows.
        let burst = support::env_usize("RELAY_BENCH_FLOOR_BURST", 1).max(1);
        // `RELAY_BENCH_FLOOR_PARTITIONS=explicit` names each record's
        // partition, as the relay does (it predicts librdkafka's own).
        let explicit_partitions =
            std::env::var("RELAY_BENCH_FLOOR_PARTITIONS").is_ok_and(|v| v == "explicit");
        for seq in 0..total {
            if seq % burst == 0 {
                for _ in 0..burst {
                    tick.tick().await;
                }
            }
            let key = format!("order-{}", seq % 100);
            let id = Uuid::now_v7().to_string();
            let value = serde_json::json!({"event_id": id, "seq": seq}).to_string();
            let headers = relay_headers(&id, &key);
            let sent = Instant::now();
            let mut record = FutureRecord::to(&topics[seq % 100 % topics.len()])
                .key(&key)
                .payload(&value)
                .headers(headers);
            if explicit_partitions {
                record = record.partition((seq % 100) as i32 % PARTITIONS);
            }
            let delivery = producer.send_result(record).map_err(|(e, _)| e).unwrap();
            acks.push(tokio::spawn(async move {
                delivery.await.unwrap().map_err(|(e, _)| e).unwrap();
                sent.elapsed()
            }));
        }
        let mut latencies = Vec::with_capacity(total);
        for ack in acks {
            latencies.push(ack.await.unwrap());
        }
        if let Some(consumer) = consumer {
            assert_eq!(
                consumer.await.unwrap().len(),
                total,
                "the reader got everything"
            );
        }
        // Sent one per tick: each `rate` of them is a second of the run.
        print_p99_per_second(
            "the floor's send to acknowledgement",
            latencies.chunks(rate.max(1)).map(|second| {
                second
                    .iter()
                    .map(|latency| latency.as_secs_f64() * 1e3)
                    .collect()
            }),
        );
        latencies.sort();
        latencies
    }

    /// Reads `topic` back (all `n` events, every partition) and checks that
    /// every one of the `keys` keys came in order (`amount` is the insertion
    /// order), each event once; panics otherwise.
    async fn check_order(&self, topic: &str, n: usize, keys: i64) {
        let (brokers, topic) = (self.brokers.clone(), topic.to_owned());
        let records = tokio::task::spawn_blocking(move || read_back(&brokers, &topic, n))
            .await
            .unwrap();
        assert_eq!(records.len(), n, "every event read back once");
        let mut last: HashMap<String, i64> = HashMap::new();
        for (key, amount) in records {
            if let Some(previous) = last.insert(key.clone(), amount) {
                assert!(previous < amount, "{key}: {amount} after {previous}");
            }
        }
        assert_eq!(last.len() as i64, keys.min(n as i64), "every key");
    }

    /// Adds `n` parked rows (dead letters: 10 failed attempts each, topic
    /// `parked`), which stay while the drains come and go.
    async fn fill_parked(&self, n: usize) {
        let started = Instant::now();
        self.insert_keys("parked", n, false, KEYS).await;
        sqlx::query(
            "UPDATE outbox_event SET parked_at = now(), attempts = 10,
                 last_error = 'Broker: Message size too large'
             WHERE topic = 'parked'",
        )
        .execute(&self.pool)
        .await
        .unwrap();
        sqlx::query("VACUUM ANALYZE outbox_event")
            .execute(&self.pool)
            .await
            .unwrap();
        sqlx::query("CHECKPOINT").execute(&self.pool).await.unwrap();
        println!(
            "(filled {n} parked rows in {:.0} s)",
            started.elapsed().as_secs_f64()
        );
    }

    /// Adds `n` already-published rows (as months of traffic would leave).
    async fn fill_published(&self, n: usize) {
        let started = Instant::now();
        self.insert("history", n, true).await;
        println!(
            "(filled {n} published rows in {:.0} s)",
            started.elapsed().as_secs_f64()
        );
    }
}

/// The headers the relay sends with a row (event id and type, aggregate,
/// content type), for the plain producers that stand beside it.
fn relay_headers(event_id: &str, aggregate_id: &str) -> OwnedHeaders {
    OwnedHeaders::new()
        .insert(Header {
            key: "event_id",
            value: Some(event_id),
        })
        .insert(Header {
            key: "event_type",
            value: Some("OrderCreated"),
        })
        .insert(Header {
            key: "aggregate_type",
            value: Some("Order"),
        })
        .insert(Header {
            key: "aggregate_id",
            value: Some(aggregate_id),
        })
        .insert(Header {
            key: "content-type",
            value: Some("application/json"),
        })
}

fn idempotent(brokers: &str) -> ClientConfig {
    // What the relay builds: see RelayBuilder (idempotence, acks=all, 30 s timeout).
    let mut config = kafka(brokers);
    config
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", "30000");
    config
}

/// Reads every partition of `topic` from the start until `total` records
/// came (then 0.5 s more, for extra copies); returns `(key, amount)` in each
/// partition's offset order, partitions one after the other.
fn read_back(brokers: &str, topic: &str, total: usize) -> Vec<(String, i64)> {
    let consumer: BaseConsumer = kafka(brokers)
        .set("group.id", unique_group("bench"))
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut assignment = TopicPartitionList::new();
    for partition in 0..PARTITIONS {
        assignment
            .add_partition_offset(topic, partition, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&assignment).unwrap();
    let mut records: Vec<(i32, i64, String, i64)> = Vec::with_capacity(total);
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut grace: Option<Instant> = None;
    while Instant::now() < grace.unwrap_or(deadline) {
        let Some(message) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let message = message.unwrap();
        let value: serde_json::Value = serde_json::from_slice(message.payload().unwrap()).unwrap();
        let key = String::from_utf8(message.key().unwrap().to_vec()).unwrap();
        records.push((
            message.partition(),
            message.offset(),
            key,
            value["amount"].as_i64().unwrap(),
        ));
        if records.len() >= total && grace.is_none() {
            grace = Some(Instant::now() + Duration::from_millis(500));
        }
    }
    records.sort_by_key(|(partition, offset, _, _)| (*partition, *offset));
    records
        .into_iter()
        .map(|(_, _, key, amount)| (key, amount))
        .collect()
}

/// Reads the topic until `total` records arrived; returns (seq, arrival) pairs.
fn consume_arrivals(brokers: &str, topics: &[String], total: usize) -> Vec<(usize, Instant)> {
    let consumer: BaseConsumer = kafka(brokers)
        .set("group.id", unique_group("bench"))
        .set("enable.auto.commit", "false")
        // tansu holds a fetch for much of this wait even when data is there
        // (commit-to-consumer p50 14 / 35 / 133 ms at 10 / 100 / 500 ms): 10
        // ms bounds what it adds. At 1 ms, 8 partitions made 8,000 fetches/s,
        // which slowed the broker's acknowledgements.
        .set("fetch.wait.max.ms", "10")
        .set("fetch.min.bytes", "1")
        .create()
        .unwrap();
    let mut assignment = TopicPartitionList::new();
    for topic in topics {
        for partition in 0..PARTITIONS {
            assignment
                .add_partition_offset(topic, partition, Offset::Beginning)
                .unwrap();
        }
    }
    consumer.assign(&assignment).unwrap();
    let mut arrivals = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(600);
    while arrivals.len() < total && Instant::now() < deadline {
        if let Some(message) = consumer.poll(Duration::from_millis(100)) {
            let message = message.unwrap();
            let arrived = Instant::now();
            let value: serde_json::Value =
                serde_json::from_slice(message.payload().unwrap()).unwrap();
            let seq = value["seq"].as_u64().unwrap() as usize;
            arrivals.entry(seq).or_insert(arrived);
        }
    }
    arrivals.into_iter().collect()
}
