//! # txoutbox-runtime
//!
//! The moving parts of the outbox framework: the relay that publishes
//! `outbox_event` rows to Kafka, the dedup and inbox consumers, migrations,
//! retention and replay.

pub mod consumer;
pub mod kafka_settings;
pub mod lifecycle;
pub mod migrations;
pub mod ops;
#[cfg(feature = "test-hooks")]
#[doc(hidden)]
pub mod probe;
#[cfg(not(feature = "test-hooks"))]
mod probe;
mod redact;
mod registry;
pub mod relay;
pub mod saga;
pub mod service;
pub mod testing;
mod topic_admin;
pub mod topics;
mod txn;
mod wire;

/// SeaORM 2 (feature `sea-orm`): command handlers on `&DatabaseTransaction`
/// and consumer handlers on [`SeaConnection`](sea_orm::SeaConnection); see
/// the module's documentation.
#[cfg(feature = "sea-orm")]
pub use txoutbox_core::sea_orm;

/// What the code that `#[event_handler]` and `#[saga]` generate needs, and
/// nothing else. Not a public API: may change in any release.
#[doc(hidden)]
pub mod __private {
    pub use futures::future::BoxFuture;
    pub use inventory;
    #[cfg(feature = "mysql")]
    pub use sqlx::MySql;
    pub use sqlx::{Postgres, Transaction};
    #[cfg(feature = "sea-orm")]
    pub use txoutbox_core::sea_orm::SeaConnection;
    pub use txoutbox_core::{DomainEvent, Events};

    use crate::consumer::HandlerError;
    use crate::registry::HandlerDescriptor;

    /// The registration of one handler, for `inventory::submit!`.
    pub const fn handler_descriptor(
        topic: &'static str,
        event_type: &'static str,
        name: &'static str,
    ) -> HandlerDescriptor {
        HandlerDescriptor::new(topic, event_type, name)
    }

    /// Turns a handler's error into a [`HandlerError`] (a `sqlx::Error`
    /// without the server source line; see [`HandlerError::new`]).
    pub fn handler_error<E: std::fmt::Display + 'static>(error: E) -> HandlerError {
        HandlerError::new(error)
    }

    /// The saga id of an incoming message, as stored in `saga_state.saga_id`.
    pub fn correlation<T: ToString + ?Sized>(id: &T) -> String {
        id.to_string()
    }
}
