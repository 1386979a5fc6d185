//! The inventory on MariaDB: its statements ([`InventorySql`]) and its
//! consumer's handlers, which call the decisions of [`super`]. What differs
//! from [`super::postgres`]: `?` placeholders, `INSERT IGNORE` and
//! `ON DUPLICATE KEY UPDATE` for `ON CONFLICT`, a lock row for the advisory
//! lock, and no `RETURNING` on `UPDATE`.

use sqlx::{MySql, MySqlConnection, MySqlPool, Transaction};
use txoutbox_core::Events;
use txoutbox_runtime::consumer::{ConsumerBuilder, event_handler};
use uuid::Uuid;

use super::{InventoryError, InventorySql};
use crate::events::{ReleaseStock, ReserveStock};

#[event_handler]
async fn on_reserve_stock(
    tx: &mut Transaction<'_, MySql>,
    event: ReserveStock,
    events: &mut Events,
) -> Result<(), InventoryError> {
    super::reserve(tx, events, &event).await.map(drop)
}

#[event_handler]
async fn on_release_stock(
    tx: &mut Transaction<'_, MySql>,
    event: ReleaseStock,
) -> Result<(), InventoryError> {
    super::release(tx, &event).await.map(drop)
}

impl InventorySql for MySql {
    const SCHEMA: &'static str = include_str!("../../migrations/mysql/inventory.sql");

    fn handlers(consumer: ConsumerBuilder<Self>) -> ConsumerBuilder<Self> {
        consumer.handler(on_reserve_stock).handler(on_release_stock)
    }

    /// The order's `reservation_lock` row, upserted (which locks it, new or
    /// not, until the transaction ends), then its reservation `FOR UPDATE`.
    async fn lock_reservation(
        conn: &mut MySqlConnection,
        order_id: Uuid,
    ) -> sqlx::Result<Option<String>> {
        sqlx::query(
            "INSERT INTO reservation_lock (order_id) VALUES (?)
             ON DUPLICATE KEY UPDATE order_id = order_id",
        )
        .bind(order_id)
        .execute(&mut *conn)
        .await?;
        sqlx::query_scalar("SELECT status FROM reservation WHERE order_id = ? FOR UPDATE")
            .bind(order_id)
            .fetch_optional(conn)
            .await
    }

    async fn warehouse(conn: &mut MySqlConnection, product_id: Uuid) -> sqlx::Result<(i32, i32)> {
        let delays =
            sqlx::query_as("SELECT reply_delay_ms, apply_delay_ms FROM stock WHERE product_id = ?")
                .bind(product_id)
                .fetch_optional(conn)
                .await?;
        Ok(delays.unwrap_or((0, 0)))
    }

    async fn defer_once(
        conn: &mut MySqlConnection,
        order_id: Uuid,
        command_id: Uuid,
    ) -> sqlx::Result<bool> {
        let done = sqlx::query(
            "INSERT IGNORE INTO deferred_reservation (order_id, command_id) VALUES (?, ?)",
        )
        .bind(order_id)
        .bind(command_id)
        .execute(conn)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn take_stock(
        conn: &mut MySqlConnection,
        product_id: Uuid,
        quantity: i32,
    ) -> sqlx::Result<bool> {
        let done = sqlx::query(
            "UPDATE stock SET available = available - ?, reserved = reserved + ?
             WHERE product_id = ? AND available >= ?",
        )
        .bind(quantity)
        .bind(quantity)
        .bind(product_id)
        .bind(quantity)
        .execute(conn)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn insert_reservation(
        conn: &mut MySqlConnection,
        order_id: Uuid,
        product_id: Uuid,
        quantity: i32,
        status: &'static str,
    ) -> sqlx::Result<()> {
        sqlx::query(
            "INSERT INTO reservation (order_id, product_id, quantity, status)
             VALUES (?, ?, ?, ?)",
        )
        .bind(order_id)
        .bind(product_id)
        .bind(quantity)
        .bind(status)
        .execute(conn)
        .await?;
        Ok(())
    }

    /// The row is locked ([`lock_reservation`](InventorySql::lock_reservation)):
    /// read it, then change it.
    async fn release_reservation(
        conn: &mut MySqlConnection,
        order_id: Uuid,
    ) -> sqlx::Result<(Uuid, i32)> {
        let held =
            sqlx::query_as("SELECT product_id, quantity FROM reservation WHERE order_id = ?")
                .bind(order_id)
                .fetch_one(&mut *conn)
                .await?;
        sqlx::query(
            "UPDATE reservation SET status = 'released', updated_at = NOW(6) WHERE order_id = ?",
        )
        .bind(order_id)
        .execute(conn)
        .await?;
        Ok(held)
    }

    async fn give_back(
        conn: &mut MySqlConnection,
        product_id: Uuid,
        quantity: i32,
    ) -> sqlx::Result<()> {
        sqlx::query(
            "UPDATE stock SET available = available + ?, reserved = reserved - ?
             WHERE product_id = ?",
        )
        .bind(quantity)
        .bind(quantity)
        .bind(product_id)
        .execute(conn)
        .await?;
        Ok(())
    }

    async fn movement(
        conn: &mut MySqlConnection,
        order_id: Uuid,
        product_id: Uuid,
        kind: &'static str,
        quantity: i32,
        command_id: Uuid,
    ) -> sqlx::Result<()> {
        sqlx::query(
            "INSERT INTO stock_movement (order_id, product_id, kind, quantity, command_id)
             VALUES (?, ?, ?, ?, ?)",
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
        pool: &MySqlPool,
        product_id: Uuid,
        available: i32,
        reply_delay_ms: i32,
    ) -> sqlx::Result<()> {
        sqlx::query(
            "INSERT INTO stock (product_id, available, reply_delay_ms) VALUES (?, ?, ?)
             ON DUPLICATE KEY UPDATE available = VALUES(available),
                                     reply_delay_ms = VALUES(reply_delay_ms)",
        )
        .bind(product_id)
        .bind(available)
        .bind(reply_delay_ms)
        .execute(pool)
        .await?;
        Ok(())
    }

    async fn backlog_product(
        pool: &MySqlPool,
        product_id: Uuid,
        apply_delay_ms: i32,
    ) -> sqlx::Result<()> {
        sqlx::query("UPDATE stock SET apply_delay_ms = ? WHERE product_id = ?")
            .bind(apply_delay_ms)
            .bind(product_id)
            .execute(pool)
            .await?;
        Ok(())
    }
}
