//! The relay's delays: after failed batches, before retrying a refused row,
//! between probes of an unavailable partition, before reconnecting the
//! listener. All are [`txoutbox_core::Backoff`]'s jittered exponential.

use std::time::Duration;

use super::config::RelayConfig;

/// [`txoutbox_core::Backoff`]'s delay with a 0-based `exponent`.
pub(super) fn jittered_exponential(initial: Duration, max: Duration, exponent: u32) -> Duration {
    txoutbox_core::Backoff::new(initial, max).delay(exponent.saturating_add(1))
}

/// The pause after `failures` failed batches in a row.
pub(super) fn error_delay(config: &RelayConfig, failures: u32) -> Duration {
    jittered_exponential(
        config.error_backoff_initial,
        config.error_backoff_max,
        failures.saturating_sub(1),
    )
}

/// The delay before retrying a row refused after `attempts_before` attempts.
pub(super) fn retry_delay(config: &RelayConfig, attempts_before: i32) -> Duration {
    jittered_exponential(
        config.retry_backoff_initial,
        config.retry_backoff_max,
        attempts_before.max(0) as u32,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_within_jitter_and_is_capped() {
        let (initial, max) = (Duration::from_millis(100), Duration::from_secs(1));
        for exponent in 0..30 {
            let expected = (initial * 2u32.pow(exponent.min(20))).min(max);
            let got = jittered_exponential(initial, max, exponent);
            assert!(
                got >= expected / 2 && got <= expected,
                "{exponent}: {got:?}"
            );
        }
    }
}
