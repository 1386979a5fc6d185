//! The saga scenario of the fault suite (see `outbox_tests::faults::saga`
//! and `RELIABILITY.md`, "Sagas under faults"): saga hosts and participants
//! as real processes, `kill -9` of both, redelivery, a broker outage, and a
//! checker over both databases and the topics. Short mode by default;
//! `OUTBOX_FAULTS=long` for the long run recorded in `RELIABILITY.md`.

use outbox_tests::faults::saga::run::{self, SagaScenario};
use outbox_tests::faults::scenario;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sagas_end_completed_or_compensated_under_kills_and_a_broker_outage() {
    let shape = if scenario::long_mode() {
        SagaScenario::long("sagas_long")
    } else {
        SagaScenario::short("sagas")
    };
    let figures = run::run_and_check(&shape, env!("CARGO_BIN_EXE_faults-saga")).await;
    assert!(figures.completed + figures.compensated == figures.sagas);
}
