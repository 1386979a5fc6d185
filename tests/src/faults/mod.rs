//! The fault-injection harness (issue 8).
//!
//! A scenario ([`scenario::Scenario`]) starts, as separate OS processes,
//! writers (`faults-writer`: an `#[outbox_handler]` command under load),
//! relays (`faults-relay`) and consumers (`faults-consumer`, dedup and inbox
//! mode) against a database pair of its own and a tansu broker of its own,
//! injects its fault (`kill -9`, broker outage, PostgreSQL restart, poison),
//! waits until everything was published and applied, and hands the databases
//! and topics to the [`checker`]. [`saga`] is the saga scenario: saga hosts
//! and participants (`faults-saga`) under kills and a broker outage, with a
//! checker of its own. `RELIABILITY.md` lists the scenarios, what
//! each proves and the figures of a long run.

pub mod broker;
pub mod checker;
pub mod db;
pub mod env;
pub mod fleet;
pub mod freeze;
pub mod liveness;
pub mod model;
pub mod poison;
pub mod proxy;
pub mod saga;
pub mod scenario;
pub mod topic;
