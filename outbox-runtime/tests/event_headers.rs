//! Headers of the user's own, end to end on the real broker and PostgreSQL:
//! static ones of the event type (`#[event(headers(...))]`) and dynamic ones
//! given when the event is recorded (`Events::with_headers`) are stored with
//! the row, published after the framework's headers (scheduled events too),
//! re-sent by `outbox replay`, and seen by consumer handlers in
//! `EventMeta::headers`; bad ones fail the recording and write nothing.
#![allow(missing_docs)]

mod consumer_support;

use std::time::Duration;

use consumer_support::*;
use rdkafka::message::OwnedMessage;
use sqlx::{PgPool, Postgres, Transaction};
use txoutbox_core::{DomainEvent, Error, Events};
use txoutbox_runtime::consumer::{Consumer, EventMeta, Mode, event_handler};
use txoutbox_runtime::ops::replay::{Replay, ReplayFilter};
use txoutbox_runtime::relay::Relay;
use txoutbox_testkit::broker::client_config;
use uuid::Uuid;

/// An event type with a static header.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema, DomainEvent)]
#[event(
    topic = "headers-test.orders",
    aggregate = "Order",
    headers("schema-version" = "2")
)]
pub struct Tagged {
    pub event_id: Uuid,
    #[partition_key]
    pub order_id: Uuid,
    pub amount: i64,
}

test_event!(Plain, "headers-test.orders", "Plain");

const TOPIC: &str = Tagged::TOPIC;

fn tagged(amount: i64) -> Tagged {
    Tagged {
        event_id: Uuid::new_v4(),
        order_id: Uuid::new_v4(),
        amount,
    }
}

/// The effect: the event, and its headers of the user's own as the handler
/// saw them (`name=value;...`, sorted: an inbox row keeps them as a JSON
/// object, whose order is PostgreSQL's).
async fn apply(
    tx: &mut Transaction<'_, Postgres>,
    event_id: Uuid,
    amount: i64,
    meta: &EventMeta,
) -> Result<(), sqlx::Error> {
    let mut own: Vec<String> = meta
        .headers
        .iter()
        .filter(|(name, _)| ["schema-version", "tenant", "correlation-id"].contains(&name.as_str()))
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    own.sort();
    record_effect(tx, event_id, amount, &own.join(";")).await
}

#[event_handler]
async fn on_tagged(
    tx: &mut Transaction<'_, Postgres>,
    event: Tagged,
    meta: &EventMeta,
) -> Result<(), sqlx::Error> {
    apply(tx, event.event_id, event.amount, meta).await
}

#[event_handler]
async fn on_plain(
    tx: &mut Transaction<'_, Postgres>,
    event: Plain,
    meta: &EventMeta,
) -> Result<(), sqlx::Error> {
    apply(tx, event.event_id, event.amount, meta).await
}

/// The record's headers, in order, as (name, value).
fn headers_of(message: &OwnedMessage) -> Vec<(String, String)> {
    use rdkafka::Message;
    use rdkafka::message::Headers;
    message
        .headers()
        .map(|headers| {
            headers
                .iter()
                .map(|h| {
                    let value = String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned();
                    (h.key.to_owned(), value)
                })
                .collect()
        })
        .unwrap_or_default()
}

fn event_id_of(message: &OwnedMessage) -> Option<Uuid> {
    header(message, "event_id")?.parse().ok()
}

