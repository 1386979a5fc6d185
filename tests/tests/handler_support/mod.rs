//! Shared fixtures of the `handler_*` tests: a tiny orders domain with
//! derived `DomainEvent`s, its table, and outbox row readers (row counting
//! is `txoutbox-testkit`'s).

#![allow(dead_code)] // each test binary uses a different subset

use schemars::JsonSchema;
use serde::{Deserialize, Serialize, Serializer};
use sqlx::PgPool;
use txoutbox_core::DomainEvent;
use uuid::Uuid;

pub(crate) const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, DomainEvent)]
#[event(topic = "order.events", aggregate = "Order")]
pub(crate) struct OrderCreated {
    pub event_id: Uuid,
    #[partition_key]
    pub order_id: i64,
    pub amount: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, DomainEvent)]
#[event(topic = "stock.events", aggregate = "Stock")]
pub(crate) struct StockReserved {
    pub event_id: Uuid,
    #[partition_key]
    pub sku: String,
    pub quantity: i32,
}

/// Serializes to a JSON array (its `bytes`, by the `Serialize` impl below),
/// which the outbox refuses (payloads are objects).
#[derive(Debug, JsonSchema, DomainEvent)]
#[event(topic = "order.events", aggregate = "Order")]
pub(crate) struct Malformed {
    pub event_id: Uuid,
    #[partition_key]
    pub order_id: i64,
    pub bytes: Vec<u8>,
}

impl Malformed {
    pub(crate) fn new(bytes: Vec<u8>) -> Self {
        Self {
            event_id: Uuid::new_v4(),
            order_id: 1,
            bytes,
        }
    }
}

impl Serialize for Malformed {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.bytes.serialize(serializer)
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

#[allow(unused_imports)] // each test binary uses a different subset
pub(crate) use txoutbox_testkit::count_rows as count;

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

/// Asserts `row` is the outbox row of `event`, payload equal to its serde
/// output named by its type (the framework adds `event_type`).
pub(crate) fn assert_row_is<E: DomainEvent>(row: &OutboxRow, event: &E) {
    assert_eq!(row.event_id, event.event_id());
    assert_eq!(row.aggregate_type, E::AGGREGATE_TYPE);
    assert_eq!(row.aggregate_id, event.aggregate_id());
    assert_eq!(row.event_type, E::EVENT_TYPE);
    let mut expected = serde_json::to_value(event).unwrap();
    expected["event_type"] = E::EVENT_TYPE.into();
    assert_eq!(row.payload, expected);
    assert_eq!(row.topic, E::TOPIC);
    assert_eq!(row.partition_key, event.partition_key());
    assert_eq!(row.published_at, None);
    assert_eq!(row.attempts, 0);
}
