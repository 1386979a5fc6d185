//! One trace per order across the three services and the broker: the orders
//! handler's unit of work, then each step of the order fulfilment saga (the
//! relay's publish of a message and its consumer's handling, in the orders,
//! inventory and payments services), each the parent of the next. Spans go to an in-memory OpenTelemetry
//! exporter through the same `tracing` layer the example binaries install.

#[path = "support/databases.rs"]
mod databases;

use std::collections::BTreeMap;
use std::time::Duration;

use databases::demo_databases;
use opentelemetry::trace::SpanId;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use outbox_examples::demo::{Demo, DemoConfig};
use outbox_examples::setup::Broker;
use rdkafka::mocking::MockCluster;
use tracing_subscriber::Layer as _;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use txoutbox_testkit::db::{drop_databases, server_url};

fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.as_str().into_owned())
}

/// `name[event_type or handler]`, for messages.
fn label(span: &SpanData) -> String {
    let detail = attribute(span, "event_type")
        .or_else(|| attribute(span, "handler"))
        .unwrap_or_default();
    format!("{}[{detail}]", span.name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_order_is_one_trace_from_the_handler_to_both_consumers() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    tracing_subscriber::registry()
        .with(
            outbox_examples::telemetry::layer(&provider, "traces-test")
                .with_filter(LevelFilter::INFO),
        )
        .init();

    let server = server_url();
    let name = format!("outbox_traces_{}", uuid::Uuid::new_v4().simple());
    let config = DemoConfig {
        database_url: format!("{server}/{name}"),
        orders: 3,
        concurrency: 1,
        timeout: Duration::from_secs(60),
        group_suffix: format!("-{name}"),
        progress_every: None,
        stock_timeout: outbox_examples::demo::DEFAULT_STOCK_TIMEOUT,
        rate: None,
        payments_orm: Default::default(),
    };
    let broker = Broker::Mock(MockCluster::new(1).expect("mock cluster"));
    let demo = Demo::<sqlx::Postgres>::start(&config, &broker)
        .await
        .expect("start the services");
    let summary = demo.drive_and_wait().await;
    let stopped = demo.shutdown().await;
    drop_databases(&demo_databases(&name)).await.unwrap();
    stopped.expect("clean shutdown");
    let summary = summary.expect("demo run");
    assert!(summary.complete(), "incomplete run:\n{summary}");
    provider.force_flush().expect("flush spans");

    let spans = exporter.get_finished_spans().expect("finished spans");
    let mut traces: BTreeMap<_, Vec<&SpanData>> = BTreeMap::new();
    // The per-message spans; the relay's and consumers' batch spans are
    // roots of their own (a batch carries the events of many traces).
    let per_message = ["outbox.unit_of_work", "outbox.publish", "outbox.handle"];
    for span in spans.iter().filter(|s| per_message.contains(&&*s.name)) {
        traces
            .entry(span.span_context.trace_id().to_string())
            .or_default()
            .push(span);
    }
    // The warm-up order and the three driven ones; no other trace (a span
    // that lost its parent would start one of its own).
    // The first orders of a run are regular ones: the saga reserves, charges
    // and confirms; its timeout is cancelled, never published.
    let expected_chain = [
        "outbox.unit_of_work[create_order]",
        "outbox.publish[OrderCreated]",
        "outbox.handle[OrderCreated]",
        "outbox.publish[ReserveStock]",
        "outbox.handle[ReserveStock]",
        "outbox.publish[StockReserved]",
        "outbox.handle[StockReserved]",
        "outbox.publish[ChargePayment]",
        "outbox.handle[ChargePayment]",
        "outbox.publish[PaymentCompleted]",
        "outbox.handle[PaymentCompleted]",
    ];
    let describe = |trace: &[&SpanData]| {
        trace
            .iter()
            .map(|s| {
                format!(
                    "{} id={} parent={}",
                    label(s),
                    s.span_context.span_id(),
                    s.parent_span_id
                )
            })
            .collect::<Vec<_>>()
            .join("\n  ")
    };
    assert_eq!(
        traces.len(),
        4,
        "one trace per order; traces:\n{}",
        traces
            .values()
            .map(|t| describe(t))
            .collect::<Vec<_>>()
            .join("\n---\n  ")
    );
    for trace in traces.values() {
        // Walk from the root down: each span's only child is the next link.
        let root: Vec<&&SpanData> = trace
            .iter()
            .filter(|s| s.parent_span_id == SpanId::INVALID)
            .collect();
        assert_eq!(root.len(), 1, "one root:\n  {}", describe(trace));
        let mut chain = vec![label(root[0])];
        let mut current = root[0].span_context.span_id();
        while let Some(child) = trace.iter().find(|s| s.parent_span_id == current) {
            let children = trace.iter().filter(|s| s.parent_span_id == current).count();
            assert_eq!(
                children,
                1,
                "one child of {current}:\n  {}",
                describe(trace)
            );
            chain.push(label(child));
            current = child.span_context.span_id();
        }
        assert_eq!(chain, expected_chain, "the trace:\n  {}", describe(trace));
        assert_eq!(trace.len(), expected_chain.len(), "{}", describe(trace));
    }
}
