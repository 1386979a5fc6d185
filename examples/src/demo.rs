//! The demo: both services on embedded defaults, orders driven through HTTP,
//! live progress, and a summary that proves nothing was lost.

use std::net::SocketAddr;
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
    /// Base `EXAMPLE_DATABASE_URL`; the services use `<db>_orders` and `<db>_payments`.
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
    /// How long the warm-up order (not counted above) took to be paid,
    /// mostly the consumers joining their groups; `None` if it was not.
    pub warm_up: Option<Duration>,
    /// Commit-to-handled latency of the orders handled so far.
    pub latency: DemoLatency,
}

/// Commit-to-handled latency of a run's orders, by the database clock (both
/// services' databases are on one server), each from the order's transaction
/// (`created_at` of the order and its `OrderCreated`) to the transaction that
/// handled the event (its `processed_at`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DemoLatency {
    /// To the payments consumer's handling of `OrderCreated`.
    pub order_created_handled: Option<Percentiles>,
    /// Round trip: to the orders service's handling of the `PaymentCompleted`
    /// that marked the order paid.
    pub order_paid: Option<Percentiles>,
}

/// The median and 99th percentile of a set of latencies (nearest rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Percentiles {
    /// How many latencies.
    pub samples: usize,
    /// The median.
    pub p50: Duration,
    /// The 99th percentile.
    pub p99: Duration,
}

impl Percentiles {
    /// Of `latencies` (any order); `None` for none.
    pub fn of(mut latencies: Vec<Duration>) -> Option<Self> {
        if latencies.is_empty() {
            return None;
        }
        latencies.sort();
        let rank = |q: f64| {
            let index = (q * latencies.len() as f64).ceil() as usize;
            latencies[index.clamp(1, latencies.len()) - 1]
        };
        Some(Self {
            samples: latencies.len(),
            p50: rank(0.50),
            p99: rank(0.99),
        })
    }
}

impl std::fmt::Display for Percentiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        write!(
            f,
            "p50 {:.1} ms, p99 {:.1} ms ({} orders)",
            ms(self.p50),
            ms(self.p99),
            self.samples
        )
    }
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
        writeln!(f, "elapsed                  {:.1?}", self.elapsed)?;
        match self.warm_up {
            Some(took) => writeln!(f, "warm-up order paid after {took:.1?} (not counted above)")?,
            None => writeln!(f, "warm-up order not paid")?,
        }
        let shown = |latency: Option<Percentiles>| {
            latency.map_or_else(|| "none handled".to_owned(), |l| l.to_string())
        };
        writeln!(f, "commit-to-handled latency (database clock):")?;
        writeln!(
            f,
            "  OrderCreated handled by payments  {}",
            shown(self.latency.order_created_handled)
        )?;
        write!(
            f,
            "  order paid (round trip)           {}",
            shown(self.latency.order_paid)
        )
    }
}

/// Runs the whole system against `broker` and returns the figures.
pub async fn run(config: &DemoConfig, broker: &Broker) -> Result<DemoSummary, ServiceError> {
    let demo = Demo::start(config, broker).await?;
    let summary = demo.drive_and_wait().await;
    // Graceful stop: the orders service first (no new HTTP requests), then payments.
    let stopped = demo.shutdown().await;
    let summary = summary?;
    stopped?;
    Ok(summary)
}

/// Both services running against their databases; [`run`] in steps, for
/// callers that look at the running services (their `/metrics` and
/// `/health/*`) before stopping them.
pub struct Demo {
    config: DemoConfig,
    orders_db: PgPool,
    payments_db: PgPool,
    payments_group: String,
    orders: OrdersService,
    payments: PaymentsService,
}

