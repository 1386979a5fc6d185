//! The example system end to end on MariaDB (`EXAMPLE_DATABASE_URL=mysql://..`)
//! against the real broker: the same run as `example_e2e.rs` on PostgreSQL,
//! with the same figures: every order's fulfilment saga ends as planned, no
//! saga stays open, every compensation is applied exactly once and never to
//! a reservation that did not happen, no stock leaks; the three services
//! answer `/health/live` and `/health/ready` on MariaDB.
//!
//! A binary of its own: two demo runs at once would share the example's
//! topics and answer each other's commands.

#[path = "support/databases.rs"]
mod databases;

use std::net::SocketAddr;
use std::time::Duration;

use databases::demo_databases;
use outbox_examples::demo::{Demo, DemoConfig};
use outbox_examples::payments_sea_orm::PaymentsOrm;
use outbox_examples::service::ServiceError;
use outbox_examples::setup::Broker;
use serde_json::Value;
use sqlx::{ConnectOptions, MySql, MySqlPool};
use txoutbox_testkit::broker::brokers;
use txoutbox_testkit::mysql::mysql_url;

/// `MYSQL_URL` without its database: the server the demo's databases go on.
fn mysql_server() -> String {
    let url = mysql_url();
    let base = url.split('?').next().unwrap_or(&url).to_owned();
    match base.rsplit_once('/') {
        Some((server, _)) if server.contains("://") && !server.ends_with('/') => server.to_owned(),
        _ => base,
    }
}

async fn drop_mysql_databases(names: &[String]) {
    let options: sqlx::mysql::MySqlConnectOptions = mysql_url().parse().expect("MYSQL_URL");
    let mut admin = options.connect().await.expect("MariaDB");
    for name in names {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS `{name}`"
        )))
        .execute(&mut admin)
        .await
        .unwrap();
    }
}

async fn get_json(addr: SocketAddr, path: &str) -> (u16, Value) {
    let response = reqwest::get(format!("http://{addr}{path}"))
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let status = response.status().as_u16();
    let body = response.text().await.unwrap();
    let body = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"));
    (status, body)
}

