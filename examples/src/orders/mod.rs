//! The orders service: `POST /orders` runs an `#[outbox_handler]` that inserts
//! the order and records `OrderCreated`; a relay publishes it; an inbox-mode
//! consumer runs the order fulfilment saga ([`crate::fulfilment`]): it
//! receives the service's own `OrderCreated`, the inventory's and the
//! payments' answers and its own timeouts, and confirms or cancels the order.
//!
//! The API and the command are written once, here, over [`OrdersSql`]: the
//! service's statements (the saga's among them), which each database
//! implements in its own module ([`postgres`], [`mysql`]) with that
//! database's `#[outbox_handler] create_order`.

pub mod mysql;
pub mod postgres;

use std::future::Future;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::{Pool, Transaction};
use txoutbox_core::Events;
use txoutbox_runtime::consumer::{ConsumerBuilder, Mode};
use uuid::Uuid;

use crate::events::OrderCreated;
use crate::fulfilment::FulfilmentSql;
use crate::http_error::ApiError;
use crate::service::{RunningService, ServiceError, ServiceKind, Tuning};

pub use crate::orders_error::OrdersError;
pub use postgres::create_order;

/// The command behind `POST /orders`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateOrder {
    /// Who orders.
    pub customer_id: Uuid,
    /// What is ordered.
    pub product_id: Uuid,
    /// Price in cents, > 0.
    pub amount: i64,
}

/// The orders service's statements on one database (`orders`,
/// `fulfilment_settings`), its `#[outbox_handler]` and its saga there (the
/// saga's own statements are the supertrait [`FulfilmentSql`]).
pub trait OrdersSql: FulfilmentSql {
    /// The orders tables, an idempotent script.
    const SCHEMA: &'static str;

    /// `consumer` with the order fulfilment saga declared for this database
    /// ([`crate::fulfilment::OrderFulfilment`]).
    fn fulfilment(consumer: ConsumerBuilder<Self>) -> ConsumerBuilder<Self>;

    /// Runs this database's `#[outbox_handler] create_order` on `pool`: one
    /// transaction, the order with its `OrderCreated`.
    fn place_order(
        pool: &Pool<Self>,
        cmd: CreateOrder,
    ) -> impl Future<Output = Result<Uuid, OrdersError>> + Send;

    /// Inserts the order; when it was created (the database's clock).
    fn insert_order(
        conn: &mut Self::Connection,
        order_id: Uuid,
        cmd: &CreateOrder,
    ) -> impl Future<Output = sqlx::Result<DateTime<Utc>>> + Send;

    /// The order as `GET /orders/{id}` shows it.
    fn order_view(
        pool: &Pool<Self>,
        order_id: Uuid,
    ) -> impl Future<Output = sqlx::Result<Option<OrderView>>> + Send;

