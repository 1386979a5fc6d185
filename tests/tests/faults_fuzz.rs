//! Fuzzing the consumer's inbound decode and dispatch path (issues 8 and 22):
//! many generated records (arbitrary key, value, header name and value
//! bytes, timestamps, mutated valid events, the harness's poison kinds) go
//! through `Consumer::__route`, which
//! is the consumer loop's own routing decision, in both modes. None may
//! panic, and each must end where an independent oracle says: handled (dedup
//! mode, then deduplicated by event id), stored (inbox mode) or
//! dead-lettered, never skipped under the dead-letter policy.
//!
//! Seeded, so a failure is reproducible: the seed and case are in the panic.
//! `FAULTS_FUZZ_CASES` sets the number of cases (default 20 000).

use outbox_tests::faults::model::{LedgerEntry, TOPIC, apply_entry};
use outbox_tests::faults::poison::{RawMessage, poison_message};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rdkafka::message::{OwnedMessage, Timestamp};
use txoutbox_runtime::consumer::{Consumer, DeadLetterReason, Mode, Route, UnknownEventPolicy};
use uuid::Uuid;

const MAX_BYTES: usize = 2048;

fn bytes(rng: &mut StdRng, max: usize) -> Vec<u8> {
    let len = rng.random_range(0..=max);
    (0..len).map(|_| rng.random()).collect()
}

/// A valid `LedgerEntry` payload, then maybe mutated.
fn mutated_event(rng: &mut StdRng) -> RawMessage {
    let mut value = serde_json::to_value(LedgerEntry {
        event_id: Uuid::new_v4(),
        key: format!("k{}", rng.random_range(0..10)),
        seq: rng.random_range(1..1000),
        writer: 0,
    })
    .expect("serializes");
    let map = value.as_object_mut().expect("object");
    match rng.random_range(0..8) {
        0 => {} // valid
        1 => {
            let field = ["event_id", "key", "seq", "writer"][rng.random_range(0..4)];
            map.remove(field);
        }
        2 => {
            let field = ["event_id", "key", "seq", "writer"][rng.random_range(0..4)];
            let junk = [
                serde_json::json!(null),
                serde_json::json!("x"),
                serde_json::json!(1.5),
                serde_json::json!([1]),
                serde_json::json!({}),
                serde_json::json!(-1),
            ];
            map.insert(field.into(), junk[rng.random_range(0..junk.len())].clone());
        }
        3 => {
            map.insert("event_type".into(), serde_json::json!("LedgerEntry"));
        }
        4 => {
            map.insert("event_type".into(), serde_json::json!("SomethingElse"));
        }
        5 => {
            map.insert("event_type".into(), serde_json::json!(42));
        }
        6 => {
            map.insert("filler".into(), serde_json::json!("y".repeat(MAX_BYTES)));
        }
        _ => {
            map.insert(
                String::from_utf8_lossy(&bytes(rng, 6)).into_owned(),
                serde_json::json!(rng.random::<u32>()),
            );
        }
    }
    let mut text = value.to_string().into_bytes();
    if rng.random_bool(0.05) {
        // Truncated JSON.
        let cut = rng.random_range(0..text.len());
        text.truncate(cut);
    }
    RawMessage {
        key: Some(bytes(rng, 20)),
        value: Some(text),
        headers: Vec::new(),
    }
}

/// Headers of any bytes: the names the consumer reads (`event_type`,
/// `event_id`, `traceparent`), random names that are often not UTF-8 or
/// hold a NUL, and values of any kind.
fn random_headers(rng: &mut StdRng) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
    let mut headers = Vec::new();
    for _ in 0..rng.random_range(0..5) {
        let name = match rng.random_range(0..10) {
            0 => b"event_type".to_vec(),
            1 => b"traceparent".to_vec(),
            2 => b"event_id".to_vec(),
            // Debezium's and CloudEvents' names, read as fallbacks.
            6 => b"id".to_vec(),
            7 => b"ce_id".to_vec(),
            8 => b"ce_type".to_vec(),
            9 => b"content-type".to_vec(),
            3 => {
                let mut name = bytes(rng, 8);
                name.push(0xfe); // never UTF-8
                name
            }
            _ => bytes(rng, 8),
        };
        let value = match rng.random_range(0..9) {
            0 => None,
            8 => Some(b"application/cloudevents+json".to_vec()),
            1 => Some(b"LedgerEntry".to_vec()),
            2 => Some(b"Bogus".to_vec()),
            3 => Some(vec![0xff, 0xfe, 0x00]),
            4 => Some(Uuid::new_v4().to_string().into_bytes()),
            5 => Some(Vec::new()),
            _ => Some(bytes(rng, 30)),
        };
        headers.push((name, value));
    }
    headers
}

