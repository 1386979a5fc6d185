//! Each kind of bad input ends in the dead-letter topic with its reason, the
//! original key, value and headers, and the consumer goes on with the next
//! good message.
#![allow(missing_docs)]

mod consumer_support;

use std::time::Duration;

use consumer_support::*;
use rdkafka::Message;
use sqlx::{PgPool, Postgres, Transaction};
use txoutbox_core::DomainEvent;
use txoutbox_runtime::consumer::{Consumer, UnknownEventPolicy, event_handler};
use uuid::Uuid;

test_event!(BadPaid, "consumer-test.bad.paid", "BadPaid");

async fn insert_effect(
    tx: &mut Transaction<'_, Postgres>,
    event_id: Uuid,
    amount: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO effect (event_id, amount) VALUES ($1, $2)")
        .bind(event_id)
        .bind(amount)
        .execute(&mut **tx)
        .await
        .map(drop)
}

#[event_handler]
async fn on_bad_paid(
    tx: &mut Transaction<'_, Postgres>,
    event: BadPaid,
) -> Result<(), sqlx::Error> {
    insert_effect(tx, event.event_id, event.amount).await
}

#[sqlx::test(migrations = false)]
async fn bad_messages_are_dead_lettered_with_their_reason_and_the_consumer_goes_on(pool: PgPool) {
    prepare_db(&pool).await;
    create_topic(BadPaid::TOPIC, 1).await;
    let group = unique_group("bad");
    start_group_at(&group, BadPaid::TOPIC, 1, true).await;
    let dlq = format!("{}.dlq", BadPaid::TOPIC);
    let dlq_start = high_watermarks(&dlq, 1).await[0];
    let producer = producer();
    let typed = [("event_type", "BadPaid"), ("tenant", "acme")];
    let id = || Uuid::new_v4().to_string();
    let oversized = serde_json::json!({
        "event_id": id(), "order_id": id(), "amount": 1, "padding": "x".repeat(5000)
    });
    type Headers<'a> = &'a [(&'a str, &'a str)];
    let cases: Vec<(&str, Vec<u8>, Headers<'_>)> = vec![
        ("not_json", b"not json {".to_vec(), &typed),
        ("not_json", b"[1, 2]".to_vec(), &typed),
        (
            "missing_event_id",
            format!(r#"{{"order_id":"{}","amount":1}}"#, id()).into_bytes(),
            &typed,
        ),
        (
            "invalid_event_id",
            format!(r#"{{"event_id":"abc","order_id":"{}","amount":1}}"#, id()).into_bytes(),
            &typed,
        ),
        (
            "payload_mismatch",
            format!(
                r#"{{"event_id":"{}","order_id":"{}","amount":"lots"}}"#,
                id(),
                id()
            )
            .into_bytes(),
            &typed,
        ),
        (
            "unknown_event_type",
            format!(
                r#"{{"event_id":"{}","order_id":"{}","amount":1}}"#,
                id(),
                id()
            )
            .into_bytes(),
            &[("event_type", "SomethingElse")],
        ),
        ("oversized", serde_json::to_vec(&oversized).unwrap(), &typed),
    ];
    for (i, (_, value, headers)) in cases.iter().enumerate() {
        let key = format!("key-{i}");
        produce(&producer, BadPaid::TOPIC, Some(&key), value, headers).await;
    }
    let good = BadPaid::new(42);
    produce_event(&producer, &good).await;
    let end = high_watermarks(BadPaid::TOPIC, 1).await;

    let running = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_bad_paid)
        .unknown_events(UnknownEventPolicy::DeadLetter)
        .max_message_bytes(4096)
        .build()
        .unwrap()
        .spawn();
    let dead = read_until(&dlq, dlq_start, Duration::from_secs(20), |m| {
        m.len() >= cases.len()
    })
    .await;
    eventually(
        "the good event handled and all offsets committed",
        Duration::from_secs(20),
        || async {
            count(&pool, "SELECT count(*) FROM effect WHERE amount = 42").await == 1
                && committed(&group, BadPaid::TOPIC, 1).await == end
        },
    )
    .await;
    running.shutdown().await.unwrap();

    assert_eq!(dead.len(), cases.len());
    let first_offset = end[0] - cases.len() as i64 - 1;
    for (i, ((reason, value, headers), message)) in cases.iter().zip(&dead).enumerate() {
        assert_eq!(
            header(message, "dlq_reason").as_deref(),
            Some(*reason),
            "case {i}"
        );
        assert!(!header(message, "dlq_error").unwrap().is_empty());
        assert_eq!(
            header(message, "dlq_original_topic").as_deref(),
            Some(BadPaid::TOPIC)
        );
        assert_eq!(
            header(message, "dlq_original_partition").as_deref(),
            Some("0")
        );
        assert_eq!(
            header(message, "dlq_original_offset"),
            Some((first_offset + i as i64).to_string())
        );
        assert_eq!(header(message, "dlq_consumer_group"), Some(group.clone()));
        assert_eq!(message.key(), Some(format!("key-{i}").as_bytes()));
        assert_eq!(
            message.payload(),
            Some(value.as_slice()),
            "case {i}: value kept"
        );
        for (name, original) in *headers {
            assert_eq!(
                header(message, name).as_deref(),
                Some(*original),
                "case {i}"
            );
        }
    }
    let mismatch = header(&dead[4], "dlq_error").unwrap();
    assert!(mismatch.contains("BadPaid"), "{mismatch}");
    assert_eq!(count(&pool, "SELECT count(*) FROM effect").await, 1);
    // Nothing that failed left a dedup row behind.
    assert_eq!(
        count(&pool, "SELECT count(*) FROM processed_event").await,
        1
    );
}

test_event!(NulPaid, "consumer-test.bad.nul", "NulPaid");

#[event_handler]
async fn on_nul_paid(
    tx: &mut Transaction<'_, Postgres>,
    event: NulPaid,
) -> Result<(), sqlx::Error> {
    insert_effect(tx, event.event_id, event.amount).await
}

/// PostgreSQL cannot store a NUL character in `text` or `jsonb`: an inbox
/// consumer must dead-letter such a message instead of failing its whole batch
/// insert over and over (which would stop the partition for good).
#[sqlx::test(migrations = false)]
async fn inbox_mode_dead_letters_nul_characters_and_goes_on(pool: PgPool) {
    prepare_db(&pool).await;
    create_topic(NulPaid::TOPIC, 1).await;
    let group = unique_group("nul");
    start_group_at(&group, NulPaid::TOPIC, 1, true).await;
    let dlq = format!("{}.dlq", NulPaid::TOPIC);
    let dlq_start = high_watermarks(&dlq, 1).await[0];
    let producer = producer();
    let typed = [("event_type", "NulPaid")];
    let body = |note: &str| {
        serde_json::to_vec(&serde_json::json!({
            "event_id": Uuid::new_v4(), "order_id": Uuid::new_v4(), "amount": 1, "note": note
        }))
        .unwrap()
    };
    let before = NulPaid::new(7);
    produce_event(&producer, &before).await;
    // In the payload (JSON "\u0000"), in the key, in a header value.
    produce(
        &producer,
        NulPaid::TOPIC,
        Some("k"),
        &body("a\u{0}b"),
        &typed,
    )
    .await;
    produce(
        &producer,
        NulPaid::TOPIC,
        Some("k\u{0}"),
        &body("fine"),
        &typed,
    )
    .await;
    let bad_header = [("event_type", "NulPaid"), ("tenant", "x\u{0}y")];
    produce(
        &producer,
        NulPaid::TOPIC,
        Some("k"),
        &body("fine"),
        &bad_header,
    )
    .await;
    let after = NulPaid::new(8);
    produce_event(&producer, &after).await;
    let end = high_watermarks(NulPaid::TOPIC, 1).await;

    let running = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_nul_paid)
        .mode(txoutbox_runtime::consumer::Mode::Inbox)
        .processor_poll_interval(Duration::from_millis(20))
        .build()
        .unwrap()
        .spawn();
    let dead = read_until(&dlq, dlq_start, Duration::from_secs(20), |m| m.len() >= 3).await;
    eventually(
        "the good events handled and all offsets committed",
        Duration::from_secs(20),
        || async {
            count(&pool, "SELECT count(*) FROM effect").await == 2
                && committed(&group, NulPaid::TOPIC, 1).await == end
        },
    )
    .await;
    running.shutdown().await.unwrap();

    assert_eq!(dead.len(), 3);
    for message in &dead {
        assert_eq!(header(message, "dlq_reason").as_deref(), Some("unstorable"));
        assert!(header(message, "dlq_error").unwrap().contains("NUL"));
    }
    assert_eq!(count(&pool, "SELECT count(*) FROM inbox_event").await, 2);
}

