//! How the framework opens its own transactions: at the isolation they
//! need, stated in the `BEGIN` (no extra round trip), whatever the
//! database's or role's default (`default_transaction_isolation`).
//!
//! Every transaction of the framework runs at `READ COMMITTED`: the inbox
//! triggers need a fresh snapshot per statement (under `REPEATABLE READ` a
//! trigger could miss a pending row committed meanwhile); `FOR UPDATE SKIP
//! LOCKED` claims, `ON CONFLICT DO NOTHING` dedup inserts and `SELECT ...
//! FOR UPDATE` saga loads would fail with serialization errors on rows
//! committed after a `REPEATABLE READ` snapshot, where `READ COMMITTED`
//! waits for or skips them. (`outbox replay`'s rebuild takes a
//! `REPEATABLE READ READ ONLY` snapshot on purpose: one consistent view.)

use sqlx::{PgConnection, PgPool, Postgres, Transaction};

/// The statement that opens a transaction of the framework.
pub(crate) const BEGIN: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";

/// For a session of the framework's own (the relay's connection), whose
/// statements also run on their own: the session's default isolation.
pub(crate) const SESSION_DEFAULT: &str = "SET default_transaction_isolation = 'read committed'";

/// A transaction on `pool` (see the module documentation).
pub(crate) async fn begin(pool: &PgPool) -> sqlx::Result<Transaction<'static, Postgres>> {
    pool.begin_with(BEGIN).await
}

/// A transaction on `conn` (see the module documentation).
pub(crate) async fn begin_on(conn: &mut PgConnection) -> sqlx::Result<Transaction<'_, Postgres>> {
    sqlx::Connection::begin_with(conn, BEGIN).await
}
