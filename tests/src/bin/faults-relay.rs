//! Fault-injection relay: one `txoutbox_runtime::relay::Relay` over the source
//! database (PostgreSQL, or MariaDB for a `mysql://` URL), tuned for fast fault recovery (short poll, rebalance and retry
//! intervals; few attempts before parking). Stops gracefully on SIGTERM.
//! Lease and database timeout are the relay's defaults unless the scenario
//! sets them (`FAULTS_RELAY_LEASE_MS`, `FAULTS_RELAY_DATABASE_TIMEOUT_MS`).

use std::time::Duration;

use outbox_tests::faults::db::is_mysql_url;
use outbox_tests::faults::env;
use sqlx::mysql::MySqlPoolOptions;
use sqlx::postgres::PgPoolOptions;
use txoutbox_runtime::relay::{Database, Relay};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    env::init_logging();
    let url = env::required(env::SOURCE_URL);
    let timeout = Duration::from_secs(5);
    // PostgreSQL, or MariaDB for a mysql:// URL.
    let pool: Database = if is_mysql_url(&url) {
        MySqlPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(timeout)
            .connect_lazy(&url)
            .expect("valid database url")
            .into()
    } else {
        PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(timeout)
            .connect_lazy(&url)
            .expect("valid database url")
            .into()
    };
    let mut kafka = rdkafka::ClientConfig::new();
    kafka
        .set("bootstrap.servers", env::required(env::BROKERS))
        .set("linger.ms", "5");
    if let Ok(debug) = std::env::var("FAULTS_KAFKA_DEBUG") {
        kafka.set("debug", debug);
    }
    let mut builder = Relay::builder(pool, kafka);
    if let Ok(stall) = std::env::var(env::STALL_TIMEOUT_MS) {
        let ms = stall
            .parse()
            .expect("FAULTS_STALL_TIMEOUT_MS in milliseconds");
        builder = builder.partition_stall_timeout(Duration::from_millis(ms));
    }
    if std::env::var_os(env::RELAY_LEASE_MS).is_some() {
        builder = builder.lease_timeout(env::millis(env::RELAY_LEASE_MS, 10_000));
    }
    if std::env::var_os(env::RELAY_DATABASE_TIMEOUT_MS).is_some() {
        builder = builder.database_timeout(env::millis(env::RELAY_DATABASE_TIMEOUT_MS, 5_000));
    }
    let relay = builder
        .batch_size(env::get(env::BATCH, 100))
        .delivery_timeout(env::millis(env::DELIVERY_TIMEOUT_MS, 5_000))
        .poll_interval(Duration::from_millis(50))
        .rebalance_interval(Duration::from_millis(300))
        .max_attempts(3)
        .retry_backoff(env::RELAY_RETRY_BACKOFF)
        .error_backoff(env::RELAY_ERROR_BACKOFF)
        .shutdown_timeout(Duration::from_secs(10))
        .spawn()
        .expect("relay starts");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    term.recv().await;
    let summary = relay.shutdown().await.unwrap();
    println!(
        "relay: published={} parked={} held_back={} batches={} errors={} clean={}",
        summary.published,
        summary.parked,
        summary.held_back,
        summary.batches,
        summary.errors,
        summary.clean
    );
}
