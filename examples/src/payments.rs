//! The payments service: a dedup-mode consumer of `order.events` "charges"
//! each order and records `PaymentCompleted` through its own outbox, in the
//! same transaction as the dedup row; its relay publishes it. A small HTTP
//! server answers `/metrics`, `/health/live` and `/health/ready`.

use std::net::SocketAddr;

use chrono::Utc;
use sqlx::{PgPool, Postgres, Transaction};
use tokio::net::TcpListener;
use txoutbox_core::Events;
use txoutbox_runtime::consumer::{Consumer, event_handler};
use txoutbox_runtime::relay::Relay;
use uuid::Uuid;

use crate::events::{OrderCreated, PaymentCompleted};
use crate::service::{ServiceError, Tasks, Tuning, consumer_config, kafka_config};

/// Errors of the payment handler.
#[derive(Debug, thiserror::Error)]
pub enum PaymentsError {
    /// The outbox write path failed.
    #[error(transparent)]
    Outbox(#[from] txoutbox_core::Error),
    /// The handler's own statements failed.
    #[error("database error: {}", txoutbox_core::DbErrorDisplay(.0))]
    Database(#[from] sqlx::Error),
}

/// Charges the order once and records `PaymentCompleted`.
///
/// Runs inside the consumer's transaction, so the payment row, the outbox row
/// of `PaymentCompleted` and the `processed_event` dedup row commit together.
#[event_handler]
async fn on_order_created(
    tx: &mut Transaction<'_, Postgres>,
    event: OrderCreated,
    events: &mut Events,
) -> Result<(), PaymentsError> {
    let payment_id = Uuid::now_v7();
    let inserted = sqlx::query(
        "INSERT INTO payments (id, order_id, amount) VALUES ($1, $2, $3)
         ON CONFLICT (order_id) DO NOTHING",
    )
    .bind(payment_id)
    .bind(event.order_id)
    .bind(event.amount)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    if inserted == 0 {
        // Already charged (a replay, or the same order under another event id).
        return Ok(());
    }
    events.record(PaymentCompleted {
        event_id: Uuid::now_v7(),
        payment_id,
        order_id: event.order_id,
        amount: event.amount,
        completed_at: Utc::now(),
    });
    Ok(())
}

/// Creates the payments schema: the framework's tables and `payments`.
pub async fn migrate(pool: &PgPool) -> Result<(), ServiceError> {
    txoutbox_runtime::migrations::run(pool).await?;
    sqlx::raw_sql(include_str!("../migrations/payments.sql"))
        .execute(pool)
        .await
        .map_err(ServiceError::Database)?;
    Ok(())
}

/// A running payments service: its consumer, its relay and the HTTP server
/// of its probes.
pub struct PaymentsService {
    /// Where the HTTP API (with `/metrics` and `/health/*`) listens.
    pub addr: SocketAddr,
    tasks: Tasks,
}

impl std::fmt::Debug for PaymentsService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PaymentsService")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl PaymentsService {
    /// Starts the dedup-mode consumer of `order.events` (group `group_id`),
    /// the relay of the payments outbox, and the probes ([`observability`])
    /// on `listener`.
    pub async fn start(
        pool: PgPool,
        bootstrap_servers: &str,
        group_id: &str,
        listener: TcpListener,
        tuning: &Tuning,
    ) -> Result<Self, ServiceError> {
        let relay = Relay::builder(pool.clone(), kafka_config(bootstrap_servers))
            .poll_interval(tuning.poll_interval)
            .spawn()?;
        let consumer =
            Consumer::builder(pool.clone(), consumer_config(bootstrap_servers), group_id)
                .handler(on_order_created)
                .build()?
                .spawn();
        let tasks = Tasks::serve(
            pool,
            listener,
            axum::Router::new(),
            (relay, consumer),
            group_id,
            tuning,
        )?;
        Ok(Self {
            addr: tasks.addr(),
            tasks,
        })
    }

    /// Resolves when the relay or the consumer stopped on its own; see
    /// [`crate::service::failure`].
    pub fn failure(&self) -> impl std::future::Future<Output = ServiceError> + Send + 'static {
        self.tasks.failure()
    }

    /// Stops accepting requests, then stops the consumer and the relay, each
    /// finishing what it has in flight.
    pub async fn shutdown(self) -> Result<(), ServiceError> {
        self.tasks.shutdown().await
    }
}