fn generate(rng: &mut StdRng) -> RawMessage {
    let mut message = match rng.random_range(0..4) {
        0 => RawMessage {
            key: rng.random_bool(0.7).then(|| bytes(rng, 40)),
            value: rng.random_bool(0.9).then(|| bytes(rng, 300)),
            headers: Vec::new(),
        },
        1 => poison_message(rng),
        _ => {
            let event = mutated_event(rng);
            wrapped(rng, event)
        }
    };
    message.headers.extend(random_headers(rng));
    message
}

/// `message` as it is, or its value as a JSON string (Kafka Connect's
/// `JsonConverter`), or as a structured CloudEvent's `data`.
fn wrapped(rng: &mut StdRng, mut message: RawMessage) -> RawMessage {
    let value = message.value.take().unwrap_or_default();
    message.value = Some(match rng.random_range(0..6) {
        0 => serde_json::to_vec(&String::from_utf8_lossy(&value)).expect("a string serializes"),
        1 => {
            message.headers.push((
                b"content-type".to_vec(),
                Some(b"application/cloudevents+json".to_vec()),
            ));
            let id = if rng.random_bool(0.5) {
                Uuid::new_v4().to_string()
            } else {
                "not-a-uuid".to_owned()
            };
            let mut event = format!(
                r#"{{"specversion": "1.0", "id": "{id}", "type": "LedgerEntry", "source": "/fuzz", "data": "#
            )
            .into_bytes();
            event.extend_from_slice(&value);
            event.push(b'}');
            event
        }
        _ => value,
    });
    message
}

/// The event of a structured CloudEvent (`content-type:
/// application/cloudevents+json`): its `data` object and the other
/// attributes, per docs/wire-format.md; `None` where it is `not_json`.
fn structured_event(
    value: &[u8],
) -> Option<(
    serde_json::Map<String, serde_json::Value>,
    serde_json::Map<String, serde_json::Value>,
)> {
    let serde_json::Value::Object(mut event) = serde_json::from_slice(value).ok()? else {
        return None;
    };
    event.get("specversion")?.as_str()?;
    if let Some(media_type) = event.get("datacontenttype").and_then(|t| t.as_str()) {
        let media_type = media_type.split(';').next().unwrap_or_default().trim();
        let media_type = media_type.to_ascii_lowercase();
        if !(media_type == "application/json"
            || media_type == "text/json"
            || media_type.ends_with("+json"))
        {
            return None;
        }
    }
    match event.remove("data") {
        Some(serde_json::Value::Object(data)) => Some((data, event)),
        _ => None,
    }
}

fn to_kafka(message: &RawMessage, offset: i64, timestamp: Timestamp) -> OwnedMessage {
    let headers = (!message.headers.is_empty()).then(|| message.kafka_headers());
    OwnedMessage::new(
        message.value.clone(),
        message.key.clone(),
        TOPIC.to_owned(),
        timestamp,
        0,
        offset,
        headers,
    )
}

/// Any timestamp a record can carry, the nonsensical ones included.
fn random_timestamp(rng: &mut StdRng) -> Timestamp {
    match rng.random_range(0..4) {
        0 => Timestamp::NotAvailable,
        1 => Timestamp::CreateTime(rng.random()),
        2 => Timestamp::LogAppendTime(rng.random()),
        _ => Timestamp::CreateTime(-1),
    }
}

/// A header's name as librdkafka hands it over: a C string, cut at a NUL.
fn c_name(name: &[u8]) -> &[u8] {
    name.split(|b| *b == 0).next().unwrap_or_default()
}

/// The first header `name` whose value is UTF-8 text (the wire format's
/// headers are text; others are left on the wire for the dead-letter copy).
fn text_header(message: &RawMessage, name: &str) -> Option<String> {
    message
        .headers
        .iter()
        .filter(|(k, _)| c_name(k) == name.as_bytes())
        .find_map(|(_, v)| String::from_utf8(v.clone()?).ok())
}

