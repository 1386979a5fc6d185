//! Whether a transaction can still commit after code the framework does not
//! control has run in it.
//!
//! PostgreSQL aborts a transaction at its first failed statement: every
//! later statement fails with SQLSTATE 25P02 until the transaction ends, and
//! `COMMIT` is then answered with `ROLLBACK` *and no error*. sqlx's
//! `Transaction::commit` does not look at the command tag, so a handler that
//! swallows an error (`Err(_) => return Ok(())`, the "unique violation means
//! already done" idiom) would be reported as committed while nothing was
//! written. The protocol's own transaction status (the `ReadyForQuery`
//! byte) would tell, but sqlx 0.9 keeps it private; so the framework asks
//! with one statement, and only where no statement of its own follows the
//! handler anyway (a statement of the framework that succeeds after the
//! handler proves the same thing for free).

use sqlx::PgConnection;

use crate::Error;

/// SQLSTATE `in_failed_sql_transaction`: a statement sent to an aborted transaction.
const IN_FAILED_TRANSACTION: &str = "25P02";
/// SQLSTATE `no_active_sql_transaction`: a transaction statement outside a transaction.
const NO_ACTIVE_TRANSACTION: &str = "25P01";

/// The framework's error for a statement that failed because the transaction
/// it ran in could no longer commit: [`Error::TransactionAborted`] (an
/// earlier statement failed) or [`Error::TransactionEnded`] (the transaction
/// is gone); `None` for any other error, which is the statement's own.
///
/// ```
/// assert!(txoutbox_core::not_committable(&sqlx::Error::PoolTimedOut).is_none());
/// ```
pub fn not_committable(error: &sqlx::Error) -> Option<Error> {
    let code = error.as_database_error()?.code()?;
    match &*code {
        IN_FAILED_TRANSACTION => Some(Error::TransactionAborted),
        NO_ACTIVE_TRANSACTION => Some(Error::TransactionEnded),
        _ => None,
    }
}

/// Checks, with one statement, that the transaction on `conn` is open and
/// not aborted, so that a `COMMIT` now would commit: `Ok(())`, or
/// [`Error::TransactionAborted`], [`Error::TransactionEnded`], or the
/// database error that kept the check from running.
///
/// The unit of work and the consumers call it before committing a
/// transaction that a handler had last; call it yourself before committing a
/// transaction of your own that ran code you do not trust to return its
/// errors.
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) -> Result<(), txoutbox_core::Error> {
/// let mut tx = pool.begin().await?;
/// // A swallowed error leaves the transaction aborted ...
/// let _ = sqlx::query("SELECT 1/0").execute(&mut *tx).await;
/// // ... which the check reports, where `tx.commit()` would "succeed".
/// assert!(matches!(
///     txoutbox_core::check_committable(&mut tx).await,
///     Err(txoutbox_core::Error::TransactionAborted)
/// ));
/// # Ok(()) }
/// ```
pub async fn check_committable(conn: &mut PgConnection) -> Result<(), Error> {
    // `SAVEPOINT` fails both in an aborted transaction (25P02) and outside
    // any (25P01), where `SELECT 1` would succeed; it assigns no transaction
    // id and is discarded by the commit that follows. The simple query
    // protocol: one round trip, nothing prepared.
    match sqlx::raw_sql("SAVEPOINT txoutbox_committable")
        .execute(conn)
        .await
    {
        Ok(_) => Ok(()),
        Err(error) => Err(statement_error(error)),
    }
}

/// The framework's error for a failed statement of its own after code it
/// does not control: [`not_committable`]'s when the transaction could no
/// longer commit, the statement's own ([`Error::Database`]) otherwise.
pub(crate) fn statement_error(error: sqlx::Error) -> Error {
    not_committable(&error).unwrap_or(Error::Database(error))
}
