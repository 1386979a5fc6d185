//! The example system with the payments service's handler written with
//! SeaORM (`outbox_examples::payments_sea_orm`), end to end against the real
//! broker and PostgreSQL. A binary of its own: two demo runs at once would
//! share the example's topics and answer each other's commands.

#[path = "support/databases.rs"]
mod databases;

use std::time::Duration;

use databases::demo_databases;
use outbox_examples::demo::{Demo, DemoConfig};
use outbox_examples::payments_sea_orm::PaymentsOrm;
use outbox_examples::setup::Broker;
use txoutbox_testkit::broker::brokers;
use txoutbox_testkit::db::{drop_databases, server_url};

/// The same system with the payments service's handler written with SeaORM
/// entities on the consumer's transaction (`demo --payments-orm sea-orm`):
/// every order ends as planned, each charged exactly once, and the payment
/// rows are the ones the answers report.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_payments_service_on_sea_orm_charges_every_order_once() {
    let server = server_url();
    let name = format!("outbox_e2e_sea_{}", uuid::Uuid::new_v4().simple());
    let config = DemoConfig {
        database_url: format!("{server}/{name}"),
        orders: 60,
        concurrency: 8,
        timeout: Duration::from_secs(90),
        group_suffix: format!("-{name}"),
        progress_every: None,
        stock_timeout: Duration::from_secs(3),
        rate: Some(20),
        payments_orm: PaymentsOrm::SeaOrm,
    };
    let demo = Demo::<sqlx::Postgres>::start(&config, &Broker::External(brokers()))
        .await
        .expect("start the services");
    let summary = demo.drive_and_wait().await;
    // This run's orders (a fresh consumer group reads the topic from its
    // start, so the payments table also holds earlier runs' charges).
    let orders: Vec<uuid::Uuid> = sqlx::query_scalar("SELECT id FROM orders")
        .fetch_all(demo.orders_db())
        .await
        .unwrap_or_default();
    let payments: Result<Vec<(String, i64, i64)>, sqlx::Error> = sqlx::query_as(
        "SELECT status, count(*), count(DISTINCT order_id) FROM payments
         WHERE order_id = ANY($1) GROUP BY 1 ORDER BY 1",
    )
    .bind(&orders)
    .fetch_all(demo.payments_db())
    .await;
    let stopped = demo.shutdown().await;
    drop_databases(&demo_databases(&name)).await.unwrap();
    stopped.expect("clean shutdown");
    let summary = summary.expect("demo run");
    assert!(summary.complete(), "incomplete run:\n{summary}");
    assert_eq!(summary.lost(), 0);
    assert_eq!(summary.sagas_open, 0, "{summary}");
    // 60 orders by kind (every ten: 6 regular, 1 over the limit, 1 slow,
    // 1 backlogged, 1 scarce with 3 in stock): 36 + 3 confirmed.
    assert_eq!(summary.confirmed, 36 + 3, "{summary}");
    assert_eq!(summary.cancelled_declined, 6, "{summary}");
    assert_eq!(summary.payments_completed, 39, "{summary}");
    assert_eq!(summary.payments_declined, 6, "{summary}");
    // The warm-up order is charged too.
    let warm_up = i64::from(summary.warm_up.is_some());
    assert_eq!(
        payments.unwrap(),
        [
            ("completed".to_owned(), 39 + warm_up, 39 + warm_up),
            ("declined".to_owned(), 6, 6)
        ],
        "one payment row per charged order, written through SeaORM"
    );
}
