//! MySQL and MariaDB (feature `mysql`): command handlers on a MySQL
//! transaction. Tested on MariaDB 10.11; MariaDB >= 10.6 is required. MySQL
//! 8 is not supported yet: the insert's guard reads MariaDB's
//! `@@in_transaction`, which MySQL lacks (the insert then fails loudly).
//!
//! `#[outbox_handler]` on a function taking `tx: &mut Transaction<'_, MySql>`
//! (or `&mut MySqlTransaction<'_>`, `&mut MySqlConnection`) expands to
//! [`transaction`] of this module: it begins the transaction on your
//! `MySqlPool`, runs the handler, inserts the recorded events into
//! `outbox_event` / `outbox_scheduled` ([`insert_events`]) and commits; an
//! `Err`, a panic, a failed insert or commit rolls everything back. The
//! schema is `txoutbox_runtime::migrations::run` on a `MySqlPool`.
//!
//! What differs from PostgreSQL, and how the framework handles it:
//!
//! - **A failed statement does not abort the transaction** (MySQL rolls back
//!   the statement only), so a handler that swallows a duplicate-key error
//!   and goes on is fine here. But a **deadlock (1213) rolls back the whole
//!   transaction**, and what the handler runs after swallowing it runs in
//!   autocommit mode, outside any transaction. The framework's insert is
//!   guarded by `@@in_transaction` (in the statement itself: no round trip):
//!   it writes nothing outside a transaction and the unit of work fails with
//!   [`Error::TransactionLost`](crate::Error::TransactionLost) instead of
//!   committing a transaction that no longer exists (with no event,
//!   `SELECT @@in_transaction` asks in the commit's round trip:
//!   [`commit_checked`]).
//! - **Deadlocks (1213) and lock wait timeouts (1205)** are transient:
//!   `retries` re-runs the handler on them, as on PostgreSQL's 40001/40P01.
//! - **Isolation**: InnoDB's default is `REPEATABLE READ`; `isolation = ..`
//!   sets the level for the one transaction (`SET TRANSACTION ISOLATION
//!   LEVEL` before `START TRANSACTION`).
//! - **Types**: `event_id` is `BINARY(16)` (sqlx's `Uuid` encoding on
//!   MySQL), payload and headers `JSON`, timestamps `DATETIME(6)` in UTC
//!   (sqlx sets the session's `time_zone` to `+00:00`).
//!
//! ```no_run
//! use sqlx::{MySql, Transaction};
//! use txoutbox_core::{DomainEvent, Events, outbox_handler};
//!
//! #[derive(serde::Serialize, schemars::JsonSchema, DomainEvent)]
//! #[event(topic = "orders", aggregate = "Order")]
//! struct OrderPlaced { event_id: uuid::Uuid, #[partition_key] order_id: i64 }
//!
//! #[outbox_handler]
//! async fn place_order(
//!     tx: &mut Transaction<'_, MySql>,
//!     events: &mut Events,
//!     amount: i64,
//! ) -> Result<u64, txoutbox_core::Error> {
//!     let order_id = sqlx::query("INSERT INTO orders (amount) VALUES (?)")
//!         .bind(amount)
//!         .execute(&mut **tx)
//!         .await?
//!         .last_insert_id();
//!     events.record(OrderPlaced { event_id: uuid::Uuid::now_v7(), order_id: order_id as i64 });
//!     Ok(order_id)
//! }
//!
//! # async fn f(pool: sqlx::MySqlPool) -> Result<(), txoutbox_core::Error> {
//! place_order(&pool, 4200).await?; // one transaction: the order and its event
//! # Ok(()) }
//! ```

mod insert;
mod unit_of_work;

pub use insert::insert_events;

use crate::{AfterCommit, Events};

/// [`Events::write`](crate::Events::write) on a MySQL transaction: the
/// deferred failure of a [`record`](Events::record) call, if any, then the
/// guarded insert of everything recorded ([`insert_events`]). Call
/// [`AfterCommit::committed_on`] with the pool after the commit. The consumer's handlers use
/// it; a transaction of your own can too.
///
/// ```no_run
/// # async fn f(pool: sqlx::MySqlPool, mut events: txoutbox_core::Events) -> Result<(), txoutbox_core::Error> {
/// let mut tx = pool.begin().await?;
/// let after_commit = txoutbox_core::mysql::write_events(&mut tx, &mut events).await?;
/// tx.commit().await?;
/// after_commit.committed_on(&pool);
/// # Ok(()) }
/// ```
pub async fn write_events(
    conn: &mut sqlx::MySqlConnection,
    events: &mut Events,
) -> Result<AfterCommit, crate::Error> {
    events.take_failure()?;
    let rows = insert_events(conn, events).await?;
    Ok(AfterCommit::for_rows(rows))
}

