//! The relay's configuration: every tuning value, its default and the
//! checks `build` runs on it.

use std::time::Duration;

use txoutbox_core::Backoff;

use super::error::BuildError;

/// Default of [`RelayBuilder::lease_timeout`](super::RelayBuilder::lease_timeout): `10 s`.
pub const DEFAULT_LEASE_TIMEOUT: Duration = Duration::from_secs(10);

/// Default of [`RelayBuilder::rebalance_interval`](super::RelayBuilder::rebalance_interval): `2 s`.
pub const DEFAULT_REBALANCE_INTERVAL: Duration = Duration::from_secs(2);

/// Tuning of a relay, filled in by [`RelayBuilder`](super::RelayBuilder),
/// whose setters document each value and its default.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RelayConfig {
    pub(crate) batch_size: usize,
    pub(crate) poll_interval: Duration,
    pub(crate) schedule_poll_interval: Duration,
    pub(crate) delivery_timeout: Duration,
    pub(crate) partition_stall_timeout: Duration,
    pub(crate) max_attempts: u32,
    /// Before retrying a row the broker refused; retry `n` follows attempt `n`.
    pub(crate) retry_backoff: Backoff,
    /// After failed batches, between probes of an unavailable partition or a
    /// refused topic; retry `n` follows `n` failures in a row.
    pub(crate) error_backoff: Backoff,
    pub(crate) lanes: u32,
    pub(crate) rebalance_interval: Duration,
    pub(crate) metrics_interval: Duration,
    pub(crate) lease_timeout: Duration,
    pub(crate) database_timeout: Duration,
    pub(crate) listen_notify: bool,
    pub(crate) shutdown_timeout: Duration,
    /// The names of the event's headers (see [`super::HeaderNames`]).
    pub(crate) header_names: super::HeaderNames,
    /// CloudEvents binary mode, if on (see [`super::CloudEvents`]).
    pub(crate) cloudevents: Option<super::CloudEvents>,
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
            retry_backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(300)),
            error_backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(10)),
            lanes: 64,
            rebalance_interval: DEFAULT_REBALANCE_INTERVAL,
            metrics_interval: Duration::from_secs(10),
            lease_timeout: DEFAULT_LEASE_TIMEOUT,
            database_timeout: Duration::from_secs(5),
            listen_notify: false,
            shutdown_timeout: Duration::from_secs(45),
            header_names: super::HeaderNames::default(),
            cloudevents: None,
            #[cfg(feature = "test-hooks")]
            crash_before_mark: false,
        }
    }
}

/// Checks the tuning values `build` is given.
pub(super) fn validate(config: &RelayConfig) -> Result<(), BuildError> {
    let invalid = |what: &'static str| Err(BuildError::InvalidConfig(what));
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
    if let Some(problem) = config.header_names.problem() {
        return Err(BuildError::HeaderNames(problem));
    }
    if let Some(problem) = config
        .cloudevents
        .as_ref()
        .and_then(super::CloudEvents::problem)
    {
        return Err(BuildError::CloudEvents(problem));
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
