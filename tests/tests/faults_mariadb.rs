//! The fault-injection scenarios of the source side on MariaDB (issue 26):
//! the writers' `#[outbox_handler]` and the relays run on a MariaDB source
//! database, the consumers on PostgreSQL (a MariaDB service publishing to a
//! PostgreSQL one), with real processes, real `kill -9`, the real broker and
//! the same checker as `faults_scenarios.rs` (lost = 0, torn = 0, order
//! violations = 0, applied twice = 0, everything converged). Short mode by
//! default; `OUTBOX_FAULTS=long` for the figures in `RELIABILITY.md`.

use std::time::Duration;

use outbox_tests::faults::db::SourceBackend;
use outbox_tests::faults::scenario::{self, Binaries, Fault, Scenario, load, scaled};

const BINARIES: Binaries = Binaries {
    writer: env!("CARGO_BIN_EXE_faults-writer"),
    relay: env!("CARGO_BIN_EXE_faults-relay"),
    consumer: env!("CARGO_BIN_EXE_faults-consumer"),
};

/// A scenario whose source service runs on MariaDB.
fn on_mariadb(name: &'static str, load: Duration) -> Scenario {
    let mut s = Scenario::new(name, load);
    s.source = SourceBackend::MariaDb;
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_relay_kill9_under_load() {
    let mut s = on_mariadb("my_relay_kill9", load());
    s.relays = 2;
    s.fault = Fault::KillRelays {
        every: scaled(1_500),
    };
    scenario::run_and_check(&s, &BINARIES).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_broker_outage_and_restart() {
    let outage = if scenario::long_mode() { 20 } else { 4 };
    let mut s = on_mariadb("my_broker_outage", load() + Duration::from_secs(outage));
    s.delivery_timeout = Duration::from_secs(5);
    s.fault = Fault::BrokerOutage {
        after: load() / 3,
        outage: Duration::from_secs(outage),
    };
    scenario::run_and_check(&s, &BINARIES).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_poison_rows_and_messages_mixed_into_traffic() {
    let mut s = on_mariadb("my_poison", load());
    s.poison_outbox = if scenario::long_mode() { 20 } else { 5 };
    s.poison_inbound = if scenario::long_mode() { 500 } else { 60 };
    scenario::run_and_check(&s, &BINARIES).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_writer_kill9_mid_transaction() {
    let mut s = on_mariadb("my_writer_kill9", load());
    s.hold_percent = 10;
    s.hold_ms = 150;
    s.fault = Fault::KillWriters { every: scaled(700) };
    scenario::run_and_check(&s, &BINARIES).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_four_relays_three_consumers_compete() {
    let mut s = on_mariadb("my_compete", load());
    s.relays = 4;
    s.dedup_consumers = 3;
    s.inbox_consumers = 3;
    s.partitions = 6;
    s.keys = 24;
    scenario::run_and_check(&s, &BINARIES).await;
}
