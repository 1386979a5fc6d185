//! The demo: the three services on embedded defaults, orders driven through
//! HTTP, live progress, and a summary that proves every order ended one way
//! or the other, consistently in every service.
//!
//! The orders are of four kinds, by their position in the run (see
//! [`OrderKind`]): most are paid and confirmed; some are over the payments'
//! limit (declined: the saga releases their stock); some are for a product
//! of a slow warehouse that answers after the saga's stock timeout (the saga
//! gives up and releases; the late answer is ignored); some are for a
//! backlogged warehouse that applies reservations after the timeout (the
//! saga's release comes first and leaves a tombstone, the late reservation
//! takes nothing); some are for a scarce product (the first ones get it, the
//! others are cancelled out of stock).
//!
//! The run is the same on PostgreSQL and MariaDB ([`run`] picks the database
//! by the URL's scheme); the figures come from each database's queries,
//! [`DemoSql`], in [`postgres`] and [`mysql`].

pub mod mysql;
pub mod postgres;

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;
use sqlx::{MySql, Pool, Postgres};
use tokio::net::TcpListener;
use uuid::Uuid;

use crate::database::Backend;
use crate::fulfilment::OrderFulfilment;
use crate::inventory::{InventoryService, InventorySql};
use crate::orders::{OrdersService, OrdersSql};
use crate::payments::{PaymentsService, PaymentsSql};
use crate::payments_sea_orm::PaymentsOrm;
use crate::service::{ServiceError, Tuning, create_topics};
use crate::setup::Broker;
use txoutbox_runtime::saga::Saga;

/// What to run.
#[derive(Debug, Clone)]
pub struct DemoConfig {
    /// Base `EXAMPLE_DATABASE_URL`; the services use `<db>_orders`,
    /// `<db>_inventory` and `<db>_payments`.
    pub database_url: String,
    /// Orders to create.
    pub orders: usize,
    /// Concurrent HTTP requests.
    pub concurrency: usize,
    /// Give up waiting for the orders to end after this long.
    pub timeout: Duration,
    /// Suffix of the consumer group ids (fresh groups start at the earliest offset).
    pub group_suffix: String,
    /// Print a progress line every this often (`None`: quiet).
    pub progress_every: Option<Duration>,
    /// How long the saga waits for the inventory (the slow warehouse answers
    /// after twice this).
    pub stock_timeout: Duration,
    /// Orders placed per second at most (`None`: as fast as `concurrency`
    /// allows). A saga step costs a few transactions; a burst beyond what
    /// the consumers handle within the stock timeout times orders out.
    pub rate: Option<u32>,
    /// What the payments service's handler is written with.
    pub payments_orm: crate::payments_sea_orm::PaymentsOrm,
}

/// The default [`DemoConfig::stock_timeout`].
pub const DEFAULT_STOCK_TIMEOUT: Duration = Duration::from_millis(2000);

/// Charges above this many cents are declined in the demo.
pub const DECLINE_OVER: i64 = 100_000;

/// What an order of the run is meant to meet, by its position `i`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OrderKind {
    /// A product in stock, an amount the payments accept: confirmed.
    Regular,
    /// An amount over [`DECLINE_OVER`]: declined, its stock released.
    OverLimit,
    /// The slow warehouse's product (reserved at once, answered late): the
    /// saga times out and releases the reservation.
    SlowWarehouse,
    /// The backlogged warehouse's product (reserved late): the saga times
    /// out, its release leaves a tombstone, the reservation takes nothing.
    Backlogged,
    /// The scarce product (stock for half of these orders): confirmed or
    /// cancelled out of stock.
    Scarce,
}

impl OrderKind {
    /// The kind of the run's order number `i`.
    pub fn of(i: usize) -> Self {
        match i % 10 {
            3 => Self::OverLimit,
            6 => Self::SlowWarehouse,
            8 => Self::Scarce,
            9 => Self::Backlogged,
            _ => Self::Regular,
        }
    }

    /// Whether `outcome` is one this kind of order may end with. A stock
    /// timeout is always possible (an inventory slower than the timeout is
    /// what the saga is built for); the summary counts the unplanned ones.
    fn allows(self, outcome: Outcome) -> bool {
        match (self, outcome) {
            (_, Outcome::Pending) => false,
            (_, Outcome::TimedOut) => true,
            (Self::Regular, Outcome::Confirmed) => true,
            (Self::OverLimit, Outcome::Declined) => true,
            (Self::Scarce, Outcome::Confirmed | Outcome::OutOfStock) => true,
            _ => false,
        }
    }
}

