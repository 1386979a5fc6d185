//! # outbox-runtime
//!
//! The moving parts of the outbox framework: the relay that publishes
//! `outbox_event` rows to Kafka, the dedup and inbox consumers, migrations,
//! retention and replay.

pub mod consumer;
pub mod kafka_settings;
pub mod lifecycle;
pub mod migrations;
pub mod ops;
mod redact;
pub mod relay;
