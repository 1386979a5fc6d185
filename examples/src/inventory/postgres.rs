//! The inventory on PostgreSQL: its statements ([`InventorySql`]) and its
//! consumer's handlers, which call the decisions of [`super`].

use sqlx::{PgConnection, PgPool, Postgres, Transaction};
use txoutbox_core::Events;
use txoutbox_runtime::consumer::{ConsumerBuilder, event_handler};
use uuid::Uuid;

use super::{InventoryError, InventorySql};
use crate::events::{ReleaseStock, ReserveStock};

#[event_handler]
async fn on_reserve_stock(
    tx: &mut Transaction<'_, Postgres>,
    event: ReserveStock,
    events: &mut Events,
) -> Result<(), InventoryError> {
    super::reserve(tx, events, &event).await.map(drop)
}

#[event_handler]
async fn on_release_stock(
    tx: &mut Transaction<'_, Postgres>,
    event: ReleaseStock,
) -> Result<(), InventoryError> {
    super::release(tx, &event).await.map(drop)
}

impl InventorySql for Postgres {
    const SCHEMA: &'static str = include_str!("../../migrations/inventory.sql");

    fn handlers(consumer: ConsumerBuilder<Self>) -> ConsumerBuilder<Self> {
        consumer.handler(on_reserve_stock).handler(on_release_stock)
    }

    /// The order's transaction-level advisory lock, then its row `FOR UPDATE`.
    async fn lock_reservation(
        conn: &mut PgConnection,
        order_id: Uuid,
    ) -> sqlx::Result<Option<String>> {
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1::text, 0))")
            .bind(order_id)
            .execute(&mut *conn)
            .await?;
        sqlx::query_scalar("SELECT status FROM reservation WHERE order_id = $1 FOR UPDATE")
            .bind(order_id)
            .fetch_optional(conn)
            .await
    }

    async fn warehouse(conn: &mut PgConnection, product_id: Uuid) -> sqlx::Result<(i32, i32)> {
        let delays = sqlx::query_as(
            "SELECT reply_delay_ms, apply_delay_ms FROM stock WHERE product_id = $1",
        )
        .bind(product_id)
        .fetch_optional(conn)
        .await?;
        Ok(delays.unwrap_or((0, 0)))
    }

    async fn defer_once(
        conn: &mut PgConnection,
        order_id: Uuid,
        command_id: Uuid,
    ) -> sqlx::Result<bool> {
        let done = sqlx::query(
            "INSERT INTO deferred_reservation (order_id, command_id) VALUES ($1, $2)
             ON CONFLICT (order_id) DO NOTHING",
        )
        .bind(order_id)
        .bind(command_id)
        .execute(conn)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn take_stock(
        conn: &mut PgConnection,
        product_id: Uuid,
        quantity: i32,
    ) -> sqlx::Result<bool> {
        let done = sqlx::query(
            "UPDATE stock SET available = available - $2, reserved = reserved + $2
             WHERE product_id = $1 AND available >= $2",
        )
        .bind(product_id)
        .bind(quantity)
        .execute(conn)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn insert_reservation(
        conn: &mut PgConnection,
        order_id: Uuid,
        product_id: Uuid,
        quantity: i32,
        status: &'static str,
    ) -> sqlx::Result<()> {
        sqlx::query(
            "INSERT INTO reservation (order_id, product_id, quantity, status)
             VALUES ($1, $2, $3, $4)",
        )
        .bind(order_id)
        .bind(product_id)
        .bind(quantity)
        .bind(status)
        .execute(conn)
        .await?;
        Ok(())
    }

    async fn release_reservation(
        conn: &mut PgConnection,
        order_id: Uuid,
    ) -> sqlx::Result<(Uuid, i32)> {
        sqlx::query_as(
            "UPDATE reservation SET status = 'released', updated_at = now()
             WHERE order_id = $1 RETURNING product_id, quantity",
        )
        .bind(order_id)
        .fetch_one(conn)
        .await
    }

    async fn give_back(
        conn: &mut PgConnection,
        product_id: Uuid,
        quantity: i32,
    ) -> sqlx::Result<()> {
        sqlx::query(
            "UPDATE stock SET available = available + $2, reserved = reserved - $2
             WHERE product_id = $1",
        )
        .bind(product_id)
        .bind(quantity)
        .execute(conn)
        .await?;
        Ok(())
    }

    async fn movement(
        conn: &mut PgConnection,
        order_id: Uuid,
        product_id: Uuid,
        kind: &'static str,
        quantity: i32,
        command_id: Uuid,
    ) -> sqlx::Result<()> {
        sqlx::query(
            "INSERT INTO stock_movement (order_id, product_id, kind, quantity, command_id)
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(order_id)
        .bind(product_id)
        .bind(kind)
        .bind(quantity)
        .bind(command_id)
        .execute(conn)
        .await?;
        Ok(())
    }

    async fn stock_product(
        pool: &PgPool,
        product_id: Uuid,
        available: i32,
        reply_delay_ms: i32,
    ) -> sqlx::Result<()> {
        sqlx::query(
            "INSERT INTO stock (product_id, available, reply_delay_ms) VALUES ($1, $2, $3)
             ON CONFLICT (product_id) DO UPDATE SET available = $2, reply_delay_ms = $3",
        )
        .bind(product_id)
        .bind(available)
        .bind(reply_delay_ms)
        .execute(pool)
        .await?;
        Ok(())
    }

    async fn backlog_product(
        pool: &PgPool,
        product_id: Uuid,
        apply_delay_ms: i32,
    ) -> sqlx::Result<()> {
        sqlx::query("UPDATE stock SET apply_delay_ms = $2 WHERE product_id = $1")
            .bind(product_id)
            .bind(apply_delay_ms)
            .execute(pool)
            .await?;
        Ok(())
    }
}