/// How an order ended (or not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Pending,
    Confirmed,
    Declined,
    TimedOut,
    OutOfStock,
}

impl Outcome {
    fn of(status: &str, reason: Option<&str>) -> Option<Self> {
        match (status, reason) {
            ("pending", _) => Some(Self::Pending),
            ("confirmed", _) => Some(Self::Confirmed),
            ("cancelled", Some("payment_declined")) => Some(Self::Declined),
            ("cancelled", Some("stock_timeout")) => Some(Self::TimedOut),
            ("cancelled", Some("out_of_stock")) => Some(Self::OutOfStock),
            _ => None,
        }
    }

    /// The saga status this outcome goes with (`crate::fulfilment`).
    fn saga_status(self) -> &'static str {
        match self {
            Self::Pending => "running",
            Self::Confirmed | Self::OutOfStock => "completed",
            Self::Declined | Self::TimedOut => "compensated",
        }
    }
}

/// Figures of one run, all counted from the three databases for this run's
/// orders.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DemoSummary {
    /// Orders the driver asked for.
    pub orders_requested: usize,
    /// `201 Created` answers.
    pub orders_created: usize,
    /// Orders confirmed (stock reserved, paid).
    pub confirmed: i64,
    /// Orders cancelled because the payment was declined.
    pub cancelled_declined: i64,
    /// Orders cancelled because the inventory did not answer in time.
    pub cancelled_timeout: i64,
    /// ... of which were not for the slow or the backlogged warehouse.
    pub unplanned_timeouts: i64,
    /// Orders cancelled out of stock.
    pub cancelled_out_of_stock: i64,
    /// Orders whose saga runs still.
    pub sagas_open: i64,
    /// Sagas ended completed.
    pub sagas_completed: i64,
    /// Sagas ended compensated.
    pub sagas_compensated: i64,
    /// Orders with no saga at all.
    pub sagas_missing: i64,
    /// Orders whose final state does not go with their saga's status, or is
    /// not one their kind may end with.
    pub inconsistent: i64,
    /// `ReserveStock` commands the saga sent / the inventory handled.
    pub reservations_sent: i64,
    /// See [`reservations_sent`](Self::reservations_sent).
    pub reservations_handled: i64,
    /// Compensations (`ReleaseStock`) the sagas sent.
    pub compensations_sent: i64,
    /// Compensations the inventory handled (its dedup rows).
    pub compensations_applied: i64,
    /// ... of which gave reserved stock back.
    pub releases: i64,
    /// ... of which came before the reservation (a tombstone).
    pub tombstones: i64,
    /// ... of which found nothing to give back (the reservation had been
    /// rejected: the saga gave up before the rejection reached it).
    pub nothing_to_release: i64,
    /// Orders released more than once (must be 0).
    pub released_twice: i64,
    /// Releases of a reservation that never happened (must be 0).
    pub released_unreserved: i64,
    /// Answers of the inventory that reached a saga already ended (late
    /// answers after a timeout), ignored.
    pub late_answers_ignored: i64,
    /// Units of the run's products reserved for orders that are not
    /// confirmed, or missing (must be 0).
    pub stock_leaked: i64,
    /// Payments completed / declined by the payments service.
    pub payments_completed: i64,
    /// See [`payments_completed`](Self::payments_completed).
    pub payments_declined: i64,
    /// Wall time until every order ended (or the timeout).
    pub elapsed: Duration,
    /// How long the warm-up order (not counted above) took to be confirmed,
    /// mostly the consumers joining their groups; `None` if it was not.
    pub warm_up: Option<Duration>,
    /// From the order's commit to its confirmation, by the database clock,
    /// for the confirmed orders.
    pub confirmed_latency: Option<Percentiles>,
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
    /// Orders created that did not end (confirmed or cancelled).
    pub fn lost(&self) -> i64 {
        self.orders_created as i64
            - self.confirmed
            - self.cancelled_declined
            - self.cancelled_timeout
            - self.cancelled_out_of_stock
    }

    /// True when every requested order was created and ended consistently:
    /// no saga open or missing, each order's state matching its saga's
    /// status and its kind, every compensation applied exactly once and
    /// only to a reservation that happened (or as a tombstone), no stock
    /// leaked, and one payment answer per order charged.
    pub fn complete(&self) -> bool {
        self.orders_created == self.orders_requested
            && self.lost() == 0
            && self.sagas_open == 0
            && self.sagas_missing == 0
            && self.inconsistent == 0
            && self.sagas_completed + self.sagas_compensated == self.orders_created as i64
            && self.reservations_sent == self.orders_created as i64
            && self.reservations_handled == self.reservations_sent
            && self.compensations_sent == self.sagas_compensated
            && self.compensations_applied == self.compensations_sent
            && self.releases + self.tombstones + self.nothing_to_release
                == self.compensations_applied
            && self.released_twice == 0
            && self.released_unreserved == 0
            && self.stock_leaked == 0
            && self.payments_completed == self.confirmed
            && self.payments_declined == self.cancelled_declined
    }

    /// Whether the run has settled: every order ended, every command and
    /// every late answer handled.
    fn settled(&self) -> bool {
        self.lost() == 0
            && self.sagas_open == 0
            && self.reservations_handled >= self.reservations_sent
            && self.compensations_applied >= self.compensations_sent
            && self.late_answers_ignored >= self.cancelled_timeout
    }
}

