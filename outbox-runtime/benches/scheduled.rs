//! Scheduled delivery (`Events::record_after` / `record_at`):
//!
//! 1. **Precision**: messages scheduled at due times spread over a few
//!    seconds, with a relay running on the real broker; lateness =
//!    `published_at - deliver_after` (the mark after the broker's
//!    acknowledgement), and how much of it is the move into `outbox_event`
//!    (`created_at - deliver_after`), min / median / p99 / max per round.
//! 2. **What future rows cost the claim**: a relay draining a backlog of
//!    immediate rows with no scheduled row present, then with 100,000
//!    not-yet-due rows in `outbox_scheduled` (due tomorrow); the ratio of the
//!    two drain rates, per round (the two orders alternate).
//!
//! ```text
//! scripts/services.sh up
//! cargo bench -p txoutbox-runtime --bench scheduled
//! SCHEDULED_BENCH_MESSAGES=1000 SCHEDULED_BENCH_SPREAD_MS=3000 SCHEDULED_BENCH_ROUNDS=5 \
//!   SCHEDULED_BENCH_DRAIN=20000 SCHEDULED_BENCH_FUTURE=100000 \
//!   cargo bench -p txoutbox-runtime --bench scheduled          # the defaults
//! ```
#![allow(missing_docs)]

mod support;

use std::time::{Duration, Instant};

use sqlx::PgPool;
use txoutbox_runtime::relay::Relay;
use txoutbox_testkit::broker::{brokers, client_config, new_topic};

const KEYS: usize = 1_000;
const PARTITIONS: i32 = 8;
/// The first due time, after the relay has started and joined its lanes.
const FIRST_DUE_MS: i64 = 1_000;

/// Schedules `n` messages of `topic` over `KEYS` keys (about 250 bytes of
/// JSON each), due evenly from `first_ms` to `first_ms + spread_ms` after the
/// database's `now()`, in one statement.
async fn schedule(pool: &PgPool, topic: &str, n: usize, first_ms: i64, spread_ms: i64) {
    sqlx::query(
        "INSERT INTO outbox_scheduled (event_id, aggregate_type, aggregate_id, event_type, payload,
                                       topic, partition_key, deliver_after)
         SELECT id, 'Order', k, 'PaymentReminder',
                jsonb_build_object('event_id', id, 'order_id', k, 'amount', g,
                                   'currency', 'EUR', 'note', repeat('x', 140)),
                $2, k,
                now() + ($4 + (g * $5) / greatest($1, 1)) * interval '1 millisecond'
         FROM (SELECT gen_random_uuid() AS id, 'order-' || (g % $3) AS k, g
               FROM generate_series(0, $1 - 1) AS g) s",
    )
    .bind(n as i64)
    .bind(topic)
    .bind(KEYS as i64)
    .bind(first_ms)
    .bind(spread_ms)
    .execute(pool)
    .await
    .unwrap();
}

/// min, median, p99 and max of a column of seconds over the moved rows.
async fn quantiles(pool: &PgPool, expression: &str) -> [f64; 4] {
    let sql = format!(
        "SELECT min(x), percentile_cont(0.5) WITHIN GROUP (ORDER BY x),
                percentile_cont(0.99) WITHIN GROUP (ORDER BY x), max(x)
         FROM (SELECT EXTRACT(EPOCH FROM {expression})::float8 * 1000 AS x
               FROM outbox_event WHERE deliver_after IS NOT NULL) s"
    );
    let (min, median, p99, max): (f64, f64, f64, f64) = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .fetch_one(pool)
        .await
        .unwrap();
    [min, median, p99, max]
}

fn row(values: [f64; 4]) -> String {
    values
        .iter()
        .map(|v| format!("{v:.1}"))
        .collect::<Vec<_>>()
        .join(" | ")
}

