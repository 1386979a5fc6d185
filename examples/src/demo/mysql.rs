//! The demo's summary queries on MariaDB ([`DemoSql`]): the run's ids as
//! `IN (?, ..)` lists (MariaDB binds no arrays), `COUNT(CASE ..)` for
//! PostgreSQL's `FILTER`, `TIMESTAMPDIFF` for its interval arithmetic, and
//! an order's id as text (the saga's id, the inbox's partition key) spelled
//! out from its 16 bytes.

use sqlx::{MySql, MySqlPool, QueryBuilder};
use uuid::Uuid;

use super::{DemoSql, OrderRow, Releases};

/// `o.id` (BINARY(16)) as the text of its uuid, `8-4-4-4-12` lowercase hex,
/// as the saga's id and the events' partition key spell it.
const ORDER_ID_TEXT: &str = "LOWER(INSERT(INSERT(INSERT(INSERT(HEX(o.id), 9, 0, '-'), 14, 0, '-'), 19, 0, '-'), 24, 0, '-'))";

/// A query starting with `sql`, to be continued by [`push_list`].
fn query(sql: impl Into<String>) -> QueryBuilder<MySql> {
    QueryBuilder::new(sql)
}

/// Appends `(?, ?, ..)` binding `values`; `(NULL)`, which matches nothing,
/// for none.
fn push_list<T>(query: &mut QueryBuilder<MySql>, values: &[T])
where
    for<'a> &'a T: sqlx::Encode<'a, MySql> + sqlx::Type<MySql>,
{
    if values.is_empty() {
        query.push("(NULL)");
        return;
    }
    query.push("(");
    let mut list = query.separated(", ");
    for value in values {
        list.push_bind(value);
    }
    query.push(")");
}

impl DemoSql for MySql {
    async fn order_status(orders: &MySqlPool, order_id: Uuid) -> sqlx::Result<String> {
        sqlx::query_scalar("SELECT status FROM orders WHERE id = ?")
            .bind(order_id)
            .fetch_one(orders)
            .await
    }

    async fn orders_and_sagas(
        orders: &MySqlPool,
        ids: &[Uuid],
        saga_type: &'static str,
    ) -> sqlx::Result<Vec<OrderRow>> {
        let mut q = query(
            "SELECT o.id, o.product_id, o.status, o.cancel_reason, s.status FROM orders o LEFT JOIN saga_state s ON s.saga_type = ",
        );
        q.push_bind(saga_type).push(format_args!(
            " AND s.saga_id = {ORDER_ID_TEXT} WHERE o.id IN "
        ));
        push_list(&mut q, ids);
        q.build_query_as().fetch_all(orders).await
    }

    async fn commands_sent(
        orders: &MySqlPool,
        keys: &[String],
    ) -> sqlx::Result<Vec<(String, Uuid)>> {
        let mut q = query(
            "SELECT event_type, event_id FROM outbox_event
             WHERE event_type IN ('ReserveStock', 'ReleaseStock') AND partition_key IN ",
        );
        push_list(&mut q, keys);
        q.build_query_as().fetch_all(orders).await
    }

    async fn handled(
        inventory: &MySqlPool,
        group: &str,
        event_ids: &[Uuid],
    ) -> sqlx::Result<Vec<Uuid>> {
        let mut q = query("SELECT event_id FROM processed_event WHERE consumer_group = ");
        q.push_bind(group).push(" AND event_id IN ");
        push_list(&mut q, event_ids);
        q.build_query_scalar().fetch_all(inventory).await
    }

    async fn releases(inventory: &MySqlPool, ids: &[Uuid]) -> sqlx::Result<Releases> {
        let mut q =
            query("WITH m AS (SELECT id, order_id, kind FROM stock_movement WHERE order_id IN ");
        push_list(&mut q, ids);
        q.push(
            "),
                  per_order AS (
                      SELECT order_id,
                             COUNT(CASE WHEN kind IN ('release', 'tombstone') THEN 1 END) AS n
                      FROM m GROUP BY order_id)
             SELECT
               (SELECT COUNT(*) FROM m WHERE kind = 'release'),
               (SELECT COUNT(*) FROM m WHERE kind = 'tombstone'),
               (SELECT COUNT(*) FROM m WHERE kind = 'release_nothing'),
               (SELECT COUNT(*) FROM per_order WHERE n > 1),
               (SELECT COUNT(*) FROM m r WHERE r.kind = 'release' AND NOT EXISTS (
                    SELECT 1 FROM m s WHERE s.order_id = r.order_id
                    AND s.kind = 'reserve' AND s.id < r.id))",
        );
        let (released, tombstones, nothing, twice, unreserved) =
            q.build_query_as().fetch_one(inventory).await?;
        Ok(Releases {
            released,
            tombstones,
            nothing,
            twice,
            unreserved,
        })
    }

    async fn late_answers(orders: &MySqlPool, keys: &[String]) -> sqlx::Result<i64> {
        let mut q = query(format!(
            "SELECT COUNT(*) FROM inbox_event i JOIN orders o ON {ORDER_ID_TEXT} = i.partition_key
             WHERE i.processed AND i.event_type IN ('StockReserved', 'StockRejected')
               AND o.cancel_reason = 'stock_timeout' AND i.partition_key IN "
        ));
        push_list(&mut q, keys);
        q.build_query_scalar().fetch_one(orders).await
    }

    async fn stock(
        inventory: &MySqlPool,
        products: &[Uuid],
    ) -> sqlx::Result<Vec<(Uuid, i32, i32)>> {
        let mut q = query("SELECT product_id, available, reserved FROM stock WHERE product_id IN ");
        push_list(&mut q, products);
        q.build_query_as().fetch_all(inventory).await
    }

    async fn confirmed_besides(
        orders: &MySqlPool,
        product_id: Uuid,
        ids: &[Uuid],
    ) -> sqlx::Result<i64> {
        let mut q =
            query("SELECT COUNT(*) FROM orders WHERE status = 'confirmed' AND product_id = ");
        q.push_bind(product_id);
        if !ids.is_empty() {
            q.push(" AND id NOT IN ");
            push_list(&mut q, ids);
        }
        q.build_query_scalar().fetch_one(orders).await
    }

    async fn payments(payments: &MySqlPool, ids: &[Uuid]) -> sqlx::Result<(i64, i64)> {
        let mut q = query(
            "SELECT COUNT(CASE WHEN status = 'completed' THEN 1 END),
                    COUNT(CASE WHEN status = 'declined' THEN 1 END)
             FROM payments WHERE order_id IN ",
        );
        push_list(&mut q, ids);
        q.build_query_as().fetch_one(payments).await
    }

    async fn confirmation_seconds(orders: &MySqlPool, ids: &[Uuid]) -> sqlx::Result<Vec<f64>> {
        let mut q = query(
            "SELECT TIMESTAMPDIFF(MICROSECOND, created_at, finished_at) / 1e6 FROM orders
             WHERE status = 'confirmed' AND id IN ",
        );
        push_list(&mut q, ids);
        q.build_query_scalar().fetch_all(orders).await
    }
}
