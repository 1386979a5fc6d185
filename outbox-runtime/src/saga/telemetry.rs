//! Names of the saga metrics (through the `metrics` facade); every one
//! carries a `saga` label.

use super::SagaStatus;

/// Counter: steps applied (labels `saga`, `message`): a start or a handler
/// that ran and committed its state.
pub const STEPS: &str = "outbox_saga_steps_total";
/// Counter: sagas started.
pub const STARTED: &str = "outbox_saga_started_total";
/// Counter: sagas ended (label `outcome`: `completed` or `compensated`).
pub const FINISHED: &str = "outbox_saga_finished_total";
/// Counter: compensation messages sent.
pub const COMPENSATIONS: &str = "outbox_saga_compensations_sent_total";
/// Counter: messages that changed nothing (labels `message`, `reason`:
/// `unknown_saga` (no such saga, on the message's last attempt: the earlier
/// ones fail, to be retried), `finished`, `already_started`).
pub const IGNORED: &str = "outbox_saga_messages_ignored_total";
/// Gauge: running sagas (refreshed by consumers with sagas, every backlog
/// interval).
pub const OPEN: &str = "outbox_sagas_open";
/// Gauge: seconds since the least recently changed running saga last moved.
pub const OLDEST_OPEN: &str = "outbox_saga_oldest_open_seconds";

pub(super) fn stepped(
    saga: &'static str,
    message: &str,
    created: bool,
    status: SagaStatus,
    compensations_sent: usize,
) {
    metrics::counter!(STEPS, "saga" => saga, "message" => message.to_owned()).increment(1);
    if created {
        metrics::counter!(STARTED, "saga" => saga).increment(1);
    }
    if status.is_finished() {
        metrics::counter!(FINISHED, "saga" => saga, "outcome" => status.as_str()).increment(1);
    }
    if compensations_sent > 0 {
        metrics::counter!(COMPENSATIONS, "saga" => saga).increment(compensations_sent as u64);
    }
}

pub(super) fn ignored(saga: &'static str, message: &str, reason: &'static str) {
    metrics::counter!(IGNORED, "saga" => saga, "message" => message.to_owned(), "reason" => reason)
        .increment(1);
}

/// Sets the open-saga gauges of `sagas` from the database.
pub(crate) async fn refresh(
    pool: &crate::consumer::database::Pool,
    sagas: &[&'static str],
) -> sqlx::Result<()> {
    use super::SagaDatabase;
    use crate::consumer::database::Pool;
    let rows = match pool {
        Pool::Postgres(pool) => sqlx::Postgres::open_sagas(pool, sagas).await?,
        #[cfg(feature = "mysql")]
        Pool::MySql(pool) => sqlx::MySql::open_sagas(pool, sagas).await?,
    };
    for (name, open, oldest) in rows {
        metrics::gauge!(OPEN, "saga" => name.clone()).set(open as f64);
        metrics::gauge!(OLDEST_OPEN, "saga" => name).set(oldest);
    }
    Ok(())
}
