//! The example system end to end against the real broker and PostgreSQL:
//! every order's fulfilment saga ends (confirmed, declined, timed out or out
//! of stock, each as planned), no saga stays open, every compensation is
//! applied exactly once and never to a reservation that did not happen, and
//! each order's state matches its saga's status; the three services answer
//! `/metrics`, `/health/live` and `/health/ready` over HTTP, and the metrics
//! the Grafana dashboard queries come out of the exporter under the names
//! and types the dashboard expects.

#[path = "support/databases.rs"]
mod databases;
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use databases::demo_databases;
use outbox_examples::demo::{Demo, DemoConfig};
use outbox_examples::observability::{self, Liveness, Readiness};
use outbox_examples::orders::{self, OrdersService, parse_create_order};
use outbox_examples::payments_sea_orm::PaymentsOrm;
use outbox_examples::service::{HttpServer, Tuning};
use outbox_examples::setup::{Broker, connect_database};
use serde_json::{Value, json};
use support::dashboard::{Kind, documented, documented_metric, exposition_types, queried};
use txoutbox_runtime::consumer::telemetry as consumer;
use txoutbox_runtime::ops::status::Thresholds;
use txoutbox_runtime::relay::{Relay, telemetry as relay};
use txoutbox_testkit::broker::brokers;
use txoutbox_testkit::db::{drop_databases, server_url};

/// `GET http://addr/path`: status and body.
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let response = reqwest::get(format!("http://{addr}{path}"))
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

async fn get_json(addr: SocketAddr, path: &str) -> (u16, Value) {
    let (status, body) = get(addr, path).await;
    let body = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"));
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_order_saga_ends_consistently_through_the_real_broker() {
    let server = server_url();
    let name = format!("outbox_e2e_{}", uuid::Uuid::new_v4().simple());
    let config = DemoConfig {
        database_url: format!("{server}/{name}"),
        orders: 120,
        concurrency: 8,
        timeout: Duration::from_secs(90),
        group_suffix: format!("-{name}"),
        progress_every: None,
        stock_timeout: Duration::from_secs(3),
        rate: Some(20),
        payments_orm: PaymentsOrm::Sqlx,
    };
    let demo = Demo::start(&config, &Broker::External(brokers()))
        .await
        .expect("start the services");
    let summary = demo.drive_and_wait().await;
    let probed = async {
        for addr in [
            demo.orders_addr(),
            demo.inventory_addr(),
            demo.payments_addr(),
        ] {
            services_answer_their_probes(addr).await;
        }
        dashboard_metrics_are_exported(demo.orders_addr()).await;
        orders_match_their_sagas(demo.orders_db()).await;
        compensations_apply_once_after_a_reservation(demo.inventory_db()).await;
        readiness_follows_the_outbox(&server, &name, demo.orders_addr()).await;
    };
    // Catch a failed probe so that the services stop and the databases go.
    let probed = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(probed)).await;
    let stopped = demo.shutdown().await;
    drop_databases(&demo_databases(&name)).await.unwrap();
    if let Err(panic) = probed {
        std::panic::resume_unwind(panic);
    }
    stopped.expect("clean shutdown");
    let summary = summary.expect("demo run");
    assert!(summary.complete(), "incomplete run:\n{summary}");
    assert_eq!(summary.lost(), 0);
    assert_eq!(summary.sagas_open, 0, "{summary}");
    // 120 orders, by kind (demo::OrderKind, every ten orders): 72 regular,
    // 12 over the payment limit, 12 for the slow warehouse (reserved at
    // once, answered late), 12 for the backlogged one (reserved late), 12
    // for the scarce product (6 in stock).
    assert_eq!(summary.confirmed, 72 + 6, "{summary}");
    assert_eq!(summary.cancelled_declined, 12, "{summary}");
    assert_eq!(summary.cancelled_timeout, 12 + 12, "{summary}");
    assert_eq!(summary.unplanned_timeouts, 0, "{summary}");
    assert_eq!(summary.cancelled_out_of_stock, 6, "{summary}");
    assert_eq!(summary.sagas_completed, 78 + 6, "{summary}");
    assert_eq!(summary.sagas_compensated, 12 + 24, "{summary}");
    // One compensation per compensated saga, each applied once: a release
    // of the declined orders' stock and of the slow warehouse's (reserved at
    // once, answered late); a tombstone for the backlogged warehouse's, whose
    // reservations come after the release and take nothing.
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
}

