//! The fault-injection scenarios on MariaDB. The source side (issue 26): the
//! writers' `#[outbox_handler]` and the relays run on a MariaDB source
//! database, the consumers on PostgreSQL (a MariaDB service publishing to a
//! PostgreSQL one). The consumer side: dedup consumers on a MariaDB receiver,
//! fed by a MariaDB or a PostgreSQL source. Real processes, real `kill -9`,
//! the real broker and the same checker as `faults_scenarios.rs` (lost = 0,
//! torn = 0, order violations = 0, applied twice = 0, everything converged).
//! Short mode by default; `OUTBOX_FAULTS=long` for the figures in
//! `RELIABILITY.md`.

use std::time::Duration;

use outbox_tests::faults::db::{ReceiverBackend, SourceBackend};
use outbox_tests::faults::env;
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

// The consumer side on MariaDB: the consumers (`Consumer::builder(mysql_pool,
// ..)`, a dedup group and an inbox group), their `processed_event` and
// `inbox_event` and the `effect` table on a MariaDB receiver, read by the
// same checker. Each mirrors a scenario of `faults_scenarios.rs`, with the
// source on MariaDB too (a MariaDB service pair) or on PostgreSQL (a
// PostgreSQL service publishing to a MariaDB one).

/// A scenario whose receiving service runs on MariaDB, its source on
/// `source`.
fn consumers_on_mariadb(name: &'static str, load: Duration, source: SourceBackend) -> Scenario {
    let mut s = Scenario::new(name, load);
    s.source = source;
    s.receiver = ReceiverBackend::MariaDb;
    s
}

/// `consumer_kill9_between_db_commit_and_offset_commit` on a MariaDB pair:
/// every consumer (two dedup, one inbox) kills itself (SIGKILL) right after
/// its 150th effect committed, before any offset commit, and a random one
/// is also killed from outside every 4 s. Each successor is redelivered
/// what its predecessor committed: MariaDB's dedup rows and inbox rows must
/// skip all of it. (The twin kills every 2 s; here a group needs about 3 s
/// to join, so at 2 s it never held its partitions during the load and the
/// hook never fired.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_consumer_kill9_between_db_commit_and_offset_commit() {
    let mut s = consumers_on_mariadb("my_consumer_kill9", load(), SourceBackend::MariaDb);
    s.dedup_consumers = 2;
    s.inbox_consumers = 1;
    s.fault = Fault::KillConsumers {
        every: scaled(4_000),
        crash_after_effects: 150,
    };
    let figures = scenario::run_and_check(&s, &BINARIES).await;
    assert!(
        figures.consumer_crash_hook_kills > 0,
        "no consumer was killed between its commit and its offset commit\n{figures}"
    );
}

/// `inbox_a_blocked_key_never_holds_back_the_others` on MariaDB consumers
/// (PostgreSQL source): `k0` (70 % of the traffic) fails for most of the
/// load and is never parked; every other key keeps flowing through the
/// inbox's processors (claims in batches of 20, so a claim sees only a
/// small part of `k0`'s backlog), and `k0` catches up, in order, once it
/// recovers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_inbox_a_blocked_key_never_holds_back_the_others() {
    let mut s = consumers_on_mariadb("my_inbox_blocked_key", load(), SourceBackend::Postgres);
    s.dedup_consumers = 0;
    s.inbox_consumers = 2;
    s.relays = 1;
    s.writer_env = vec![(env::HOT_KEY_PERCENT, "70".into())];
    s.consumer_env = vec![
        (env::MAX_ATTEMPTS, "1000000".into()),
        (env::PROCESSOR_BATCH, "20".into()),
    ];
    s.fault = Fault::BlockedKey {
        from: load() / 8,
        until: load() * 3 / 4,
    };
    let figures = scenario::run_and_check(&s, &BINARIES).await;
    let waited = figures.healthy_wait_max.expect("measured");
    assert!(
        waited < Duration::from_secs(5),
        "healthy keys waited up to {waited:?} behind the blocked key\n{figures}"
    );
}

/// The same blocked key in dedup mode, a PostgreSQL source publishing to
/// MariaDB consumers. A dedup consumer retries a failing event in place,
/// its partition paused behind it (docs/consumer.md), so the keys sharing
/// `k0`'s partition wait with it by design; the keys of the other
/// partitions must keep flowing (the same bound as the inbox's), and `k0`
/// catches up, in order, once it recovers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_dedup_a_blocked_key_holds_back_its_partition_only() {
    let mut s = consumers_on_mariadb("my_blocked_key", load(), SourceBackend::Postgres);
    s.dedup_consumers = 2;
    s.inbox_consumers = 0;
    s.relays = 1;
    s.writer_env = vec![(env::HOT_KEY_PERCENT, "70".into())];
    // Never dead-letter the blocked key: the point is the others' flow.
    s.consumer_env = vec![(env::MAX_ATTEMPTS, "1000000".into())];
    s.fault = Fault::BlockedKey {
        from: load() / 8,
        until: load() * 3 / 4,
    };
    let figures = scenario::run_and_check(&s, &BINARIES).await;
    let waited = figures.healthy_wait_max.expect("measured");
    assert!(
        waited < Duration::from_secs(5),
        "the other partitions' keys waited up to {waited:?} behind the blocked key\n{figures}"
    );
}

