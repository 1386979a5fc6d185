//! Poison: inbound messages no handler can take, and outbox rows the broker
//! refuses.

use super::db::SourceDb;
use rand::Rng;
use rand::seq::IndexedRandom;
use uuid::Uuid;

/// Header tagging a poison message with its number, so the checker can find
/// it again on the dead-letter topic (which keeps the original headers).
pub const POISON_HEADER: &str = "faults-poison";

/// A record to produce: key, value and headers, any bytes.
#[derive(Debug, Clone, Default)]
pub struct RawMessage {
    /// Key bytes.
    pub key: Option<Vec<u8>>,
    /// Value bytes.
    pub value: Option<Vec<u8>>,
    /// Headers: names and values are any bytes (a name need not be UTF-8,
    /// which rdkafka's own header API cannot express: build them with
    /// `txoutbox_runtime::consumer::headers_from_bytes`).
    pub headers: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

impl RawMessage {
    /// The headers as librdkafka takes them.
    pub fn kafka_headers(&self) -> rdkafka::message::OwnedHeaders {
        let headers: Vec<(&[u8], Option<&[u8]>)> = self
            .headers
            .iter()
            .map(|(name, value)| (name.as_slice(), value.as_deref()))
            .collect();
        txoutbox_runtime::consumer::headers_from_bytes(&headers)
    }
}

fn random_bytes(rng: &mut impl Rng, max: usize) -> Vec<u8> {
    let len = rng.random_range(0..=max);
    (0..len).map(|_| rng.random()).collect()
}

fn random_text(rng: &mut impl Rng, max: usize) -> String {
    let len = rng.random_range(0..=max);
    (0..len).map(|_| rng.random::<char>()).collect()
}

/// Noise headers: arbitrary names (text, or bytes that are not UTF-8),
/// non-UTF-8 and missing values, and sometimes a misleading `event_type`
/// header.
fn noise_headers(rng: &mut impl Rng) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
    let mut headers = Vec::new();
    for _ in 0..rng.random_range(0..4) {
        let value = if rng.random_bool(0.2) {
            None
        } else {
            Some(random_bytes(rng, 40))
        };
        let name = if rng.random_bool(0.5) {
            random_text(rng, 12).into_bytes()
        } else {
            // `\xff` never occurs in UTF-8.
            let mut name = random_bytes(rng, 11);
            name.push(0xff);
            name
        };
        headers.push((name, value));
    }
    if rng.random_bool(0.3) {
        let names: &[&[u8]] = &[b"LedgerEntry", b"Bogus", b"", b"\xff\xfe"];
        let name = names.choose(rng).expect("non-empty").to_vec();
        headers.push((b"event_type".to_vec(), Some(name)));
    }
    headers
}