impl std::fmt::Debug for Demo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Demo")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Demo {
    /// Creates and migrates the databases, creates the topics and starts both
    /// services (their HTTP servers on ephemeral ports of 127.0.0.1).
    pub async fn start(config: &DemoConfig, broker: &Broker) -> Result<Self, ServiceError> {
        let orders_db = connect_database(&config.database_url, "_orders").await?;
        let payments_db = connect_database(&config.database_url, "_payments").await?;
        crate::orders::migrate(&orders_db).await?;
        crate::payments::migrate(&payments_db).await?;

        let servers = broker.bootstrap_servers();
        create_topics(broker, 3).await?;
        let tuning = Tuning::default();
        let payments_group = format!("payments{}", config.group_suffix);
        let payments = PaymentsService::start(
            payments_db.clone(),
            &servers,
            &payments_group,
            ephemeral_listener().await?,
            &tuning,
        )
        .await?;
        let orders = OrdersService::start(
            orders_db.clone(),
            &servers,
            &format!("orders{}", config.group_suffix),
            ephemeral_listener().await?,
            &tuning,
        )
        .await?;
        Ok(Self {
            config: config.clone(),
            orders_db,
            payments_db,
            payments_group,
            orders,
            payments,
        })
    }

    /// Where the orders service's HTTP API listens.
    pub fn orders_addr(&self) -> SocketAddr {
        self.orders.addr
    }

    /// Where the payments service's probes listen.
    pub fn payments_addr(&self) -> SocketAddr {
        self.payments.addr
    }

    /// Places one warm-up order and waits until it is paid (the consumers
    /// have then joined their groups), then drives the configured orders
    /// through `POST /orders` and waits until every one is paid (or the
    /// timeout), printing progress if configured.
    pub async fn drive_and_wait(&self) -> Result<DemoSummary, ServiceError> {
        let config = &self.config;
        let base = format!("http://{}", self.orders.addr);
        let warm_up = self.warm_up(&base).await?;
        let started = Instant::now();
        let ids = drive_orders(&base, config).await;
        let mut last_print = Instant::now();
        loop {
            let mut summary = count(
                &self.orders_db,
                &self.payments_db,
                &self.payments_group,
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
                summary.warm_up = warm_up;
                summary.latency = latency(
                    &self.orders_db,
                    &self.payments_db,
                    &self.payments_group,
                    &ids,
                )
                .await?;
                return Ok(summary);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// One order, not counted in the run, until it is paid: so that the
    /// run's latencies are those of running services, not of consumer groups
    /// still joining. How long it took, or `None` if it was not paid within
    /// the timeout (the run then goes on and reports what it sees).
    async fn warm_up(&self, base: &str) -> Result<Option<Duration>, ServiceError> {
        let started = Instant::now();
        let warm_up = DemoConfig {
            orders: 1,
            ..self.config.clone()
        };
        let Some(id) = drive_orders(base, &warm_up).await.pop() else {
            return Ok(None);
        };
        while started.elapsed() < self.config.timeout {
            let paid: bool =
                sqlx::query_scalar("SELECT payment_status = 'paid' FROM orders WHERE id = $1")
                    .bind(id)
                    .fetch_one(&self.orders_db)
                    .await
                    .map_err(ServiceError::Database)?;
            if paid {
                if self.config.progress_every.is_some() {
                    eprintln!(
                        "[{:>5.1}s] warm-up order paid: both consumers have joined their groups",
                        started.elapsed().as_secs_f64()
                    );
                }
                return Ok(Some(started.elapsed()));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(None)
    }

    /// Stops the orders service first (no new HTTP requests), then payments.
    pub async fn shutdown(self) -> Result<(), ServiceError> {
        let orders = self.orders.shutdown().await;
        let payments = self.payments.shutdown().await;
        orders?;
        payments
    }
}

async fn ephemeral_listener() -> Result<TcpListener, ServiceError> {
    TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(ServiceError::Listen)
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
        warm_up: None,
        latency: DemoLatency::default(),
    })
}

/// Commit-to-handled latencies of the orders `ids` (see [`DemoLatency`]).
async fn latency(
    orders_db: &PgPool,
    payments_db: &PgPool,
    payments_group: &str,
    ids: &[Uuid],
) -> Result<DemoLatency, ServiceError> {
    let db = ServiceError::Database;
    let keys: Vec<String> = ids.iter().map(Uuid::to_string).collect();
    // Epoch seconds: the two sides come from two databases of one server.
    let created: Vec<(Uuid, f64)> = sqlx::query_as(
        "SELECT event_id, EXTRACT(EPOCH FROM created_at)::float8 FROM outbox_event
         WHERE event_type = 'OrderCreated' AND partition_key = ANY($1)",
    )
    .bind(&keys)
    .fetch_all(orders_db)
    .await
    .map_err(db)?;
    let event_ids: Vec<Uuid> = created.iter().map(|(id, _)| *id).collect();
    let handled: std::collections::HashMap<Uuid, f64> = sqlx::query_as(
        "SELECT event_id, EXTRACT(EPOCH FROM processed_at)::float8 FROM processed_event
         WHERE consumer_group = $1 AND event_id = ANY($2)",
    )
    .bind(payments_group)
    .bind(&event_ids)
    .fetch_all(payments_db)
    .await
    .map_err(db)?
    .into_iter()
    .collect();
    let seconds = |secs: f64| Duration::from_secs_f64(secs.max(0.0));
    let order_created_handled = created
        .iter()
        .filter_map(|(id, created_at)| Some(seconds(handled.get(id)? - created_at)))
        .collect();
    let order_paid: Vec<f64> = sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM i.processed_at - o.created_at)::float8
         FROM orders o JOIN inbox_event i
           ON i.partition_key = o.id::text AND i.event_type = 'PaymentCompleted' AND i.processed
         WHERE o.id = ANY($1)",
    )
    .bind(ids)
    .fetch_all(orders_db)
    .await
    .map_err(db)?;
    Ok(DemoLatency {
        order_created_handled: Percentiles::of(order_created_handled),
        order_paid: Percentiles::of(order_paid.into_iter().map(seconds).collect()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_take_the_nearest_rank() {
        assert_eq!(Percentiles::of(Vec::new()), None);
        let ms = Duration::from_millis;
        let one = Percentiles::of(vec![ms(7)]).unwrap();
        assert_eq!((one.samples, one.p50, one.p99), (1, ms(7), ms(7)));
        let hundred = Percentiles::of((1..=100).rev().map(ms).collect()).unwrap();
        assert_eq!((hundred.p50, hundred.p99), (ms(50), ms(99)));
        assert_eq!(hundred.to_string(), "p50 50.0 ms, p99 99.0 ms (100 orders)");
    }
}