impl std::fmt::Display for DemoSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "orders requested             {}", self.orders_requested)?;
        writeln!(f, "orders created (HTTP 201)    {}", self.orders_created)?;
        writeln!(f, "  confirmed                  {}", self.confirmed)?;
        writeln!(
            f,
            "  cancelled, payment declined {}",
            self.cancelled_declined
        )?;
        writeln!(
            f,
            "  cancelled, stock timeout   {} ({} not planned)",
            self.cancelled_timeout, self.unplanned_timeouts
        )?;
        writeln!(
            f,
            "  cancelled, out of stock    {}",
            self.cancelled_out_of_stock
        )?;
        writeln!(f, "  lost                       {}", self.lost())?;
        writeln!(
            f,
            "sagas completed / compensated {} / {}",
            self.sagas_completed, self.sagas_compensated
        )?;
        writeln!(f, "sagas still open             {}", self.sagas_open)?;
        writeln!(f, "sagas missing                {}", self.sagas_missing)?;
        writeln!(f, "orders not matching saga     {}", self.inconsistent)?;
        writeln!(
            f,
            "ReserveStock sent / handled  {} / {}",
            self.reservations_sent, self.reservations_handled
        )?;
        writeln!(
            f,
            "compensations sent / applied {} / {} ({} released, {} tombstones, {} with nothing to release)",
            self.compensations_sent,
            self.compensations_applied,
            self.releases,
            self.tombstones,
            self.nothing_to_release
        )?;
        writeln!(f, "  released twice             {}", self.released_twice)?;
        writeln!(
            f,
            "  released, never reserved   {}",
            self.released_unreserved
        )?;
        writeln!(
            f,
            "late answers ignored         {}",
            self.late_answers_ignored
        )?;
        writeln!(f, "stock units leaked           {}", self.stock_leaked)?;
        writeln!(
            f,
            "payments completed / declined {} / {}",
            self.payments_completed, self.payments_declined
        )?;
        writeln!(f, "elapsed                      {:.1?}", self.elapsed)?;
        match self.warm_up {
            Some(took) => writeln!(
                f,
                "warm-up order confirmed after {took:.1?} (not counted above)"
            )?,
            None => writeln!(f, "warm-up order not confirmed")?,
        }
        write!(
            f,
            "order commit to confirmed, five hops (database clock): {}",
            self.confirmed_latency
                .map_or_else(|| "none confirmed".to_owned(), |l| l.to_string())
        )
    }
}

/// Runs the whole system against `broker` and returns the figures, on the
/// database `config.database_url` names: PostgreSQL (`postgres://`) or
/// MariaDB (`mysql://`, `mariadb://`).
pub async fn run(config: &DemoConfig, broker: &Broker) -> Result<DemoSummary, ServiceError> {
    match Backend::of_url(&config.database_url)? {
        Backend::Postgres => run_on::<Postgres>(config, broker).await,
        Backend::MySql => run_on::<MySql>(config, broker).await,
    }
}

/// [`run`] on database `DB`.
pub async fn run_on<DB: DemoSql>(
    config: &DemoConfig,
    broker: &Broker,
) -> Result<DemoSummary, ServiceError> {
    let demo = Demo::<DB>::start(config, broker).await?;
    let summary = demo.drive_and_wait().await;
    // Graceful stop: the orders service first (no new HTTP requests), then
    // the services it calls.
    let stopped = demo.shutdown().await;
    let summary = summary?;
    stopped?;
    Ok(summary)
}

