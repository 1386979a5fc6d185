//! Receiving events: idempotent handlers in dedup or inbox mode.
//!
//! Write one `#[event_handler]` async function per event type, assemble a
//! [`Consumer`] from them and spawn it:
//!
//! ```no_run
//! use txoutbox_runtime::consumer::{event_handler, Consumer, Mode};
//! use sqlx::{Postgres, Transaction};
//! # #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, txoutbox_core::DomainEvent)]
//! # #[event(topic = "payments", aggregate = "Payment")]
//! # struct PaymentCompleted { event_id: uuid::Uuid, #[partition_key] order_id: uuid::Uuid }
//!
//! #[event_handler]
//! async fn on_payment_completed(
//!     tx: &mut Transaction<'_, Postgres>,
//!     event: PaymentCompleted,
//! ) -> Result<(), sqlx::Error> {
//!     sqlx::query("UPDATE orders SET paid = true WHERE id = $1")
//!         .bind(event.order_id)
//!         .execute(&mut **tx)
//!         .await?;
//!     Ok(())
//! }
//!
//! # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! let mut kafka_config = rdkafka::ClientConfig::new();
//! kafka_config.set("bootstrap.servers", "127.0.0.1:9092");
//! let running = Consumer::builder(pool, kafka_config, "orders-service")
//!     .handler(on_payment_completed)
//!     .mode(Mode::Dedup) // the default; Mode::Inbox for critical or bursty flows
//!     .build()?
//!     .spawn();
//! // ... on SIGTERM:
//! running.shutdown().await?;
//! # Ok(()) }
//! ```
//!
//! Delivery is at-least-once; the consumer makes the effect happen once per
//! event id and consumer group. An offset is stored only after its message was
//! handled, found to be a duplicate, written to the inbox, skipped by policy or
//! dead-lettered, and only after the database commit. `docs/consumer.md`
//! describes the failure semantics and metrics.

mod builder;
mod call;
mod client_context;
mod config;
mod counts;
pub(crate) mod database;
mod dead_letter;
mod dedup;
mod dlq;
mod error;
mod handler;
#[cfg(feature = "test-hooks")]
mod hooks;
pub(crate) mod inbox;
mod message;
mod offsets;
mod progress;
mod receive;
mod route;
mod run;
mod shared;
mod stall;
mod summary;
mod work;

pub use crate::wire::dead_letter::DeadLetterReason;
#[doc(hidden)]
#[cfg(feature = "test-hooks")]
pub use crate::wire::raw_headers::{headers_as_bytes, headers_from_bytes};
pub use builder::ConsumerBuilder;
pub use config::{Mode, UnknownEventPolicy};
pub use error::{BuildError, ConsumerError};
pub use handler::{ConsumerDatabase, EventHandler, EventMeta, HandlerError};
#[doc(hidden)]
pub use handler::{ConsumerPool, HandlerTx};
#[doc(hidden)]
#[cfg(feature = "test-hooks")]
pub use hooks::Route;
#[cfg(feature = "test-hooks")]
#[doc(hidden)]
pub use inbox::claim_once_for_benchmark;
#[cfg(all(feature = "test-hooks", feature = "mysql"))]
#[doc(hidden)]
pub use inbox::claim_once_for_benchmark_mysql;
#[cfg(feature = "test-hooks")]
pub use run::fetch_settings_for_benchmark;
pub use run::{Consumer, ConsumerHandle};
pub use summary::ConsumerSummary;
pub use txoutbox_derive::event_handler;

pub mod telemetry;
