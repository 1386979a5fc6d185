//! Records a foreign producer can send, through the real broker (issue 22):
//! header names that are not UTF-8, a record that names no event type, an
//! event id carried only in the header. None of them may stop a consumer,
//! and each ends where the wire format says.
#![allow(missing_docs)]

mod consumer_support;

use std::time::Duration;

use consumer_support::*;
use rdkafka::Message;
use rdkafka::message::OwnedMessage;
use rdkafka::producer::{FutureProducer, FutureRecord};
use sqlx::{PgPool, Postgres, Transaction};
use txoutbox_core::DomainEvent;
use txoutbox_runtime::consumer::{
    Consumer, EventMeta, Mode, event_handler, headers_as_bytes, headers_from_bytes,
};
use txoutbox_runtime::lifecycle::Stopped;
use uuid::Uuid;

test_event!(Binary, "consumer-test.hostile.binary", "Binary");
test_event!(
    BinaryInbox,
    "consumer-test.hostile.binary-inbox",
    "BinaryInbox"
);
test_event!(Shipped, "consumer-test.hostile.untyped", "Shipped");
test_event!(Returned, "consumer-test.hostile.untyped", "Returned");
test_event!(HeaderId, "consumer-test.hostile.header-id", "HeaderId");

async fn insert_effect(
    tx: &mut Transaction<'_, Postgres>,
    event_id: Uuid,
    amount: i64,
    note: String,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO effect (event_id, amount, note) VALUES ($1, $2, $3)")
        .bind(event_id)
        .bind(amount)
        .bind(note)
        .execute(&mut **tx)
        .await
        .map(drop)
}

/// Records the event and the names of the text headers it saw.
#[event_handler]
async fn on_binary(
    tx: &mut Transaction<'_, Postgres>,
    event: Binary,
    meta: &EventMeta,
) -> Result<(), sqlx::Error> {
    let names: Vec<&str> = meta.headers.iter().map(|(k, _)| k.as_str()).collect();
    insert_effect(tx, event.event_id, event.amount, names.join(",")).await
}

#[event_handler]
async fn on_binary_inbox(
    tx: &mut Transaction<'_, Postgres>,
    event: BinaryInbox,
    meta: &EventMeta,
) -> Result<(), sqlx::Error> {
    let names: Vec<&str> = meta.headers.iter().map(|(k, _)| k.as_str()).collect();
    insert_effect(tx, event.event_id, event.amount, names.join(",")).await
}

/// Sends one record with headers of any bytes.
async fn send_raw(
    producer: &FutureProducer,
    topic: &str,
    key: &[u8],
    value: &[u8],
    headers: &[(&[u8], Option<&[u8]>)],
) {
    producer
        .send(
            FutureRecord::to(topic)
                .key(key)
                .payload(value)
                .headers(headers_from_bytes(headers)),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)
        .expect("produce");
}

fn raw_header(message: &OwnedMessage, name: &[u8]) -> Option<Vec<u8>> {
    headers_as_bytes(message.headers()?.as_borrowed())
        .into_iter()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v)
}

