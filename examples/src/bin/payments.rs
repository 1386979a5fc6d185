//! The payments service on its own: dedup consumer of `order.events` and the
//! relay of its outbox, until Ctrl-C / SIGTERM.
//!
//! Needs a real broker: `KAFKA_BROKERS=127.0.0.1:9092 cargo run -p outbox-examples --bin payments`.

use std::process::ExitCode;

use outbox_examples::payments::{self, PaymentsService};
use outbox_examples::service::{
    Tuning, create_topics, exit_code, init_tracing, until_signal_or_failure,
};
use outbox_examples::setup::{Broker, connect_database, database_url_from_env};

#[tokio::main]
async fn main() -> ExitCode {
    init_tracing("info");
    exit_code(run().await)
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let servers = Broker::external_from_env()?;
    let pool = connect_database(&database_url_from_env(), "_payments").await?;
    payments::migrate(&pool).await?;
    create_topics(&Broker::External(servers.clone()), 3).await?;
    let service = PaymentsService::start(pool, &servers, "payments", &Tuning::default())?;
    tracing::info!("payments service running; Ctrl-C to stop");
    let stopped = until_signal_or_failure(service.failure()).await;
    let shut_down = service.shutdown().await;
    stopped?;
    shut_down?;
    Ok(())
}
