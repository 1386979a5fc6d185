//! The demo: both services on embedded defaults, orders driven through HTTP,
//! live progress, and a summary that proves nothing was lost.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;
use sqlx::PgPool;
use tokio::net::TcpListener;
use uuid::Uuid;

use crate::orders::OrdersService;
use crate::payments::PaymentsService;
use crate::service::{ServiceError, Tuning, create_topics};
use crate::setup::{Broker, connect_database};

/// What to run.
#[derive(Debug, Clone)]
pub struct DemoConfig {
    /// Base `DATABASE_URL`; the services use `<db>_orders` and `<db>_payments`.
    pub database_url: String,
    /// Orders to create.
    pub orders: usize,
    /// Concurrent HTTP requests.
    pub concurrency: usize,
    /// Give up waiting for payments after this long.
    pub timeout: Duration,
    /// Suffix of the consumer group ids (fresh groups start at the earliest offset).
    pub group_suffix: String,
    /// Print a progress line every this often (`None`: quiet).
    pub progress_every: Option<Duration>,
}

/// Figures of one run, all counted from the databases for this run's orders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DemoSummary {
    /// Orders the driver asked for.
    pub orders_requested: usize,
    /// `201 Created` answers.
    pub orders_created: usize,
    /// `OrderCreated` rows the orders relay marked published.
    pub order_events_published: i64,
    /// Payments the payments service recorded (at most one per order).
    pub payments_completed: i64,
    /// `processed_event` rows of the payments consumer for these orders' events.
    pub order_events_handled: i64,
    /// `PaymentCompleted` rows the payments relay marked published.
    pub payment_events_published: i64,
    /// Inbox rows of the orders service for these orders' payments, processed.
    pub payment_events_handled: i64,
    /// Orders whose `payment_status` is `paid`.
    pub orders_paid: i64,
    /// Wall time until all orders were paid (or the timeout).
    pub elapsed: Duration,
}

impl DemoSummary {
    /// Orders created but not paid.
    pub fn lost(&self) -> i64 {
        self.orders_created as i64 - self.orders_paid
    }

    /// True when every requested order was created, published, paid once and
    /// marked paid.
    pub fn complete(&self) -> bool {
        let created = self.orders_created as i64;
        self.orders_created == self.orders_requested
            && self.order_events_published == created
            && self.payments_completed == created
            && self.order_events_handled == created
            && self.payment_events_published == created
            && self.payment_events_handled == created
            && self.orders_paid == created
    }
}

impl std::fmt::Display for DemoSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "orders requested          {}", self.orders_requested)?;
        writeln!(f, "orders created (HTTP 201) {}", self.orders_created)?;
        writeln!(
            f,
            "OrderCreated published   {}",
            self.order_events_published
        )?;
        writeln!(f, "OrderCreated handled     {}", self.order_events_handled)?;
        writeln!(f, "payments completed       {}", self.payments_completed)?;
        writeln!(
            f,
            "PaymentCompleted published {}",
            self.payment_events_published
        )?;
        writeln!(
            f,
            "PaymentCompleted handled {}",
            self.payment_events_handled
        )?;
        writeln!(f, "orders paid              {}", self.orders_paid)?;
        writeln!(f, "lost                     {}", self.lost())?;
        write!(f, "elapsed                  {:.1?}", self.elapsed)
    }
}

