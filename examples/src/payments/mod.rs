//! The payments service: a dedup-mode consumer of `payment.commands`
//! "charges" each order the order fulfilment saga asks it to
//! (`ChargePayment`) and answers with `PaymentCompleted`, or `PaymentFailed`
//! when the amount is over the policy's limit (`payment_policy`), through its
//! own outbox, in the same transaction as the dedup row; its relay publishes
//! the answer. A small HTTP server answers `/metrics`, `/health/live` and
//! `/health/ready`.
//!
//! The charge is decided once, in [`charge`], over [`PaymentsSql`]: the
//! service's two statements, which each database implements in its own
//! module ([`postgres`], [`mysql`]) with that database's `#[event_handler]`.

pub mod mysql;
pub mod postgres;

use std::future::Future;

use chrono::Utc;
use sqlx::{Pool, Transaction};
use txoutbox_core::Events;
use txoutbox_runtime::consumer::ConsumerBuilder;
use uuid::Uuid;

use crate::database::ExampleDatabase;
use crate::events::{ChargePayment, PaymentCompleted, PaymentFailed};
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

/// The payments service's statements on one database (`payments`,
/// `payment_policy`), and its consumer's handler there.
pub trait PaymentsSql: ExampleDatabase {
    /// The payments tables, an idempotent script.
    const SCHEMA: &'static str;

    /// `consumer` with this database's handler of `ChargePayment` (the one
    /// `tuning.payments_orm` names, where there is a choice).
    fn handlers(consumer: ConsumerBuilder<Self>, tuning: &Tuning) -> ConsumerBuilder<Self>;

    /// The policy's limit, in cents.
    fn decline_over(conn: &mut Self::Connection) -> impl Future<Output = sqlx::Result<i64>> + Send;

    /// Inserts the order's payment row; false if the order has one already.
    fn insert_payment(
        conn: &mut Self::Connection,
        payment_id: Uuid,
        order_id: Uuid,
        amount: i64,
        status: &'static str,
    ) -> impl Future<Output = sqlx::Result<bool>> + Send;

    /// See [`set_decline_over`].
    fn set_decline_over(
        pool: &Pool<Self>,
        cents: i64,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;
}

/// Charges the order once: records `PaymentCompleted`, or `PaymentFailed`
/// when the amount is over the policy's limit.
///
/// Runs inside the consumer's transaction, so the payment row, the outbox row
/// of the answer and the `processed_event` dedup row commit together.
pub async fn charge<DB: PaymentsSql>(
    tx: &mut Transaction<'_, DB>,
    events: &mut Events,
    event: &ChargePayment,
) -> Result<(), PaymentsError> {
    let decline_over = DB::decline_over(tx).await?;
    let declined = event.amount > decline_over;
    let payment_id = Uuid::now_v7();
    let status = if declined { "declined" } else { "completed" };
    if !DB::insert_payment(tx, payment_id, event.order_id, event.amount, status).await? {
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
pub async fn set_decline_over<DB: PaymentsSql>(
    pool: &Pool<DB>,
    cents: i64,
) -> Result<(), sqlx::Error> {
    DB::set_decline_over(pool, cents).await
}

/// Creates the payments schema: the framework's tables and `payments`.
pub async fn migrate<DB: PaymentsSql>(pool: &Pool<DB>) -> Result<(), ServiceError> {
    Ok(DB::migrate(pool, DB::SCHEMA).await?)
}

/// A running payments service: the dedup-mode consumer of
/// `payment.commands`, the relay of the payments outbox, and the probes.
pub type PaymentsService<DB = sqlx::Postgres> = RunningService<Payments, DB>;

/// What makes the payments service (see [`PaymentsService`]).
#[derive(Debug)]
pub struct Payments;

impl<DB: PaymentsSql> ServiceKind<DB> for Payments {
    const NAME: &'static str = "PaymentsService";

    fn consumer(builder: ConsumerBuilder<DB>, tuning: &Tuning) -> ConsumerBuilder<DB> {
        DB::handlers(builder, tuning)
    }
}