/// An order of the run as the orders database has it: id, product, status,
/// cancel reason, and its saga's status (if it has a saga).
pub type OrderRow = (Uuid, Uuid, String, Option<String>, Option<String>);

/// The products of one run (fresh ids, so that runs do not share stock).
#[derive(Debug, Clone, Copy)]
struct Products {
    regular: Uuid,
    slow: Uuid,
    backlogged: Uuid,
    scarce: Uuid,
}

/// What the inventory did with the run's compensations, from its ledger
/// (`stock_movement`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Releases {
    /// Releases that gave reserved stock back.
    pub released: i64,
    /// Releases that came before their reservation.
    pub tombstones: i64,
    /// Releases that found nothing to give back.
    pub nothing: i64,
    /// Orders released more than once.
    pub twice: i64,
    /// Releases with no earlier reservation of their order.
    pub unreserved: i64,
}

/// The demo's queries on one database: the figures of the summary, read
/// from the three services' databases (each `&Pool` is the one its name
/// says) for the run's orders. Implemented in [`postgres`] and [`mysql`].
pub trait DemoSql: OrdersSql + InventorySql + PaymentsSql {
    /// The order's status (`pending`, `confirmed`, `cancelled`).
    fn order_status(
        orders: &Pool<Self>,
        order_id: Uuid,
    ) -> impl Future<Output = sqlx::Result<String>> + Send;

    /// Each of `ids` the orders service has: id, product, status, cancel
    /// reason, and the status of its saga of type `saga_type` (if any).
    fn orders_and_sagas(
        orders: &Pool<Self>,
        ids: &[Uuid],
        saga_type: &'static str,
    ) -> impl Future<Output = sqlx::Result<Vec<OrderRow>>> + Send;

    /// The `ReserveStock` and `ReleaseStock` commands of the orders keyed
    /// `keys` in the orders outbox: event type and event id.
    fn commands_sent(
        orders: &Pool<Self>,
        keys: &[String],
    ) -> impl Future<Output = sqlx::Result<Vec<(String, Uuid)>>> + Send;

    /// Which of `event_ids` the inventory's consumer group `group` handled
    /// (its dedup rows).
    fn handled(
        inventory: &Pool<Self>,
        group: &str,
        event_ids: &[Uuid],
    ) -> impl Future<Output = sqlx::Result<Vec<Uuid>>> + Send;

    /// What the inventory's ledger says of the releases of `ids`.
    fn releases(
        inventory: &Pool<Self>,
        ids: &[Uuid],
    ) -> impl Future<Output = sqlx::Result<Releases>> + Send;

    /// Answers of the inventory (processed inbox rows of the orders keyed
    /// `keys`) to orders cancelled by their stock timeout.
    fn late_answers(
        orders: &Pool<Self>,
        keys: &[String],
    ) -> impl Future<Output = sqlx::Result<i64>> + Send;

    /// `(product, available, reserved)` of `products`.
    fn stock(
        inventory: &Pool<Self>,
        products: &[Uuid],
    ) -> impl Future<Output = sqlx::Result<Vec<(Uuid, i32, i32)>>> + Send;

    /// Confirmed orders of `product_id` other than `ids` (the warm-up order).
    fn confirmed_besides(
        orders: &Pool<Self>,
        product_id: Uuid,
        ids: &[Uuid],
    ) -> impl Future<Output = sqlx::Result<i64>> + Send;

    /// `(completed, declined)` payments of `ids`.
    fn payments(
        payments: &Pool<Self>,
        ids: &[Uuid],
    ) -> impl Future<Output = sqlx::Result<(i64, i64)>> + Send;

    /// Seconds from each confirmed order's creation to its confirmation,
    /// by the database's clock, for `ids`.
    fn confirmation_seconds(
        orders: &Pool<Self>,
        ids: &[Uuid],
    ) -> impl Future<Output = sqlx::Result<Vec<f64>>> + Send;
}

/// The databases of the three services.
#[derive(Debug)]
struct Databases<DB: sqlx::Database> {
    orders: Pool<DB>,
    inventory: Pool<DB>,
    payments: Pool<DB>,
}

