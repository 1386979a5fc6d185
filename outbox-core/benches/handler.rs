//! `#[outbox_handler]` against a hand-written sqlx transaction running the same
//! statements (one domain insert, one multi-row outbox insert, commit), for 1
//! and 10 events per command, and for a command that records none (by hand:
//! the domain insert and the commit; the framework adds its check that the
//! transaction can still commit, which a handler that swallowed a database
//! error would fail). The two run interleaved on the same connection
//! (order alternating every iteration, so drift hits both), and the medians
//! and their ratio are printed.
//!
//! Needs PostgreSQL at `DATABASE_URL` (a scratch database is created and
//! dropped). Run: `cargo bench -p txoutbox-core --bench handler`.
//! `BENCH_ITERATIONS` (default 1000) sets the samples per variant, size and
//! round; `BENCH_ROUNDS` (default 5) the rounds, whose ratios are summarized
//! as min / median / max.

use std::time::{Duration, Instant};

use schemars::JsonSchema;
use serde::Serialize;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgPool, Postgres, Transaction};
use txoutbox_core::{DomainEvent, Events, outbox_handler};
use uuid::Uuid;

#[derive(Serialize, JsonSchema, DomainEvent)]
#[event(topic = "order.events", aggregate = "Order")]
struct OrderLineAdded {
    event_id: Uuid,
    #[partition_key]
    order_id: i64,
    line: usize,
    sku: String,
    quantity: i32,
}

fn line(order_id: i64, line: usize) -> OrderLineAdded {
    OrderLineAdded {
        event_id: Uuid::new_v4(),
        order_id,
        line,
        sku: format!("sku-{line}"),
        quantity: 1,
    }
}

const INSERT_ORDER: &str = "INSERT INTO bench_orders (amount) VALUES ($1) RETURNING id";

/// The framework's way.
#[outbox_handler]
async fn place_order(
    tx: &mut Transaction<'_, Postgres>,
    events: &mut Events,
    amount: i64,
    lines: usize,
) -> Result<i64, txoutbox_core::Error> {
    let order_id: i64 = sqlx::query_scalar(INSERT_ORDER)
        .bind(amount)
        .fetch_one(&mut **tx)
        .await?;
    for i in 0..lines {
        events.record(line(order_id, i));
    }
    Ok(order_id)
}