/// Straight from the orders database: every order has a saga, none is
/// running, and the order's final state is the one its saga's status goes
/// with (`outbox_examples::fulfilment`).
async fn orders_match_their_sagas(orders: &sqlx::PgPool) {
    let rows: Vec<(String, Option<String>, Option<String>, i64)> = sqlx::query_as(
        "SELECT o.status, o.cancel_reason, s.status, count(*)
         FROM orders o
         LEFT JOIN saga_state s ON s.saga_type = 'order_fulfilment' AND s.saga_id = o.id::text
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
/// release without an earlier reservation of that order, and each tombstone
/// (a release first) followed by no reservation that took stock.
async fn compensations_apply_once_after_a_reservation(inventory: &sqlx::PgPool) {
    let twice: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (
             SELECT order_id FROM stock_movement WHERE kind IN ('release', 'tombstone')
             GROUP BY order_id HAVING count(*) > 1) t",
    )
    .fetch_one(inventory)
    .await
    .unwrap();
    assert_eq!(twice, 0, "orders released more than once");
    let unreserved: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM stock_movement r WHERE r.kind = 'release' AND NOT EXISTS (
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
        "SELECT count(*) FROM stock_movement t JOIN stock_movement s
           ON s.order_id = t.order_id AND s.kind = 'reserve' AND s.id > t.id
         WHERE t.kind = 'tombstone'",
    )
    .fetch_one(inventory)
    .await
    .unwrap();
    assert_eq!(reserved_after_tombstone, 0, "stock taken after a tombstone");
}

/// Live (relay and consumer running), ready (database reachable, outbox
/// within the default thresholds) and a Prometheus scrape with the
/// framework's metrics.
async fn services_answer_their_probes(addr: SocketAddr) {
    let (status, live) = get_json(addr, "/health/live").await;
    assert_eq!(status, 200, "{live}");
    assert_eq!(live["status"], "live");
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
    assert_eq!(ready["status"], "ready");
    assert_eq!(ready["breaches"], json!([]));
    assert!(ready["outbox_pending"].is_i64(), "{ready}");

    let response = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    let text = response.text().await.unwrap();
    assert!(
        text.contains(&format!("# TYPE {} counter", relay::PUBLISHED)),
        "{text}"
    );
}

/// Metrics that a healthy run does not record: counters of failures (they
/// appear with the first one) and gauges set only when their state changes
/// from the initial one.
const ONLY_ON_TROUBLE: [&str; 14] = [
    relay::ERRORS,
    relay::HELD_BACK,
    relay::HELD_TOPICS,
    relay::TOPIC_REFUSALS,
    relay::MEMBERS_EVICTED,
    relay::BROKER_FAILING,
    relay::UNAVAILABLE_PARTITIONS,
    consumer::HANDLER_ERRORS,
    consumer::DEAD_LETTERED,
    consumer::UNKNOWN_SKIPPED,
    consumer::DB_ERRORS,
    consumer::INBOX_PARKED,
    consumer::OFFSET_GAPS,
    txoutbox_runtime::lifecycle::TASKS_FAILED,
];

/// Every metric the dashboard queries is in the exporter's output with the
/// type its docs give it (a histogram with `_bucket` series), unless a
/// healthy run does not record it ([`ONLY_ON_TROUBLE`]).
async fn dashboard_metrics_are_exported(addr: SocketAddr) {
    let documented = documented();
    let wanted: BTreeMap<&str, Kind> = queried()
        .keys()
        .map(|series| documented_metric(series, &documented).expect("documented"))
        .collect();
    // Gauges refreshed on an interval need a moment after start-up: the lag
    // comes with librdkafka's first statistics, 10 s after a consumer starts.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, text) = get(addr, "/metrics").await;
        assert_eq!(status, 200);
        let types = exposition_types(&text);
        let mut missing = BTreeSet::new();
        for (&metric, &kind) in &wanted {
            match types.get(metric) {
                Some(exported) => {
                    let expected = match kind {
                        Kind::Counter => "counter",
                        Kind::Gauge => "gauge",
                        Kind::Histogram => "histogram",
                    };
                    assert_eq!(exported, expected, "{metric} is exported as a {exported}");
                    if kind == Kind::Histogram {
                        assert!(
                            text.contains(&format!("{metric}_bucket{{")),
                            "{metric} has no buckets: {text}"
                        );
                    }
                }
                None if ONLY_ON_TROUBLE.contains(&metric) => {}
                None => {
                    missing.insert(metric);
                }
            }
        }
        if missing.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the dashboard queries metrics a healthy run does not export: {missing:?}\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// An unpublished event older than the threshold (its retry put an hour
/// away, so the relay leaves it) makes `/health/ready` answer 503 naming
/// `max-age`; once it is gone the service is ready again.
async fn readiness_follows_the_outbox(server: &str, name: &str, addr: SocketAddr) {
    let pool = connect_database(&format!("{server}/{name}"), "_orders")
        .await
        .unwrap();
    let event_id = uuid::Uuid::now_v7();
    sqlx::query(
        "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type, payload,
                                   topic, partition_key, created_at, attempts, next_attempt_at)
         VALUES ($1, 'Order', 'stale', 'OrderCreated', '{}', 'order.events', 'stale',
                 now() - interval '1 hour', 1, now() + interval '1 hour')",
    )
    .bind(event_id)
    .execute(&pool)
    .await
    .unwrap();
    let (status, ready) = get_json(addr, "/health/ready").await;
    sqlx::query("DELETE FROM outbox_event WHERE event_id = $1")
        .bind(event_id)
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(status, 503, "{ready}");
    assert_eq!(ready["status"], "not ready");
    assert_eq!(ready["breaches"][0]["threshold"], "max-age", "{ready}");
    assert!(
        ready["breaches"][0]["actual"]
            .as_str()
            .unwrap()
            .contains("oldest unpublished event is 3600s old"),
        "{ready}"
    );
    let (status, ready) = get_json(addr, "/health/ready").await;
    assert_eq!(status, 200, "{ready}");
}

/// A service whose relay stops on its own answers 503 on `/health/live`,
/// naming the relay and why. Its relay is refused here the way a real one
/// can be: another relay with another lane count already runs on its
/// database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn liveness_fails_when_the_relay_stops_on_its_own() {
    let server = server_url();
    let name = format!("outbox_e2e_live_{}", uuid::Uuid::new_v4().simple());
    let pool = connect_database(&format!("{server}/{name}"), "_orders")
        .await
        .unwrap();
    orders::migrate(&pool).await.unwrap();
    // The consumer needs its topics (dead-letter topic included) to start.
    outbox_examples::service::create_topics(&Broker::External(brokers()), 3)
        .await
        .unwrap();
    let mut kafka = rdkafka::ClientConfig::new();
    kafka.set("bootstrap.servers", brokers());
    let other = Relay::builder(pool.clone(), kafka)
        .lanes(7)
        .spawn()
        .unwrap();
    // The other relay has registered once it owns its lanes.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let members: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_relay_member")
            .fetch_one(&pool)
            .await
            .unwrap();
        if members > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the first relay never registered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let service = OrdersService::start(
        pool.clone(),
        &brokers(),
        &format!("orders-{name}"),
        listener,
        &Tuning::default(),
    )
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let (status, live) = loop {
        let (status, live) = get_json(service.addr, "/health/live").await;
        if status != 200 || Instant::now() > deadline {
            break (status, live);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let _ = service.shutdown().await;
    let _ = other.shutdown().await;
    pool.close().await;
    drop_databases(&demo_databases(&name)).await.unwrap();
    assert_eq!(status, 503, "{live}");
    assert_eq!(live["status"], "dead");
    let relay = &live["tasks"][0];
    assert_eq!(relay["task"], "relay", "{live}");
    assert_eq!(relay["running"], false, "{live}");
    let reason = relay["stopped"].as_str().unwrap();
    assert!(
        reason.starts_with("failed: ") && reason.contains("lane"),
        "{live}"
    );
    assert_eq!(live["tasks"][1]["running"], true, "{live}");
}

/// `/health/ready` answers 503 within its timeout when the database cannot
/// be reached, naming it; `/health/live` does not depend on the database.
#[tokio::test]
async fn readiness_fails_when_the_database_is_unreachable() {
    // Nothing listens on port 1.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(30))
        .connect_lazy("postgres://postgres@127.0.0.1:1/none")
        .unwrap();
    let readiness = Readiness {
        thresholds: Thresholds::default(),
        timeout: Duration::from_millis(500),
    };
    let router = observability::router(
        pool,
        Liveness::new(),
        readiness,
        observability::prometheus(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = HttpServer::start(listener, router).unwrap();
    let asked = Instant::now();
    let (status, ready) = get_json(server.addr, "/health/ready").await;
    let took = asked.elapsed();
    let (live_status, _) = get(server.addr, "/health/live").await;
    server.shutdown().await.unwrap();
    assert_eq!(status, 503, "{ready}");
    assert!(
        ready["database"]
            .as_str()
            .unwrap()
            .starts_with("unreachable"),
        "{ready}"
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_eq!(live_status, 200);
}

#[test]
fn invalid_order_bodies_name_the_field() {
    let valid = json!({
        "customer_id": "6a2f41a3-c54c-fce8-32d2-0324e1c32e22",
        "product_id": "0b1c1d4e-2f3a-4b5c-8d9e-0f1a2b3c4d5e",
        "amount": 250,
    });
    assert_eq!(parse_create_order(&valid).unwrap().amount, 250);

    let cases = [
        (
            json!({"product_id": valid["product_id"], "amount": 1}),
            "customer_id",
        ),
        (
            json!({"customer_id": "nope", "product_id": valid["product_id"], "amount": 1}),
            "customer_id",
        ),
        (
            json!({"customer_id": valid["customer_id"], "amount": 1}),
            "product_id",
        ),
        (
            json!({"customer_id": valid["customer_id"], "product_id": valid["product_id"]}),
            "amount",
        ),
        (
            json!({"customer_id": valid["customer_id"], "product_id": valid["product_id"], "amount": 0}),
            "amount",
        ),
        (
            json!({"customer_id": valid["customer_id"], "product_id": valid["product_id"], "amount": "10"}),
            "amount",
        ),
        (
            json!({"customer_id": valid["customer_id"], "product_id": valid["product_id"], "amount": 1.5}),
            "amount",
        ),
    ];
    for (body, field) in cases {
        let error = parse_create_order(&body).expect_err(&body.to_string());
        assert_eq!(
            error.status(),
            axum::http::StatusCode::UNPROCESSABLE_ENTITY,
            "{body}"
        );
        let rendered = serde_json::to_value(&error).unwrap();
        assert_eq!(rendered["field"], field, "{body}: {rendered}");
    }
    let not_object = parse_create_order(&json!([1, 2])).unwrap_err();
    assert_eq!(not_object.status(), axum::http::StatusCode::BAD_REQUEST);
}
