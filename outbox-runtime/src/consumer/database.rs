//! How a consumer uses its database: how each of its transactions begins,
//! and what it does when the database does not answer (count, back off,
//! try again unless the consumer is stopping).

use std::sync::Arc;
use std::time::Duration;

use sqlx::{PgPool, Postgres, Transaction};
use tokio_util::sync::CancellationToken;
use txoutbox_core::Backoff;

use super::counts::Counts;

/// A consumer's database side.
pub(crate) struct Database {
    pool: PgPool,
    /// How every transaction of the consumer begins (see [`Database::begin`]).
    begin_statement: Arc<str>,
    backoff: Backoff,
    token: CancellationToken,
    counts: Counts,
}

impl Database {
    pub(crate) fn new(
        pool: PgPool,
        handler_timeout: Duration,
        backoff: Backoff,
        token: CancellationToken,
        counts: Counts,
    ) -> Self {
        Self {
            pool,
            begin_statement: begin_statement(handler_timeout).into(),
            backoff,
            token,
            counts,
        }
    }

    /// Opens one of the consumer's transactions: `READ COMMITTED`, whatever
    /// the database's or role's default, because the inbox triggers and the
    /// dedup and saga statements need a fresh snapshot per statement (under
    /// `REPEATABLE READ` a trigger could miss a pending row committed
    /// meanwhile, and `ON CONFLICT` on a row committed after the snapshot
    /// fails with a serialization error); and with `statement_timeout` set to
    /// the handler timeout. Both in the `BEGIN` round trip.
    pub(crate) async fn begin(&self) -> sqlx::Result<Transaction<'static, Postgres>> {
        self.pool
            .begin_with(sqlx::AssertSqlSafe(Arc::clone(&self.begin_statement)))
            .await
    }

    /// Sleeps `delay`; false if the consumer is shutting down.
    pub(crate) async fn pause(&self, delay: Duration) -> bool {
        tokio::select! {
            () = self.token.cancelled() => false,
            () = tokio::time::sleep(delay) => true,
        }
    }

    /// After a database error: counts it and waits before the next try.
    /// False if the consumer is shutting down.
    pub(crate) async fn failed(&self, error: &sqlx::Error, retry: &mut u32) -> bool {
        *retry += 1;
        self.counts.database_error();
        tracing::warn!(error = %txoutbox_core::DbErrorDisplay(error), retry = *retry, "database unavailable; pausing before retry");
        self.pause(self.backoff.delay(*retry)).await
    }

    /// Whether the database answers; a handler error while it does not is an
    /// outage, not the event's fault, and must not use up the event's attempts.
    pub(crate) async fn reachable(&self) -> bool {
        let ping = sqlx::query("SELECT 1").execute(&self.pool);
        matches!(
            tokio::time::timeout(Duration::from_secs(5), ping).await,
            Ok(Ok(_))
        )
    }
}

/// The statement that opens each of a consumer's transactions: `READ
/// COMMITTED` and, unless the timeout is off, a `statement_timeout` of the
/// handler timeout (`SET LOCAL`: it ends with the transaction).
fn begin_statement(handler_timeout: Duration) -> String {
    const BEGIN: &str = crate::txn::BEGIN;
    match i32::try_from(handler_timeout.as_millis()) {
        Ok(millis) if millis > 0 => format!("{BEGIN}; SET LOCAL statement_timeout = {millis}"),
        _ => BEGIN.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transactions_state_their_isolation_and_bound_their_statements() {
        assert_eq!(
            begin_statement(Duration::from_secs(30)),
            "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL statement_timeout = 30000"
        );
        assert_eq!(
            begin_statement(Duration::MAX),
            "BEGIN ISOLATION LEVEL READ COMMITTED"
        );
    }
}
