//! The payments service on PostgreSQL: its statements ([`PaymentsSql`]) and
//! its consumer's handler, which calls [`super::charge`]; or, with
//! `--payments-orm sea-orm`, the handler written with SeaORM
//! ([`crate::payments_sea_orm`]).

use sqlx::{PgConnection, PgPool, Postgres, Transaction};
use txoutbox_core::Events;
use txoutbox_runtime::consumer::{ConsumerBuilder, event_handler};
use uuid::Uuid;

use super::{PaymentsError, PaymentsSql};
use crate::events::ChargePayment;
use crate::payments_sea_orm::PaymentsOrm;
use crate::service::Tuning;

/// Charges the order once ([`super::charge`]).
#[event_handler]
async fn on_charge_payment(
    tx: &mut Transaction<'_, Postgres>,
    event: ChargePayment,
    events: &mut Events,
) -> Result<(), PaymentsError> {
    super::charge(tx, events, &event).await
}

impl PaymentsSql for Postgres {
    const SCHEMA: &'static str = include_str!("../../migrations/payments.sql");

    fn handlers(consumer: ConsumerBuilder<Self>, tuning: &Tuning) -> ConsumerBuilder<Self> {
        match tuning.payments_orm {
            PaymentsOrm::Sqlx => consumer.handler(on_charge_payment),
            PaymentsOrm::SeaOrm => {
                consumer.handler(crate::payments_sea_orm::on_charge_payment_sea_orm)
            }
        }
    }

    async fn decline_over(conn: &mut PgConnection) -> sqlx::Result<i64> {
        sqlx::query_scalar("SELECT decline_over FROM payment_policy")
            .fetch_one(conn)
            .await
    }

    async fn insert_payment(
        conn: &mut PgConnection,
        payment_id: Uuid,
        order_id: Uuid,
        amount: i64,
        status: &'static str,
    ) -> sqlx::Result<bool> {
        let done = sqlx::query(
            "INSERT INTO payments (id, order_id, amount, status) VALUES ($1, $2, $3, $4)
             ON CONFLICT (order_id) DO NOTHING",
        )
        .bind(payment_id)
        .bind(order_id)
        .bind(amount)
        .bind(status)
        .execute(conn)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn set_decline_over(pool: &PgPool, cents: i64) -> sqlx::Result<()> {
        sqlx::query("UPDATE payment_policy SET decline_over = $1")
            .bind(cents)
            .execute(pool)
            .await?;
        Ok(())
    }
}