#[sqlx::test(migrations = false)]
async fn headers_of_your_own_are_stored_published_replayed_and_seen_by_handlers(pool: PgPool) {
    prepare_db(&pool).await;
    create_topic(TOPIC, 1).await;
    let from = high_watermarks(TOPIC, 1).await[0];

    let (static_only, both, plain, plain_dynamic, scheduled) = (
        tagged(1),
        tagged(2),
        Plain::new(3),
        Plain::new(4),
        tagged(5),
    );
    let mut events = Events::new();
    events.record(static_only.clone());
    events
        .with_headers([("tenant", "acme"), ("correlation-id", "req-42")])
        .record(both.clone());
    events.record(plain.clone());
    events
        .with_headers([("tenant", "globex")])
        .record(plain_dynamic.clone());
    events.with_headers([("tenant", "initech")]).record_at(
        scheduled.clone(),
        chrono::Utc::now() - chrono::TimeDelta::seconds(1),
    );
    let mut tx = pool.begin().await.unwrap();
    let after_commit = events.write(&mut tx).await.unwrap();
    tx.commit().await.unwrap();
    after_commit.committed_on(&pool);

    // Stored: an object of strings, NULL without headers.
    let stored: Vec<(Uuid, Option<serde_json::Value>)> = sqlx::query_as(
        "SELECT event_id, headers FROM outbox_event UNION ALL
         SELECT event_id, headers FROM outbox_scheduled",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let stored_of = |id: Uuid| stored.iter().find(|(e, _)| *e == id).unwrap().1.clone();
    assert_eq!(
        stored_of(static_only.event_id),
        Some(serde_json::json!({"schema-version": "2"}))
    );
    assert_eq!(
        stored_of(both.event_id),
        Some(
            serde_json::json!({"schema-version": "2", "tenant": "acme", "correlation-id": "req-42"})
        )
    );
    assert_eq!(stored_of(plain.event_id), None);
    assert_eq!(
        stored_of(scheduled.event_id),
        Some(serde_json::json!({"schema-version": "2", "tenant": "initech"}))
    );

    let relay = Relay::builder(pool.clone(), client_config(&brokers()))
        .schedule_poll_interval(Duration::from_millis(50))
        .spawn()
        .unwrap();
    let ids = [
        static_only.event_id,
        both.event_id,
        plain.event_id,
        plain_dynamic.event_id,
        scheduled.event_id,
    ];
    let ours = |m: &OwnedMessage| event_id_of(m).is_some_and(|id| ids.contains(&id));
    let read = read_until(TOPIC, from, Duration::from_secs(30), |read| {
        read.iter().filter(|m| ours(m)).count() >= ids.len()
    })
    .await;
    let published = |id: Uuid| {
        headers_of(
            read.iter()
                .find(|m| event_id_of(m) == Some(id))
                .unwrap_or_else(|| panic!("{id} published")),
        )
    };
    // The framework's headers first, the user's after them.
    let both_headers = published(both.event_id);
    let names: Vec<&str> = both_headers.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names[..5],
        [
            "event_id",
            "event_type",
            "aggregate_type",
            "aggregate_id",
            "content-type"
        ]
    );
    let own = |headers: &[(String, String)]| {
        let mut own: Vec<String> = headers[5..]
            .iter()
            .filter(|(n, _)| n != "traceparent" && n != "replay")
            .map(|(n, v)| format!("{n}={v}"))
            .collect();
        own.sort();
        own
    };
    assert_eq!(
        own(&both_headers),
        ["correlation-id=req-42", "schema-version=2", "tenant=acme"]
    );
    assert_eq!(own(&published(static_only.event_id)), ["schema-version=2"]);
    assert!(own(&published(plain.event_id)).is_empty());
    assert_eq!(own(&published(plain_dynamic.event_id)), ["tenant=globex"]);
    assert_eq!(
        own(&published(scheduled.event_id)),
        ["schema-version=2", "tenant=initech"],
        "a scheduled event keeps its headers through the move"
    );

    // Handlers see them: dedup mode, inbox mode handling on receipt, and
    // inbox mode through a processor (the headers read back from the row).
    for (mode, on_receipt) in [
        (Mode::Dedup, true),
        (Mode::Inbox, true),
        (Mode::Inbox, false),
    ] {
        sqlx::query("TRUNCATE effect").execute(&pool).await.unwrap();
        sqlx::query("TRUNCATE processed_event, inbox_event")
            .execute(&pool)
            .await
            .unwrap();
        let group = unique_group("headers");
        start_group_at(&group, TOPIC, 1, false).await;
        let consumer = Consumer::builder(pool.clone(), kafka_config(), &group)
            .mode(mode)
            .handle_on_receipt(on_receipt)
            .handler(on_tagged)
            .handler(on_plain)
            .spawn()
            .unwrap();
        eventually(
            &format!("{mode:?} (on receipt: {on_receipt}): all five applied"),
            Duration::from_secs(30),
            || async {
                let applied: i64 =
                    sqlx::query_scalar("SELECT count(*) FROM effect WHERE event_id = ANY($1)")
                        .bind(&ids[..])
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                applied == ids.len() as i64
            },
        )
        .await;
        consumer.shutdown().await.unwrap();
        let seen: Vec<(Uuid, String)> =
            sqlx::query_as("SELECT event_id, note FROM effect WHERE event_id = ANY($1)")
                .bind(&ids[..])
                .fetch_all(&pool)
                .await
                .unwrap();
        let seen_of = |id: Uuid| seen.iter().find(|(e, _)| *e == id).unwrap().1.clone();
        let case = format!("{mode:?} (on receipt: {on_receipt})");
        assert_eq!(
            seen_of(both.event_id),
            "correlation-id=req-42;schema-version=2;tenant=acme",
            "{case}"
        );
        assert_eq!(seen_of(plain.event_id), "", "{case}");
        assert_eq!(seen_of(plain_dynamic.event_id), "tenant=globex", "{case}");
        assert_eq!(
            seen_of(scheduled.event_id),
            "schema-version=2;tenant=initech",
            "{mode:?}"
        );
    }

    // Replay re-sends them.
    let target = format!("headers-test.replay-{}", Uuid::new_v4().simple());
    txoutbox_testkit::broker::create_topics(&brokers(), &[(&target, 1)]).await;
    let producer = client_config(&brokers())
        .set("enable.idempotence", "true")
        .create()
        .unwrap();
    Replay::new(ReplayFilter {
        topic: Some(TOPIC.into()),
        ..Default::default()
    })
    .target_topic(target.clone())
    .run(&pool, &producer, |_| {})
    .await
    .unwrap();
    let replayed = read_until(&target, 0, Duration::from_secs(30), |read| {
        read.iter().filter(|m| ours(m)).count() >= ids.len()
    })
    .await;
    let replayed_both = replayed
        .iter()
        .find(|m| event_id_of(m) == Some(both.event_id))
        .unwrap();
    assert_eq!(
        own(&headers_of(replayed_both)),
        ["correlation-id=req-42", "schema-version=2", "tenant=acme"]
    );
    relay.shutdown().await.unwrap();
}

