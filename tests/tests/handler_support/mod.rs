//! Shared fixtures of the `handler_*` tests: a tiny orders domain with
//! hand-written `DomainEvent` impls, its table, and outbox row readers.

#![allow(dead_code)] // each test binary uses a different subset

use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use txoutbox_core::DomainEvent;
use uuid::Uuid;

pub(crate) const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct OrderCreated {
    pub event_id: Uuid,
    pub order_id: i64,
    pub amount: i64,
}

impl DomainEvent for OrderCreated {
    const TOPIC: &'static str = "order.events";
    const EVENT_TYPE: &'static str = "OrderCreated";
    const AGGREGATE_TYPE: &'static str = "Order";
    const PARTITION_KEY_FIELD: &'static str = "order_id";
    fn event_id(&self) -> Uuid {
        self.event_id
    }
    fn aggregate_id(&self) -> String {
        self.order_id.to_string()
    }
    fn partition_key(&self) -> String {
        self.order_id.to_string()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StockReserved {
    pub event_id: Uuid,
    pub sku: String,
    pub quantity: i32,
}

impl DomainEvent for StockReserved {
    const TOPIC: &'static str = "stock.events";
    const EVENT_TYPE: &'static str = "StockReserved";
    const AGGREGATE_TYPE: &'static str = "Stock";
    const PARTITION_KEY_FIELD: &'static str = "sku";
    fn event_id(&self) -> Uuid {
        self.event_id
    }
    fn aggregate_id(&self) -> String {
        self.sku.clone()
    }
    fn partition_key(&self) -> String {
        self.sku.clone()
    }
}

/// Serializes to a JSON array, which the outbox refuses (payloads are objects).
#[derive(Debug, Serialize)]
pub(crate) struct Malformed(pub Vec<u8>);

impl DomainEvent for Malformed {
    const TOPIC: &'static str = "order.events";
    const EVENT_TYPE: &'static str = "Malformed";
    const AGGREGATE_TYPE: &'static str = "Order";
    const PARTITION_KEY_FIELD: &'static str = "";
    fn event_id(&self) -> Uuid {
        Uuid::nil()
    }
    fn aggregate_id(&self) -> String {
        String::new()
    }
    fn partition_key(&self) -> String {
        String::new()
    }
}

pub(crate) fn order_created(order_id: i64, amount: i64) -> OrderCreated {
    OrderCreated {
        event_id: Uuid::new_v4(),
        order_id,
        amount,
    }
}

pub(crate) fn stock_reserved(sku: &str, quantity: i32) -> StockReserved {
    StockReserved {
        event_id: Uuid::new_v4(),
        sku: sku.to_owned(),
        quantity,
    }
}

/// The application's error type: it only needs `From<txoutbox_core::Error>`
/// (plus `std::error::Error` for retries, which thiserror provides).
#[derive(Debug, thiserror::Error)]
pub(crate) enum AppError {
    #[error(transparent)]
    Outbox(#[from] txoutbox_core::Error),
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("rejected: {0}")]
    Rejected(&'static str),
}

/// Runs the framework migrations and creates the domain tables.
pub(crate) async fn setup(pool: &PgPool) {
    txoutbox_runtime::migrations::run(pool).await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE customers (id bigint PRIMARY KEY);
         CREATE TABLE orders (
             id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             amount bigint NOT NULL,
             -- deferred so a bad customer only fails at COMMIT
             customer_id bigint REFERENCES customers(id) DEFERRABLE INITIALLY DEFERRED);
         INSERT INTO customers VALUES (1);",
    )
    .execute(pool)
    .await
    .unwrap();
}

/// Inserts an order on `conn` and returns its id.
pub(crate) async fn insert_order(
    conn: &mut sqlx::PgConnection,
    amount: i64,
    customer_id: i64,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("INSERT INTO orders (amount, customer_id) VALUES ($1, $2) RETURNING id")
        .bind(amount)
        .bind(customer_id)
        .fetch_one(conn)
        .await
}

pub(crate) async fn count(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(pool)
        .await
        .unwrap()
}

/// One `outbox_event` row, every column the write path sets or defaults.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct OutboxRow {
    pub id: i64,
    pub event_id: Uuid,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub event_type: String,
    pub payload: serde_json::Value,
    pub topic: String,
    pub partition_key: String,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub published_at: Option<chrono::DateTime<chrono::Utc>>,
    pub traceparent: Option<String>,
    pub attempts: i32,
}

pub(crate) async fn outbox_rows(pool: &PgPool) -> Vec<OutboxRow> {
    sqlx::query_as(
        "SELECT id, event_id, aggregate_type, aggregate_id, event_type, payload, topic,
                partition_key, created_at, published_at, traceparent, attempts
         FROM outbox_event ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Asserts `row` is the outbox row of `event`, payload equal to its serde output.
pub(crate) fn assert_row_is<E: DomainEvent>(row: &OutboxRow, event: &E) {
    assert_eq!(row.event_id, event.event_id());
    assert_eq!(row.aggregate_type, E::AGGREGATE_TYPE);
    assert_eq!(row.aggregate_id, event.aggregate_id());
    assert_eq!(row.event_type, E::EVENT_TYPE);
    assert_eq!(row.payload, serde_json::to_value(event).unwrap());
    assert_eq!(row.topic, E::TOPIC);
    assert_eq!(row.partition_key, event.partition_key());
    assert_eq!(row.published_at, None);
    assert_eq!(row.attempts, 0);
}
