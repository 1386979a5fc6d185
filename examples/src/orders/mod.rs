//! The orders service: `POST /orders` runs an `#[outbox_handler]` that inserts
//! the order and records `OrderCreated`; a relay publishes it; an inbox-mode
//! consumer runs the order fulfilment saga ([`crate::fulfilment`]): it
//! receives the service's own `OrderCreated`, the inventory's and the
//! payments' answers and its own timeouts, and confirms or cancels the order.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::{PgPool, Postgres, Transaction};
use txoutbox_core::{Events, outbox_handler};
use txoutbox_runtime::consumer::{ConsumerBuilder, Mode};
use uuid::Uuid;

use crate::events::OrderCreated;
use crate::fulfilment::OrderFulfilment;
use crate::http_error::ApiError;
use crate::service::{RunningService, ServiceError, ServiceKind, Tuning};

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

pub use crate::orders_error::OrdersError;

/// Inserts the order and records `OrderCreated`, in one transaction.
#[outbox_handler]
pub async fn create_order(
    tx: &mut Transaction<'_, Postgres>,
    events: &mut Events,
    cmd: CreateOrder,
) -> Result<Uuid, OrdersError> {
    let order_id = Uuid::now_v7();
    let created_at: DateTime<Utc> = sqlx::query_scalar(
        "INSERT INTO orders (id, customer_id, product_id, amount) VALUES ($1, $2, $3, $4)
         RETURNING created_at",
    )
    .bind(order_id)
    .bind(cmd.customer_id)
    .bind(cmd.product_id)
    .bind(cmd.amount)
    .fetch_one(&mut **tx)
    .await?;
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
pub async fn migrate(pool: &PgPool) -> Result<(), ServiceError> {
    txoutbox_runtime::migrations::run(pool).await?;
    sqlx::raw_sql(include_str!("../migrations/orders.sql"))
        .execute(pool)
        .await
        .map_err(ServiceError::Database)?;
    Ok(())
}

/// The HTTP API (without the probes of [`crate::observability::router`]).
pub fn router(pool: PgPool) -> Router {
    Router::new()
        .route("/orders", post(post_order))
        .route("/orders/{id}", get(get_order))
        .with_state(pool)
}

async fn post_order(
    State(pool): State<PgPool>,
    body: Result<Json<Value>, axum::extract::rejection::JsonRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let Json(body) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let cmd = parse_create_order(&body)?;
    let order_id = create_order(&pool, cmd).await.map_err(ApiError::internal)?;
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

async fn get_order(
    State(pool): State<PgPool>,
    Path(id): Path<String>,
) -> Result<Json<OrderView>, ApiError> {
    let id = Uuid::parse_str(&id).map_err(|_| {
        ApiError::invalid_field("id", format!("order id must be a UUID, got {id:?}"))
    })?;
    let order = sqlx::query_as::<_, OrderView>(
        "SELECT id AS order_id, customer_id, product_id, amount, payment_status, status,
                cancel_reason, created_at, paid_at
         FROM orders WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(&pool)
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
pub type OrdersService = RunningService<Orders>;

/// What makes the orders service (see [`OrdersService`]).
#[derive(Debug)]
pub struct Orders;

impl ServiceKind for Orders {
    const NAME: &'static str = "OrdersService";

    fn routes(pool: &PgPool) -> axum::Router {
        router(pool.clone())
    }

    fn consumer(builder: ConsumerBuilder, tuning: &Tuning) -> ConsumerBuilder {
        builder
            .saga::<OrderFulfilment>()
            .mode(Mode::Inbox)
            .processor_poll_interval(tuning.poll_interval)
    }
}