/// The same statements by hand: serialize, bind column arrays, insert, commit.
async fn place_order_by_hand(pool: &PgPool, amount: i64, lines: usize) -> Result<i64, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let order_id: i64 = sqlx::query_scalar(INSERT_ORDER)
        .bind(amount)
        .fetch_one(&mut *tx)
        .await?;
    if lines == 0 {
        // A command that records no event: what a competent hand writes is
        // the domain statement and the commit (the framework's check that
        // the transaction can still commit is the difference measured).
        tx.commit().await?;
        return Ok(order_id);
    }
    let events: Vec<_> = (0..lines).map(|i| line(order_id, i)).collect();
    let text = |value: &str| vec![value.to_owned(); lines];
    sqlx::query(
        "INSERT INTO outbox_event
             (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, traceparent)
         SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::text[], $7::text[], $8::text[])",
    )
    .bind(events.iter().map(|e| e.event_id).collect::<Vec<_>>())
    .bind(text(OrderLineAdded::AGGREGATE_TYPE))
    .bind(events.iter().map(|e| e.aggregate_id()).collect::<Vec<_>>())
    .bind(text(OrderLineAdded::EVENT_TYPE))
    .bind(
        events
            .iter()
            .map(|e| serde_json::to_value(e).expect("serializable"))
            .collect::<Vec<_>>(),
    )
    .bind(text(OrderLineAdded::TOPIC))
    .bind(events.iter().map(|e| e.partition_key()).collect::<Vec<_>>())
    .bind(vec![None::<String>; lines])
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(order_id)
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn percentile(samples: &[Duration], p: f64) -> Duration {
    samples[((samples.len() as f64 * p) as usize).min(samples.len() - 1)]
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let iterations: usize = std::env::var("BENCH_ITERATIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000);
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(5)
        .max(1);
    let database = format!("outbox_bench_handler_{}", std::process::id());
    let admin_options: PgConnectOptions = url.parse()?;
    let mut admin = sqlx::PgConnection::connect_with(&admin_options).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {database}")))
        .execute(&mut admin)
        .await?;

    let setup = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(admin_options.clone().database(&database))
        .await?;
    // The outbox tables as the runtime's migrations make them: the base,
    // scheduled delivery, and the `headers` column every insert writes.
    for migration in [
        include_str!("../../outbox-runtime/migrations/0001_outbox_inbox_base.sql"),
        include_str!("../../outbox-runtime/migrations/0007_scheduled_delivery.sql"),
        include_str!("../../outbox-runtime/migrations/0014_event_headers.sql"),
    ] {
        sqlx::raw_sql(migration).execute(&setup).await?;
    }
    sqlx::raw_sql(
        "CREATE TABLE bench_orders (
             id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, amount bigint NOT NULL)",
    )
    .execute(&setup)
    .await?;
    setup.close().await;

    println!(
        "#[outbox_handler] vs hand-written sqlx transaction, {rounds} rounds of \
         {iterations} samples each, times in µs, commit {}",
        txoutbox_testkit::measured_commit()
    );
    println!(
        "{:<5} {:<22} {:>6} | {:>9} {:>9} | {:>9} {:>9} | {:>6}",
        "round", "commit", "events", "hand p50", "p90", "macro p50", "p90", "ratio"
    );
    let mut ratios: Vec<((&str, usize), Vec<f64>)> = Vec::new();
    for round in 1..=rounds {
        // Durable commits are what services run; with `synchronous_commit = off`
        // the WAL flush no longer hides the framework's own cost, so that row is
        // the stricter test of the overhead.
        for synchronous_commit in ["on", "off"] {
            // One connection: both variants use the same backend and statement cache.
            let pool = PgPoolOptions::new()
                .max_connections(1)
                .connect_with(
                    admin_options
                        .clone()
                        .database(&database)
                        .options([("synchronous_commit", synchronous_commit)]),
                )
                .await?;
            for lines in [0usize, 1, 10] {
                let (mut by_hand, mut handler) = measure(&pool, lines, iterations).await?;
                let (hand_p50, handler_p50) = (median(&mut by_hand), median(&mut handler));
                let us = |d: Duration| d.as_secs_f64() * 1e6;
                let ratio = handler_p50.as_secs_f64() / hand_p50.as_secs_f64();
                println!(
                    "{round:<5} {:<22} {lines:>6} | {:>9.0} {:>9.0} | {:>9.0} {:>9.0} | {ratio:>6.3}",
                    format!("synchronous_commit={synchronous_commit}"),
                    us(hand_p50),
                    us(percentile(&by_hand, 0.9)),
                    us(handler_p50),
                    us(percentile(&handler, 0.9)),
                );
                match ratios
                    .iter_mut()
                    .find(|(of, _)| *of == (synchronous_commit, lines))
                {
                    Some((_, seen)) => seen.push(ratio),
                    None => ratios.push(((synchronous_commit, lines), vec![ratio])),
                }
            }
            pool.close().await;
        }
    }
    println!("\n| commit | events / command | ratio min / median / max | rounds within 1.05 |");
    println!("|---|---:|---|---:|");
    for ((synchronous_commit, lines), mut seen) in ratios {
        seen.sort_by(f64::total_cmp);
        println!(
            "| synchronous_commit={synchronous_commit} | {lines} | {:.3} / {:.3} / {:.3} | {} of {} |",
            seen[0],
            seen[seen.len() / 2],
            seen[seen.len() - 1],
            seen.iter().filter(|r| **r <= 1.05).count(),
            seen.len()
        );
    }

    sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE {database}")))
        .execute(&mut admin)
        .await?;
    Ok(())
}

/// Warms up, then times both variants alternately; returns (by hand, handler).
async fn measure(
    pool: &PgPool,
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
