//! Recognizing serialization failures and spacing the retries.

use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use sqlx::error::DatabaseError;
use sqlx::postgres::PgDatabaseError;

/// SQLSTATEs after which re-running the whole transaction can succeed:
/// `serialization_failure` and `deadlock_detected`.
const RETRYABLE_SQLSTATES: [&str; 2] = ["40001", "40P01"];

/// Whether `error`, or any error in its `source()` chain, is a PostgreSQL
/// serialization failure or deadlock.
pub(crate) fn is_serialization_failure(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(error) = current {
        // thiserror's `#[error(transparent)]` forwards `source()` past the
        // `sqlx::Error`, to its boxed driver error, so that is checked as well.
        let code = if let Some(sqlx::Error::Database(db)) = error.downcast_ref::<sqlx::Error>() {
            db.code().map(|code| code.into_owned())
        } else if let Some(db) = error.downcast_ref::<Box<dyn DatabaseError>>() {
            db.code().map(|code| code.into_owned())
        } else {
            error
                .downcast_ref::<PgDatabaseError>()
                .map(|db| db.code().to_owned())
        };
        if code.is_some_and(|code| RETRYABLE_SQLSTATES.contains(&code.as_str())) {
            return true;
        }
        current = error.source();
    }
    false
}

/// Delay before retry number `retry` (1-based): uniformly random in
/// `[d/2, d]` with `d = 4 ms * 2^(retry-1)`, capped at 100 ms. The jitter keeps
/// the transactions that just conflicted from colliding again in lockstep.
pub(crate) fn backoff(retry: u32) -> Duration {
    let ceiling_us = (4_000u64 << retry.saturating_sub(1).min(5)).min(100_000);
    // A fresh `RandomState` is randomly keyed: enough entropy for jitter
    // without a random-number dependency.
    let random = RandomState::new().hash_one(retry);
    Duration::from_micros(ceiling_us / 2 + random % (ceiling_us / 2 + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_bounded_and_grows() {
        for retry in 1..20 {
            let delay = backoff(retry);
            assert!(delay <= Duration::from_millis(100), "{delay:?}");
            assert!(delay >= Duration::from_millis(2), "{delay:?}");
        }
        assert!(backoff(1) <= Duration::from_millis(4));
        assert!(backoff(5) >= Duration::from_millis(32));
    }

    #[test]
    fn other_errors_are_not_retryable() {
        let error = crate::Error::Database(sqlx::Error::RowNotFound);
        assert!(!is_serialization_failure(&error));
        assert!(!is_serialization_failure(&sqlx::Error::PoolTimedOut));
    }
}