/// Whether PostgreSQL could not store `message` in the inbox: a NUL
/// character in its key, a UTF-8 header value, or a string of its JSON
/// payload.
fn holds_nul(message: &RawMessage, payload: &serde_json::Value) -> bool {
    fn in_json(value: &serde_json::Value) -> bool {
        match value {
            serde_json::Value::String(s) => s.contains('\0'),
            serde_json::Value::Array(items) => items.iter().any(in_json),
            serde_json::Value::Object(map) => {
                map.iter().any(|(k, v)| k.contains('\0') || in_json(v))
            }
            _ => false,
        }
    }
    let key = message
        .key
        .as_deref()
        .is_some_and(|k| String::from_utf8_lossy(k).contains('\0'));
    // Header names travel as C strings (cut at a NUL); headers are kept
    // when name and value are UTF-8.
    let header = message.headers.iter().any(|(name, value)| {
        std::str::from_utf8(c_name(name)).is_ok()
            && value
                .as_deref()
                .and_then(|v| std::str::from_utf8(v).ok())
                .is_some_and(|v| v.contains('\0'))
    });
    key || header || in_json(payload)
}

/// What the consumer must do with `message` in `mode`, derived from the wire
/// format (docs/wire-format.md) independently of the consumer's code.
fn oracle(message: &RawMessage, mode: Mode) -> Route {
    let value = message.value.as_deref().unwrap_or_default();
    if value.len() + message.key.as_ref().map_or(0, Vec::len) > MAX_BYTES {
        return Route::DeadLetter(DeadLetterReason::Oversized);
    }
    let not_json = Route::DeadLetter(DeadLetterReason::NotJson);
    // The event: a structured CloudEvent's `data`, the object a JSON string
    // value holds, or the value itself.
    let structured = text_header(message, "content-type").is_some_and(|t| {
        t.split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .eq_ignore_ascii_case("application/cloudevents+json")
    });
    let (mut payload, attributes) = if structured {
        match structured_event(value) {
            Some(found) => found,
            None => return not_json,
        }
    } else {
        let object = match serde_json::from_slice(value) {
            Ok(serde_json::Value::Object(payload)) => Some(payload),
            Ok(serde_json::Value::String(inner)) if !inner.trim_start().starts_with('"') => {
                match serde_json::from_str(&inner) {
                    Ok(serde_json::Value::Object(payload)) => Some(payload),
                    _ => None,
                }
            }
            _ => None,
        };
        match object {
            Some(payload) => (payload, serde_json::Map::new()),
            None => return not_json,
        }
    };
    let attribute = |name: &str| attributes.get(name)?.as_str().map(str::to_owned);
    // The payload's `event_id`, else the first of the `event_id`, `ce_id`
    // and `id` headers, else the CloudEvent's `id`.
    let from_headers = ["event_id", "ce_id", "id"]
        .into_iter()
        .find_map(|name| text_header(message, name))
        .or_else(|| attribute("id"));
    let event_id = match payload.get("event_id") {
        None | Some(serde_json::Value::Null) => match from_headers {
            None => return Route::DeadLetter(DeadLetterReason::MissingEventId),
            Some(text) => match Uuid::parse_str(&text) {
                Ok(id) => {
                    payload.insert("event_id".into(), id.to_string().into());
                    id
                }
                Err(_) => return Route::DeadLetter(DeadLetterReason::InvalidEventId),
            },
        },
        Some(serde_json::Value::String(s)) => match Uuid::parse_str(s) {
            Ok(id) => id,
            Err(_) => return Route::DeadLetter(DeadLetterReason::InvalidEventId),
        },
        Some(_) => return Route::DeadLetter(DeadLetterReason::InvalidEventId),
    };
    // The first `event_type` (then `ce_type`) header with a UTF-8 value,
    // else the CloudEvent's `type`, else the payload's string field, else
    // the topic's only handler's type; an empty name names nothing.
    let event_type = text_header(message, "event_type")
        .or_else(|| text_header(message, "ce_type"))
        .or_else(|| attribute("type"))
        .or_else(|| payload.get("event_type")?.as_str().map(str::to_owned))
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "LedgerEntry".to_owned());
    if event_type != "LedgerEntry" {
        return Route::DeadLetter(DeadLetterReason::UnknownEventType);
    }
    if mode == Mode::Inbox {
        // Stored as it is; a payload that does not fit is the processor's
        // to park.
        let payload = serde_json::Value::Object(payload);
        // A key is stored as text (invalid UTF-8 replaced by U+FFFD, three
        // bytes each), at most `MAX_PARTITION_KEY_BYTES` of it.
        let key_too_long = message.key.as_deref().is_some_and(|k| {
            String::from_utf8_lossy(k).len() > txoutbox_core::MAX_PARTITION_KEY_BYTES
        });
        return if holds_nul(message, &payload) || key_too_long {
            Route::DeadLetter(DeadLetterReason::Unstorable)
        } else {
            Route::Store { event_id }
        };
    }
    match serde_json::from_value::<LedgerEntry>(serde_json::Value::Object(payload)) {
        Ok(event) if event.event_id == event_id => Route::Handle {
            event_id,
            handler: "apply_entry",
        },
        Ok(_) => unreachable!("one field"),
        Err(_) => Route::DeadLetter(DeadLetterReason::PayloadMismatch),
    }
}