/// One precision round; returns the lateness quantiles (ms).
async fn precision_round(pool: &PgPool, n: usize, spread_ms: i64) -> ([f64; 4], [f64; 4]) {
    let topic = new_topic(&brokers(), "bench-scheduled", PARTITIONS).await;
    let relay = Relay::builder(pool.clone(), client_config(&brokers()))
        .spawn()
        .unwrap();
    schedule(pool, &topic, n, FIRST_DUE_MS, spread_ms).await;
    let deadline =
        Instant::now() + Duration::from_millis((FIRST_DUE_MS + spread_ms) as u64 + 60_000);
    while relay.summary().published < n as u64 {
        assert!(
            Instant::now() < deadline,
            "not published within a minute of the last due time"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    relay.shutdown().await.unwrap();
    let lateness = quantiles(pool, "published_at - deliver_after").await;
    let moved = quantiles(pool, "created_at - deliver_after").await;
    sqlx::query("DELETE FROM outbox_event")
        .execute(pool)
        .await
        .unwrap();
    (lateness, moved)
}

/// Drains `n` immediate rows with a fresh relay; events/s from its first
/// mark to its last (the relay's start, the same in both conditions, left
/// out).
async fn drain(pool: &PgPool, n: usize) -> f64 {
    let topic = new_topic(&brokers(), "bench-scheduled-drain", PARTITIONS).await;
    support::outbox_backlog(pool, &topic, n, KEYS).await;
    let started = Instant::now();
    let relay = Relay::builder(pool.clone(), client_config(&brokers()))
        .spawn()
        .unwrap();
    let mut first: Option<(Instant, u64)> = None;
    loop {
        let published = relay.summary().published;
        if published >= n as u64 {
            break;
        }
        if published > 0 && first.is_none() {
            first = Some((Instant::now(), published));
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "drain too slow"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let (since, already) = first.unwrap_or((started, 0));
    let rate = (n as u64 - already) as f64 / since.elapsed().as_secs_f64();
    relay.shutdown().await.unwrap();
    sqlx::query("DELETE FROM outbox_event")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("VACUUM outbox_event")
        .execute(pool)
        .await
        .unwrap();
    rate
}

async fn set_future_rows(pool: &PgPool, future: usize) {
    sqlx::query("TRUNCATE outbox_scheduled")
        .execute(pool)
        .await
        .unwrap();
    if future > 0 {
        // Due tomorrow: never moved during the drain.
        schedule(pool, "bench-scheduled-future", future, 86_400_000, 0).await;
    }
    sqlx::query("VACUUM ANALYZE outbox_scheduled")
        .execute(pool)
        .await
        .unwrap();
}

#[tokio::main]
async fn main() {
    let n = support::env_usize("SCHEDULED_BENCH_MESSAGES", 1_000);
    let spread_ms = support::env_usize("SCHEDULED_BENCH_SPREAD_MS", 3_000) as i64;
    let rounds = support::env_usize("SCHEDULED_BENCH_ROUNDS", 5).max(1);
    let drained = support::env_usize("SCHEDULED_BENCH_DRAIN", 20_000);
    let future = support::env_usize("SCHEDULED_BENCH_FUTURE", 100_000);
    let (pool, db) = support::scratch_database("outbox_bench_scheduled", 8).await;
    println!(
        "scheduled delivery, commit {}, {rounds} round(s)",
        txoutbox_testkit::measured_commit()
    );

    // 1. Precision.
    println!(
        "\n{n} messages over {KEYS} keys due evenly over {spread_ms} ms, relay defaults \
         (schedule_poll_interval 200 ms); milliseconds:\n"
    );
    println!(
        "| round | lateness min | median | p99 | max | moved after due: min | median | p99 | max |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut medians = Vec::new();
    let mut p99s = Vec::new();
    for round in 1..=rounds {
        let (lateness, moved) = precision_round(&pool, n, spread_ms).await;
        medians.push(lateness[1]);
        p99s.push(lateness[2]);
        println!("| {round} | {} | {} |", row(lateness), row(moved));
    }
    let (lo, mid, hi) = support::spread(&medians);
    let (p99_lo, p99_mid, p99_hi) = support::spread(&p99s);
    println!(
        "\nlateness median over rounds: min {lo:.1} / median {mid:.1} / max {hi:.1} ms; \
         p99: {p99_lo:.1} / {p99_mid:.1} / {p99_hi:.1} ms"
    );

    // 2. What future rows cost the claim.
    println!(
        "\ndraining {drained} immediate rows (fresh relay, defaults) with 0 and with {future} \
         not-yet-due rows in outbox_scheduled:\n"
    );
    println!("| round | events/s, none scheduled | events/s, {future} scheduled | ratio |");
    println!("|---:|---:|---:|---:|");
    let (mut without, mut with, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=rounds {
        // Alternate which condition runs first, so a drift of the machine
        // does not favour one.
        let mut rates = [0.0; 2];
        let order = if round % 2 == 1 { [0, 1] } else { [1, 0] };
        for condition in order {
            set_future_rows(&pool, if condition == 0 { 0 } else { future }).await;
            rates[condition] = drain(&pool, drained).await;
        }
        let ratio = rates[1] / rates[0];
        println!(
            "| {round} | {:.0} | {:.0} | {ratio:.3} |",
            rates[0], rates[1]
        );
        without.push(rates[0]);
        with.push(rates[1]);
        ratios.push(ratio);
    }
    let show = |values: &[f64], digits: usize| {
        let (lo, mid, hi) = support::spread(values);
        format!("{lo:.digits$} / {mid:.digits$} / {hi:.digits$}")
    };
    println!(
        "\nmin / median / max: none scheduled {} events/s; {future} scheduled {} events/s; \
         ratio {}",
        show(&without, 0),
        show(&with, 0),
        show(&ratios, 3)
    );
    pool.close().await;
    support::drop_database(&db).await;
}
