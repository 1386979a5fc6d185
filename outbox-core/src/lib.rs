//! # txoutbox-core
//!
//! The vocabulary of the transactional outbox: domain events, the records they
//! become in the `outbox_event` table and on the wire, and the write path that
//! stores them in the same PostgreSQL transaction as the domain change.
//!
//! Declare an event with `#[derive(DomainEvent)]`:
//!
//! ```
//! use txoutbox_core::DomainEvent;
//! use serde::{Deserialize, Serialize};
//! use schemars::JsonSchema;
//! use uuid::Uuid;
//!
//! #[derive(DomainEvent, Serialize, Deserialize, JsonSchema)]
//! #[event(topic = "order.events", event_type = "OrderCreated", aggregate = "Order")]
//! pub struct OrderCreated {
//!     #[event_id]
//!     pub event_id: Uuid,
//!     #[partition_key]
//!     #[aggregate_id]
//!     pub order_id: Uuid,
//!     pub amount: i64,
//! }
//!
//! let event = OrderCreated { event_id: Uuid::new_v4(), order_id: Uuid::new_v4(), amount: 42 };
//! assert_eq!(OrderCreated::TOPIC, "order.events");
//! assert_eq!(event.partition_key(), event.order_id.to_string());
//! let record = txoutbox_core::OutboxRecord::from_event(&event).unwrap();
//! assert_eq!(record.payload["event_id"], event.event_id.to_string());
//! assert_eq!(record.payload["event_type"], "OrderCreated");
//! ```
//!
//! Write them with a command handler: `#[outbox_handler]` (or the plain
//! [`transaction`] API) runs your statements and inserts the events you
//! [record](Events::record) in one transaction; see `docs/handler.md`. Code
//! that manages its own transaction writes a collector with [`Events::write`].
//! Events recorded with [`Events::record_after`] or [`Events::record_at`] are
//! delivered not before a given time ([`cancel_scheduled`] calls one back
//! while it is not due); see `docs/relay.md`, *Scheduled delivery*.

mod committable;
mod derive_support;
mod domain_event;
mod error;
mod events;
mod insert;
#[cfg(feature = "mysql")]
pub mod mysql;
mod record;
mod retry;
pub mod schema;
#[cfg(feature = "sea-orm")]
pub mod sea_orm;
mod sink;
pub mod testing;
pub mod trace;
mod unit_of_work;
mod wakeup;
pub mod wire;

pub use committable::{check_committable, commit_checked, not_committable};
pub use domain_event::{DomainEvent, PartitionKey};
pub use error::{DbErrorDisplay, Error};
pub use events::{Events, ScheduledRecord, WithHeaders};
pub use insert::{cancel_scheduled, insert_events};
pub use record::{MAX_PARTITION_KEY_BYTES, OutboxRecord};
pub use retry::{Backoff, is_transient_error};
pub use sink::{AfterCommit, CommitTarget};
pub use unit_of_work::{
    IsolationLevel, RetryingUnitOfWork, TransactionSource, UnitOfWork, transaction,
};

#[cfg(feature = "derive")]
pub use txoutbox_derive::{Command, DomainEvent, outbox_handler};

/// What the code `#[derive(DomainEvent)]` generates needs, plus one internal
/// seam to the runtime ([`wakeup`](self::__private::wakeup)). Not a public
/// API: may change in any release.
#[doc(hidden)]
pub mod __private {
    pub use crate::derive_support::{EventIdField, EventSchema, String};
    pub use inventory;
    pub use schemars;
    pub use uuid;

    /// The in-process wake-up behind [`AfterCommit`](crate::AfterCommit), for
    /// the runtime: its relay listens, and its writers that insert outbox
    /// rows without a collector (the scheduler, dead-letter replays) signal.
    /// Not for generated code: an internal seam between txoutbox-core and
    /// txoutbox-runtime (the one process-wide channel lives here, where
    /// `AfterCommit` signals it), kept here rather than in a public API.
    pub mod wakeup {
        pub use crate::wakeup::{
            CommitListener, Scope, listener, listener_in, notify_committed, notify_committed_in,
        };
    }
}
