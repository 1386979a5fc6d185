//! The relay's configuration: every tuning value, its default and the
//! checks `build` runs on it.

use std::time::Duration;

use super::error::RelayError;

/// Tuning of a relay. Every field has a documented default ([`RelayConfig::default`]);
/// set them through [`RelayBuilder`](super::RelayBuilder).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RelayConfig {
    /// Rows claimed, published and marked per batch. Default `1000`.
    pub batch_size: usize,
    /// Longest wait between two polls when the outbox is idle. Default `500 ms`.
    ///
    /// The relay polls again at once while batches come back full, waits for
    /// the in-process commit signal otherwise, and backs off from 5 ms up to
    /// this interval while polls find nothing (commits in another process are
    /// seen within this interval).
    pub poll_interval: Duration,
    /// Longest sleep of the relay's scheduler, which moves scheduled events
    /// (`Events::record_after` / `record_at`) into the outbox when due.
    /// Default `200 ms`.
    ///
    /// The scheduler sleeps until the earliest due time it found, but at
    /// most this long: an event scheduled meanwhile with an earlier due time
    /// (or whose due time has passed) is seen within this interval. Each
    /// wake-up costs one indexed `min()` query.
    pub schedule_poll_interval: Duration,
    /// How long librdkafka may try to deliver a message (`message.timeout.ms`):
    /// the longest a row stays in flight before its delivery counts as
    /// failed (the claim itself holds no transaction open meanwhile).
    /// Default `30 s`.
    pub delivery_timeout: Duration,
    /// How long a batch waits for its last delivery reports once other rows
    /// got through, before it is settled without them. Default `2 s`.
    ///
    /// Reports missing that long while other partitions deliver mean a
    /// partition whose leader is down (librdkafka keeps its records until
    /// `delivery_timeout`): the batch's delivered rows are marked at once,
    /// the late ones wait on their own (holding their keys, not the
    /// pipeline), and the relay holds back further rows of that partition,
    /// without counting attempts, until it is back. This bounds how long an
    /// outage of some partitions delays the events of the others; see
    /// `docs/relay.md`, *Partial broker outages*.
    pub partition_stall_timeout: Duration,
    /// Failed attempts after which a row is parked (`parked_at` set), so that it
    /// no longer blocks later events of its key. Default `10`. Only refusals
    /// of the record itself count (too large, invalid); an unavailable
    /// broker or partition never does, nor a topic the broker refuses as a
    /// whole (unknown topic, not authorized: the relay holds the topic, see
    /// `docs/relay.md`, *Refused topics*).
    pub max_attempts: u32,
    /// Delay before retrying a row the broker rejected: doubles per attempt
    /// from `retry_backoff_initial` up to `retry_backoff_max`, with jitter.
    /// Default `1 s`.
    pub retry_backoff_initial: Duration,
    /// Upper bound of the per-row retry delay. Default `5 min`.
    pub retry_backoff_max: Duration,
    /// First pause after a failed batch (broker unreachable, database gone);
    /// doubles up to `error_backoff_max`, with jitter. Default `100 ms`. Also
    /// the first wait between probes of an unavailable partition or of a
    /// topic the broker refuses.
    pub error_backoff_initial: Duration,
    /// Upper bound of the pause after failed batches. Default `10 s`.
    pub error_backoff_max: Duration,
    /// Number of lanes partition keys are hashed into. Each lane is published
    /// by one relay at a time; **every relay on a database must use the same
    /// value**: a relay whose count differs from a running relay's is refused
    /// (its task ends with [`RelayError::LaneCountMismatch`]); to change the
    /// count, stop every relay of the database first. Bounds the useful
    /// number of relays. Default `64`.
    pub lanes: u32,
    /// How often a relay re-checks its lane ownership and the number of live
    /// relays, taking or releasing lanes for a fair share. Default `2 s`.
    pub rebalance_interval: Duration,
    /// How often the backlog gauges are refreshed. Default `10 s`.
    pub metrics_interval: Duration,
    /// How long a relay may go without renewing its membership before another
    /// relay ends its database session (`pg_terminate_backend`) and takes its
    /// lanes. Default `10 s`.
    ///
    /// A relay renews its lease on its own connection every
    /// `min(rebalance_interval, lease_timeout / 3)`, also while it waits for
    /// the broker. A relay whose host froze or vanished (power loss, network
    /// partition: the connection stays open, so PostgreSQL keeps its locks)
    /// therefore loses its lanes within `lease_timeout + 2 x
    /// rebalance_interval` (14 s by default) while another relay runs. The
    /// relay's session also gets server-side TCP keepalive derived from this
    /// value (probes after `lease_timeout` of silence, every `lease_timeout /
    /// 5`, five of them; `tcp_user_timeout = 2 x lease_timeout`), which ends
    /// a vanished host's session after about `2 x lease_timeout` even when no
    /// other relay can end it. Must exceed `database_timeout` plus the
    /// renewal period. Ending another relay's session needs the same database
    /// role or `pg_signal_backend`; without it a warning is logged and only
    /// keepalive applies.
    pub lease_timeout: Duration,
    /// The longest the relay waits for any statement (and for connecting) on
    /// its own connection: claims, marks, lane changes, renewals. After it
    /// the relay drops the connection with its lanes (its unmarked batches
    /// are published again by the lanes' next owner) and reconnects. Keeps a
    /// relay whose connection froze from waiting for hours. Default `5 s`.
    pub database_timeout: Duration,
    /// Also wake up on PostgreSQL notifications from other processes' commits
    /// (see [`ops::notify`](crate::ops::notify): needs the trigger installed
    /// with [`ops::notify::enable`](crate::ops::notify::enable) or `outbox
    /// notify enable`).
    /// Costs one extra connection per relay. Default `false`: commits in the
    /// relay's own process wake it at once; others are seen within
    /// `poll_interval`.
    pub listen_notify: bool,
    /// Bound of [`RelayHandle::shutdown`](super::RelayHandle::shutdown): after it, the task is aborted (its
    /// unmarked rows are published again later). Default `45 s`.
    pub shutdown_timeout: Duration,
    /// Testing only (feature `test-hooks`): abandon every batch after
    /// delivery and before marking, as a crash at that point would.
    #[cfg(feature = "test-hooks")]
    pub(crate) crash_before_mark: bool,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            batch_size: 1000,
            poll_interval: Duration::from_millis(500),
            schedule_poll_interval: Duration::from_millis(200),
            delivery_timeout: Duration::from_secs(30),
            partition_stall_timeout: Duration::from_secs(2),
            max_attempts: 10,
            retry_backoff_initial: Duration::from_secs(1),
            retry_backoff_max: Duration::from_secs(300),
            error_backoff_initial: Duration::from_millis(100),
            error_backoff_max: Duration::from_secs(10),
            lanes: 64,
            rebalance_interval: Duration::from_secs(2),
            metrics_interval: Duration::from_secs(10),
            lease_timeout: Duration::from_secs(10),
            database_timeout: Duration::from_secs(5),
            listen_notify: false,
            shutdown_timeout: Duration::from_secs(45),
            #[cfg(feature = "test-hooks")]
            crash_before_mark: false,
        }
    }
}