#[sqlx::test(migrations = false)]
async fn bad_headers_fail_the_recording_and_nothing_is_written(pool: PgPool) {
    prepare_db(&pool).await;
    let long = "x".repeat(txoutbox_core::wire::MAX_USER_HEADER_VALUE_BYTES + 1);
    let many: Vec<(String, String)> = (0..txoutbox_core::wire::MAX_USER_HEADERS)
        .map(|i| (format!("h{i}"), "v".to_owned()))
        .collect();
    let cases: Vec<(Vec<(String, String)>, &str)> = vec![
        (
            vec![("event_type".into(), "x".into())],
            "the framework sets itself",
        ),
        (
            vec![("Content-Type".into(), "x".into())],
            "the framework sets itself",
        ),
        (vec![("ce_type".into(), "x".into())], "starting with `ce_`"),
        (vec![("tenant id".into(), "x".into())], "is not allowed"),
        (vec![("".into(), "x".into())], "cannot be empty"),
        (vec![("tenant".into(), long)], "at most 1024 bytes"),
        (vec![("tenant".into(), "a\0b".into())], "NUL"),
        (
            vec![("tenant".into(), "a".into()), ("tenant".into(), "b".into())],
            "given twice",
        ),
        // 16 dynamic ones plus the type's static one.
        (many, "at most 16 headers"),
        (vec![("schema-version".into(), "3".into())], "given twice"),
    ];
    for (headers, expected) in cases {
        let mut events = Events::new();
        let refused = events
            .with_headers(headers.clone())
            .try_record(tagged(1))
            .unwrap_err();
        assert!(
            matches!(&refused, Error::InvalidHeaders { event_type: "Tagged", problem } if problem.contains(expected)),
            "{headers:?}: {refused}"
        );
        assert!(events.is_empty());
        // `record` defers it: the write refuses the whole collector.
        events.record(Plain::new(1));
        events.with_headers(headers).record(tagged(2));
        let mut tx = pool.begin().await.unwrap();
        assert!(matches!(
            events.write(&mut tx).await,
            Err(Error::InvalidHeaders { .. })
        ));
        tx.rollback().await.unwrap();
    }
    assert_eq!(count(&pool, "SELECT count(*) FROM outbox_event").await, 0);
}
