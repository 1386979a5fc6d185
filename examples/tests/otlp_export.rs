//! The example exports its spans over OTLP/HTTP when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set: the `demo` binary, run as a user
//! runs it, against a stand-in collector that decodes what it receives.

#[path = "support/databases.rs"]
mod databases;

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use databases::demo_databases;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message as _;
use txoutbox_testkit::db::{drop_databases, server_url};

type Received = Arc<Mutex<Vec<(String, Bytes)>>>;

async fn collect(
    State(received): State<Received>,
    headers: HeaderMap,
    body: Bytes,
) -> ([(&'static str, &'static str); 1], Vec<u8>) {
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    received.lock().unwrap().push((content_type, body));
    // An empty ExportTraceServiceResponse: everything accepted.
    ([("content-type", "application/x-protobuf")], Vec::new())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_exports_its_spans_to_the_configured_collector() {
    let received: Received = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let collector = listener.local_addr().unwrap();
    let app = Router::new()
        .route("/v1/traces", post(collect))
        .with_state(received.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let server = server_url();
    let name = format!("outbox_otlp_{}", uuid::Uuid::new_v4().simple());
    let mut demo = std::process::Command::new(env!("CARGO_BIN_EXE_demo"));
    demo.args(["--orders", "5", "--timeout-secs", "60"])
        .env("EXAMPLE_DATABASE_URL", format!("{server}/{name}"))
        .env_remove("KAFKA_BROKERS")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{collector}"));
    // The collector answers on this runtime while a blocking thread waits.
    let output = tokio::task::spawn_blocking(move || demo.output())
        .await
        .unwrap()
        .expect("the demo runs");

    drop_databases(&demo_databases(&name)).await.unwrap();
    assert!(
        output.status.success(),
        "demo failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );

    // The batch exporter flushed at exit: every request is OTLP protobuf
    // from the service `outbox-demo`, and the framework's per-message spans
    // are there for each of the 6 orders (5 + the warm-up) and each step of
    // their sagas.
    let received = received.lock().unwrap();
    assert!(
        !received.is_empty(),
        "no export request reached the collector"
    );
    let mut names = Vec::new();
    for (content_type, body) in received.iter() {
        assert_eq!(content_type, "application/x-protobuf");
        let request = ExportTraceServiceRequest::decode(body.as_ref()).expect("OTLP protobuf");
        for resource_spans in &request.resource_spans {
            let service = resource_spans
                .resource
                .as_ref()
                .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
                .and_then(|kv| kv.value.as_ref()?.value.clone());
            assert_eq!(service, Some(Value::StringValue("outbox-demo".into())));
            for scope in &resource_spans.scope_spans {
                names.extend(scope.spans.iter().map(|s| s.name.clone()));
            }
        }
    }
    let count = |name: &str| names.iter().filter(|n| *n == name).count();
    assert_eq!(count("outbox.unit_of_work"), 6, "{names:?}");
    // Each order's saga: 5 of the 6 are confirmed (OrderCreated, ReserveStock,
    // StockReserved, ChargePayment, PaymentCompleted: 5 published, 5
    // handled); the fourth driven order is over the payments' limit
    // (OrderCreated, ReserveStock, StockReserved, ChargePayment,
    // PaymentFailed, then ReleaseStock and OrderCancelled: 7 published; 6
    // handled, as no consumer handles OrderCancelled). The saga's timeouts
    // were cancelled, never published.
    assert_eq!(count("outbox.publish"), 5 * 5 + 7, "{names:?}");
    assert_eq!(count("outbox.handle"), 5 * 5 + 6, "{names:?}");
}