/// Issue 22 item 11: rdkafka's header accessors panic on a name that is not
/// UTF-8. Before the fix the panic escaped the handler guard, the consumer
/// stopped (`the consumer panicked: called Result::unwrap() on an Err value:
/// Utf8Error`), and every member that took the partition over died the same
/// way. Now such a header is left out of `EventMeta::headers` (it is not
/// text), the event is handled, a bad record with such a header is
/// dead-lettered with the header kept byte for byte, and the consumer runs on.
#[sqlx::test(migrations = false)]
async fn header_names_that_are_not_utf8_stop_nothing(pool: PgPool) {
    prepare_db(&pool).await;
    for mode in [Mode::Dedup, Mode::Inbox] {
        let topic = match mode {
            Mode::Dedup => Binary::TOPIC,
            Mode::Inbox => BinaryInbox::TOPIC,
        };
        create_topic(topic, 1).await;
        let group = unique_group("hostile-binary");
        start_group_at(&group, topic, 1, true).await;
        let dlq = format!("{topic}.dlq");
        let dlq_from = high_watermarks(&dlq, 1).await[0];
        sqlx::query("DELETE FROM effect")
            .execute(&pool)
            .await
            .unwrap();
        let producer = producer();
        let binary_name: &[u8] = b"\xff\xfe-binary\x80";
        let event_type = match mode {
            Mode::Dedup => Binary::EVENT_TYPE,
            Mode::Inbox => BinaryInbox::EVENT_TYPE,
        };
        let good = Binary::new(1);
        let body = serde_json::to_vec(&good).unwrap();
        send_raw(
            &producer,
            topic,
            b"k1",
            &body,
            &[
                (b"event_type", Some(event_type.as_bytes())),
                (binary_name, Some(b"value")),
                (b"tenant", Some(b"acme")),
                (b"tenant-raw", Some(b"\xff\x00")),
            ],
        )
        .await;
        send_raw(
            &producer,
            topic,
            b"k2",
            b"not json {",
            &[(binary_name, Some(b"\x00\x01")), (b"\xc3\x28", None)],
        )
        .await;
        let after = Binary::new(2);
        send_raw(
            &producer,
            topic,
            b"k3",
            &serde_json::to_vec(&after).unwrap(),
            &[(b"event_type", Some(event_type.as_bytes()))],
        )
        .await;
        let end = high_watermarks(topic, 1).await;
        let builder = Consumer::builder(pool.clone(), kafka_config(), &group)
            .mode(mode)
            .processor_poll_interval(Duration::from_millis(20));
        let builder = match mode {
            Mode::Dedup => builder.handler(on_binary),
            Mode::Inbox => builder.handler(on_binary_inbox),
        };
        let running = builder.build().unwrap().spawn();
        let dead = read_until(&dlq, dlq_from, Duration::from_secs(20), |m| !m.is_empty()).await;
        eventually(
            &format!("{mode:?}: both events handled and every offset committed"),
            Duration::from_secs(20),
            || async {
                count(&pool, "SELECT count(*) FROM effect").await == 2
                    && committed(&group, topic, 1).await == end
            },
        )
        .await;
        assert!(
            running.is_running(),
            "{mode:?}: the consumer stopped: {}",
            running.stopped().now_or_never_text()
        );
        running.shutdown().await.unwrap();
        // The handler saw the text headers only.
        let notes: String = sqlx::query_scalar("SELECT note FROM effect WHERE amount = 1")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(notes, "event_type,tenant", "{mode:?}");
        // The dead-letter copy keeps every original header byte for byte.
        // (`consumer_support::header` goes through rdkafka's accessors, which
        // would panic on this record's header names.)
        assert_eq!(
            raw_header(&dead[0], b"dlq_reason").as_deref(),
            Some(&b"not_json"[..]),
            "{mode:?}"
        );
        assert_eq!(
            raw_header(&dead[0], binary_name),
            Some(b"\x00\x01".to_vec())
        );
        let names: Vec<Vec<u8>> = headers_as_bytes(dead[0].headers().unwrap().as_borrowed())
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert!(names.contains(&b"\xc3\x28".to_vec()), "{mode:?}: {names:?}");
    }
}

/// The stop reason of a handle that stopped, for a failure message.
trait StoppedText {
    fn now_or_never_text(self) -> String;
}

impl<F: std::future::Future<Output = Stopped>> StoppedText for F {
    fn now_or_never_text(self) -> String {
        use futures::FutureExt;
        self.now_or_never()
            .map_or_else(|| "still running".to_owned(), |s| s.to_string())
    }
}

#[event_handler]
async fn on_shipped(tx: &mut Transaction<'_, Postgres>, event: Shipped) -> Result<(), sqlx::Error> {
    insert_effect(tx, event.event_id, event.amount, "shipped".into()).await
}

#[event_handler]
async fn on_returned(
    tx: &mut Transaction<'_, Postgres>,
    event: Returned,
) -> Result<(), sqlx::Error> {
    insert_effect(tx, event.event_id, event.amount, "returned".into()).await
}

