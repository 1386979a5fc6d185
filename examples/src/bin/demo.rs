//! The main job: runs the orders, inventory and payments services on embedded
//! defaults, drives orders through HTTP and proves that every order's
//! fulfilment saga ended, consistently in every service.
//!
//! `cargo run -p outbox-examples --bin demo -- --help`

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use outbox_examples::demo::{DemoConfig, run};
use outbox_examples::payments_sea_orm::PaymentsOrm;
use outbox_examples::setup::{Broker, database_url_from_env};

/// Orders -> inventory -> payments -> orders through outboxes and Kafka, driven by
/// the order fulfilment saga, end to end.
///
/// Orders are confirmed, or cancelled (payment declined, stock timeout, out of
/// stock) with their stock released; the summary checks that no saga is left
/// open, nothing is lost, every compensation was applied once and no stock leaked.
///
/// With no KAFKA_BROKERS set, librdkafka's in-process mock cluster is used.
/// EXAMPLE_DATABASE_URL (default postgres://postgres@127.0.0.1:5432/outbox_demo) names
/// the server; the services use the databases `<name>_orders`, `<name>_inventory`
/// and `<name>_payments`, created and migrated on first use. A mysql:// (or mariadb://)
/// URL runs everything on MariaDB, e.g. mysql://root@127.0.0.1:3306/outbox_demo.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Orders to create through `POST /orders`.
    #[arg(long, default_value_t = 200)]
    orders: usize,
    /// Orders placed per second at most (0: as fast as the concurrency allows).
    #[arg(long, default_value_t = 25)]
    rate: u32,
    /// Concurrent HTTP requests.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Give up waiting for the orders to end after this many seconds.
    #[arg(long, default_value_t = 60)]
    timeout_secs: u64,
    /// How long the saga waits for the inventory, in milliseconds (the slow
    /// warehouse answers after twice this).
    #[arg(long, default_value_t = outbox_examples::demo::DEFAULT_STOCK_TIMEOUT.as_millis() as u64)]
    stock_timeout_ms: u64,
    /// What the payments service's handler is written with: `sqlx`, or
    /// `sea-orm` (SeaORM entities on the consumer's transaction; PostgreSQL only).
    #[arg(long, default_value = "sqlx")]
    payments_orm: PaymentsOrm,
}

#[tokio::main]
async fn main() -> ExitCode {
    let _telemetry = outbox_examples::telemetry::Telemetry::init("outbox-demo", "warn");
    let args = Args::parse();

    let broker = match Broker::from_env() {
        Ok(broker) => broker,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    let config = DemoConfig {
        database_url: database_url_from_env(),
        orders: args.orders,
        concurrency: args.concurrency,
        timeout: Duration::from_secs(args.timeout_secs),
        group_suffix: format!("-demo-{}", std::process::id()),
        progress_every: Some(Duration::from_millis(500)),
        stock_timeout: Duration::from_millis(args.stock_timeout_ms.max(1)),
        rate: Some(args.rate).filter(|rate| *rate > 0),
        payments_orm: args.payments_orm,
    };
    println!("outbox demo: {} orders", config.orders);
    println!("  broker:   {}", broker.describe());
    println!(
        "  database: {} (+ _orders, _inventory, _payments)",
        redacted(&config.database_url)
    );

    match run(&config, &broker).await {
        Ok(summary) => {
            println!("\n{summary}");
            if summary.complete() {
                println!(
                    "\nOK: every order ended, confirmed or cancelled, as its saga did; \
                     every compensation was applied once; no stock leaked."
                );
                ExitCode::SUCCESS
            } else {
                println!(
                    "\nFAILED: some orders or sagas did not end consistently within {} s.",
                    args.timeout_secs
                );
                ExitCode::FAILURE
            }
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::from(2)
        }
    }
}

fn redacted(url: &str) -> String {
    match url.split_once('@') {
        Some((credentials, rest))
            if credentials.contains(':') && credentials.matches(':').count() > 1 =>
        {
            let user_end = credentials.rfind(':').unwrap_or(credentials.len());
            format!("{}:***@{rest}", &credentials[..user_end])
        }
        _ => url.to_owned(),
    }
}
