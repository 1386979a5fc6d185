//! The payments service: a dedup-mode consumer of `payment.commands`
//! "charges" each order the order fulfilment saga asks it to
//! (`ChargePayment`) and answers with `PaymentCompleted`, or `PaymentFailed`
//! when the amount is over the policy's limit (`payment_policy`), through its
//! own outbox, in the same transaction as the dedup row; its relay publishes
//! the answer. A small HTTP server answers `/metrics`, `/health/live` and
//! `/health/ready`.

use std::net::SocketAddr;

use chrono::Utc;
use sqlx::{PgPool, Postgres, Transaction};
use tokio::net::TcpListener;
use txoutbox_core::Events;
use txoutbox_runtime::consumer::{Consumer, event_handler};
use txoutbox_runtime::relay::Relay;
use uuid::Uuid;

use crate::events::{ChargePayment, PaymentCompleted, PaymentFailed};
use crate::service::{ServiceError, Tasks, Tuning, consumer_config, kafka_config};

/// Errors of the payment handler.
#[derive(Debug, thiserror::Error)]
pub enum PaymentsError {
    /// The outbox write path failed.
    #[error(transparent)]
    Outbox(#[from] txoutbox_core::Error),
    /// The handler's own statements failed.
    #[error("database error: {}", txoutbox_core::DbErrorDisplay(.0))]
    Database(#[from] sqlx::Error),
}

/// Charges the order once: records `PaymentCompleted`, or `PaymentFailed`
/// when the amount is over the policy's limit.
///
/// Runs inside the consumer's transaction, so the payment row, the outbox row
/// of the answer and the `processed_event` dedup row commit together.
#[event_handler]
async fn on_charge_payment(
    tx: &mut Transaction<'_, Postgres>,
    event: ChargePayment,
    events: &mut Events,
) -> Result<(), PaymentsError> {
    let decline_over: i64 = sqlx::query_scalar("SELECT decline_over FROM payment_policy")
        .fetch_one(&mut **tx)
        .await?;
    let declined = event.amount > decline_over;
    let payment_id = Uuid::now_v7();
    let inserted = sqlx::query(
        "INSERT INTO payments (id, order_id, amount, status) VALUES ($1, $2, $3, $4)
         ON CONFLICT (order_id) DO NOTHING",
    )
    .bind(payment_id)
    .bind(event.order_id)
    .bind(event.amount)
    .bind(if declined { "declined" } else { "completed" })
    .execute(&mut **tx)
    .await?
    .rows_affected();
    if inserted == 0 {
        // Already charged (a replay, or the same order under another event id).
        return Ok(());
    }
    if declined {
        events.record(PaymentFailed {
            event_id: Uuid::now_v7(),
            payment_id,
            order_id: event.order_id,
            amount: event.amount,
            reason: format!("{} cents is over the limit of {decline_over}", event.amount),
            failed_at: Utc::now(),
        });
    } else {
        events.record(PaymentCompleted {
            event_id: Uuid::now_v7(),
            payment_id,
            order_id: event.order_id,
            amount: event.amount,
            completed_at: Utc::now(),
        });
    }
    Ok(())
}

/// Sets the amount (cents) above which charges are declined.
pub async fn set_decline_over(pool: &PgPool, cents: i64) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE payment_policy SET decline_over = $1")
        .bind(cents)
        .execute(pool)
        .await?;
    Ok(())
}

/// Creates the payments schema: the framework's tables and `payments`.
pub async fn migrate(pool: &PgPool) -> Result<(), ServiceError> {
    txoutbox_runtime::migrations::run(pool).await?;
    sqlx::raw_sql(include_str!("../migrations/payments.sql"))
        .execute(pool)
        .await
        .map_err(ServiceError::Database)?;
    Ok(())
}

/// A running payments service: its consumer, its relay and the HTTP server
/// of its probes.
pub struct PaymentsService {
    /// Where the HTTP API (with `/metrics` and `/health/*`) listens.
    pub addr: SocketAddr,
    tasks: Tasks,
}

impl std::fmt::Debug for PaymentsService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PaymentsService")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl PaymentsService {
    /// Starts the dedup-mode consumer of `payment.commands` (group `group_id`),
    /// the relay of the payments outbox, and the probes ([`observability`])
    /// on `listener`.
    pub async fn start(
        pool: PgPool,
        bootstrap_servers: &str,
        group_id: &str,
        listener: TcpListener,
        tuning: &Tuning,
    ) -> Result<Self, ServiceError> {
        let relay = Relay::builder(pool.clone(), kafka_config(bootstrap_servers))
            .poll_interval(tuning.poll_interval)
            .schedule_poll_interval(tuning.poll_interval)
            .spawn()?;
        let consumer =
            Consumer::builder(pool.clone(), consumer_config(bootstrap_servers), group_id)
                .handler(on_charge_payment)
                .build()?
                .spawn();
        let tasks = Tasks::serve(
            pool,
            listener,
            axum::Router::new(),
            (relay, consumer),
            tuning,
        )?;
        Ok(Self {
            addr: tasks.addr(),
            tasks,
        })
    }

    /// Resolves when the relay or the consumer stopped on its own, with
    /// which one and why.
    pub fn failure(&self) -> impl std::future::Future<Output = ServiceError> + Send + 'static {
        self.tasks.failure()
    }

    /// Stops accepting requests, then stops the consumer and the relay, each
    /// finishing what it has in flight.
    pub async fn shutdown(self) -> Result<(), ServiceError> {
        self.tasks.shutdown().await
    }
}
