//! The cost of one inbox claim at 100,000 pending rows, in the shapes that
//! matter for liveness, against the claim of the previous release (which
//! looked for key heads among a window of the oldest pending rows).
//!
//! ```text
//! scripts/services.sh up
//! cargo bench -p txoutbox-runtime --bench inbox_claim
//! OUTBOX_BENCH_PENDING=20000 OUTBOX_BENCH_ROUNDS=5 cargo bench -p txoutbox-runtime --bench inbox_claim
//! ```
//!
//! Needs `DATABASE_URL` (a database the bench may create a scratch database
//! from). Each shape is loaded into a fresh inbox group, analyzed, then
//! claimed `OUTBOX_BENCH_ROUNDS` times (default 9), each claim of 500 rows
//! in a transaction that is rolled back, so every round sees the same rows.
//! Times are measured around the statement by the client (loopback).

use std::time::Instant;

mod support;

use sqlx::PgPool;
use support::{drop_database, scratch_database};

const TOPIC: &str = "bench.inbox";
const HANDLED: &str = "Handled";
const BATCH: usize = 500;

/// Rows of one part of a shape: how many, their key and their event type
/// (SQL expressions of the row number `n`).
type Part<'a> = (usize, &'a str, &'a str);

/// Inserts `count` pending rows of `group`: row `n` gets the key
/// `key_sql` (an SQL expression of `n`) and the event type `type_sql`.
async fn insert(pool: &PgPool, group: &str, count: usize, key_sql: &str, type_sql: &str) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO inbox_event (consumer_group, event_id, payload, event_type, topic, partition_key)
         SELECT $1, gen_random_uuid(), jsonb_build_object('n', n), {type_sql}, $2, {key_sql}
         FROM generate_series(1, $3) AS n"
    )))
    .bind(group)
    .bind(TOPIC)
    .bind(count as i64)
    .execute(pool)
    .await
    .unwrap();
}

/// The previous release's claim statement (heads among the oldest
/// `max(8 x batch, 1,000)` pending rows of the table, and their runs), on
/// the same data, as the baseline.
async fn previous_claim(pool: &PgPool) -> usize {
    let mut tx = pool.begin().await.unwrap();
    let rows: Vec<i64> = sqlx::query_scalar(
        "WITH oldest AS (
             SELECT seq, topic, partition_key FROM inbox_event
             WHERE NOT processed AND parked_at IS NULL
             ORDER BY seq LIMIT $2),
         heads AS (
             SELECT min(seq) AS seq FROM oldest WHERE partition_key IS NOT NULL
             GROUP BY topic, partition_key
             UNION ALL
             SELECT seq FROM oldest WHERE partition_key IS NULL),
         owned AS (
             SELECT i.seq, i.topic, i.partition_key FROM inbox_event i
             WHERE i.seq = ANY(ARRAY(SELECT seq FROM heads)) AND NOT processed
               AND parked_at IS NULL
               AND (next_attempt_at IS NULL OR next_attempt_at <= now())
             ORDER BY i.seq LIMIT $1
             FOR UPDATE OF i SKIP LOCKED),
         runs AS (
             SELECT seq FROM owned
             UNION ALL
             SELECT o.seq FROM oldest o JOIN owned h
               ON o.topic = h.topic AND o.partition_key = h.partition_key AND o.seq > h.seq)
         SELECT i.seq FROM inbox_event i
         WHERE i.seq = ANY(ARRAY(SELECT seq FROM runs)) AND NOT processed AND parked_at IS NULL
         ORDER BY seq LIMIT $1
         FOR UPDATE OF i",
    )
    .bind(BATCH as i64)
    .bind((BATCH * 8).max(1_000) as i64)
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    rows.len()
}

/// min / median / max of `rounds` timings, in ms, and the rows claimed.
async fn measure<F, Fut>(rounds: usize, mut claim: F) -> (f64, f64, f64, usize)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = usize>,
{
    let mut times = Vec::with_capacity(rounds);
    let mut rows = 0;
    claim().await; // warm the caches and the plan
    for _ in 0..rounds {
        let started = Instant::now();
        rows = claim().await;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    (
        times[0],
        times[times.len() / 2],
        times[times.len() - 1],
        rows,
    )
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let pending: usize = std::env::var("OUTBOX_BENCH_PENDING")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let rounds: usize = std::env::var("OUTBOX_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(9);
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    println!(
        "inbox claim of {BATCH} rows at {pending} pending rows, {rounds} rounds, commit {commit}"
    );
    println!(
        "{:<44} {:>22} {:>6} {:>24} {:>6}",
        "shape", "claim ms min/med/max", "rows", "previous ms min/med/max", "rows"
    );
    let (pool, name) = scratch_database("outbox_bench_claim", 2).await;
    let blocked_rows = pending - pending / 100;
    let shapes: [(&str, Vec<Part<'_>>); 4] = [
        ("one key per row", vec![(pending, "'k' || n", "'Handled'")]),
        (
            "16 hot keys",
            vec![(pending, "'k' || (n % 16)", "'Handled'")],
        ),
        (
            "1 blocked key ahead of 1% healthy rows",
            vec![
                (blocked_rows, "'blocked'", "'Handled'"),
                (pending / 100, "'k' || n", "'Handled'"),
            ],
        ),
        (
            "10% of keys waiting for a handler",
            vec![(
                pending,
                "'k' || n",
                "CASE WHEN n % 10 = 0 THEN 'Unhandled' ELSE 'Handled' END",
            )],
        ),
    ];
    for (index, (shape, parts)) in shapes.iter().enumerate() {
        let group = format!("g{index}");
        sqlx::query("TRUNCATE inbox_event, inbox_key")
            .execute(&pool)
            .await
            .unwrap();
        for (count, key_sql, type_sql) in parts {
            insert(&pool, &group, *count, key_sql, type_sql).await;
        }
        if shape.contains("blocked") {
            // Its head failed and backs off for an hour.
            sqlx::query(
                "UPDATE inbox_event SET attempts = 1, next_attempt_at = now() + interval '1 hour'
                 WHERE seq = (SELECT min(seq) FROM inbox_event WHERE partition_key = 'blocked')",
            )
            .execute(&pool)
            .await
            .unwrap();
        }
        sqlx::query("ANALYZE inbox_event, inbox_key")
            .execute(&pool)
            .await
            .unwrap();
        let handled = [(TOPIC, HANDLED)];
        let current = measure(rounds, || async {
            txoutbox_runtime::consumer::claim_once_for_benchmark(&pool, &group, &handled, BATCH)
                .await
                .unwrap()
        })
        .await;
        let previous = measure(rounds, || previous_claim(&pool)).await;
        println!(
            "{:<44} {:>22} {:>6} {:>24} {:>6}",
            shape,
            format!("{:.1} / {:.1} / {:.1}", current.0, current.1, current.2),
            current.3,
            format!("{:.1} / {:.1} / {:.1}", previous.0, previous.1, previous.2),
            previous.3,
        );
    }
    pool.close().await;
    drop_database(&name).await;
}
