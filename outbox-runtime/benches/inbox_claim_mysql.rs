//! The cost of one inbox claim on MariaDB (issue 26), in the shapes of
//! `inbox_claim.rs` (PostgreSQL), and what a claim costs once the inbox
//! keeps a long history of processed rows: MySQL has no partial index, so
//! the key index holds processed rows too (`processed` before `seq` keeps
//! them out of the ranges a claim reads), and this measures that they cost
//! nothing.
//!
//! ```text
//! scripts/services.sh up
//! cargo bench -p txoutbox-runtime --features mysql,test-hooks --bench inbox_claim_mysql
//! INBOX_MYSQL_PENDING=20000 INBOX_MYSQL_HISTORY=200000 INBOX_MYSQL_ROUNDS=5 cargo bench ...
//! ```
//!
//! Each shape is loaded into a fresh inbox group of a scratch database
//! (`INBOX_MYSQL_PENDING` [100000] pending rows, with `inbox_key` built as
//! the consumer's statements would leave it), analyzed, then claimed
//! `INBOX_MYSQL_ROUNDS` [9] times, each claim of up to 500 rows in a
//! transaction that is rolled back, so every round sees the same rows. The
//! history shape adds `INBOX_MYSQL_HISTORY` [1000000] processed rows of
//! the same 16 keys before their pending ones; its figure is set against
//! the same keys without history, in the same run. Times are measured
//! around the claim by the client (loopback): min / median / max.

use std::time::Instant;

mod support;

use sqlx::MySqlPool;
use txoutbox_testkit::mysql::MySqlScratch;

const TOPIC: &str = "bench.inbox";
const HANDLED: &str = "Handled";
const BATCH: usize = 500;

/// Inserts `count` rows of `group` (`processed` or pending, after
/// whatever the group holds): row `n` gets the key `key_sql` (an SQL
/// expression of `n`) and the event type `type_sql`. Chunked, for MariaDB's
/// statement size.
async fn insert(
    pool: &MySqlPool,
    group: &str,
    count: usize,
    key_sql: &str,
    type_sql: &str,
    processed: bool,
) {
    const CHUNK: usize = 100_000;
    let mut done = 0;
    while done < count {
        let rows = CHUNK.min(count - done);
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO inbox_event
                 (consumer_group, event_id, payload, payload_bytes, event_type, topic,
                  partition_key, processed, processed_at)
             SELECT ?, UNHEX(REPLACE(UUID(), '-', '')), CONCAT('{{\"n\":', n, '}}'), 12,
                    {type_sql}, ?, CAST({key_sql} AS BINARY), {processed}, {processed_at}
             FROM (SELECT seq + {done} AS n FROM seq_1_to_{rows}) AS s",
            processed = if processed { "TRUE" } else { "FALSE" },
            processed_at = if processed { "NOW(6)" } else { "NULL" },
        )))
        .bind(group.as_bytes())
        .bind(TOPIC)
        .execute(pool)
        .await
        .unwrap();
        done += rows;
    }
}

/// `inbox_key` as the consumer's statements leave it: an entry per key
/// with pending rows at its oldest one, an entry per pending row without a
/// key.
async fn build_keys(pool: &MySqlPool, group: &str) {
    sqlx::query(
        "INSERT INTO inbox_key (consumer_group, topic, partition_key, head_seq, head_event_type, not_before)
         SELECT i.consumer_group, i.topic, i.partition_key, i.seq, i.event_type, i.next_attempt_at
         FROM inbox_event i
         JOIN (SELECT consumer_group, topic, partition_key, MIN(seq) AS seq FROM inbox_event
               WHERE consumer_group = ? AND processed = FALSE AND parked_at IS NULL
                 AND partition_key IS NOT NULL
               GROUP BY consumer_group, topic, partition_key) h ON h.seq = i.seq",
    )
    .bind(group.as_bytes())
    .execute(pool)
    .await
    .unwrap();
}

