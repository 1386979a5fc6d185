//! The main job: runs the orders and payments services on embedded defaults,
//! drives orders through HTTP and proves every one ends up paid.
//!
//! `cargo run -p outbox-examples --bin demo -- --help`

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use outbox_examples::demo::{DemoConfig, run};
use outbox_examples::setup::{Broker, database_url_from_env};

/// Orders -> outbox -> Kafka -> payments -> outbox -> Kafka -> orders, end to end.
///
/// With no KAFKA_BROKERS set, librdkafka's in-process mock cluster is used.
/// EXAMPLE_DATABASE_URL (default postgres://postgres@127.0.0.1:5432/outbox_demo) names
/// the server; the services use the databases `<name>_orders` and `<name>_payments`,
/// created and migrated on first use.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Orders to create through `POST /orders`.
    #[arg(long, default_value_t = 500)]
    orders: usize,
    /// Concurrent HTTP requests.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Give up waiting for payments after this many seconds.
    #[arg(long, default_value_t = 60)]
    timeout_secs: u64,
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
    };
    println!("outbox demo: {} orders", config.orders);
    println!("  broker:   {}", broker.describe());
    println!(
        "  database: {} (+ _orders, _payments)",
        redacted(&config.database_url)
    );

    match run(&config, &broker).await {
        Ok(summary) => {
            println!("\n{summary}");
            if summary.complete() {
                println!("\nOK: every order was published, paid once and marked paid.");
                ExitCode::SUCCESS
            } else {
                println!(
                    "\nFAILED: some orders did not complete within {} s.",
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