    /// See [`set_stock_timeout`].
    fn set_stock_timeout_ms(
        pool: &Pool<Self>,
        timeout_ms: i32,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;
}

/// Inserts the order and records `OrderCreated`, in the caller's
/// transaction: the body of each database's `#[outbox_handler]
/// create_order` ([`postgres::create_order`], [`mysql::create_order`]).
pub async fn create<DB: OrdersSql>(
    tx: &mut Transaction<'_, DB>,
    events: &mut Events,
    cmd: CreateOrder,
) -> Result<Uuid, OrdersError> {
    let order_id = Uuid::now_v7();
    let created_at = DB::insert_order(tx, order_id, &cmd).await?;
    events.record(OrderCreated {
        event_id: Uuid::now_v7(),
        order_id,
        customer_id: cmd.customer_id,
        product_id: Some(cmd.product_id),
        amount: cmd.amount,
        created_at,
    });
    Ok(order_id)
}

/// Creates the orders schema: the framework's tables (`saga_state` among
/// them), `orders` and `fulfilment_settings`.
pub async fn migrate<DB: OrdersSql>(pool: &Pool<DB>) -> Result<(), ServiceError> {
    Ok(DB::migrate(pool, DB::SCHEMA).await?)
}

/// Sets how long the fulfilment saga waits for the inventory's answer.
pub async fn set_stock_timeout<DB: OrdersSql>(
    pool: &Pool<DB>,
    timeout: std::time::Duration,
) -> Result<(), sqlx::Error> {
    let timeout_ms = i32::try_from(timeout.as_millis().max(1)).unwrap_or(i32::MAX);
    DB::set_stock_timeout_ms(pool, timeout_ms).await
}

/// The HTTP API (without the probes of [`crate::observability::router`]).
pub fn router<DB: OrdersSql>(pool: Pool<DB>) -> Router {
    Router::new()
        .route("/orders", post(post_order::<DB>))
        .route("/orders/{id}", get(get_order::<DB>))
        .with_state(pool)
}

async fn post_order<DB: OrdersSql>(
    State(pool): State<Pool<DB>>,
    body: Result<Json<Value>, axum::extract::rejection::JsonRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let Json(body) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let cmd = parse_create_order(&body)?;
    let order_id = DB::place_order(&pool, cmd)
        .await
        .map_err(ApiError::internal)?;
    Ok((
        StatusCode::CREATED,
        Json(serde_json::json!({ "order_id": order_id })),
    ))
}

/// Validates the body of `POST /orders`, naming the first bad field.
pub fn parse_create_order(body: &Value) -> Result<CreateOrder, ApiError> {
    let object = body
        .as_object()
        .ok_or_else(|| ApiError::bad_request("the body must be a JSON object"))?;
    let uuid = |field: &'static str| -> Result<Uuid, ApiError> {
        match object.get(field) {
            None | Some(Value::Null) => Err(ApiError::invalid_field(
                field,
                format!("`{field}` is required"),
            )),
            Some(Value::String(text)) => Uuid::parse_str(text).map_err(|_| {
                ApiError::invalid_field(field, format!("`{field}` must be a UUID, got {text:?}"))
            }),
            Some(other) => Err(ApiError::invalid_field(
                field,
                format!("`{field}` must be a UUID string, got {other}"),
            )),
        }
    };
    let customer_id = uuid("customer_id")?;
    let product_id = uuid("product_id")?;
    let amount = match object.get("amount") {
        None | Some(Value::Null) => {
            return Err(ApiError::invalid_field("amount", "`amount` is required"));
        }
        Some(value) => value.as_i64().filter(|amount| *amount > 0).ok_or_else(|| {
            ApiError::invalid_field(
                "amount",
                format!("`amount` must be a positive integer (cents), got {value}"),
            )
        })?,
    };
    Ok(CreateOrder {
        customer_id,
        product_id,
        amount,
    })
}

/// An order as `GET /orders/{id}` shows it.
#[derive(Debug, Serialize, sqlx::FromRow)]
pub struct OrderView {
    /// The order id.
    pub order_id: Uuid,
    /// Who ordered.
    pub customer_id: Uuid,
    /// What was ordered.
    pub product_id: Uuid,
    /// Price in cents.
    pub amount: i64,
    /// `pending` until `PaymentCompleted` arrives, then `paid`.
    pub payment_status: String,
    /// `pending` while its fulfilment runs, then `confirmed` or `cancelled`.
    pub status: String,
    /// Why it was cancelled: `out_of_stock`, `payment_declined` or
    /// `stock_timeout`.
    pub cancel_reason: Option<String>,
    /// When the order was created.
    pub created_at: DateTime<Utc>,
    /// When it was paid.
    pub paid_at: Option<DateTime<Utc>>,
}

async fn get_order<DB: OrdersSql>(
    State(pool): State<Pool<DB>>,
    Path(id): Path<String>,
) -> Result<Json<OrderView>, ApiError> {
    let id = Uuid::parse_str(&id).map_err(|_| {
        ApiError::invalid_field("id", format!("order id must be a UUID, got {id:?}"))
    })?;
    let order = DB::order_view(&pool, id)
        .await
        .map_err(|e| ApiError::internal(txoutbox_core::DbErrorDisplay(&e)))?;
    order
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("no order {id}")))
}

/// A running orders service: the orders API, its relay (which also moves
/// the saga's timeouts into the outbox when due) and the inbox-mode consumer
/// of the order fulfilment saga (`order.events`, `order.saga`,
/// `inventory.events`, `payment.events`), with the probes.
pub type OrdersService<DB = sqlx::Postgres> = RunningService<Orders, DB>;

/// What makes the orders service (see [`OrdersService`]).
#[derive(Debug)]
pub struct Orders;

impl<DB: OrdersSql> ServiceKind<DB> for Orders {
    const NAME: &'static str = "OrdersService";

    fn routes(pool: &Pool<DB>) -> axum::Router {
        router(pool.clone())
    }

    fn consumer(builder: ConsumerBuilder<DB>, tuning: &Tuning) -> ConsumerBuilder<DB> {
        DB::fulfilment(builder)
            .mode(Mode::Inbox)
            .processor_poll_interval(tuning.poll_interval)
    }
}
