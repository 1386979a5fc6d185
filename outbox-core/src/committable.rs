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

use sqlx::{PgConnection, Postgres, Transaction};

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

/// Commits `tx` if it can still commit, checking it ([`check_committable`])
/// in the same round trip to the database: `Ok(())` once committed, or
/// [`Error::TransactionAborted`] / [`Error::TransactionEnded`] (nothing was
/// committed by this call; the transaction is rolled back), or the database's
/// error when the commit itself failed (a deferred constraint, a
/// serialization failure: the database rolled it back).
///
/// This is `check_committable` followed by `tx.commit()`, one round trip
/// shorter, which is what the consumers use at the end of every
/// transaction a handler had last. It leaves an empty transaction open on
/// the connection (`COMMIT AND CHAIN`), which the `ROLLBACK` sqlx queues
/// for the dropped `tx` ends with the connection's next message: at once
/// for a transaction of a pool ([`PgPool::begin`](sqlx::PgPool::begin)),
/// whose connection the pool tests as it takes it back. Use it on those,
/// never on a savepoint (whose `commit` releases the savepoint alone); on
/// a connection of your own, call `check_committable`, then `commit`.
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) -> Result<(), txoutbox_core::Error> {
/// let mut tx = pool.begin().await?;
/// // ... code you do not trust to return its errors ...
/// let _ = sqlx::query("SELECT 1/0").execute(&mut *tx).await;
/// assert!(matches!(
///     txoutbox_core::commit_checked(tx).await,
///     Err(txoutbox_core::Error::TransactionAborted)
/// ));
/// # Ok(()) }
/// ```
pub async fn commit_checked(tx: Transaction<'static, Postgres>) -> Result<(), Error> {
    commit_checked_pooled(tx).await
}

/// [`commit_checked`] for a transaction that the caller knows is a pool's
/// (not a savepoint; its connection goes back to the pool when it ends).
pub(crate) async fn commit_checked_pooled(mut tx: Transaction<'_, Postgres>) -> Result<(), Error> {
    // One simple query, two statements: the savepoint fails in an aborted
    // transaction (25P02) or outside any (25P01), and then the commit does
    // not run. `AND CHAIN` opens an empty transaction in the committed one's
    // place, for sqlx's bookkeeping: `tx` still counts as open (sqlx only
    // closes it in its own `commit`, which would cost the round trip saved
    // here), and dropping it queues a `ROLLBACK`, which ends that empty
    // transaction ahead of the connection's next message (for a pooled
    // connection, the test the pool runs as it takes the connection back,
    // in a task of its own). A plain `COMMIT` would have that `ROLLBACK`
    // answered with a "no transaction in progress" warning every time.
    match sqlx::raw_sql("SAVEPOINT txoutbox_committable; COMMIT AND CHAIN")
        .execute(&mut *tx)
        .await
    {
        Ok(_) => Ok(()),
        Err(error) => match not_committable(&error) {
            Some(unusable) => {
                if let Err(error) = tx.rollback().await {
                    tracing::debug!(
                        error = %crate::DbErrorDisplay(&error),
                        "rolling back a transaction that could not commit"
                    );
                }
                Err(unusable)
            }
            // The commit failed: the database ended the transaction.
            None => Err(Error::Database(error)),
        },
    }
}

/// The framework's error for a failed statement of its own after code it
/// does not control: [`not_committable`]'s when the transaction could no
/// longer commit, the statement's own ([`Error::Database`]) otherwise.
pub(crate) fn statement_error(error: sqlx::Error) -> Error {
    not_committable(&error).unwrap_or(Error::Database(error))
}
