//! The orders service on PostgreSQL: its statements ([`OrdersSql`], and the
//! saga's, [`FulfilmentSql`]), its `#[outbox_handler]` and the fulfilment
//! saga declared for PostgreSQL.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool, Postgres, Transaction};
use txoutbox_core::{Events, outbox_handler};
use txoutbox_runtime::consumer::ConsumerBuilder;
use uuid::Uuid;

use super::{CreateOrder, OrderView, OrdersError, OrdersSql};
use crate::fulfilment::{FulfilmentSql, OrderFulfilment};

/// Inserts the order and records `OrderCreated`, in one transaction
/// ([`super::create`]); called with a `&PgPool`.
#[outbox_handler]
pub async fn create_order(
    tx: &mut Transaction<'_, Postgres>,
    events: &mut Events,
    cmd: CreateOrder,
) -> Result<Uuid, OrdersError> {
    super::create(tx, events, cmd).await
}

impl OrdersSql for Postgres {
    const SCHEMA: &'static str = include_str!("../../migrations/orders.sql");

    fn fulfilment(consumer: ConsumerBuilder<Self>) -> ConsumerBuilder<Self> {
        consumer.saga::<OrderFulfilment<Postgres>>()
    }

    async fn place_order(pool: &PgPool, cmd: CreateOrder) -> Result<Uuid, OrdersError> {
        create_order(pool, cmd).await
    }

    async fn insert_order(
        conn: &mut PgConnection,
        order_id: Uuid,
        cmd: &CreateOrder,
    ) -> sqlx::Result<DateTime<Utc>> {
        sqlx::query_scalar(
            "INSERT INTO orders (id, customer_id, product_id, amount) VALUES ($1, $2, $3, $4)
             RETURNING created_at",
        )
        .bind(order_id)
        .bind(cmd.customer_id)
        .bind(cmd.product_id)
        .bind(cmd.amount)
        .fetch_one(conn)
        .await
    }

    async fn order_view(pool: &PgPool, order_id: Uuid) -> sqlx::Result<Option<OrderView>> {
        sqlx::query_as(
            "SELECT id AS order_id, customer_id, product_id, amount, payment_status, status,
                    cancel_reason, created_at, paid_at
             FROM orders WHERE id = $1",
        )
        .bind(order_id)
        .fetch_optional(pool)
        .await
    }

    async fn set_stock_timeout_ms(pool: &PgPool, timeout_ms: i32) -> sqlx::Result<()> {
        sqlx::query("UPDATE fulfilment_settings SET stock_timeout_ms = $1")
            .bind(timeout_ms)
            .execute(pool)
            .await?;
        Ok(())
    }
}

impl FulfilmentSql for Postgres {
    async fn order_to_fulfil(
        conn: &mut PgConnection,
        order_id: Uuid,
    ) -> sqlx::Result<Option<(Uuid, Uuid, i64)>> {
        sqlx::query_as("SELECT customer_id, product_id, amount FROM orders WHERE id = $1")
            .bind(order_id)
            .fetch_optional(conn)
            .await
    }

    async fn stock_timeout_ms(conn: &mut PgConnection) -> sqlx::Result<i32> {
        sqlx::query_scalar("SELECT stock_timeout_ms FROM fulfilment_settings")
            .fetch_one(conn)
            .await
    }

    async fn confirm(
        conn: &mut PgConnection,
        order_id: Uuid,
        paid_at: DateTime<Utc>,
    ) -> sqlx::Result<()> {
        sqlx::query(
            "UPDATE orders SET status = 'confirmed', payment_status = 'paid', paid_at = $2,
                               finished_at = now()
             WHERE id = $1 AND status = 'pending'",
        )
        .bind(order_id)
        .bind(paid_at)
        .execute(conn)
        .await?;
        Ok(())
    }

    async fn cancel(
        conn: &mut PgConnection,
        order_id: Uuid,
        reason: &'static str,
    ) -> sqlx::Result<()> {
        sqlx::query(
            "UPDATE orders SET status = 'cancelled', cancel_reason = $2, finished_at = now()
             WHERE id = $1 AND status = 'pending'",
        )
        .bind(order_id)
        .bind(reason)
        .execute(conn)
        .await?;
        Ok(())
    }
}
