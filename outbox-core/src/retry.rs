//! Recognizing serialization failures and spacing the retries.

use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use sqlx::error::DatabaseError;
use sqlx::postgres::PgDatabaseError;

/// SQLSTATEs after which re-running the whole transaction can succeed:
/// `serialization_failure` and `deadlock_detected`.
const RETRYABLE_SQLSTATES: [&str; 2] = ["40001", "40P01"];

/// Whether `error`, or any error in its `source()` chain, is a failure of
/// the moment that running the whole transaction again can cure: a
/// serialization failure or deadlock (SQLSTATE 40001 / 40P01) and, with the
/// feature `mysql`, a MySQL deadlock (1213) or lock wait timeout (1205).
/// The consumers retry a handler that failed so without counting an attempt.
///
/// ```
/// assert!(!txoutbox_core::is_transient_error(&sqlx::Error::RowNotFound));
/// ```
pub fn is_transient_error(error: &(dyn std::error::Error + 'static)) -> bool {
    #[cfg(feature = "mysql")]
    if is_mysql_lock_failure(error) {
        return true;
    }
    is_serialization_failure(error)
}

/// MySQL error numbers after which re-running the whole transaction can
/// succeed: `ER_LOCK_DEADLOCK` (the server rolled the transaction back) and
/// `ER_LOCK_WAIT_TIMEOUT`.
#[cfg(feature = "mysql")]
const MYSQL_TRANSIENT_ERRORS: [u16; 2] = [1213, 1205];

/// Whether `error`, or any error in its `source()` chain, is a MySQL
/// deadlock or lock wait timeout.
#[cfg(feature = "mysql")]
fn is_mysql_lock_failure(error: &(dyn std::error::Error + 'static)) -> bool {
    use sqlx::mysql::MySqlDatabaseError;
    let mut current = Some(error);
    while let Some(error) = current {
        let number = if let Some(sqlx::Error::Database(db)) = error.downcast_ref::<sqlx::Error>() {
            db.try_downcast_ref::<MySqlDatabaseError>()
                .map(MySqlDatabaseError::number)
        } else {
            error
                .downcast_ref::<MySqlDatabaseError>()
                .map(MySqlDatabaseError::number)
        };
        if number.is_some_and(|number| MYSQL_TRANSIENT_ERRORS.contains(&number)) {
            return true;
        }
        current = error.source();
    }
    false
}

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

/// Exponential backoff with "equal jitter": the delay before retry `n`
/// (1-based) is `d = initial * 2^(n-1)`, capped at `max`, of which half is
/// fixed and half random, so that parties that failed together do not retry
/// in lockstep. The framework's one backoff: transaction retries, handler
/// retries (`ConsumerBuilder::backoff`), the relay's outages and per-row
/// retries (`RelayBuilder::error_backoff`, `retry_backoff`) use it.
///
/// ```
/// use std::time::Duration;
/// use txoutbox_core::Backoff;
///
/// let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(10));
/// assert_eq!(backoff.initial(), Duration::from_millis(100));
/// assert_eq!(backoff.max(), Duration::from_secs(10));
/// let third = backoff.delay(3); // between 200 and 400 ms
/// assert!(third >= Duration::from_millis(200) && third <= Duration::from_millis(400));
/// assert!(backoff.delay(100) <= Duration::from_secs(10));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
}

impl Backoff {
    /// From `initial` (before the first retry), doubling, up to `max`
    /// (raised to `initial` if lower).
    pub const fn new(initial: Duration, max: Duration) -> Self {
        let max = if max.as_nanos() < initial.as_nanos() {
            initial
        } else {
            max
        };
        Self { initial, max }
    }

    /// The delay before the first retry.
    pub const fn initial(&self) -> Duration {
        self.initial
    }

    /// The longest delay.
    pub const fn max(&self) -> Duration {
        self.max
    }

    /// The delay before retry number `retry` (1-based; 0 counts as 1).
    pub fn delay(&self, retry: u32) -> Duration {
        let ceiling = self
            .initial
            .saturating_mul(1u32 << retry.saturating_sub(1).min(20))
            .min(self.max);
        let half = ceiling / 2;
        // A fresh `RandomState` is randomly keyed: enough entropy for jitter
        // without a random-number dependency.
        let random = RandomState::new().hash_one(retry) as f64 / u64::MAX as f64;
        half + half.mul_f64(random)
    }
}

/// Backoff between retries of a transaction that hit a serialization
/// failure or a deadlock: 4 ms doubling up to 100 ms.
pub(crate) const TRANSACTION_RETRY: Backoff =
    Backoff::new(Duration::from_millis(4), Duration::from_millis(100));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_within_jitter_and_is_capped() {
        let (initial, max) = (Duration::from_millis(100), Duration::from_secs(1));
        let backoff = Backoff::new(initial, max);
        for retry in 1..40 {
            let expected = (initial * 2u32.pow((retry - 1).min(20))).min(max);
            let got = backoff.delay(retry);
            assert!(got >= expected / 2 && got <= expected, "{retry}: {got:?}");
        }
        assert!(TRANSACTION_RETRY.delay(1) <= Duration::from_millis(4));
        assert!(TRANSACTION_RETRY.delay(5) >= Duration::from_millis(32));
        assert!(TRANSACTION_RETRY.delay(30) <= Duration::from_millis(100));
    }

    #[test]
    fn other_errors_are_not_retryable() {
        let error = crate::Error::Database(sqlx::Error::RowNotFound);
        assert!(!is_serialization_failure(&error));
        assert!(!is_serialization_failure(&sqlx::Error::PoolTimedOut));
    }
}