/// A poison message of a random kind: not JSON, JSON but not an object, no
/// `event_id`, an `event_id` that is not a UUID, a known event type whose
/// payload does not fit, an unknown event type, or no value at all; with
/// random keys and noise headers. None of them can be handled.
pub fn poison_message(rng: &mut impl Rng) -> RawMessage {
    let id = Uuid::new_v4().to_string();
    let kind = rng.random_range(0..8);
    let value: Option<Vec<u8>> = match kind {
        0 => Some(random_bytes(rng, 200)),
        1 => {
            let values = ["[1,2,3]", "\"text\"", "42", "null", "true", "{", ""];
            Some(values.choose(rng).expect("non-empty").as_bytes().to_vec())
        }
        2 => Some(
            serde_json::json!({ "key": "k0", "seq": 1 })
                .to_string()
                .into_bytes(),
        ),
        3 => {
            let bad = [
                serde_json::json!(random_text(rng, 20)),
                serde_json::json!(12345),
                serde_json::json!({ "nested": id }),
                serde_json::json!(format!("{id}x")),
            ];
            let event_id = bad.choose(rng).expect("non-empty").clone();
            Some(
                serde_json::json!({ "event_id": event_id })
                    .to_string()
                    .into_bytes(),
            )
        }
        4 => {
            // Right envelope, wrong body: `seq` is not a number, `key` missing.
            let body = serde_json::json!({
                "event_id": id, "event_type": "LedgerEntry", "seq": random_text(rng, 5),
            });
            Some(body.to_string().into_bytes())
        }
        5 => {
            let body = serde_json::json!({
                "event_id": id, "event_type": format!("Unknown{}", rng.random::<u16>()),
                "key": "k0", "seq": 1, "writer": 0,
            });
            Some(body.to_string().into_bytes())
        }
        6 => None,
        _ => {
            // JSON object with random fields and a valid id, but nothing else.
            let mut map = serde_json::Map::new();
            map.insert("event_id".into(), id.clone().into());
            for _ in 0..rng.random_range(0..4) {
                map.insert(random_text(rng, 8), random_text(rng, 8).into());
            }
            map.remove("event_type");
            map.remove("key");
            Some(serde_json::Value::Object(map).to_string().into_bytes())
        }
    };
    let key = match rng.random_range(0..3) {
        0 => None,
        1 => Some(random_bytes(rng, 30)),
        _ => Some(format!("poison-{}", rng.random::<u32>()).into_bytes()),
    };
    let mut headers = noise_headers(rng);
    if kind == 5 {
        // Its body would fit `LedgerEntry`: a header naming that type would
        // make it a valid event, not poison.
        headers.retain(|(name, _)| name != b"event_type");
    }
    RawMessage {
        key,
        value,
        headers,
    }
}

/// `message` with every NUL removed: 0 bytes in the key, header names and
/// values and the value become 1, and JSON `\u0000` escapes become `\u0001`.
///
/// PostgreSQL `text` and `jsonb` cannot hold NUL, and the inbox consumer
/// currently wedges on a message that carries one (see `RELIABILITY.md`,
/// "known bugs"); the scenarios use this so that they test everything else,
/// and `inbox_consumer_survives_nul_bytes` shows the bug on its own.
pub fn without_nul(mut message: RawMessage) -> RawMessage {
    let clean = |bytes: &mut Vec<u8>| bytes.iter_mut().filter(|b| **b == 0).for_each(|b| *b = 1);
    if let Some(key) = &mut message.key {
        clean(key);
    }
    for (name, value) in &mut message.headers {
        clean(name);
        if let Some(value) = value {
            clean(value);
        }
    }
    if let Some(value) = &mut message.value {
        clean(value);
        let text = String::from_utf8_lossy(value);
        if text.contains("\\u0000") {
            *value = text.replace("\\u0000", "\\u0001").into_bytes();
        }
    }
    message
}

/// Inserts `count` outbox rows the broker refuses (2 MiB payloads, above the
/// producer's `message.max.bytes`), keyed `poison-<n>`, as a service with a
/// bug would. Returns their event ids.
pub async fn insert_poison_rows(source: &SourceDb, count: usize, first: usize) -> Vec<Uuid> {
    let mut ids = Vec::new();
    for n in first..first + count {
        let id = Uuid::now_v7();
        let payload = serde_json::json!({
            "event_id": id.to_string(),
            "filler": "x".repeat(2 * 1024 * 1024),
        });
        let key = format!("poison-{n}");
        let inserted = match source {
            SourceDb::Postgres(pool) => sqlx::query(
                "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type,
                                               payload, topic, partition_key)
                     VALUES ($1, 'Ledger', $2, 'LedgerEntry', $3, $4, $2)",
            )
            .bind(id)
            .bind(&key)
            .bind(payload)
            .bind(super::model::TOPIC)
            .execute(pool)
            .await
            .map(|done| done.rows_affected()),
            SourceDb::MariaDb(scratch) => sqlx::query(
                "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type,
                                               payload, topic, partition_key)
                     VALUES (?, 'Ledger', ?, 'LedgerEntry', ?, ?, ?)",
            )
            .bind(id)
            .bind(&key)
            .bind(payload.to_string())
            .bind(super::model::TOPIC)
            .bind(&key)
            .execute(&scratch.pool)
            .await
            .map(|done| done.rows_affected()),
        };
        inserted.expect("insert poison row");
        ids.push(id);
    }
    ids
}
