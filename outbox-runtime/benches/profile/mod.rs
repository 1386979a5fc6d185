//! Where a bench variant's database work goes, from PostgreSQL's own
//! counters: `pg_stat_statements` (time, rows, blocks and WAL per statement,
//! trigger statements included), `pg_stat_user_tables` (tuples written) and
//! the statements per event.
//!
//! Opt-in (`OUTBOX_BENCH_PROFILE=1`) because it needs the server to preload
//! the extension:
//!
//! ```text
//! psql -c "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'"
//! # restart PostgreSQL, then
//! OUTBOX_BENCH_PROFILE=1 cargo bench -p txoutbox-runtime --bench consumer
//! ```
//!
//! Counters are per database, so other databases' work on a shared server
//! does not leak in; times do include waiting for a CPU on a busy machine.
#![allow(dead_code)] // each bench uses some of it

use sqlx::PgPool;

/// Whether profiles were asked for.
pub(crate) fn enabled() -> bool {
    std::env::var("OUTBOX_BENCH_PROFILE").is_ok_and(|v| v == "1")
}

/// Whether the server preloads `pg_stat_statements`.
pub(crate) async fn available(pool: &PgPool) -> bool {
    sqlx::query_scalar(
        "SELECT 'pg_stat_statements' = ANY(string_to_array(current_setting('shared_preload_libraries'), ', '))",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Makes `database`'s future sessions record trigger statements too, and
/// checks that the extension is loaded (panics with the fix otherwise).
pub(crate) async fn prepare(pool: &PgPool, database: &str) {
    assert!(
        available(pool).await,
        "OUTBOX_BENCH_PROFILE=1 needs shared_preload_libraries = 'pg_stat_statements' \
         (ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements', then restart PostgreSQL)"
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE EXTENSION IF NOT EXISTS pg_stat_statements;
         ALTER DATABASE {database} SET pg_stat_statements.track = 'all'"
    )))
    .execute(pool)
    .await
    .unwrap();
}

/// Starts a profile: zeroes this database's statement and table counters.
pub(crate) async fn reset(pool: &PgPool) {
    sqlx::raw_sql(
        "SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database WHERE datname = current_database()), 0);
         SELECT pg_stat_reset();",
    )
    .execute(pool)
    .await
    .unwrap();
}

/// One `pg_stat_statements` row: query, top level, calls, milliseconds,
/// rows, blocks dirtied, WAL records, WAL bytes.
type Statement = (String, bool, i64, f64, i64, i64, i64, f64);

/// Per-event totals of a profile's top-level statements.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PerEvent {
    pub(crate) statements: f64,
    pub(crate) exec_us: f64,
    pub(crate) wal_bytes: f64,
}

/// Prints what this database did since [`reset`], per event of `events`, and
/// returns the totals.
pub(crate) async fn report(pool: &PgPool, label: &str, events: u64) -> PerEvent {
    // A backend that goes idle publishes its table counters within 10 s
    // (PostgreSQL 15's PGSTAT_IDLE_INTERVAL).
    tokio::time::sleep(std::time::Duration::from_secs(11)).await;
    let per = |x: f64| x / events.max(1) as f64;
    let statements: Vec<Statement> = sqlx::query_as(
        "SELECT regexp_replace(query, '\\s+', ' ', 'g'), toplevel, calls, total_exec_time, rows,
                shared_blks_dirtied, wal_records, wal_bytes::float8
         FROM pg_stat_statements
         WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND query NOT LIKE '%pg_stat%' AND calls > 0
         ORDER BY total_exec_time DESC",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let top: Vec<_> = statements.iter().filter(|s| s.1).collect();
    let total_ms: f64 = top.iter().map(|s| s.3).sum();
    let total_calls: i64 = top.iter().map(|s| s.2).sum();
    let total_wal: f64 = top.iter().map(|s| s.7).sum();
    println!("\n#### database profile: {label} ({events} events)\n");
    println!(
        "statements per event {:.2}, execution {:.1} µs per event, WAL {:.0} bytes per event \
         (top-level statements; trigger statements are inside their statement's figures)\n",
        per(total_calls as f64),
        per(total_ms * 1_000.0),
        per(total_wal),
    );
    println!(
        "| statement | level | calls/event | µs/event | share | rows/call | blocks dirtied/event | WAL bytes/event |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for (query, toplevel, calls, ms, rows, dirtied, _records, wal) in statements.iter().take(14) {
        let mut query: String = query.chars().take(110).collect();
        query = query.replace('|', "\\|");
        println!(
            "| `{query}` | {} | {:.3} | {:.1} | {:.0}% | {:.1} | {:.3} | {:.0} |",
            if *toplevel { "top" } else { "trigger" },
            per(*calls as f64),
            per(ms * 1_000.0),
            if *toplevel {
                100.0 * ms / total_ms.max(f64::EPSILON)
            } else {
                f64::NAN
            },
            *rows as f64 / (*calls).max(1) as f64,
            per(*dirtied as f64),
            per(*wal),
        );
    }
    let tables: Vec<(String, i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT relname::text, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del
         FROM pg_stat_user_tables
         WHERE n_tup_ins + n_tup_upd + n_tup_del > 0 ORDER BY relname",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let totals = PerEvent {
        statements: per(total_calls as f64),
        exec_us: per(total_ms * 1_000.0),
        wal_bytes: per(total_wal),
    };
    println!("\n| table | inserted/event | updated/event | of which HOT | deleted/event |");
    println!("|---|---:|---:|---:|---:|");
    for (table, ins, upd, hot, del) in tables {
        println!(
            "| {table} | {:.2} | {:.2} | {:.2} | {:.2} |",
            per(ins as f64),
            per(upd as f64),
            per(hot as f64),
            per(del as f64)
        );
    }
    totals
}