/// Issue 22 item 13: on a topic with several handlers, a record that names
/// no event type (no header, no payload field) cannot be routed by anyone.
/// Before the fix the default `Skip` policy dropped it silently, as if it
/// were another service's type; now it is dead-lettered as malformed,
/// whatever the policy, and typed records around it are handled.
#[sqlx::test(migrations = false)]
async fn a_record_that_names_no_event_type_is_dead_lettered_not_skipped(pool: PgPool) {
    prepare_db(&pool).await;
    create_topic(Shipped::TOPIC, 1).await;
    let group = unique_group("hostile-untyped");
    start_group_at(&group, Shipped::TOPIC, 1, true).await;
    let dlq = format!("{}.dlq", Shipped::TOPIC);
    let dlq_from = high_watermarks(&dlq, 1).await[0];
    let producer = producer();
    produce_event(&producer, &Shipped::new(1)).await;
    let untyped = Shipped::new(2);
    produce(
        &producer,
        Shipped::TOPIC,
        Some("k"),
        &serde_json::to_vec(&untyped).unwrap(),
        &[],
    )
    .await;
    // An empty type names nothing either.
    produce(
        &producer,
        Shipped::TOPIC,
        Some("k"),
        &serde_json::to_vec(&Shipped::new(3)).unwrap(),
        &[("event_type", "")],
    )
    .await;
    produce_event(&producer, &Returned::new(4)).await;
    let end = high_watermarks(Shipped::TOPIC, 1).await;
    let running = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_shipped)
        .handler(on_returned)
        .build()
        .unwrap()
        .spawn();
    let dead = read_until(&dlq, dlq_from, Duration::from_secs(20), |m| m.len() >= 2).await;
    eventually(
        "the typed events handled and every offset committed",
        Duration::from_secs(20),
        || async {
            count(&pool, "SELECT count(*) FROM effect").await == 2
                && committed(&group, Shipped::TOPIC, 1).await == end
        },
    )
    .await;
    let summary = running.summary();
    running.shutdown().await.unwrap();
    assert_eq!(summary.skipped, 0, "nothing is skipped as another type");
    for message in &dead {
        assert_eq!(
            header(message, "dlq_reason").as_deref(),
            Some("missing_event_type")
        );
        let error = header(message, "dlq_error").unwrap();
        assert!(error.contains("several handlers"), "{error}");
    }
}

#[event_handler]
async fn on_header_id(
    tx: &mut Transaction<'_, Postgres>,
    event: HeaderId,
    meta: &EventMeta,
) -> Result<(), sqlx::Error> {
    assert_eq!(event.event_id, meta.event_id);
    insert_effect(tx, event.event_id, event.amount, "header".into()).await
}

/// Issue 22 item 14: `docs/wire-format.md` says the event id is the
/// payload's `event_id`, else the `event_id` header. Before the fix a record
/// with the id in the header alone was dead-lettered `missing_event_id`.
/// Now it is handled under that id, once, in both modes.
#[sqlx::test(migrations = false)]
async fn an_event_id_in_the_header_alone_identifies_the_event(pool: PgPool) {
    prepare_db(&pool).await;
    create_topic(HeaderId::TOPIC, 1).await;
    for mode in [Mode::Dedup, Mode::Inbox] {
        let group = unique_group("hostile-header-id");
        start_group_at(&group, HeaderId::TOPIC, 1, true).await;
        sqlx::query("DELETE FROM effect")
            .execute(&pool)
            .await
            .unwrap();
        let producer = producer();
        let id = Uuid::new_v4();
        let body = serde_json::json!({ "order_id": Uuid::new_v4(), "amount": 7 }).to_string();
        let id_text = id.to_string();
        // Sent twice, as a redelivery would: handled once.
        for _ in 0..2 {
            produce(
                &producer,
                HeaderId::TOPIC,
                Some("k"),
                body.as_bytes(),
                &[("event_type", "HeaderId"), ("event_id", &id_text)],
            )
            .await;
        }
        let end = high_watermarks(HeaderId::TOPIC, 1).await;
        let running = Consumer::builder(pool.clone(), kafka_config(), &group)
            .handler(on_header_id)
            .mode(mode)
            .processor_poll_interval(Duration::from_millis(20))
            .build()
            .unwrap()
            .spawn();
        eventually(
            &format!("{mode:?}: the event handled and every offset committed"),
            Duration::from_secs(20),
            || async {
                count(&pool, "SELECT count(*) FROM effect").await == 1
                    && committed(&group, HeaderId::TOPIC, 1).await == end
            },
        )
        .await;
        let summary = running.summary();
        running.shutdown().await.unwrap();
        let handled: Uuid = sqlx::query_scalar("SELECT event_id FROM effect")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(handled, id, "{mode:?}");
        assert_eq!(summary.dead_lettered, 0, "{mode:?}");
    }
}
