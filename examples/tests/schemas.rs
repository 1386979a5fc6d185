//! The committed `schemas/` against the code and against independent tooling:
//! the official AsyncAPI parser and ajv (JSON Schema 2020-12), run by
//! `tests/asyncapi/validate.js` under Node.js. The first run on a machine
//! installs the npm packages with `npm ci` (from the committed lockfile).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use chrono::{TimeZone, Utc};
use outbox_examples::events::{
    CancellationReason, ChargePayment, OrderCancelled, OrderCreated, PaymentCompleted,
    PaymentFailed, ReleaseStock, ReserveStock, StockRejected, StockRejection, StockReserved,
    StockTimedOut, schema_export,
};
use serde_json::Value;
use txoutbox_core::OutboxRecord;
use txoutbox_core::schema::registered_events;
use uuid::Uuid;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

#[test]
fn committed_schemas_match_the_code() {
    let dir = workspace().join("schemas");
    if let Err(differences) = schema_export().unwrap().check(&dir) {
        panic!(
            "{differences}\nrun `cargo run -p outbox-examples --bin schemas -- export` and commit schemas/"
        );
    }
}

/// Real payloads, as the outbox stores and the relay sends them.
fn valid_samples() -> BTreeMap<String, Vec<Value>> {
    let at = Utc.with_ymd_and_hms(2026, 11, 30, 9, 30, 0).unwrap();
    let order_id = Uuid::new_v4();
    let payload = |record: OutboxRecord| {
        (
            format!("{}/{}", record.topic, record.event_type),
            record.payload,
        )
    };
    let records = [
        payload(
            OutboxRecord::from_event(&OrderCreated {
                event_id: Uuid::new_v4(),
                order_id,
                customer_id: Uuid::new_v4(),
                product_id: Some(Uuid::new_v4()),
                amount: 4_200,
                created_at: at + chrono::Duration::nanoseconds(123_456_789),
            })
            .unwrap(),
        ),
        payload(
            OutboxRecord::from_event(&OrderCancelled {
                event_id: Uuid::new_v4(),
                order_id,
                reason: CancellationReason::PaymentDeclined,
                cancelled_at: at,
            })
            .unwrap(),
        ),
        payload(
            OutboxRecord::from_event(&OrderCancelled {
                event_id: Uuid::new_v4(),
                order_id,
                reason: CancellationReason::OutOfStock,
                cancelled_at: at,
            })
            .unwrap(),
        ),
        payload(
            OutboxRecord::from_event(&PaymentCompleted {
                event_id: Uuid::new_v4(),
                payment_id: Uuid::new_v4(),
                order_id,
                amount: i64::from(i32::MAX) + 1,
                completed_at: at,
            })
            .unwrap(),
        ),
        payload(
            OutboxRecord::from_event(&OrderCancelled {
                event_id: Uuid::new_v4(),
                order_id,
                reason: CancellationReason::StockTimeout,
                cancelled_at: at,
            })
            .unwrap(),
        ),
        payload(
            OutboxRecord::from_event(&ReserveStock {
                event_id: Uuid::new_v4(),
                order_id,
                product_id: Uuid::new_v4(),
                quantity: 1,
            })
            .unwrap(),
        ),
        payload(
            OutboxRecord::from_event(&ReleaseStock {
                event_id: Uuid::new_v4(),
                order_id,
                product_id: Uuid::new_v4(),
            })
            .unwrap(),
        ),
        payload(
            OutboxRecord::from_event(&StockReserved {
                event_id: Uuid::new_v4(),
                order_id,
                product_id: Uuid::new_v4(),
                quantity: 1,
                reserved_at: at,
            })
            .unwrap(),
        ),
        payload(
            OutboxRecord::from_event(&StockRejected {
                event_id: Uuid::new_v4(),
                order_id,
                product_id: Uuid::new_v4(),
                reason: StockRejection::AlreadyReleased,
                rejected_at: at,
            })
            .unwrap(),
        ),
        payload(
            OutboxRecord::from_event(&ChargePayment {
                event_id: Uuid::new_v4(),
                order_id,
                customer_id: Uuid::new_v4(),
                amount: 4_200,
            })
            .unwrap(),
        ),
        payload(
            OutboxRecord::from_event(&PaymentFailed {
                event_id: Uuid::new_v4(),
                payment_id: Uuid::new_v4(),
                order_id,
                amount: 4_200_000,
                reason: "over the limit".into(),
                failed_at: at,
            })
            .unwrap(),
        ),
        payload(
            OutboxRecord::from_event(&StockTimedOut {
                event_id: Uuid::new_v4(),
                order_id,
                waited_ms: 1_500,
            })
            .unwrap(),
        ),
    ];
    let mut samples = BTreeMap::<String, Vec<Value>>::new();
    for (key, payload) in records {
        samples.entry(key).or_default().push(payload);
    }
    samples
}

