//! # txoutbox-runtime
//!
//! The moving parts of the outbox framework: the relay that publishes
//! `outbox_event` rows to Kafka, the dedup and inbox consumers, migrations,
//! retention and replay.

pub mod consumer;
/// The core crate, for code the macros generate. Not a public API.
#[doc(hidden)]
pub use txoutbox_core as __private_core;
pub mod kafka_settings;
pub mod lifecycle;
pub mod migrations;
pub mod ops;
mod redact;
mod registry;
pub mod relay;
pub mod saga;
mod topic_admin;
pub mod topics;
mod txn;
mod wire;