/// The three services running against their databases on `DB`
/// (PostgreSQL unless `Demo::<MySql>`); [`run`] in steps, for callers that
/// look at the running services (their `/metrics` and `/health/*`) before
/// stopping them.
pub struct Demo<DB: DemoSql = Postgres> {
    config: DemoConfig,
    db: Databases<DB>,
    inventory_group: String,
    products: Products,
    /// The initial stock of each product.
    stocked: HashMap<Uuid, i32>,
    orders: OrdersService<DB>,
    inventory: InventoryService<DB>,
    payments: PaymentsService<DB>,
}

impl<DB: DemoSql> std::fmt::Debug for Demo<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Demo")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<DB: DemoSql> Demo<DB> {
    /// Creates and migrates the databases, sets the saga's timeout, the
    /// payments' limit and the run's stock, creates the topics and starts
    /// the three services (their HTTP servers on ephemeral ports of
    /// 127.0.0.1), on `DB`: `config.database_url` must name that database.
    pub async fn start(config: &DemoConfig, broker: &Broker) -> Result<Self, ServiceError> {
        let backend = Backend::of_url(&config.database_url)?;
        if backend != DB::BACKEND {
            return Err(ServiceError::Unsupported(format!(
                "the demo on {} was given a {backend} URL",
                DB::BACKEND
            )));
        }
        if DB::BACKEND == Backend::MySql && config.payments_orm == PaymentsOrm::SeaOrm {
            return Err(ServiceError::Unsupported(
                "--payments-orm sea-orm runs on PostgreSQL only: on MariaDB the payments \
                 service's handler is written with sqlx (leave the option out)"
                    .into(),
            ));
        }
        let db = Databases {
            orders: DB::connect(&config.database_url, "_orders").await?,
            inventory: DB::connect(&config.database_url, "_inventory").await?,
            payments: DB::connect(&config.database_url, "_payments").await?,
        };
        crate::orders::migrate(&db.orders).await?;
        crate::inventory::migrate(&db.inventory).await?;
        crate::payments::migrate(&db.payments).await?;

        crate::orders::set_stock_timeout(&db.orders, config.stock_timeout)
            .await
            .map_err(ServiceError::Database)?;
        crate::payments::set_decline_over(&db.payments, DECLINE_OVER)
            .await
            .map_err(ServiceError::Database)?;
        let products = Products {
            regular: Uuid::now_v7(),
            slow: Uuid::now_v7(),
            backlogged: Uuid::now_v7(),
            scarce: Uuid::now_v7(),
        };
        let planned = |kind| {
            (0..config.orders)
                .filter(|&i| OrderKind::of(i) == kind)
                .count()
        };
        let units = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
        let stocked = HashMap::from([
            // Every order of the run and the warm-up order.
            (products.regular, units(config.orders + 1)),
            (products.slow, units(planned(OrderKind::SlowWarehouse))),
            (products.backlogged, units(planned(OrderKind::Backlogged))),
            (products.scarce, units(planned(OrderKind::Scarce) / 2)),
        ]);
        for (&product, &available) in &stocked {
            let delay = if product == products.slow {
                config.stock_timeout * 2
            } else {
                Duration::ZERO
            };
            crate::inventory::stock_product(&db.inventory, product, available, delay)
                .await
                .map_err(ServiceError::Database)?;
        }
        crate::inventory::backlog_product(
            &db.inventory,
            products.backlogged,
            config.stock_timeout * 2,
        )
        .await
        .map_err(ServiceError::Database)?;

        let servers = broker.bootstrap_servers();
        create_topics(broker, 3).await?;
        let tuning = Tuning {
            payments_orm: config.payments_orm,
            ..Tuning::default()
        };
        let inventory_group = format!("inventory{}", config.group_suffix);
        let payments = PaymentsService::<DB>::start(
            db.payments.clone(),
            &servers,
            &format!("payments{}", config.group_suffix),
            ephemeral_listener().await?,
            &tuning,
        )
        .await?;
        let inventory = InventoryService::<DB>::start(
            db.inventory.clone(),
            &servers,
            &inventory_group,
            ephemeral_listener().await?,
            &tuning,
        )
        .await?;
        let orders = OrdersService::<DB>::start(
            db.orders.clone(),
            &servers,
            &format!("orders{}", config.group_suffix),
            ephemeral_listener().await?,
            &tuning,
        )
        .await?;
        Ok(Self {
            config: config.clone(),
            db,
            inventory_group,
            products,
            stocked,
            orders,
            inventory,
            payments,
        })
    }

    /// Where the orders service's HTTP API listens.
    pub fn orders_addr(&self) -> SocketAddr {
        self.orders.addr
    }

    /// Where the inventory service's probes listen.
    pub fn inventory_addr(&self) -> SocketAddr {
        self.inventory.addr
    }

    /// Where the payments service's probes listen.
    pub fn payments_addr(&self) -> SocketAddr {
        self.payments.addr
    }

    /// The orders database (for tests that look further).
    pub fn orders_db(&self) -> &Pool<DB> {
        &self.db.orders
    }

    /// The inventory database (for tests that look further).
    pub fn inventory_db(&self) -> &Pool<DB> {
        &self.db.inventory
    }

    /// The payments database (for tests that look further).
    pub fn payments_db(&self) -> &Pool<DB> {
        &self.db.payments
    }

    /// Places one warm-up order and waits until it is confirmed (the
    /// consumers have then joined their groups), then drives the configured
    /// orders through `POST /orders` and waits until every one has ended
    /// and every command and late answer is handled (or the timeout),
    /// printing progress if configured.
    pub async fn drive_and_wait(&self) -> Result<DemoSummary, ServiceError> {
        let config = &self.config;
        let base = format!("http://{}", self.orders.addr);
        let warm_up = self.warm_up(&base).await?;
        let started = Instant::now();
        let plan: Vec<(OrderKind, Uuid, i64)> = (0..config.orders)
            .map(|i| {
                let kind = OrderKind::of(i);
                let small = 100 + (i % 1000) as i64;
                match kind {
                    OrderKind::Regular => (kind, self.products.regular, small),
                    OrderKind::OverLimit => (kind, self.products.regular, DECLINE_OVER + small),
                    OrderKind::SlowWarehouse => (kind, self.products.slow, small),
                    OrderKind::Backlogged => (kind, self.products.backlogged, small),
                    OrderKind::Scarce => (kind, self.products.scarce, small),
                }
            })
            .collect();
        let orders = drive_orders(&base, &plan, config.concurrency, config.rate).await;
        let mut last_print = Instant::now();
        loop {
            let mut summary = self.count(&orders, started).await?;
            let done = summary.settled() || started.elapsed() > config.timeout;
            if let Some(every) = config.progress_every
                && (done || last_print.elapsed() >= every)
            {
                last_print = Instant::now();
                eprintln!(
                    "[{:>5.1}s] created {}/{} | confirmed {} | declined {} | timed out {} | out of stock {} | sagas open {} | compensations {}/{} applied",
                    started.elapsed().as_secs_f64(),
                    summary.orders_created,
                    summary.orders_requested,
                    summary.confirmed,
                    summary.cancelled_declined,
                    summary.cancelled_timeout,
                    summary.cancelled_out_of_stock,
                    summary.sagas_open,
                    summary.compensations_applied,
                    summary.compensations_sent,
                );
            }
            if done {
                summary.warm_up = warm_up;
                return Ok(summary);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// One order, not counted in the run, until it is confirmed: so that the
    /// run's timings are those of running services, not of consumer groups
    /// still joining. How long it took, or `None` if it did not end
    /// confirmed within the timeout (the run then goes on and reports what
    /// it sees).
    async fn warm_up(&self, base: &str) -> Result<Option<Duration>, ServiceError> {
        let started = Instant::now();
        let plan = [(OrderKind::Regular, self.products.regular, 100)];
        let Some((id, _)) = drive_orders(base, &plan, 1, None).await.pop() else {
            return Ok(None);
        };
        while started.elapsed() < self.config.timeout {
            let status = DB::order_status(&self.db.orders, id)
                .await
                .map_err(ServiceError::Database)?;
            if status == "confirmed" {
                if self.config.progress_every.is_some() {
                    eprintln!(
                        "[{:>5.1}s] warm-up order confirmed: the consumers have joined their groups",
                        started.elapsed().as_secs_f64()
                    );
                }
                return Ok(Some(started.elapsed()));
            }
            if status != "pending" {
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(None)
    }

    /// Stops the orders service first (no new HTTP requests, no new
    /// commands), then the inventory and the payments.
    pub async fn shutdown(self) -> Result<(), ServiceError> {
        let orders = self.orders.shutdown().await;
        let inventory = self.inventory.shutdown().await;
        let payments = self.payments.shutdown().await;
        orders?;
        inventory?;
        payments
    }

    /// The figures of `orders` as the three databases show them now.
    async fn count(
        &self,
        orders: &[(Uuid, OrderKind)],
        started: Instant,
    ) -> Result<DemoSummary, ServiceError> {
        let db = ServiceError::Database;
        let ids: Vec<Uuid> = orders.iter().map(|(id, _)| *id).collect();
        let keys: Vec<String> = ids.iter().map(Uuid::to_string).collect();
        let kinds: HashMap<Uuid, OrderKind> = orders.iter().copied().collect();
        let mut summary = DemoSummary {
            orders_requested: self.config.orders,
            orders_created: orders.len(),
            elapsed: started.elapsed(),
            ..DemoSummary::default()
        };

        // Each order's state and its saga's status.
        // The saga has the same name on both databases.
        let saga_type = <OrderFulfilment as Saga>::NAME;
        let rows = DB::orders_and_sagas(&self.db.orders, &ids, saga_type)
            .await
            .map_err(db)?;
        let mut confirmed_per_product: HashMap<Uuid, i64> = HashMap::new();
        for (id, product, status, reason, saga) in &rows {
            let outcome = Outcome::of(status, reason.as_deref());
            match outcome {
                Some(Outcome::Confirmed) => {
                    summary.confirmed += 1;
                    *confirmed_per_product.entry(*product).or_default() += 1;
                }
                Some(Outcome::Declined) => summary.cancelled_declined += 1,
                Some(Outcome::TimedOut) => {
                    summary.cancelled_timeout += 1;
                    if !matches!(
                        kinds.get(id),
                        Some(OrderKind::SlowWarehouse | OrderKind::Backlogged)
                    ) {
                        summary.unplanned_timeouts += 1;
                    }
                }
                Some(Outcome::OutOfStock) => summary.cancelled_out_of_stock += 1,
                Some(Outcome::Pending) | None => {}
            }
            match saga.as_deref() {
                Some("running") => summary.sagas_open += 1,
                Some("completed") => summary.sagas_completed += 1,
                Some("compensated") => summary.sagas_compensated += 1,
                _ => summary.sagas_missing += 1,
            }
            let consistent = outcome.is_some_and(|outcome| {
                saga.as_deref() == Some(outcome.saga_status())
                    && kinds
                        .get(id)
                        .is_some_and(|kind| outcome == Outcome::Pending || kind.allows(outcome))
            });
            if !consistent {
                summary.inconsistent += 1;
            }
        }
        // Rows of orders the service does not have count as missing sagas.
        summary.sagas_missing += orders.len() as i64 - rows.len() as i64;

        // The commands the sagas sent, and which of them the inventory handled.
        let sent = DB::commands_sent(&self.db.orders, &keys)
            .await
            .map_err(db)?;
        let sent_ids: Vec<Uuid> = sent.iter().map(|(_, id)| *id).collect();
        let handled = DB::handled(&self.db.inventory, &self.inventory_group, &sent_ids)
            .await
            .map_err(db)?;
        let handled: std::collections::HashSet<Uuid> = handled.into_iter().collect();
        for (event_type, id) in &sent {
            let applied = i64::from(handled.contains(id));
            if event_type == "ReserveStock" {
                summary.reservations_sent += 1;
                summary.reservations_handled += applied;
            } else {
                summary.compensations_sent += 1;
                summary.compensations_applied += applied;
            }
        }

        // What the inventory did with them.
        let Releases {
            released: releases,
            tombstones,
            nothing,
            twice: released_twice,
            unreserved: released_unreserved,
        } = DB::releases(&self.db.inventory, &ids).await.map_err(db)?;
        summary.releases = releases;
        summary.tombstones = tombstones;
        summary.nothing_to_release = nothing;
        summary.released_twice = released_twice;
        summary.released_unreserved = released_unreserved;

        // Answers of the inventory that reached a saga ended by its
        // timeout: had one come before, the saga would not have timed out,
        // so each was ignored (the saga's release takes care of its stock).
        summary.late_answers_ignored =
            DB::late_answers(&self.db.orders, &keys).await.map_err(db)?;

        // The stock: what is reserved is what the confirmed orders hold, and
        // nothing went missing.
        let products: Vec<Uuid> = self.stocked.keys().copied().collect();
        let stock = DB::stock(&self.db.inventory, &products).await.map_err(db)?;
        // The warm-up order holds one unit of the regular product.
        let warm_up = DB::confirmed_besides(&self.db.orders, self.products.regular, &ids)
            .await
            .map_err(db)?;
        summary.stock_leaked = stock
            .iter()
            .map(|(product, available, reserved)| {
                let held = confirmed_per_product.get(product).copied().unwrap_or(0)
                    + if *product == self.products.regular {
                        warm_up
                    } else {
                        0
                    };
                let initial = i64::from(self.stocked.get(product).copied().unwrap_or(0));
                (i64::from(*reserved) - held).abs()
                    + (i64::from(*available) + i64::from(*reserved) - initial).abs()
            })
            .sum();

        let (completed, declined) = DB::payments(&self.db.payments, &ids).await.map_err(db)?;
        summary.payments_completed = completed;
        summary.payments_declined = declined;

        let latencies = DB::confirmation_seconds(&self.db.orders, &ids)
            .await
            .map_err(db)?;
        summary.confirmed_latency = Percentiles::of(
            latencies
                .into_iter()
                .map(|secs| Duration::from_secs_f64(secs.max(0.0)))
                .collect(),
        );
        Ok(summary)
    }
}

async fn ephemeral_listener() -> Result<TcpListener, ServiceError> {
    TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(ServiceError::Listen)
}

/// Places the orders of `plan` through `POST /orders`, `concurrency` at a
/// time and at most `rate` a second; the ids of those created, with their
/// kind.
async fn drive_orders(
    base: &str,
    plan: &[(OrderKind, Uuid, i64)],
    concurrency: usize,
    rate: Option<u32>,
) -> Vec<(Uuid, OrderKind)> {
    let client = reqwest::Client::new();
    // Order `i` is not placed before `start + i / rate`.
    let period = rate
        .filter(|rate| *rate > 0)
        .map(|rate| Duration::from_secs(1) / rate);
    let start = tokio::time::Instant::now();
    futures::stream::iter(plan.iter().copied().enumerate())
        .then(move |(i, order)| async move {
            if let Some(period) = period {
                tokio::time::sleep_until(start + period * i as u32).await;
            }
            order
        })
        .map(|(kind, product_id, amount)| {
            let client = client.clone();
            let url = format!("{base}/orders");
            async move {
                let body = json!({
                    "customer_id": Uuid::new_v4(),
                    "product_id": product_id,
                    "amount": amount,
                });
                let response = client.post(&url).json(&body).send().await.ok()?;
                if response.status() != reqwest::StatusCode::CREATED {
                    tracing::warn!(status = %response.status(), "order not created");
                    return None;
                }
                let created: serde_json::Value = response.json().await.ok()?;
                let id = created["order_id"].as_str()?.parse::<Uuid>().ok()?;
                Some((id, kind))
            }
        })
        .buffer_unordered(concurrency.max(1))
        .filter_map(|id| async move { id })
        .collect()
        .await
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

    #[test]
    fn order_kinds_repeat_every_ten_orders() {
        let kinds: Vec<OrderKind> = (0..20).map(OrderKind::of).collect();
        assert_eq!(kinds[..10], kinds[10..]);
        let count = |kind| kinds.iter().filter(|k| **k == kind).count();
        assert_eq!(count(OrderKind::Regular), 12);
        assert_eq!(count(OrderKind::Backlogged), 2);
        assert_eq!(count(OrderKind::OverLimit), 2);
        assert_eq!(count(OrderKind::SlowWarehouse), 2);
        assert_eq!(count(OrderKind::Scarce), 2);
    }

    #[test]
    fn outcomes_go_with_saga_statuses_and_kinds() {
        assert_eq!(Outcome::of("confirmed", None), Some(Outcome::Confirmed));
        assert_eq!(
            Outcome::of("cancelled", Some("out_of_stock")).map(Outcome::saga_status),
            Some("completed")
        );
        assert_eq!(
            Outcome::of("cancelled", Some("payment_declined")).map(Outcome::saga_status),
            Some("compensated")
        );
        assert_eq!(Outcome::of("cancelled", Some("customer_request")), None);
        assert!(OrderKind::SlowWarehouse.allows(Outcome::TimedOut));
        assert!(!OrderKind::SlowWarehouse.allows(Outcome::Confirmed));
        assert!(!OrderKind::Backlogged.allows(Outcome::Confirmed));
        assert!(!OrderKind::Regular.allows(Outcome::OutOfStock));
        assert!(OrderKind::Scarce.allows(Outcome::OutOfStock));
        assert!(!OrderKind::OverLimit.allows(Outcome::Pending));
    }
}