/// Each valid sample broken in one way the schema must catch.
fn invalid_samples(valid: &BTreeMap<String, Vec<Value>>) -> BTreeMap<String, Vec<Value>> {
    let broken = |key: &str, edit: &dyn Fn(&mut serde_json::Map<String, Value>)| {
        let mut sample = valid[key][0].clone();
        edit(sample.as_object_mut().unwrap());
        sample
    };
    let created = "order.events/OrderCreated";
    let cancelled = "order.events/OrderCancelled";
    let paid = "payment.events/PaymentCompleted";
    let reserve = "inventory.commands/ReserveStock";
    let rejected = "inventory.events/StockRejected";
    let declined = "payment.events/PaymentFailed";
    BTreeMap::from([
        (
            created.to_owned(),
            vec![
                broken(created, &|m| {
                    m.remove("order_id");
                }),
                broken(created, &|m| {
                    m.remove("event_id");
                }),
                broken(created, &|m| {
                    m.insert("amount".into(), "42".into());
                }),
                broken(created, &|m| {
                    m.insert("amount".into(), 1.5.into());
                }),
                broken(created, &|m| {
                    m.insert("customer_id".into(), "not-a-uuid".into());
                }),
                broken(created, &|m| {
                    m.insert("created_at".into(), "yesterday".into());
                }),
            ],
        ),
        (
            cancelled.to_owned(),
            vec![broken(cancelled, &|m| {
                m.insert("reason".into(), "lost_in_mail".into());
            })],
        ),
        (
            paid.to_owned(),
            vec![broken(paid, &|m| {
                m.remove("payment_id");
            })],
        ),
        (
            reserve.to_owned(),
            vec![broken(reserve, &|m| {
                m.remove("product_id");
            })],
        ),
        (
            rejected.to_owned(),
            vec![broken(rejected, &|m| {
                m.insert("reason".into(), "lost_in_mail".into());
            })],
        ),
        (
            declined.to_owned(),
            vec![broken(declined, &|m| {
                m.remove("reason");
            })],
        ),
    ])
}

fn write_samples(dir: &Path, samples: &BTreeMap<String, Vec<Value>>) {
    for (key, payloads) in samples {
        let file = dir.join(format!("{key}.json"));
        fs::create_dir_all(file.parent().unwrap()).unwrap();
        fs::write(file, serde_json::to_string_pretty(payloads).unwrap()).unwrap();
    }
}

/// Installs the validator's npm packages from the lockfile unless present and
/// at least as new as the lockfile.
fn ensure_node_modules(tool: &Path) {
    let installed = tool.join("node_modules/.package-lock.json");
    let modified = |p: &Path| fs::metadata(p).and_then(|m| m.modified()).ok();
    if let (Some(installed), Some(lock)) = (
        modified(&installed),
        modified(&tool.join("package-lock.json")),
    ) && installed >= lock
    {
        return;
    }
    let output = Command::new("npm")
        .args(["ci", "--ignore-scripts", "--no-audit", "--no-fund"])
        .current_dir(tool)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run `npm ci` in {} (install Node.js >= 18 with npm): {e}",
                tool.display()
            )
        });
    assert!(
        output.status.success(),
        "`npm ci` failed in {} (needs Node.js >= 18, npm and access to the npm registry):\n{}{}",
        tool.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn schemas_pass_the_asyncapi_parser_and_json_schema_2020_12() {
    let root = workspace();
    let tool = root.join("tests/asyncapi");
    ensure_node_modules(&tool);

    let valid = valid_samples();
    let registered: Vec<String> = registered_events()
        .iter()
        .map(|e| format!("{}/{}", e.topic, e.event_type))
        .collect();
    assert_eq!(
        valid.keys().cloned().collect::<Vec<_>>(),
        registered,
        "every example event needs a sample"
    );
    let invalid = invalid_samples(&valid);
    let scratch = std::env::temp_dir().join(format!("outbox-schema-samples-{}", Uuid::new_v4()));
    write_samples(&scratch.join("valid"), &valid);
    write_samples(&scratch.join("invalid"), &invalid);

    let output = Command::new("node")
        .arg(tool.join("validate.js"))
        .arg("--asyncapi")
        .arg(root.join("schemas/asyncapi.yaml"))
        .arg("--schemas")
        .arg(root.join("schemas"))
        .arg("--samples")
        .arg(scratch.join("valid"))
        .arg("--invalid-samples")
        .arg(scratch.join("invalid"))
        .env("SCARF_ANALYTICS", "false")
        .output()
        .expect("cannot run `node` (install Node.js >= 18)");
    let _ = fs::remove_dir_all(&scratch);
    assert!(
        output.status.success(),
        "schema validation failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // What the parser understood matches the registry.
    let summary: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(summary["schemas"], serde_json::json!(registered));
    assert_eq!(summary["samples"], 12);
    assert_eq!(summary["invalidSamples"], 11);
    for event in registered_events() {
        let channel = &summary["channels"][event.topic];
        assert_eq!(channel["address"], event.topic);
        assert_eq!(channel["kafkaTopic"], event.topic);
        let message = &channel["messages"][event.event_type];
        assert_eq!(message["keyType"], "string", "{summary:#}");
        assert_eq!(message["payloadTitle"], event.event_type);
        assert_eq!(
            message["headers"],
            serde_json::json!([
                "aggregate_id",
                "aggregate_type",
                "content-type",
                "event_id",
                "event_type",
                "traceparent"
            ])
        );
    }
    let topics: Vec<_> = summary["channels"].as_object().unwrap().keys().collect();
    assert_eq!(
        topics,
        [
            "inventory.commands",
            "inventory.events",
            "order.events",
            "order.saga",
            "payment.commands",
            "payment.events"
        ]
    );
    assert!(
        summary["operations"]
            .as_array()
            .unwrap()
            .iter()
            .all(|op| op["action"] == "send")
    );
}
