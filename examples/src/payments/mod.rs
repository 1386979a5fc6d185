//! The payments service: a dedup-mode consumer of `payment.commands`
//! "charges" each order the order fulfilment saga asks it to
//! (`ChargePayment`) and answers with `PaymentCompleted`, or `PaymentFailed`
//! when the amount is over the policy's limit (`payment_policy`), through its
//! own outbox, in the same transaction as the dedup row; its relay publishes
//! the answer. A small HTTP server answers `/metrics`, `/health/live` and
//! `/health/ready`.

use chrono::Utc;
use sqlx::{PgPool, Postgres, Transaction};
use txoutbox_core::Events;
use txoutbox_runtime::consumer::{ConsumerBuilder, event_handler};
use uuid::Uuid;

use crate::events::{ChargePayment, PaymentCompleted, PaymentFailed};
use crate::payments_sea_orm::PaymentsOrm;
use crate::service::{RunningService, ServiceError, ServiceKind, Tuning};

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

/// A running payments service: the dedup-mode consumer of
/// `payment.commands`, the relay of the payments outbox, and the probes.
pub type PaymentsService = RunningService<Payments>;

/// What makes the payments service (see [`PaymentsService`]).
#[derive(Debug)]
pub struct Payments;

impl ServiceKind for Payments {
    const NAME: &'static str = "PaymentsService";

    fn consumer(builder: ConsumerBuilder, tuning: &Tuning) -> ConsumerBuilder {
        match tuning.payments_orm {
            PaymentsOrm::Sqlx => builder.handler(on_charge_payment),
            PaymentsOrm::SeaOrm => {
                builder.handler(crate::payments_sea_orm::on_charge_payment_sea_orm)
            }
        }
    }
}
