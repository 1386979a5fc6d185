//! The payments service on its own: dedup consumer of `payment.commands` and the
//! relay of its outbox, with `/metrics`, `/health/live` and `/health/ready` at
//! `PAYMENTS_ADDR` (default 127.0.0.1:8081), until Ctrl-C / SIGTERM.
//!
//! Needs a real broker: `KAFKA_BROKERS=127.0.0.1:9092 cargo run -p outbox-examples --bin payments`.
//! Readiness thresholds: `READY_*` (see `outbox_examples::observability::Readiness::from_env`).
//! The database: `EXAMPLE_DATABASE_URL` (PostgreSQL by default; a `mysql://` URL runs the
//! service on MariaDB).

use std::process::ExitCode;

use outbox_examples::database::Backend;
use outbox_examples::observability::Readiness;
use outbox_examples::payments::{self, PaymentsService, PaymentsSql};
use outbox_examples::service::{Tuning, create_topics, exit_code, until_signal_or_failure};
use outbox_examples::setup::{Broker, database_url_from_env};
use outbox_examples::telemetry::Telemetry;
use sqlx::{MySql, Postgres};

#[tokio::main]
async fn main() -> ExitCode {
    let _telemetry = Telemetry::init("payments", "info");
    exit_code(run().await)
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let url = database_url_from_env();
    match Backend::of_url(&url)? {
        Backend::Postgres => serve::<Postgres>(&url).await,
        Backend::MySql => serve::<MySql>(&url).await,
    }
}

/// The service on database `DB` (the one `EXAMPLE_DATABASE_URL` names).
async fn serve<DB: PaymentsSql>(url: &str) -> Result<(), Box<dyn std::error::Error>> {
    let servers = Broker::external_from_env()?;
    let addr = std::env::var("PAYMENTS_ADDR").unwrap_or_else(|_| "127.0.0.1:8081".into());
    let tuning = Tuning {
        readiness: Readiness::from_env()?,
        ..Tuning::default()
    };
    let pool = DB::connect(url, "_payments").await?;
    payments::migrate(&pool).await?;
    create_topics(&Broker::External(servers.clone()), 3).await?;
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let service =
        PaymentsService::<DB>::start(pool, &servers, "payments", listener, &tuning).await?;
    tracing::info!(
        addr = %service.addr,
        "payments service running (/metrics, /health/live, /health/ready); Ctrl-C to stop"
    );
    let stopped = until_signal_or_failure(service.failure()).await;
    let shut_down = service.shutdown().await;
    stopped?;
    shut_down?;
    Ok(())
}
