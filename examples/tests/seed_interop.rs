//! Services written from the design seed and ours interoperate, both ways,
//! on the real broker: a charge sent the way a seed-style relay sends (key =
//! order id, the JSON payload, no headers) reaches the payments service and
//! is answered with a `PaymentCompleted` in the seed's format (the payments
//! service charges on the order fulfilment saga's `ChargePayment` now, not on
//! `OrderCreated`); and what the orders service publishes is read by a
//! consumer that knows only the seed's format.

use std::time::{Duration, Instant};

use outbox_examples::orders::{self, OrdersService};
use outbox_examples::payments::{self, PaymentsService};
use outbox_examples::service::{Tuning, create_topics};
use outbox_examples::setup::{Broker, connect_database};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use serde_json::{Value, json};
use txoutbox_testkit::broker::brokers;
use txoutbox_testkit::db::{drop_databases, server_url};
use uuid::Uuid;

const PARTITIONS: i32 = 3;

fn client() -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", brokers());
    config
}

/// The end offset of each partition of `topic`.
fn ends(topic: &str) -> Vec<i64> {
    let consumer: BaseConsumer = client().create().unwrap();
    (0..PARTITIONS)
        .map(|p| {
            consumer
                .fetch_watermarks(topic, p, Duration::from_secs(10))
                .unwrap()
                .1
        })
        .collect()
}

/// Commits `offsets` for `group`, so that it starts there rather than
/// re-reading what earlier runs left on the shared broker.
fn start_group_at(group: &str, topic: &str, offsets: &[i64]) {
    let consumer: BaseConsumer = client().set("group.id", group).create().unwrap();
    let mut tpl = TopicPartitionList::new();
    for (partition, offset) in offsets.iter().enumerate() {
        tpl.add_partition_offset(topic, partition as i32, Offset::Offset(*offset))
            .unwrap();
    }
    consumer.commit(&tpl, CommitMode::Sync).unwrap();
}

/// Reads `topic` from `from` until a record whose JSON value satisfies
/// `wanted`; returns its key, value and whether it had headers.
fn find(topic: &str, from: &[i64], wanted: impl Fn(&Value) -> bool) -> (String, Value, bool) {
    let consumer: BaseConsumer = client()
        .set("group.id", format!("seed-reader-{}", Uuid::new_v4()))
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for (partition, offset) in from.iter().enumerate() {
        tpl.add_partition_offset(topic, partition as i32, Offset::Offset(*offset))
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let Some(Ok(message)) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let Ok(value) = serde_json::from_slice::<Value>(message.payload().unwrap_or_default())
        else {
            continue;
        };
        if wanted(&value) {
            let key = String::from_utf8_lossy(message.key().unwrap_or_default()).into_owned();
            return (key, value, message.headers().is_some());
        }
    }
    panic!("no matching record on {topic} within 30 s");
}

fn is_uuid(value: &Value) -> bool {
    value.as_str().is_some_and(|s| Uuid::parse_str(s).is_ok())
}