/// [`cancel_scheduled`](crate::cancel_scheduled) on MySQL: deletes the
/// scheduled event `event_id` from `outbox_scheduled` if it is not due yet
/// (not moved to `outbox_event` by a relay); `false` if it was not there.
///
/// ```no_run
/// # async fn f(pool: sqlx::MySqlPool, reminder_id: uuid::Uuid) -> Result<(), sqlx::Error> {
/// let mut tx = pool.begin().await?;
/// if !txoutbox_core::mysql::cancel_scheduled(&mut tx, reminder_id).await? {
///     // Too late (or unknown): receivers must tolerate the reminder.
/// }
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn cancel_scheduled(
    conn: &mut sqlx::MySqlConnection,
    event_id: uuid::Uuid,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query("DELETE FROM outbox_scheduled WHERE event_id = ?")
        .bind(event_id)
        .execute(conn)
        .await?;
    Ok(done.rows_affected() > 0)
}

pub use unit_of_work::{
    MySqlTransactionSource, MySqlUnitOfWork, RetryingMySqlUnitOfWork, transaction,
};

/// Commits `tx` if it is still a transaction, checking it
/// ([`check_in_transaction`]) in the same round trip to the database:
/// `Ok(())` once committed, [`Error::TransactionLost`](crate::Error::TransactionLost)
/// when the session had left it (a deadlock rolled it back under the code
/// that ran in it, or that code ended it; the commit then did nothing), or
/// the database's error.
///
/// `tx` is a transaction of its own ([`MySqlPool::begin`](sqlx::MySqlPool::begin)),
/// never a savepoint: on a connection already in a transaction, call
/// `check_in_transaction`, then `commit`. (The `ROLLBACK` sqlx queues for
/// the dropped `tx` does nothing on MySQL, whenever it is sent.)
///
/// ```no_run
/// # async fn f(pool: sqlx::MySqlPool) -> Result<(), txoutbox_core::Error> {
/// let tx = pool.begin().await?;
/// txoutbox_core::mysql::commit_checked(tx).await?;
/// # Ok(()) }
/// ```
pub async fn commit_checked(
    tx: sqlx::Transaction<'static, sqlx::MySql>,
) -> Result<(), crate::Error> {
    commit_checked_top_level(tx).await
}

/// [`commit_checked`] for a transaction that the caller knows is not a
/// savepoint (its connection was in no transaction when it began).
pub(crate) async fn commit_checked_top_level(
    mut tx: sqlx::Transaction<'_, sqlx::MySql>,
) -> Result<(), crate::Error> {
    use sqlx::Row;
    // Two statements in one message: the session's transaction flag, read
    // before the commit, then the commit, which does nothing in a session
    // that left its transaction. `tx` still counts as open for sqlx (only
    // its own `commit` would close it, a round trip more): dropping it
    // queues a `ROLLBACK`, which outside a transaction does nothing, sent
    // ahead of the connection's next message (a pooled connection's: the
    // test the pool runs as it takes the connection back).
    let rows = sqlx::raw_sql("SELECT CAST(@@in_transaction AS SIGNED); COMMIT")
        .fetch_all(&mut *tx)
        .await?;
    let open: Option<i64> = match rows.first() {
        Some(row) => Some(row.try_get(0)?),
        None => None,
    };
    match open {
        Some(1) => Ok(()),
        _ => Err(crate::Error::TransactionLost),
    }
}

/// Whether `error`, or any error in its `source()` chain, is a MySQL
/// deadlock or lock wait timeout (or a serialization failure by SQLSTATE):
/// [`crate::is_transient_error`], which knows MySQL's error numbers.
pub(crate) fn is_transient(error: &(dyn std::error::Error + 'static)) -> bool {
    crate::retry::is_transient_error(error)
}

/// Checks, with one statement, that `conn` is inside a transaction, so that
/// a `COMMIT` now would commit what ran since `START TRANSACTION`:
/// `Ok(())`, [`Error::TransactionLost`](crate::Error::TransactionLost), or
/// the database error that kept the check from running.
///
/// ```no_run
/// # async fn f(pool: sqlx::MySqlPool) -> Result<(), txoutbox_core::Error> {
/// let mut tx = pool.begin().await?;
/// txoutbox_core::mysql::check_in_transaction(&mut tx).await?;
/// # Ok(()) }
/// ```
pub async fn check_in_transaction(conn: &mut sqlx::MySqlConnection) -> Result<(), crate::Error> {
    let open: i64 = sqlx::query_scalar("SELECT CAST(@@in_transaction AS SIGNED)")
        .fetch_one(conn)
        .await?;
    if open == 1 {
        Ok(())
    } else {
        Err(crate::Error::TransactionLost)
    }
}
