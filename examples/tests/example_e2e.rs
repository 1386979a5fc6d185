//! The example system end to end against the real broker and PostgreSQL:
//! every order ends up paid, each event handled exactly once.

use std::time::Duration;

use outbox_examples::demo::{DemoConfig, run};
use outbox_examples::orders::parse_create_order;
use outbox_examples::setup::Broker;
use serde_json::json;
use sqlx::Connection;

fn server_url() -> String {
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL (set in .cargo/config.toml)");
    // Scheme, credentials and host of `postgres://user@host:port/db`: the demo
    // names its own databases.
    let (server, _database) = url.rsplit_once('/').expect("DATABASE_URL names a database");
    server.to_owned()
}

async fn drop_databases(server: &str, name: &str) {
    let mut admin = sqlx::PgConnection::connect(&format!("{server}/postgres"))
        .await
        .unwrap();
    for suffix in ["_orders", "_payments"] {
        let sql = format!("DROP DATABASE IF EXISTS \"{name}{suffix}\" WITH (FORCE)");
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut admin)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_order_is_paid_once_through_the_real_broker() {
    let brokers = std::env::var("KAFKA_BROKERS_TEST").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let server = server_url();
    let name = format!("outbox_e2e_{}", uuid::Uuid::new_v4().simple());
    let config = DemoConfig {
        database_url: format!("{server}/{name}"),
        orders: 120,
        concurrency: 8,
        timeout: Duration::from_secs(60),
        group_suffix: format!("-{name}"),
        progress_every: None,
    };
    let summary = run(&config, &Broker::External(brokers)).await;
    drop_databases(&server, &name).await;
    let summary = summary.expect("demo run");
    assert!(summary.complete(), "incomplete run:\n{summary}");
    assert_eq!(summary.lost(), 0);
    // Exactly once per event on the receiving side: one dedup row per
    // OrderCreated, one processed inbox row per PaymentCompleted, one payment
    // per order (the table's unique key would reject a second one anyway).
    assert_eq!(summary.order_events_handled, 120);
    assert_eq!(summary.payment_events_handled, 120);
    assert_eq!(summary.payments_completed, 120);
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