/// What the seed's Python services do with an `OrderCreated`: the payload
/// must have exactly the seed's fields, of the seed's types.
fn readable_by_the_seed(payload: &Value) -> Result<(), String> {
    for field in ["event_id", "order_id", "customer_id"] {
        if !is_uuid(&payload[field]) {
            return Err(format!("`{field}` is not a UUID string: {payload}"));
        }
    }
    if !payload["amount"].is_i64() {
        return Err(format!("`amount` is not an integer: {payload}"));
    }
    // Python: datetime.fromisoformat(payload["created_at"]).
    payload["created_at"]
        .as_str()
        .and_then(|at| chrono::DateTime::parse_from_rfc3339(at).ok())
        .ok_or_else(|| format!("`created_at` is not an ISO 8601 time: {payload}"))?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_headerless_charge_is_paid_and_answered_with_a_seed_format_payment_completed() {
    create_topics(&Broker::External(brokers()), PARTITIONS)
        .await
        .unwrap();
    let server = server_url();
    let name = format!("outbox_seed_pay_{}", Uuid::new_v4().simple());
    let pool = connect_database(&format!("{server}/{name}"), "")
        .await
        .unwrap();
    payments::migrate(&pool).await.unwrap();
    let group = format!("payments-seed-{}", Uuid::new_v4().simple());
    start_group_at(&group, "payment.commands", &ends("payment.commands"));
    let answers_from = ends("payment.events");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let service = PaymentsService::start(
        pool.clone(),
        &brokers(),
        &group,
        listener,
        &Tuning::default(),
    )
    .await
    .unwrap();

    // What a seed-style relay sends: key = the order id, the payload's JSON,
    // no headers (the consumer resolves the type: the topic's only handler).
    let order_id = Uuid::new_v4();
    let seed_event = json!({
        "event_id": Uuid::new_v4(),
        "order_id": order_id,
        "customer_id": Uuid::new_v4(),
        "amount": 4200,
    });
    let producer: FutureProducer = client().create().unwrap();
    let value = seed_event.to_string();
    let key = order_id.to_string();
    producer
        .send(
            FutureRecord::to("payment.commands")
                .key(&key)
                .payload(&value),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)
        .unwrap();

    let (answer_key, answer, _) = find("payment.events", &answers_from, |value| {
        value["order_id"] == json!(order_id)
    });
    let paid: i64 = sqlx::query_scalar("SELECT count(*) FROM payments WHERE order_id = $1")
        .bind(order_id)
        .fetch_one(&pool)
        .await
        .unwrap();
    let _ = service.shutdown().await;
    pool.close().await;
    drop_databases(std::slice::from_ref(&name)).await.unwrap();
    assert_eq!(paid, 1, "the order was charged once");
    // The seed's PaymentCompleted: keyed by the order, its fields and types.
    assert_eq!(answer_key, order_id.to_string());
    assert_eq!(answer["amount"], 4200, "{answer}");
    assert!(
        is_uuid(&answer["event_id"]) && is_uuid(&answer["payment_id"]),
        "{answer}"
    );
    assert!(
        answer["completed_at"]
            .as_str()
            .and_then(|at| chrono::DateTime::parse_from_rfc3339(at).ok())
            .is_some(),
        "{answer}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_orders_service_output_is_read_by_a_seed_format_consumer() {
    create_topics(&Broker::External(brokers()), PARTITIONS)
        .await
        .unwrap();
    let server = server_url();
    let name = format!("outbox_seed_ord_{}", Uuid::new_v4().simple());
    let pool = connect_database(&format!("{server}/{name}"), "")
        .await
        .unwrap();
    orders::migrate(&pool).await.unwrap();
    let group = format!("orders-seed-{}", Uuid::new_v4().simple());
    start_group_at(&group, "payment.events", &ends("payment.events"));
    let from = ends("order.events");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let service = OrdersService::start(
        pool.clone(),
        &brokers(),
        &group,
        listener,
        &Tuning::default(),
    )
    .await
    .unwrap();
    let created: Value = reqwest::Client::new()
        .post(format!("http://{}/orders", service.addr))
        .json(&json!({
            "customer_id": Uuid::new_v4(),
            "product_id": Uuid::new_v4(),
            "amount": 1999,
        }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let order_id = created["order_id"].clone();
    let (key, payload, _) = find("order.events", &from, |value| value["order_id"] == order_id);
    let _ = service.shutdown().await;
    pool.close().await;
    drop_databases(std::slice::from_ref(&name)).await.unwrap();
    // The seed's consumer keys on the order and reads only the value.
    assert_eq!(json!(key), order_id);
    readable_by_the_seed(&payload).unwrap();
    assert_eq!(payload["amount"], 1999);
    // `order.events` carries OrderCreated and OrderCancelled: a reader of
    // the value alone tells them apart by the type the value names.
    assert_eq!(payload["event_type"], "OrderCreated");
}
