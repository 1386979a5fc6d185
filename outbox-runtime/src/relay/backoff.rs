//! The relay's delays: after failed batches, before retrying a refused row,
//! between probes of an unavailable partition, before reconnecting the
//! listener. All are [`txoutbox_core::Backoff`]'s jittered exponential, with
//! its 1-based retry numbers.

use std::time::Duration;

use super::config::RelayConfig;

/// The pause after `failures` failed batches in a row: retry `failures`.
pub(super) fn error_delay(config: &RelayConfig, failures: u32) -> Duration {
    config.error_backoff.delay(failures)
}

/// The delay before retrying a row refused after `attempts_before` earlier
/// attempts: the refused attempt is number `attempts_before + 1`, and so is
/// the retry that follows it.
pub(super) fn retry_delay(config: &RelayConfig, attempts_before: i32) -> Duration {
    config
        .retry_backoff
        .delay((attempts_before.max(0) as u32).saturating_add(1))
}

#[cfg(test)]
mod tests {
    use txoutbox_core::Backoff;

    use super::*;

    #[test]
    fn backoff_doubles_within_jitter_and_is_capped() {
        let (initial, max) = (Duration::from_millis(100), Duration::from_secs(1));
        let config = RelayConfig {
            retry_backoff: Backoff::new(initial, max),
            error_backoff: Backoff::new(initial, max),
            ..RelayConfig::default()
        };
        for exponent in 0..30 {
            let expected = (initial * 2u32.pow(exponent.min(20))).min(max);
            for got in [
                retry_delay(&config, exponent as i32),
                error_delay(&config, exponent + 1),
            ] {
                assert!(
                    got >= expected / 2 && got <= expected,
                    "{exponent}: {got:?}"
                );
            }
        }
    }
}