/// Runs the whole system against `broker` and returns the figures.
pub async fn run(config: &DemoConfig, broker: &Broker) -> Result<DemoSummary, ServiceError> {
    let orders_db = connect_database(&config.database_url, "_orders").await?;
    let payments_db = connect_database(&config.database_url, "_payments").await?;
    crate::orders::migrate(&orders_db).await?;
    crate::payments::migrate(&payments_db).await?;

    let servers = broker.bootstrap_servers();
    create_topics(broker, 3).await?;
    let tuning = Tuning::default();
    let payments_group = format!("payments{}", config.group_suffix);
    let payments = PaymentsService::start(payments_db.clone(), &servers, &payments_group, &tuning)?;
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(ServiceError::Listen)?;
    let orders = OrdersService::start(
        orders_db.clone(),
        &servers,
        &format!("orders{}", config.group_suffix),
        listener,
        &tuning,
    )
    .await?;
    let base = format!("http://{}", orders.addr);

    let started = Instant::now();
    let ids = drive_orders(&base, config).await;
    let mut summary;
    let mut last_print = Instant::now();
    loop {
        summary = count(
            &orders_db,
            &payments_db,
            &payments_group,
            config.orders,
            &ids,
            started,
        )
        .await?;
        let done = summary.complete() || started.elapsed() > config.timeout;
        if let Some(every) = config.progress_every
            && (done || last_print.elapsed() >= every)
        {
            last_print = Instant::now();
            eprintln!(
                "[{:>5.1}s] created {}/{} | OrderCreated published {} | payments {} | PaymentCompleted published {} | paid {}",
                started.elapsed().as_secs_f64(),
                summary.orders_created,
                summary.orders_requested,
                summary.order_events_published,
                summary.payments_completed,
                summary.payment_events_published,
                summary.orders_paid,
            );
        }
        if done {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Graceful stop: the orders service first (no new HTTP requests), then payments.
    orders.shutdown().await?;
    payments.shutdown().await?;
    Ok(summary)
}

async fn drive_orders(base: &str, config: &DemoConfig) -> Vec<Uuid> {
    let client = reqwest::Client::new();
    futures::stream::iter(0..config.orders)
        .map(|i| {
            let client = client.clone();
            let url = format!("{base}/orders");
            async move {
                let body = json!({
                    "customer_id": Uuid::new_v4(),
                    "product_id": Uuid::new_v4(),
                    "amount": 100 + i as i64,
                });
                let response = client.post(&url).json(&body).send().await.ok()?;
                if response.status() != reqwest::StatusCode::CREATED {
                    tracing::warn!(status = %response.status(), "order not created");
                    return None;
                }
                let created: serde_json::Value = response.json().await.ok()?;
                created["order_id"].as_str()?.parse::<Uuid>().ok()
            }
        })
        .buffer_unordered(config.concurrency.max(1))
        .filter_map(|id| async move { id })
        .collect()
        .await
}

async fn count(
    orders_db: &PgPool,
    payments_db: &PgPool,
    payments_group: &str,
    requested: usize,
    ids: &[Uuid],
    started: Instant,
) -> Result<DemoSummary, ServiceError> {
    let keys: Vec<String> = ids.iter().map(Uuid::to_string).collect();
    let db = ServiceError::Database;
    let (order_events_published, order_event_ids): (i64, Vec<Uuid>) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE published_at IS NOT NULL),
                coalesce(array_agg(event_id), '{}')
         FROM outbox_event WHERE event_type = 'OrderCreated' AND partition_key = ANY($1)",
    )
    .bind(&keys)
    .fetch_one(orders_db)
    .await
    .map_err(db)?;
    let orders_paid: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM orders WHERE id = ANY($1) AND payment_status = 'paid'",
    )
    .bind(ids)
    .fetch_one(orders_db)
    .await
    .map_err(db)?;
    let payment_events_handled: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM inbox_event
         WHERE processed AND event_type = 'PaymentCompleted' AND partition_key = ANY($1)",
    )
    .bind(&keys)
    .fetch_one(orders_db)
    .await
    .map_err(db)?;
    let payments_completed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM payments WHERE order_id = ANY($1)")
            .bind(ids)
            .fetch_one(payments_db)
            .await
            .map_err(db)?;
    let order_events_handled: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM processed_event WHERE consumer_group = $1 AND event_id = ANY($2)",
    )
    .bind(payments_group)
    .bind(&order_event_ids)
    .fetch_one(payments_db)
    .await
    .map_err(db)?;
    let payment_events_published: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_event WHERE event_type = 'PaymentCompleted'
         AND partition_key = ANY($1) AND published_at IS NOT NULL",
    )
    .bind(&keys)
    .fetch_one(payments_db)
    .await
    .map_err(db)?;
    Ok(DemoSummary {
        orders_requested: requested,
        orders_created: ids.len(),
        order_events_published,
        payments_completed,
        order_events_handled,
        payment_events_published,
        payment_events_handled,
        orders_paid,
        elapsed: started.elapsed(),
    })
}