test_event!(LongKeyPaid, "consumer-test.bad.long-key", "LongKeyPaid");

#[event_handler]
async fn on_long_key_paid(
    tx: &mut Transaction<'_, Postgres>,
    event: LongKeyPaid,
    meta: &txoutbox_runtime::consumer::EventMeta,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO effect (event_id, amount, note) VALUES ($1, $2, $3)")
        .bind(event.event_id)
        .bind(event.amount)
        .bind(meta.key.as_deref())
        .execute(&mut **tx)
        .await
        .map(drop)
}

/// `len` random printable ASCII characters: random so that PostgreSQL cannot
/// compress them under its b-tree limit (about 2,700 bytes per index entry).
fn incompressible(len: usize) -> String {
    std::iter::repeat_with(|| *Uuid::new_v4().as_bytes())
        .flatten()
        .take(len)
        .map(|byte| char::from(b'!' + byte % 94))
        .collect()
}

fn long_key_body(amount: i64) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "event_id": Uuid::new_v4(), "order_id": Uuid::new_v4(), "amount": amount
    }))
    .unwrap()
}

/// A key longer than PostgreSQL can index used to fail the inbox insert of
/// its whole batch, retried for ever as a database outage: the partition
/// stopped for good. Such a record is dead-lettered instead, whichever way the
/// inbox would store it: handled on receipt, stored pending (no handling on
/// receipt), or kept for another version (`UnknownEventPolicy::Keep`).
#[sqlx::test(migrations = false)]
async fn inbox_mode_dead_letters_keys_too_long_to_index_and_goes_on(pool: PgPool) {
    prepare_db(&pool).await;
    create_topic(LongKeyPaid::TOPIC, 1).await;
    // Two consumers of the same records: one handles on receipt, one only
    // stores pending rows for its processors.
    let groups = [unique_group("long-key"), unique_group("long-key-pending")];
    for group in &groups {
        start_group_at(group, LongKeyPaid::TOPIC, 1, true).await;
    }
    let dlq = format!("{}.dlq", LongKeyPaid::TOPIC);
    let dlq_start = high_watermarks(&dlq, 1).await[0];
    let producer = producer();
    let long_key = incompressible(10 * 1024);
    let (body, producer) = (&long_key_body, &producer);
    let healthy = |amount: i64| async move {
        let key = format!("order-{amount}");
        let typed = [("event_type", "LongKeyPaid")];
        produce(
            producer,
            LongKeyPaid::TOPIC,
            Some(&key),
            &body(amount),
            &typed,
        )
        .await;
    };
    healthy(1).await;
    // Of a type handled here, and of a type only a later version handles.
    let known = [("event_type", "LongKeyPaid")];
    produce(
        producer,
        LongKeyPaid::TOPIC,
        Some(&long_key),
        &body(100),
        &known,
    )
    .await;
    let unknown = [("event_type", "LongKeyRefunded")];
    produce(
        producer,
        LongKeyPaid::TOPIC,
        Some(&long_key),
        &body(101),
        &unknown,
    )
    .await;
    healthy(2).await;
    let end = high_watermarks(LongKeyPaid::TOPIC, 1).await;

    let running: Vec<_> = groups
        .iter()
        .zip([true, false])
        .map(|(group, on_receipt)| {
            Consumer::builder(pool.clone(), kafka_config(), group)
                .handler(on_long_key_paid)
                .mode(txoutbox_runtime::consumer::Mode::Inbox)
                .unknown_events(UnknownEventPolicy::Keep)
                .handle_on_receipt(on_receipt)
                .processor_poll_interval(Duration::from_millis(20))
                .build()
                .unwrap()
                .spawn()
        })
        .collect();
    let effects = |amount: i64| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM effect WHERE amount = $1")
                .bind(amount)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    eventually(
        "the healthy events handled by both groups and all offsets committed",
        Duration::from_secs(30),
        || async {
            effects(1).await == 2
                && effects(2).await == 2
                && committed(&groups[0], LongKeyPaid::TOPIC, 1).await == end
                && committed(&groups[1], LongKeyPaid::TOPIC, 1).await == end
        },
    )
    .await;
    let dead = read_until(&dlq, dlq_start, Duration::from_secs(20), |m| m.len() >= 4).await;

    // Still running: a later healthy event goes through both.
    healthy(3).await;
    let end = high_watermarks(LongKeyPaid::TOPIC, 1).await;
    eventually(
        "a later event handled by both",
        Duration::from_secs(20),
        || async {
            effects(3).await == 2
                && committed(&groups[0], LongKeyPaid::TOPIC, 1).await == end
                && committed(&groups[1], LongKeyPaid::TOPIC, 1).await == end
        },
    )
    .await;
    for consumer in running {
        let summary = consumer.shutdown().await.unwrap();
        assert_eq!(summary.dead_lettered, 2, "{summary:?}");
    }

    assert_eq!(dead.len(), 4);
    for group in &groups {
        let ours: Vec<_> = dead
            .iter()
            .filter(|m| header(m, "dlq_consumer_group").as_deref() == Some(group.as_str()))
            .collect();
        assert_eq!(ours.len(), 2, "{group}");
        for message in ours {
            assert_eq!(message.key(), Some(long_key.as_bytes()), "key kept");
            assert_eq!(header(message, "dlq_reason").as_deref(), Some("unstorable"));
            let error = header(message, "dlq_error").unwrap();
            assert!(
                error.contains("10240 bytes")
                    && error.contains("1024")
                    && error.contains("shorter key"),
                "says what and how to fix it: {error}"
            );
        }
    }
    assert_eq!(effects(100).await + effects(101).await, 0);
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM inbox_event WHERE length(partition_key) > 1024"
        )
        .await,
        0
    );
    assert_eq!(count(&pool, "SELECT count(*) FROM inbox_event").await, 6);
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM inbox_event WHERE NOT processed"
        )
        .await,
        0
    );
}