/// Checks the tuning values `build` is given.
pub(super) fn validate(config: &RelayConfig) -> Result<(), RelayError> {
    let invalid = |what: &'static str| Err(RelayError::InvalidConfig(what));
    if config.batch_size == 0 {
        return invalid("batch_size must be at least 1");
    }
    if config.lanes == 0 || config.lanes > i32::MAX as u32 {
        return invalid("lanes must be between 1 and 2^31-1");
    }
    if config.max_attempts == 0 {
        return invalid("max_attempts must be at least 1");
    }
    if config.delivery_timeout < Duration::from_millis(1) {
        return invalid("delivery_timeout must be at least 1 ms");
    }
    if config.poll_interval.is_zero()
        || config.rebalance_interval.is_zero()
        || config.schedule_poll_interval.is_zero()
    {
        return invalid(
            "poll_interval, schedule_poll_interval and rebalance_interval must be positive",
        );
    }
    if config.partition_stall_timeout.is_zero() {
        return invalid("partition_stall_timeout must be positive");
    }
    if config.database_timeout.is_zero() {
        return invalid("database_timeout must be positive");
    }
    if config.database_timeout + renew_every(config) >= config.lease_timeout {
        // A healthy relay renews within the renewal period plus one statement.
        return invalid(
            "lease_timeout must exceed database_timeout plus min(rebalance_interval, lease_timeout / 3)",
        );
    }
    Ok(())
}

/// How often the lease is renewed: every rebalance, and at least three times
/// per lease.
pub(super) fn renew_every(config: &RelayConfig) -> Duration {
    config.rebalance_interval.min(config.lease_timeout / 3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_shorter_than_a_renewal_plus_a_statement_is_refused() {
        let mut config = RelayConfig::default();
        assert!(validate(&config).is_ok());
        config.lease_timeout = Duration::from_secs(6);
        let err = validate(&config).unwrap_err().to_string();
        assert!(err.contains("lease_timeout"), "{err}");
        config.database_timeout = Duration::from_secs(1);
        assert!(validate(&config).is_ok(), "1 s + 2 s < 6 s");
    }
}
