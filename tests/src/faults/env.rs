//! Settings of the harness processes, passed as environment variables.

use std::str::FromStr;
use std::time::Duration;

use txoutbox_core::Backoff;

/// The harness relays' per-row retry backoff: short, so that refused rows
/// are retried (and parked) within a run.
pub const RELAY_RETRY_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(50), Duration::from_millis(500));
/// The harness relays' backoff after failed batches: the default start,
/// at most 1 s, so that the relays resume soon after a fault heals.
pub const RELAY_ERROR_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
/// The harness consumers' backoff between handler attempts.
pub const CONSUMER_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(50), Duration::from_secs(1));

/// Source database URL (writers, relays).
pub const SOURCE_URL: &str = "FAULTS_SOURCE_URL";
/// Receiver database URL (consumers).
pub const RECEIVER_URL: &str = "FAULTS_RECEIVER_URL";
/// Broker address.
pub const BROKERS: &str = "FAULTS_BROKERS";
/// Writer number.
pub const WRITER: &str = "FAULTS_WRITER";
/// Number of keys.
pub const KEYS: &str = "FAULTS_KEYS";
/// Writers stop at this Unix time, in milliseconds.
pub const UNTIL_MS: &str = "FAULTS_UNTIL_MS";
/// Concurrent command loops per writer.
pub const CONCURRENCY: &str = "FAULTS_CONCURRENCY";
/// Pause between two commands of one loop, in milliseconds.
pub const PAUSE_MS: &str = "FAULTS_PAUSE_MS";
/// Percentage of commands that roll back after recording their event.
pub const ROLLBACK_PERCENT: &str = "FAULTS_ROLLBACK_PERCENT";
/// Percentage of commands that sleep inside their transaction.
pub const HOLD_PERCENT: &str = "FAULTS_HOLD_PERCENT";
/// How long those commands sleep, in milliseconds.
pub const HOLD_MS: &str = "FAULTS_HOLD_MS";
/// Relay batch size.
pub const BATCH: &str = "FAULTS_BATCH";
/// Relay delivery timeout, in milliseconds.
pub const DELIVERY_TIMEOUT_MS: &str = "FAULTS_DELIVERY_TIMEOUT_MS";
/// Relay `partition_stall_timeout`, in milliseconds (unset: the relay's default).
pub const STALL_TIMEOUT_MS: &str = "FAULTS_STALL_TIMEOUT_MS";
/// Relay lease timeout, in milliseconds (unset: the relay's default).
pub const RELAY_LEASE_MS: &str = "FAULTS_RELAY_LEASE_MS";
/// Relay database timeout, in milliseconds (unset: the relay's default).
pub const RELAY_DATABASE_TIMEOUT_MS: &str = "FAULTS_RELAY_DATABASE_TIMEOUT_MS";
/// Set by hand: keep the databases and logs of scenarios that passed.
pub const KEEP: &str = "FAULTS_KEEP";
/// Set by hand: overrides every scenario's relay delivery timeout (ms).
pub const RELAY_TIMEOUT_OVERRIDE_MS: &str = "FAULTS_RELAY_TIMEOUT_MS";
/// Set by hand: `0` runs the consumers without re-reading offset gaps.
pub const REFETCH_GAPS: &str = "FAULTS_REFETCH_GAPS";
/// Consumer group.
pub const GROUP: &str = "FAULTS_GROUP";
/// Consumer mode: `dedup` or `inbox`.
pub const MODE: &str = "FAULTS_MODE";
/// Consumer crash hook: kill itself with SIGKILL right after this many of its
/// effects committed (0: never). Offsets are then never committed before the kill.
pub const CRASH_AFTER_EFFECTS: &str = "FAULTS_CRASH_AFTER_EFFECTS";

/// Writers: percentage of commands that record a `LedgerNote`.
pub const NOTE_PERCENT: &str = "FAULTS_NOTE_PERCENT";
/// Writers: percentage of commands on key `k0` (the rest spread evenly).
pub const HOT_KEY_PERCENT: &str = "FAULTS_HOT_KEY_PERCENT";
/// Consumers: the event types handled, `entry` or `entry,note` (default).
pub const HANDLES: &str = "FAULTS_HANDLES";
/// Consumers: the unknown-event policy, `dead_letter` (default) or `keep`.
pub const UNKNOWN: &str = "FAULTS_UNKNOWN";
/// Consumers: handler attempts before dead-lettering / parking (default 3).
pub const MAX_ATTEMPTS: &str = "FAULTS_MAX_ATTEMPTS";
/// Consumers: rows an inbox processor claims per transaction (default 500).
pub const PROCESSOR_BATCH: &str = "FAULTS_PROCESSOR_BATCH";
/// Consumers: a key whose events fail while the clock is in
/// [`BLOCKED_FROM_MS`, `BLOCKED_UNTIL_MS`).
pub const BLOCKED_KEY: &str = "FAULTS_BLOCKED_KEY";
/// See [`BLOCKED_KEY`] (Unix ms).
pub const BLOCKED_FROM_MS: &str = "FAULTS_BLOCKED_FROM_MS";
/// See [`BLOCKED_KEY`] (Unix ms).
pub const BLOCKED_UNTIL_MS: &str = "FAULTS_BLOCKED_UNTIL_MS";
/// Consumers: events whose sequence number is a multiple of this panic in
/// the handler, once per process each (0: never).
pub const PANIC_EVERY: &str = "FAULTS_PANIC_EVERY";
/// Consumers: events whose sequence number is a multiple of this make the
/// handler run a failing statement, drop its error and return `Ok` without
/// its effect, once per process each (0: never). The framework must charge
/// that attempt, not commit it.
pub const SWALLOW_EVERY: &str = "FAULTS_SWALLOW_EVERY";
/// Consumers: events whose sequence number is a multiple of this make the
/// handler wait an hour, once per process each (0: never): the handler
/// timeout must abandon the call.
pub const HANG_EVERY: &str = "FAULTS_HANG_EVERY";
/// Consumers: the handler timeout, in milliseconds (default: the
/// framework's).
pub const HANDLER_TIMEOUT_MS: &str = "FAULTS_HANDLER_TIMEOUT_MS";

/// The variable `name` parsed, or `default` if unset.
///
/// # Panics
/// If the variable is set but does not parse: a harness bug.
pub fn get<T: FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(value) => value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?} does not parse")),
        Err(_) => default,
    }
}

/// The variable `name`.
///
/// # Panics
/// If it is unset: the harness always sets it.
pub fn required(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} must be set"))
}

/// A duration given in milliseconds.
pub fn millis(name: &str, default_ms: u64) -> Duration {
    Duration::from_millis(get(name, default_ms))
}

/// Initializes logging to stderr (the harness redirects it to a file).
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("FAULTS_LOG").unwrap_or_else(|_| {
        // Warnings, plus what tells a broker's skipped record from ours:
        // the consumers' assignments and the offset gaps they saw.
        tracing_subscriber::EnvFilter::new(
            "warn,txoutbox_runtime::consumer::client_context=info,txoutbox_runtime::consumer::offsets=debug",
        )
    });
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
