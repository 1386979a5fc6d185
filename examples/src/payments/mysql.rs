//! The payments service on MariaDB: its statements ([`PaymentsSql`]) and
//! its consumer's handler, which calls [`super::charge`]. The SeaORM
//! handler (`--payments-orm sea-orm`) is PostgreSQL's only: the demo
//! refuses it on MariaDB.

use sqlx::{MySql, MySqlConnection, MySqlPool, Transaction};
use txoutbox_core::Events;
use txoutbox_runtime::consumer::{ConsumerBuilder, event_handler};
use uuid::Uuid;

use super::{PaymentsError, PaymentsSql};
use crate::events::ChargePayment;
use crate::service::Tuning;

/// Charges the order once ([`super::charge`]).
#[event_handler]
async fn on_charge_payment(
    tx: &mut Transaction<'_, MySql>,
    event: ChargePayment,
    events: &mut Events,
) -> Result<(), PaymentsError> {
    super::charge(tx, events, &event).await
}

impl PaymentsSql for MySql {
    const SCHEMA: &'static str = include_str!("../../migrations/mysql/payments.sql");

    fn handlers(consumer: ConsumerBuilder<Self>, _: &Tuning) -> ConsumerBuilder<Self> {
        consumer.handler(on_charge_payment)
    }

    async fn decline_over(conn: &mut MySqlConnection) -> sqlx::Result<i64> {
        sqlx::query_scalar("SELECT decline_over FROM payment_policy")
            .fetch_one(conn)
            .await
    }

    /// `INSERT IGNORE`: a second payment of the order (its unique key)
    /// inserts nothing.
    async fn insert_payment(
        conn: &mut MySqlConnection,
        payment_id: Uuid,
        order_id: Uuid,
        amount: i64,
        status: &'static str,
    ) -> sqlx::Result<bool> {
        let done = sqlx::query(
            "INSERT IGNORE INTO payments (id, order_id, amount, status) VALUES (?, ?, ?, ?)",
        )
        .bind(payment_id)
        .bind(order_id)
        .bind(amount)
        .bind(status)
        .execute(conn)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn set_decline_over(pool: &MySqlPool, cents: i64) -> sqlx::Result<()> {
        sqlx::query("UPDATE payment_policy SET decline_over = ?")
            .bind(cents)
            .execute(pool)
            .await?;
        Ok(())
    }
}