#[tokio::test]
async fn arbitrary_records_are_handled_or_dead_lettered_never_panic() {
    fuzz(Mode::Dedup);
}

#[tokio::test]
async fn arbitrary_records_are_stored_or_dead_lettered_in_inbox_mode_never_panic() {
    fuzz(Mode::Inbox);
}

fn fuzz(mode: Mode) {
    let cases: usize = std::env::var("FAULTS_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let seed: u64 = std::env::var("FAULTS_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x0b0c_5eed);
    // Neither the pool nor the Kafka client connects: routing does no I/O.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .connect_lazy("postgres://nobody@127.0.0.1:1/none")
        .expect("lazy pool");
    let mut kafka = rdkafka::ClientConfig::new();
    kafka.set("bootstrap.servers", "127.0.0.1:1");
    let consumer = Consumer::builder(pool, kafka, "fuzz")
        .handler(apply_entry)
        .mode(mode)
        .unknown_events(UnknownEventPolicy::DeadLetter)
        .max_message_bytes(MAX_BYTES)
        .build()
        .expect("consumer");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut tally = std::collections::BTreeMap::<String, usize>::new();
    for case in 0..cases {
        let mut message = generate(&mut rng);
        if mode == Mode::Inbox && rng.random_bool(0.05) {
            // NUL characters where the inbox must refuse them.
            message.key = Some(b"k\0ey".to_vec());
        } else if mode == Mode::Inbox && rng.random_bool(0.05) {
            // Keys around the inbox's bound, as raw bytes: some are longer
            // only once stored as text.
            message.key = Some(bytes(&mut rng, 1_100));
        }
        let timestamp = random_timestamp(&mut rng);
        let route = consumer.__route(&to_kafka(&message, case as i64, timestamp));
        let expected = oracle(&message, mode);
        assert_eq!(
            route,
            expected,
            "{mode:?} seed {seed} case {case}: key {:?} value {:?} headers {:?}",
            message.key,
            message.value.as_deref().map(String::from_utf8_lossy),
            message.headers
        );
        assert_ne!(route, Route::Skip, "the dead-letter policy never skips");
        let label = match route {
            Route::Handle { .. } => "handled".to_owned(),
            Route::Store { .. } => "stored".to_owned(),
            Route::DeadLetter(reason) => format!("dead-lettered ({reason})"),
            Route::Skip => "skipped".to_owned(),
        };
        *tally.entry(label).or_default() += 1;
    }
    println!("[fuzz] {mode:?}: {cases} cases, seed {seed}: {tally:?}");
    // The generator must reach every outcome, or the test proves little
    // (inbox mode: stored, unstorable and the envelope's five reasons).
    assert!(tally.len() >= 7, "too few distinct outcomes: {tally:?}");
    if mode == Mode::Inbox {
        assert!(
            tally.contains_key("dead-lettered (unstorable)"),
            "{tally:?}"
        );
        assert!(!tally.contains_key("handled"), "{tally:?}");
    }
}