/// `inbox_mode_keeps_per_key_order` on MariaDB: one inbox consumer whose
/// processors claim rows side by side applies each key's events in order,
/// and everything converges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_inbox_mode_keeps_per_key_order() {
    let mut s = consumers_on_mariadb(
        "my_inbox_order",
        Duration::from_secs(6),
        SourceBackend::MariaDb,
    );
    s.dedup_consumers = 0;
    s.inbox_consumers = 1;
    s.relays = 1;
    let figures = scenario::run_and_check(&s, &BINARIES).await;
    assert_eq!(figures.groups[0].order_violations, 0, "{figures}");
    assert_eq!(figures.groups[0].applied, figures.written, "{figures}");
}

/// `inbox_consumer_survives_nul_bytes` on MariaDB, which stores NUL bytes
/// (PostgreSQL cannot, and dead-letters such records as unstorable): the
/// poison messages with NUL in a key, a header or a JSON string are set
/// aside all the same (dead-lettered, or parked in the inbox), and the
/// consumer never wedges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_inbox_consumer_survives_nul_bytes() {
    let mut s = consumers_on_mariadb(
        "my_inbox_nul",
        Duration::from_secs(5),
        SourceBackend::MariaDb,
    );
    s.dedup_consumers = 0;
    s.inbox_consumers = 1;
    s.poison_inbound = 5;
    s.poison_nul = true;
    s.settle_timeout = Duration::from_secs(30);
    scenario::run_and_check(&s, &BINARIES).await;
}

/// `four_relays_three_consumers_compete` with the consumers killed: three
/// dedup and three inbox consumers on a MariaDB pair compete for 6
/// partitions (4 relays, 24 keys) while a random one is `kill -9`ed every
/// 4 s, wherever it is (mid-batch, mid-transaction, mid-rebalance, an inbox
/// store holding its partitions' store locks), and restarted at once. Not
/// more often: a killed member holds up the group's rebalance until its
/// session expires (6 s), so kills every 1.5 s kept the group rebalancing
/// for the whole load and few of them hit a consumer at work; and 6 s
/// longer than the twin, for three kills in short mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_consumers_compete_under_kill9() {
    let mut s = consumers_on_mariadb(
        "my_consumers_compete",
        load() + Duration::from_secs(6),
        SourceBackend::MariaDb,
    );
    s.relays = 4;
    s.dedup_consumers = 3;
    s.inbox_consumers = 3;
    s.partitions = 6;
    s.keys = 24;
    s.fault = Fault::KillConsumers {
        every: scaled(4_000),
        crash_after_effects: 0,
    };
    scenario::run_and_check(&s, &BINARIES).await;
}

/// `poison_rows_and_messages_mixed_into_traffic` on a MariaDB pair: poison
/// outbox rows parked by the MariaDB relays, poison messages dead-lettered
/// by the MariaDB consumers (or parked in the inbox), and every workload
/// event applied once by both groups.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_consumer_poison_messages_mixed_into_traffic() {
    let mut s = consumers_on_mariadb("my_consumer_poison", load(), SourceBackend::MariaDb);
    s.poison_outbox = if scenario::long_mode() { 20 } else { 5 };
    s.poison_inbound = if scenario::long_mode() { 500 } else { 60 };
    scenario::run_and_check(&s, &BINARIES).await;
}

/// `misbehaving_handlers_lose_nothing` with MariaDB consumers of both modes
/// (PostgreSQL source): every 45th sequence number's handler waits an hour
/// (the handler timeout is 400 ms), and every 20th swallows a database
/// error and returns `Ok` without its effect, once per process and event
/// each. On MariaDB a failed statement leaves the transaction open, so the
/// swallowed error is the one that does not: a real deadlock (1213), which
/// rolls the whole transaction back under the handler and leaves the
/// session in autocommit (`model.rs`), on receipt, in a processor's claim
/// or in a dedup batch. The framework must find the transaction gone and
/// run it again, not commit what is left or let later writes commit on
/// their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_misbehaving_handlers_lose_nothing() {
    let mut s = consumers_on_mariadb("my_misbehaving", load(), SourceBackend::Postgres);
    if scenario::long_mode() {
        // A minute of load makes about 800 swallowed deadlocks (each with
        // the 5,000-row transaction that loses it) and 700 calls abandoned
        // at 400 ms, a dedup partition or an inbox processor waiting for
        // each: the consumers need more than the default 90 s to catch up.
        s.settle_timeout = Duration::from_secs(300);
    }
    s.fault = Fault::MisbehavingHandlers {
        swallow_every: 20,
        hang_every: 45,
        timeout: Duration::from_millis(400),
    };
    let figures = scenario::run_and_check(&s, &BINARIES).await;
    assert!(figures.swallowed_errors > 0, "nothing swallowed\n{figures}");
    assert!(figures.hung_calls > 0, "nothing hung\n{figures}");
    assert_eq!(figures.consumer_restarts, 0, "a consumer died\n{figures}");
}
