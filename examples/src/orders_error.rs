//! The error type of the orders service's commands: the HTTP commands in
//! [`crate::orders`] and the steps of the fulfilment saga
//! ([`crate::fulfilment`]) both return it.

/// Errors of the orders commands. `From<txoutbox_core::Error>` is all the
/// framework asks of a handler's error type.
#[derive(Debug, thiserror::Error)]
pub enum OrdersError {
    /// The outbox write path failed (database, serialization).
    #[error(transparent)]
    Outbox(#[from] txoutbox_core::Error),
    /// The handler's own statements failed.
    #[error("database error: {}", txoutbox_core::DbErrorDisplay(.0))]
    Database(#[from] sqlx::Error),
}