/// Live (relay and consumer running) and ready (the MariaDB status query
/// answered, the outbox within the default thresholds).
async fn services_answer_their_probes(addr: SocketAddr) {
    let (status, live) = get_json(addr, "/health/live").await;
    assert_eq!(status, 200, "{live}");
    let tasks: Vec<&str> = live["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["task"].as_str().unwrap())
        .collect();
    assert_eq!(tasks.len(), 2, "{live}");
    assert_eq!(tasks[0], "relay");
    assert!(tasks[1].starts_with("consumer "), "{live}");
    let (status, ready) = get_json(addr, "/health/ready").await;
    assert_eq!(status, 200, "{ready}");
    assert_eq!(ready["status"], "ready", "{ready}");
    assert!(ready["outbox_pending"].is_i64(), "{ready}");
}

/// Straight from the orders database: every order has a saga, none is
/// running, and the order's final state is the one its saga's status goes
/// with.
async fn orders_match_their_sagas(orders: &MySqlPool) {
    let rows: Vec<(String, Option<String>, Option<String>, i64)> = sqlx::query_as(
        "SELECT o.status, o.cancel_reason, s.status, COUNT(*)
         FROM orders o
         LEFT JOIN saga_state s ON s.saga_type = 'order_fulfilment'
          AND s.saga_id = LOWER(INSERT(INSERT(INSERT(INSERT(HEX(o.id), 9, 0, '-'), 14, 0, '-'),
                                       19, 0, '-'), 24, 0, '-'))
         GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
    )
    .fetch_all(orders)
    .await
    .unwrap();
    for (order, reason, saga, count) in &rows {
        let expected = match (order.as_str(), reason.as_deref()) {
            ("confirmed", None) | ("cancelled", Some("out_of_stock")) => "completed",
            ("cancelled", Some("payment_declined" | "stock_timeout")) => "compensated",
            other => panic!("{count} orders ended as {other:?}: {rows:?}"),
        };
        assert_eq!(saga.as_deref(), Some(expected), "{rows:?}");
    }
}

/// Straight from the inventory's ledger: no order released twice, no
/// release without an earlier reservation, no stock taken after a tombstone.
async fn compensations_apply_once_after_a_reservation(inventory: &MySqlPool) {
    let twice: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM (
             SELECT order_id FROM stock_movement WHERE kind IN ('release', 'tombstone')
             GROUP BY order_id HAVING COUNT(*) > 1) t",
    )
    .fetch_one(inventory)
    .await
    .unwrap();
    assert_eq!(twice, 0, "orders released more than once");
    let unreserved: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM stock_movement r WHERE r.kind = 'release' AND NOT EXISTS (
             SELECT 1 FROM stock_movement s
             WHERE s.order_id = r.order_id AND s.kind = 'reserve' AND s.id < r.id)",
    )
    .fetch_one(inventory)
    .await
    .unwrap();
    assert_eq!(
        unreserved, 0,
        "releases of reservations that never happened"
    );
    let reserved_after_tombstone: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM stock_movement t JOIN stock_movement s
           ON s.order_id = t.order_id AND s.kind = 'reserve' AND s.id > t.id
         WHERE t.kind = 'tombstone'",
    )
    .fetch_one(inventory)
    .await
    .unwrap();
    assert_eq!(reserved_after_tombstone, 0, "stock taken after a tombstone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_order_saga_ends_consistently_on_mariadb_through_the_real_broker() {
    let name = format!("outbox_e2e_my_{}", uuid::Uuid::new_v4().simple());
    let config = DemoConfig {
        database_url: format!("{}/{name}", mysql_server()),
        orders: 120,
        concurrency: 8,
        timeout: Duration::from_secs(90),
        group_suffix: format!("-{name}"),
        progress_every: None,
        stock_timeout: Duration::from_secs(3),
        rate: Some(20),
        payments_orm: PaymentsOrm::Sqlx,
    };
    let demo = Demo::<MySql>::start(&config, &Broker::External(brokers()))
        .await
        .expect("start the services on MariaDB");
    let summary = demo.drive_and_wait().await;
    let probed = async {
        for addr in [
            demo.orders_addr(),
            demo.inventory_addr(),
            demo.payments_addr(),
        ] {
            services_answer_their_probes(addr).await;
        }
        orders_match_their_sagas(demo.orders_db()).await;
        compensations_apply_once_after_a_reservation(demo.inventory_db()).await;
    };
    // Catch a failed probe so that the services stop and the databases go.
    let probed = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(probed)).await;
    let stopped = demo.shutdown().await;
    drop_mysql_databases(&demo_databases(&name)).await;
    if let Err(panic) = probed {
        std::panic::resume_unwind(panic);
    }
    stopped.expect("clean shutdown");
    let summary = summary.expect("demo run");
    assert!(summary.complete(), "incomplete run:\n{summary}");
    assert_eq!(summary.lost(), 0);
    assert_eq!(summary.sagas_open, 0, "{summary}");
    // The figures of the PostgreSQL run (example_e2e.rs): 120 orders, by
    // kind, 72 regular, 12 over the limit, 12 for the slow warehouse, 12
    // for the backlogged one, 12 for the scarce product (6 in stock).
    assert_eq!(summary.confirmed, 72 + 6, "{summary}");
    assert_eq!(summary.cancelled_declined, 12, "{summary}");
    assert_eq!(summary.cancelled_timeout, 12 + 12, "{summary}");
    assert_eq!(summary.unplanned_timeouts, 0, "{summary}");
    assert_eq!(summary.cancelled_out_of_stock, 6, "{summary}");
    assert_eq!(summary.sagas_completed, 78 + 6, "{summary}");
    assert_eq!(summary.sagas_compensated, 12 + 24, "{summary}");
    assert_eq!(summary.compensations_sent, 36, "{summary}");
    assert_eq!(summary.compensations_applied, 36, "{summary}");
    assert_eq!(summary.releases, 24, "{summary}");
    assert_eq!(summary.tombstones, 12, "{summary}");
    assert_eq!(summary.nothing_to_release, 0, "{summary}");
    assert_eq!(summary.released_twice, 0, "{summary}");
    assert_eq!(summary.released_unreserved, 0, "{summary}");
    assert_eq!(summary.late_answers_ignored, 24, "{summary}");
    assert_eq!(summary.stock_leaked, 0, "{summary}");
    assert_eq!(summary.payments_completed, 78, "{summary}");
    assert_eq!(summary.payments_declined, 12, "{summary}");
    assert!(summary.confirmed_latency.is_some(), "{summary}");
}

/// The SeaORM handler of the payments service is PostgreSQL's: on MariaDB
/// the demo refuses it before it connects to anything, saying so.
#[tokio::test]
async fn the_sea_orm_payments_handler_is_refused_on_mariadb() {
    let config = DemoConfig {
        database_url: "mysql://nobody@127.0.0.1:1/never".into(),
        orders: 1,
        concurrency: 1,
        timeout: Duration::from_secs(1),
        group_suffix: String::new(),
        progress_every: None,
        stock_timeout: Duration::from_secs(1),
        rate: None,
        payments_orm: PaymentsOrm::SeaOrm,
    };
    let broker = Broker::External("127.0.0.1:1".into());
    let error = outbox_examples::demo::run(&config, &broker)
        .await
        .expect_err("refused");
    assert!(matches!(error, ServiceError::Unsupported(_)), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains("--payments-orm sea-orm") && message.contains("PostgreSQL only"),
        "{message}"
    );
}
