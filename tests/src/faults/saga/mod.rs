//! The saga scenario: sagas across two services under `kill -9`, redelivery
//! and a broker outage.
//!
//! Two services with a database each run as OS processes (`faults-saga`):
//! two saga hosts (the saga service's relay and its dedup consumer running
//! [`model::FaultSaga`]) and two participants (the participant's relay and
//! its dedup consumer applying reservations, charges and releases). The test
//! starts sagas at a steady rate by inserting `Begin` into the saga
//! service's outbox, kills saga hosts and participants in turn (each kill
//! redelivers what the dead consumer had handled but not committed the offset
//! of, and republishes what the dead relay had sent but not marked), cuts the
//! broker off once, then waits until every message sent was handled, and the
//! [`checker`] proves from both databases and the topics that every saga
//! ended completed or compensated, that no compensation was applied twice or
//! to a charge, that no reservation leaked, and that nothing was lost.
//! `RELIABILITY.md` ("Sagas under faults") has the figures.

pub mod checker;
pub mod model;
pub mod run;

/// The `faults-saga` process's role: `saga` or `participant`.
pub const ROLE: &str = "FAULTS_SAGA_ROLE";