/// min / median / max of `rounds` timings, in ms, and the rows claimed.
async fn measure(pool: &MySqlPool, group: &str, rounds: usize) -> (f64, f64, f64, usize) {
    let handled = [(TOPIC, HANDLED)];
    let claim = || async {
        txoutbox_runtime::consumer::claim_once_for_benchmark_mysql(pool, group, &handled, BATCH)
            .await
            .unwrap()
    };
    let mut times = Vec::with_capacity(rounds);
    let mut rows = 0;
    claim().await; // warm the buffer pool and the statement cache
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

fn show(figures: (f64, f64, f64, usize)) -> String {
    format!("{:.1} / {:.1} / {:.1}", figures.0, figures.1, figures.2)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let pending = support::env_usize("INBOX_MYSQL_PENDING", 100_000);
    let history = support::env_usize("INBOX_MYSQL_HISTORY", 1_000_000);
    let rounds = support::env_usize("INBOX_MYSQL_ROUNDS", 9).max(1);
    println!(
        "MariaDB inbox claim of {BATCH} rows at {pending} pending rows, {rounds} rounds, commit {}",
        txoutbox_testkit::measured_commit()
    );
    println!(
        "{:<52} {:>24} {:>6}",
        "shape", "claim ms min/med/max", "rows"
    );
    let scratch = MySqlScratch::create(2).await;
    let pool = scratch.pool.clone();
    txoutbox_runtime::migrations::run(&pool).await.unwrap();
    let blocked_rows = pending - pending / 100;
    // (name, parts: (rows, key, type, processed), blocked head?)
    type Part<'a> = (usize, &'a str, &'a str, bool);
    let shapes: Vec<(&str, Vec<Part<'_>>)> = vec![
        (
            "one key per row",
            vec![(pending, "CONCAT('k', n)", "'Handled'", false)],
        ),
        (
            "16 hot keys",
            vec![(pending, "CONCAT('k', n % 16)", "'Handled'", false)],
        ),
        (
            "16 hot keys behind a history of processed rows",
            vec![
                (history, "CONCAT('k', n % 16)", "'Handled'", true),
                (pending, "CONCAT('k', n % 16)", "'Handled'", false),
            ],
        ),
        (
            "1 blocked key ahead of 1% healthy rows",
            vec![
                (blocked_rows, "'blocked'", "'Handled'", false),
                (pending / 100, "CONCAT('k', n)", "'Handled'", false),
            ],
        ),
        (
            "10% of keys waiting for a handler",
            vec![(
                pending,
                "CONCAT('k', n)",
                "IF(n % 10 = 0, 'Unhandled', 'Handled')",
                false,
            )],
        ),
    ];
    let mut medians = Vec::new();
    for (index, (shape, parts)) in shapes.iter().enumerate() {
        let group = format!("g{index}");
        sqlx::raw_sql("DELETE FROM inbox_key; TRUNCATE inbox_event")
            .execute(&pool)
            .await
            .unwrap();
        let loaded = Instant::now();
        for (count, key_sql, type_sql, processed) in parts {
            insert(&pool, &group, *count, key_sql, type_sql, *processed).await;
        }
        if shape.contains("blocked") {
            // Its head failed and backs off for an hour.
            sqlx::query(
                "UPDATE inbox_event SET attempts = 1, next_attempt_at = NOW(6) + INTERVAL 1 HOUR
                 WHERE consumer_group = ? AND partition_key = 'blocked' AND processed = FALSE
                 ORDER BY seq LIMIT 1",
            )
            .bind(group.as_bytes())
            .execute(&pool)
            .await
            .unwrap();
        }
        build_keys(&pool, &group).await;
        sqlx::raw_sql("ANALYZE TABLE inbox_event, inbox_key")
            .execute(&pool)
            .await
            .unwrap();
        let load_secs = loaded.elapsed().as_secs_f64();
        let figures = measure(&pool, &group, rounds).await;
        medians.push(figures.1);
        println!(
            "{:<52} {:>24} {:>6}   (loaded in {load_secs:.0} s)",
            shape,
            show(figures),
            figures.3
        );
    }
    println!(
        "\nwith {history} processed rows of history / without (16 hot keys, medians): {:.2}",
        medians[2] / medians[1]
    );
    pool.close().await;
    scratch.drop().await;
}
