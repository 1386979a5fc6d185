//! SeaORM 2 on PostgreSQL (feature `sea-orm`): command handlers that write
//! through SeaORM's `DatabaseTransaction`, and a SeaORM connection on a
//! transaction the framework opened, for consumer handlers.
//!
//! - **Command side.** `#[outbox_handler]` on a function taking
//!   `tx: &DatabaseTransaction` expands to [`transaction`] of this module:
//!   it begins the transaction on your `DatabaseConnection`, runs the
//!   handler, inserts the events it recorded through the same
//!   `DatabaseTransaction` ([`insert_events`]), and commits; an `Err`, a
//!   panic, a failed insert or commit rolls everything back. A handler that
//!   swallowed a database error and returned `Ok` is found out before the
//!   commit ([`Error::TransactionAborted`]),
//!   exactly as on the sqlx path.
//! - **Consumer side.** A consumer runs its handlers inside its own sqlx
//!   transaction (the dedup row or the inbox mark commits with the
//!   handler's writes). SeaORM cannot wrap a transaction it did not open,
//!   so a consumer handler takes `tx: &SeaConnection<'_>` instead:
//!   [`SeaConnection`] implements SeaORM's `ConnectionTrait` on that very
//!   transaction, so entities, active models, `find`, `insert`, `update`,
//!   raw statements all work on it, and all of it commits or rolls back
//!   with the consumer's bookkeeping.
//!
//! Write repository code against `&impl ConnectionTrait` (SeaORM's own
//! advice) and it runs on both.
//!
//! ```no_run
//! use sea_orm::{ConnectionTrait, DatabaseTransaction, DbErr, Statement};
//! use txoutbox_core::{DomainEvent, Events, outbox_handler};
//!
//! #[derive(serde::Serialize, schemars::JsonSchema, DomainEvent)]
//! #[event(topic = "orders", aggregate = "Order")]
//! struct OrderPlaced { event_id: uuid::Uuid, #[partition_key] order_id: i64 }
//!
//! #[outbox_handler]
//! async fn place_order(tx: &DatabaseTransaction, events: &mut Events, order_id: i64) -> Result<(), DbErr> {
//!     tx.execute_raw(Statement::from_sql_and_values(
//!         sea_orm::DbBackend::Postgres,
//!         "INSERT INTO orders (id) VALUES ($1)",
//!         [order_id.into()],
//!     ))
//!     .await?;
//!     events.record(OrderPlaced { event_id: uuid::Uuid::now_v7(), order_id });
//!     Ok(())
//! }
//!
//! # async fn f(db: sea_orm::DatabaseConnection) -> Result<(), DbErr> {
//! place_order(&db, 7).await?; // one transaction: the order and its event
//! # Ok(()) }
//! ```

mod connection;
mod insert;
mod unit_of_work;

pub use connection::SeaConnection;
pub use insert::insert_events;
pub use unit_of_work::{RetryingSeaUnitOfWork, SeaTransactionSource, SeaUnitOfWork, transaction};

use std::sync::Arc;

use ::sea_orm::{DbErr, RuntimeErr};

use crate::Error;

/// Whether `error`, or any error in its `source()` chain, is a
/// serialization failure or deadlock, also inside a `DbErr` (whose
/// `source()` does not lead to its sqlx error).
pub(crate) fn is_transient(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(error) = current {
        if crate::retry::is_serialization_failure(error) {
            return true;
        }
        if let Some(inner) = error.downcast_ref::<DbErr>().and_then(sqlx_error)
            && crate::retry::is_serialization_failure(inner)
        {
            return true;
        }
        current = error.source();
    }
    false
}

/// The sqlx error inside a SeaORM error, if it carries one.
pub(crate) fn sqlx_error(error: &DbErr) -> Option<&sqlx::Error> {
    match error {
        DbErr::Conn(RuntimeErr::SqlxError(error))
        | DbErr::Exec(RuntimeErr::SqlxError(error))
        | DbErr::Query(RuntimeErr::SqlxError(error)) => Some(error),
        _ => None,
    }
}

/// A sqlx error as SeaORM reports the failure of a statement.
pub(crate) fn exec_error(error: sqlx::Error) -> DbErr {
    DbErr::Exec(RuntimeErr::SqlxError(Arc::new(error)))
}

/// The framework's error for a failed statement of its own after the
/// handler's code: [`Error::TransactionAborted`] / `TransactionEnded` when
/// the transaction could no longer commit, else [`Error::SeaOrm`].
pub(crate) fn statement_error(error: DbErr) -> Error {
    sqlx_error(&error)
        .and_then(crate::not_committable)
        .unwrap_or(Error::SeaOrm(error))
}

/// So that a handler can return SeaORM's own error type: the framework's
/// failures (begin, serialization, the outbox insert, the commit) become a
/// `DbErr`. A SeaORM or sqlx error is handed back as the `DbErr` it is (a
/// serialization failure stays recognizable for retries); the framework's
/// own conditions become `DbErr::Custom` with their message.
impl From<Error> for DbErr {
    fn from(error: Error) -> Self {
        match error {
            Error::SeaOrm(error) => error,
            Error::Database(error) => exec_error(error),
            other => DbErr::Custom(other.to_string()),
        }
    }
}

/// Renders a SeaORM error as [`DbErrorDisplay`](crate::DbErrorDisplay)
/// renders sqlx's: a PostgreSQL error as its message, SQLSTATE, detail and
/// hint (SeaORM's own `Display` adds the server's source line, through
/// sqlx); any other SeaORM error as SeaORM writes it.
///
/// ```
/// use txoutbox_core::sea_orm::DbErrDisplay;
///
/// let error = sea_orm::DbErr::Custom("no such order".into());
/// assert_eq!(DbErrDisplay(&error).to_string(), error.to_string());
/// ```
#[derive(Debug, Clone, Copy)]
pub struct DbErrDisplay<'a>(pub &'a DbErr);

impl std::fmt::Display for DbErrDisplay<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match sqlx_error(self.0) {
            Some(error) => crate::DbErrorDisplay(error).fmt(f),
            None => self.0.fmt(f),
        }
    }
}
