//! The demo's summary queries on PostgreSQL ([`DemoSql`]): arrays of the
//! run's ids bound whole (`= ANY($1)`).

use sqlx::{PgPool, Postgres};
use uuid::Uuid;

use super::{DemoSql, OrderRow, Releases};

impl DemoSql for Postgres {
    async fn order_status(orders: &PgPool, order_id: Uuid) -> sqlx::Result<String> {
        sqlx::query_scalar("SELECT status FROM orders WHERE id = $1")
            .bind(order_id)
            .fetch_one(orders)
            .await
    }

    async fn orders_and_sagas(
        orders: &PgPool,
        ids: &[Uuid],
        saga_type: &'static str,
    ) -> sqlx::Result<Vec<OrderRow>> {
        sqlx::query_as(
            "SELECT o.id, o.product_id, o.status, o.cancel_reason, s.status
             FROM orders o
             LEFT JOIN saga_state s ON s.saga_type = $2 AND s.saga_id = o.id::text
             WHERE o.id = ANY($1)",
        )
        .bind(ids)
        .bind(saga_type)
        .fetch_all(orders)
        .await
    }

    async fn commands_sent(orders: &PgPool, keys: &[String]) -> sqlx::Result<Vec<(String, Uuid)>> {
        sqlx::query_as(
            "SELECT event_type, event_id FROM outbox_event
             WHERE event_type IN ('ReserveStock', 'ReleaseStock') AND partition_key = ANY($1)",
        )
        .bind(keys)
        .fetch_all(orders)
        .await
    }

    async fn handled(
        inventory: &PgPool,
        group: &str,
        event_ids: &[Uuid],
    ) -> sqlx::Result<Vec<Uuid>> {
        sqlx::query_scalar(
            "SELECT event_id FROM processed_event WHERE consumer_group = $1 AND event_id = ANY($2)",
        )
        .bind(group)
        .bind(event_ids)
        .fetch_all(inventory)
        .await
    }

    async fn releases(inventory: &PgPool, ids: &[Uuid]) -> sqlx::Result<Releases> {
        let (released, tombstones, nothing, twice, unreserved) = sqlx::query_as(
            "WITH m AS (SELECT * FROM stock_movement WHERE order_id = ANY($1)),
                  per_order AS (
                      SELECT order_id, count(*) FILTER (WHERE kind IN ('release', 'tombstone')) AS n
                      FROM m GROUP BY order_id)
             SELECT
               (SELECT count(*) FROM m WHERE kind = 'release'),
               (SELECT count(*) FROM m WHERE kind = 'tombstone'),
               (SELECT count(*) FROM m WHERE kind = 'release_nothing'),
               (SELECT count(*) FROM per_order WHERE n > 1),
               (SELECT count(*) FROM m r WHERE r.kind = 'release' AND NOT EXISTS (
                    SELECT 1 FROM m s WHERE s.order_id = r.order_id
                    AND s.kind = 'reserve' AND s.id < r.id))",
        )
        .bind(ids)
        .fetch_one(inventory)
        .await?;
        Ok(Releases {
            released,
            tombstones,
            nothing,
            twice,
            unreserved,
        })
    }

    async fn late_answers(orders: &PgPool, keys: &[String]) -> sqlx::Result<i64> {
        sqlx::query_scalar(
            "SELECT count(*) FROM inbox_event i JOIN orders o ON o.id::text = i.partition_key
             WHERE i.partition_key = ANY($1) AND i.processed
               AND i.event_type IN ('StockReserved', 'StockRejected')
               AND o.cancel_reason = 'stock_timeout'",
        )
        .bind(keys)
        .fetch_one(orders)
        .await
    }

    async fn stock(inventory: &PgPool, products: &[Uuid]) -> sqlx::Result<Vec<(Uuid, i32, i32)>> {
        sqlx::query_as(
            "SELECT product_id, available, reserved FROM stock WHERE product_id = ANY($1)",
        )
        .bind(products)
        .fetch_all(inventory)
        .await
    }

    async fn confirmed_besides(
        orders: &PgPool,
        product_id: Uuid,
        ids: &[Uuid],
    ) -> sqlx::Result<i64> {
        sqlx::query_scalar(
            "SELECT count(*) FROM orders WHERE product_id = $1 AND status = 'confirmed'
             AND NOT (id = ANY($2))",
        )
        .bind(product_id)
        .bind(ids)
        .fetch_one(orders)
        .await
    }

    async fn payments(payments: &PgPool, ids: &[Uuid]) -> sqlx::Result<(i64, i64)> {
        sqlx::query_as(
            "SELECT count(*) FILTER (WHERE status = 'completed'),
                    count(*) FILTER (WHERE status = 'declined')
             FROM payments WHERE order_id = ANY($1)",
        )
        .bind(ids)
        .fetch_one(payments)
        .await
    }

    async fn confirmation_seconds(orders: &PgPool, ids: &[Uuid]) -> sqlx::Result<Vec<f64>> {
        sqlx::query_scalar(
            "SELECT EXTRACT(EPOCH FROM finished_at - created_at)::float8 FROM orders
             WHERE id = ANY($1) AND status = 'confirmed'",
        )
        .bind(ids)
        .fetch_all(orders)
        .await
    }
}
