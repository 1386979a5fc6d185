//! `#[outbox_handler]` on a MySQL / MariaDB transaction against the same
//! command written by hand with sqlx: `pool.begin()`, the domain insert, one
//! multi-row `INSERT INTO outbox_event .. VALUES (..), (..)`, `commit()`;
//! for 0, 1 and 10 events per command. The framework's insert is guarded by
//! `@@in_transaction` (so a deadlock the handler swallowed publishes
//! nothing), and with no event it asks the server once; the hand-written
//! variant does neither. Both run interleaved on one connection, order
//! alternating every iteration.
//!
//! Needs MySQL or MariaDB at `MYSQL_URL` (default
//! `mysql://root@127.0.0.1:3306/test`; a scratch database is created and
//! dropped). Run:
//! `cargo bench -p txoutbox-core --features mysql --bench handler_mysql`.
//! `BENCH_ITERATIONS` (default 1000) sets the samples per variant, size and
//! round; `BENCH_ROUNDS` (default 5) the rounds, whose ratios are summarized
//! as min / median / max.

use std::time::{Duration, Instant};

use schemars::JsonSchema;
use serde::Serialize;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::{ConnectOptions, MySql, MySqlPool, QueryBuilder, Transaction};
use txoutbox_core::{DomainEvent, Events, outbox_handler};
use uuid::Uuid;

#[derive(Serialize, JsonSchema, DomainEvent)]
#[event(topic = "order.events", aggregate = "Order")]
struct OrderLineAdded {
    event_id: Uuid,
    #[partition_key]
    order_id: u64,
    line: usize,
    sku: String,
    quantity: i32,
}

fn line(order_id: u64, line: usize) -> OrderLineAdded {
    OrderLineAdded {
        event_id: Uuid::new_v4(),
        order_id,
        line,
        sku: format!("sku-{line}"),
        quantity: 1,
    }
}

const INSERT_ORDER: &str = "INSERT INTO bench_orders (amount) VALUES (?)";

/// The framework's way.
#[outbox_handler]
async fn place_order(
    tx: &mut Transaction<'_, MySql>,
    events: &mut Events,
    amount: i64,
    lines: usize,
) -> Result<u64, txoutbox_core::Error> {
    let order_id = sqlx::query(INSERT_ORDER)
        .bind(amount)
        .execute(&mut **tx)
        .await?
        .last_insert_id();
    for i in 0..lines {
        events.record(line(order_id, i));
    }
    Ok(order_id)
}

/// By hand: the same rows with a multi-row `VALUES`, then commit.
async fn place_order_by_hand(
    pool: &MySqlPool,
    amount: i64,
    lines: usize,
) -> Result<u64, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let order_id = sqlx::query(INSERT_ORDER)
        .bind(amount)
        .execute(&mut *tx)
        .await?
        .last_insert_id();
    if lines > 0 {
        let mut query = QueryBuilder::<MySql>::new(
            "INSERT INTO outbox_event
                 (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key) ",
        );
        query.push_values((0..lines).map(|i| line(order_id, i)), |mut row, event| {
            row.push_bind(event.event_id)
                .push_bind(OrderLineAdded::AGGREGATE_TYPE)
                .push_bind(event.aggregate_id())
                .push_bind(OrderLineAdded::EVENT_TYPE)
                .push_bind(sqlx::types::Json(
                    serde_json::to_value(&event).expect("serializable"),
                ))
                .push_bind(OrderLineAdded::TOPIC)
                .push_bind(event.partition_key());
        });
        query.build().execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(order_id)
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned());
    let iterations = env_or("BENCH_ITERATIONS", 1000);
    let rounds = env_or("BENCH_ROUNDS", 5).max(1);
    let server: MySqlConnectOptions = url.parse()?;
    let database = format!("outbox_bench_handler_mysql_{}", std::process::id());
    let mut admin = server.connect().await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {database}")))
        .execute(&mut admin)
        .await?;
    let pool = MySqlPoolOptions::new()
        .max_connections(1)
        .connect_with(server.clone().database(&database))
        .await?;
    sqlx::raw_sql(include_str!(
        "../../outbox-runtime/migrations/mysql/0001_outbox.sql"
    ))
    .execute(&pool)
    .await?;
    sqlx::raw_sql(
        "CREATE TABLE bench_orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, amount BIGINT NOT NULL)
         ENGINE = InnoDB",
    )
    .execute(&pool)
    .await?;
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(&pool)
        .await?;

    println!(
        "#[outbox_handler] on MySQL vs a hand-written sqlx transaction, {rounds} rounds of \
         {iterations} samples each, times in µs (p50), server {version}, commit {}",
        txoutbox_testkit::measured_commit()
    );
    println!(
        "{:<5} {:>6} | {:>9} {:>9} | {:>6}",
        "round", "events", "hand", "macro", "ratio"
    );
    let mut ratios: Vec<(usize, Vec<f64>)> = Vec::new();
    for round in 1..=rounds {
        for lines in [0usize, 1, 10] {
            let (mut hand, mut handler) = measure(&pool, lines, iterations).await?;
            let (hand, handler) = (median(&mut hand), median(&mut handler));
            let ratio = handler.as_secs_f64() / hand.as_secs_f64();
            let us = |d: Duration| d.as_secs_f64() * 1e6;
            println!(
                "{round:<5} {lines:>6} | {:>9.0} {:>9.0} | {ratio:>6.3}",
                us(hand),
                us(handler)
            );
            match ratios.iter_mut().find(|(of, _)| *of == lines) {
                Some((_, seen)) => seen.push(ratio),
                None => ratios.push((lines, vec![ratio])),
            }
        }
    }
    println!("\n| events / command | ratio min / median / max | rounds within 1.05 |");
    println!("|---:|---|---:|");
    for (lines, mut seen) in ratios {
        seen.sort_by(f64::total_cmp);
        println!(
            "| {lines} | {:.3} / {:.3} / {:.3} | {} of {} |",
            seen[0],
            seen[seen.len() / 2],
            seen[seen.len() - 1],
            seen.iter().filter(|r| **r <= 1.05).count(),
            seen.len()
        );
    }

    pool.close().await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP DATABASE {database}")))
        .execute(&mut admin)
        .await?;
    Ok(())
}

/// Warms up, then times both variants alternately; returns (by hand, handler).
async fn measure(
    pool: &MySqlPool,
    lines: usize,
    iterations: usize,
) -> Result<(Vec<Duration>, Vec<Duration>), Box<dyn std::error::Error>> {
    for i in 0..200 {
        place_order(pool, i, lines).await?;
        place_order_by_hand(pool, i, lines).await?;
    }
    let mut by_hand = Vec::with_capacity(iterations);
    let mut handler = Vec::with_capacity(iterations);
    for i in 0..iterations {
        let amount = i as i64;
        let hand_first = i % 2 == 0;
        if hand_first {
            let start = Instant::now();
            place_order_by_hand(pool, amount, lines).await?;
            by_hand.push(start.elapsed());
        }
        let start = Instant::now();
        place_order(pool, amount, lines).await?;
        handler.push(start.elapsed());
        if !hand_first {
            let start = Instant::now();
            place_order_by_hand(pool, amount, lines).await?;
            by_hand.push(start.elapsed());
        }
    }
    Ok((by_hand, handler))
}
