//! Export tests on hand-written events, so that this test binary's registry
//! holds exactly the two submitted below (the derive, its registration
//! included, is tested in `tests/derive.rs`, a binary of its own).

use std::fs;
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Value, json};
use uuid::Uuid;

use super::check::incompatibilities;
use super::*;
use crate::DomainEvent;

/// A line of an order: nested, so the schema has `$defs` and `$ref`s.
#[derive(Serialize, JsonSchema)]
struct Line {
    sku: String,
    quantity: u32,
}

#[derive(Serialize, JsonSchema)]
struct OrderPlaced {
    event_id: Uuid,
    order_id: Uuid,
    amount: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
    lines: Vec<Line>,
}

impl DomainEvent for OrderPlaced {
    const TOPIC: &'static str = "test.orders";
    const EVENT_TYPE: &'static str = "OrderPlaced";
    const AGGREGATE_TYPE: &'static str = "Order";
    const PARTITION_KEY_FIELD: &'static str = "order_id";
    fn event_id(&self) -> Uuid {
        self.event_id
    }
    fn aggregate_id(&self) -> String {
        self.order_id.to_string()
    }
    fn partition_key(&self) -> String {
        self.order_id.to_string()
    }
}

/// Serde renames the id field, so the export must add `event_id` itself.
#[derive(Serialize, JsonSchema)]
struct PaymentSettled {
    #[serde(rename = "id")]
    event_id: Uuid,
    payment_id: String,
}

impl DomainEvent for PaymentSettled {
    const TOPIC: &'static str = "test.payments";
    const EVENT_TYPE: &'static str = "payment-settled";
    const AGGREGATE_TYPE: &'static str = "Payment";
    const PARTITION_KEY_FIELD: &'static str = "payment_id";
    fn event_id(&self) -> Uuid {
        self.event_id
    }
    fn aggregate_id(&self) -> String {
        self.payment_id.clone()
    }
    fn partition_key(&self) -> String {
        self.payment_id.clone()
    }
}

const fn descriptor<E: DomainEvent + JsonSchema>(rust_type: &'static str) -> EventDescriptor {
    EventDescriptor {
        topic: E::TOPIC,
        event_type: E::EVENT_TYPE,
        aggregate_type: E::AGGREGATE_TYPE,
        partition_key_field: E::PARTITION_KEY_FIELD,
        rust_type,
        kind: MessageKind::Event,
        headers: E::HEADERS,
        schema: json_schema_for::<E>,
    }
}

static ORDER_PLACED: EventDescriptor = descriptor::<OrderPlaced>("tests::OrderPlaced");
static PAYMENT_SETTLED: EventDescriptor = descriptor::<PaymentSettled>("tests::PaymentSettled");

inventory::submit! { descriptor::<OrderPlaced>("tests::OrderPlaced") }
inventory::submit! { descriptor::<PaymentSettled>("tests::PaymentSettled") }

fn export() -> SchemaExport {
    SchemaExport::from_descriptors(&[&PAYMENT_SETTLED, &ORDER_PLACED]).unwrap()
}

fn json_file(export: &SchemaExport, path: &str) -> Value {
    serde_json::from_str(export.file(path).unwrap()).unwrap()
}

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("outbox-schema-{}", Uuid::new_v4()));
        fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[test]
fn registry_lists_submitted_events_sorted() {
    let registered: Vec<_> = registered_events()
        .iter()
        .map(|e| (e.topic, e.event_type))
        .collect();
    assert_eq!(
        registered,
        [
            ("test.orders", "OrderPlaced"),
            ("test.payments", "payment-settled")
        ]
    );
    assert_eq!(SchemaExport::from_registry().unwrap(), export());
}

#[test]
fn export_of_two_events_produces_expected_files() {
    let export = export();
    let paths: Vec<_> = export.files().map(|(p, _)| p).collect();
    assert_eq!(
        paths,
        [
            "asyncapi.yaml",
            "test.orders/OrderPlaced.json",
            "test.payments/payment-settled.json"
        ]
    );

    assert_eq!(
        json_file(&export, "test.orders/OrderPlaced.json"),
        json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "test.orders/OrderPlaced.json",
            "title": "OrderPlaced",
            "type": "object",
            "properties": {
                "event_id": { "type": "string", "format": "uuid" },
                "event_type": { "type": "string", "const": "OrderPlaced" },
                "order_id": { "type": "string", "format": "uuid" },
                "amount": { "type": "integer", "format": "int64" },
                "note": { "type": ["string", "null"] },
                "lines": { "type": "array", "items": { "$ref": "#/$defs/Line" } },
            },
            "required": ["event_id", "order_id", "amount", "lines", "event_type"],
            "$defs": {
                "Line": {
                    "type": "object",
                    "description": "A line of an order: nested, so the schema has `$defs` and `$ref`s.",
                    "properties": {
                        "sku": { "type": "string" },
                        "quantity": { "type": "integer", "format": "uint32", "minimum": 0 },
                    },
                    "required": ["sku", "quantity"],
                },
            },
            "x-topic": "test.orders",
            "x-event-type": "OrderPlaced",
            "x-aggregate-type": "Order",
            "x-partition-key": "order_id",
        })
    );

    // The renamed id field stays, and `event_id` is promised on top of it;
    // so is the event type, under `event_type`.
    let payment = json_file(&export, "test.payments/payment-settled.json");
    assert_eq!(
        payment["required"],
        json!(["id", "payment_id", "event_id", "event_type"])
    );
    assert_eq!(
        payment["properties"]["event_type"],
        json!({ "type": "string", "const": "payment-settled" })
    );
    assert_eq!(
        payment["properties"]["event_id"],
        json!({ "type": "string", "format": "uuid" })
    );
    assert_eq!(payment["x-partition-key"], "payment_id");
}

#[test]
fn asyncapi_document_has_channels_messages_bindings_and_resolvable_refs() {
    let export = export();
    let doc: Value = yaml_to_json(export.file("asyncapi.yaml").unwrap());
    assert_eq!(doc["asyncapi"], "3.0.0");
    assert_eq!(doc["defaultContentType"], "application/json");
    assert_eq!(
        doc["channels"]["test.orders"],
        json!({
            "address": "test.orders",
            "messages": { "OrderPlaced": { "$ref": "#/components/messages/test.orders.OrderPlaced" } },
            "bindings": { "kafka": { "topic": "test.orders", "bindingVersion": "0.5.0" } },
        })
    );
    assert_eq!(doc["operations"]["test.payments.send"]["action"], "send");
    assert_eq!(
        doc["operations"]["test.payments.send"]["messages"],
        json!([{ "$ref": "#/channels/test.payments/messages/payment-settled" }])
    );

    let message = &doc["components"]["messages"]["test.orders.OrderPlaced"];
    assert_eq!(message["name"], "OrderPlaced");
    assert_eq!(message["bindings"]["kafka"]["key"]["type"], "string");
    assert_eq!(message["x-partition-key"], "order_id");
    let headers = &message["headers"];
    assert_eq!(
        headers["required"],
        json!([
            "event_id",
            "event_type",
            "aggregate_type",
            "aggregate_id",
            "content-type"
        ])
    );
    assert_eq!(headers["properties"]["event_type"]["const"], "OrderPlaced");
    assert_eq!(headers["properties"]["aggregate_type"]["const"], "Order");
    assert!(headers["properties"]["traceparent"].is_object());

    // The embedded payload is draft-07 style: no `$schema`/`$id`, nested types
    // under `definitions`, references rebased onto the document.
    let payload = &doc["components"]["schemas"]["test.orders.OrderPlaced"];
    assert!(payload.get("$schema").is_none() && payload.get("$id").is_none());
    assert!(payload.get("$defs").is_none());
    assert_eq!(
        payload["properties"]["lines"]["items"]["$ref"],
        "#/components/schemas/test.orders.OrderPlaced/definitions/Line"
    );

    let mut refs = Vec::new();
    collect_refs(&doc, &mut refs);
    assert_eq!(refs.len(), 9, "{refs:?}");
    for reference in refs {
        let pointer = reference.strip_prefix('#').unwrap();
        assert!(doc.pointer(pointer).is_some(), "dangling $ref {reference}");
    }
}

fn collect_refs(value: &Value, refs: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("$ref", Value::String(r)) => refs.push(r.clone()),
                    _ => collect_refs(v, refs),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect_refs(v, refs)),
        _ => {}
    }
}

#[test]
fn export_is_deterministic_and_canonical() {
    let first = export();
    let reversed = SchemaExport::from_descriptors(&[&ORDER_PLACED, &PAYMENT_SETTLED]).unwrap();
    assert_eq!(first, reversed);
    assert_eq!(first, export());
    for (path, contents) in first.files() {
        assert!(contents.ends_with('\n'), "{path} lacks a trailing newline");
    }
    // Keys are written sorted, so the text is its own canonical form.
    let text = first.file("test.orders/OrderPlaced.json").unwrap();
    let keys: Vec<_> = text
        .lines()
        .filter(|l| l.starts_with("  \""))
        .map(|l| l.trim().split('"').nth(1).unwrap())
        .collect();
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    assert_eq!(keys, sorted);
    assert_eq!(keys.first(), Some(&"$defs"));
}

#[test]
fn write_then_check_passes_and_rewrites_nothing() {
    let dir = TempDir::new();
    let export = export();
    let report = export.write_to(&dir.0).unwrap();
    assert_eq!(report.written.len(), 3);
    assert_eq!(export.check(&dir.0), Ok(()));
    let again = export.write_to(&dir.0).unwrap();
    assert_eq!(
        again,
        WriteReport {
            written: vec![],
            removed: vec![],
            unchanged: 3
        }
    );
}

#[test]
fn check_names_missing_extra_and_changed_files() {
    let dir = TempDir::new();
    let export = export();
    export.write_to(&dir.0).unwrap();
    fs::remove_file(dir.0.join("test.payments/payment-settled.json")).unwrap();
    fs::write(dir.0.join("test.orders/OrderShipped.json"), "{}\n").unwrap();
    let order = dir.0.join("test.orders/OrderPlaced.json");
    let edited = fs::read_to_string(&order)
        .unwrap()
        .replace("\"int64\"", "\"int32\"");
    fs::write(&order, edited).unwrap();
    // Files the export does not own are ignored.
    fs::write(dir.0.join("README.md"), "hand-written\n").unwrap();
    fs::write(dir.0.join("test.orders/notes.txt"), "x\n").unwrap();

    let differences = export.check(&dir.0).unwrap_err();
    let summary: Vec<_> = differences
        .entries
        .iter()
        .map(|d| (d.path.as_str(), &d.kind))
        .collect();
    assert_eq!(
        summary,
        [
            (
                "test.orders/OrderPlaced.json",
                &DifferenceKind::Changed {
                    incompatible: vec![
                        "property `amount` changed type from type=\"integer\",format=\"int32\" to type=\"integer\",format=\"int64\"".to_owned()
                    ]
                }
            ),
            ("test.orders/OrderShipped.json", &DifferenceKind::Extra),
            ("test.payments/payment-settled.json", &DifferenceKind::Missing),
        ]
    );
    let message = differences.to_string();
    assert!(message.starts_with(&format!("{} differs", dir.0.display())));
    assert!(message.contains("missing  "), "{message}");
    assert!(message.contains(&format!(
        "extra    {}",
        dir.0.join("test.orders/OrderShipped.json").display()
    )));

    // Export repairs the directory: rewrites, deletes the extra, keeps the rest.
    let report = export.write_to(&dir.0).unwrap();
    assert_eq!(
        report.written,
        [
            "test.orders/OrderPlaced.json",
            "test.payments/payment-settled.json"
        ]
    );
    assert_eq!(report.removed, ["test.orders/OrderShipped.json"]);
    assert_eq!(export.check(&dir.0), Ok(()));
    assert!(dir.0.join("README.md").exists());
}

#[test]
fn check_of_a_missing_directory_lists_every_file_as_missing() {
    let dir = TempDir::new();
    let missing = dir.0.join("nope");
    let differences = export().check(&missing).unwrap_err();
    assert_eq!(differences.entries.len(), 3);
    assert!(
        differences
            .entries
            .iter()
            .all(|d| d.kind == DifferenceKind::Missing)
    );
}

#[test]
fn write_removes_topic_directories_left_empty() {
    let dir = TempDir::new();
    export().write_to(&dir.0).unwrap();
    let only_orders = SchemaExport::from_descriptors(&[&ORDER_PLACED]).unwrap();
    let report = only_orders.write_to(&dir.0).unwrap();
    assert_eq!(report.removed, ["test.payments/payment-settled.json"]);
    assert!(!dir.0.join("test.payments").exists());
    assert_eq!(only_orders.check(&dir.0), Ok(()));
}

#[test]
fn incompatible_changes_are_classified() {
    let old = json!({
        "properties": { "a": { "type": "string" }, "b": { "type": "integer" }, "c": { "type": "string" } },
        "required": ["a", "b"],
        "x-partition-key": "a",
    })
    .to_string();
    let compatible = json!({
        "properties": {
            "a": { "type": "string", "description": "docs are fine" },
            "b": { "type": "integer" },
            "c": { "type": "string" },
            "d": { "type": "string" },
        },
        "required": ["a", "b"],
        "x-partition-key": "a",
    })
    .to_string();
    assert_eq!(incompatibilities(&old, &compatible), Vec::<String>::new());

    let breaking = json!({
        "properties": { "a": { "type": "string" }, "b": { "type": "string" }, "c": { "type": "string" }, "e": {} },
        "required": ["b", "c", "e"],
        "x-partition-key": "b",
    })
    .to_string();
    assert_eq!(
        incompatibilities(&old, &breaking),
        [
            "partition key field changed from \"a\" to \"b\"",
            "property `b` changed type from type=\"integer\" to type=\"string\"",
            "property `c` is now required",
            "new required property `e` (stored events lack it; add it as optional)",
            "property `a` is no longer required",
        ]
    );
    assert_eq!(
        incompatibilities("{", &old),
        ["the committed file is not valid JSON"]
    );
    let removed = json!({ "properties": { "a": {}, "b": {} } }).to_string();
    let without_b = json!({ "properties": { "a": {} } }).to_string();
    assert_eq!(
        incompatibilities(&removed, &without_b),
        ["property `b` removed"]
    );
}

#[test]
fn incompatible_changes_in_nested_types_are_classified() {
    let old = json!({
        "properties": {
            "reason": { "$ref": "#/$defs/Reason" },
            "address": {
                "type": "object",
                "properties": { "city": { "type": "string" } },
                "required": ["city"],
            },
            "lines": { "type": "array", "items": { "$ref": "#/$defs/Line" } },
        },
        "$defs": {
            "Reason": { "oneOf": [{ "const": "a" }, { "const": "b" }] },
            "Line": {
                "type": "object",
                "properties": { "qty": { "type": "integer" } },
                "required": ["qty"],
            },
        },
    });
    let mut new = old.clone();
    new["$defs"]["Reason"]["oneOf"] = json!([{ "const": "a" }]);
    new["properties"]["address"]["properties"]["city"] = json!({ "type": "integer" });
    new["$defs"]["Line"]["properties"]["sku"] = json!({ "type": "string" });
    new["$defs"]["Line"]["required"] = json!(["qty", "sku"]);
    assert_eq!(
        incompatibilities(&old.to_string(), &new.to_string()),
        [
            "property `address.city` changed type from type=\"string\" to type=\"integer\"",
            "new required property `Line.sku` (stored events lack it; add it as optional)",
            "type `Reason` changed from oneOf=[\"a\",\"b\"] to oneOf=[\"a\"]",
        ]
    );

    let mut retyped_items = old.clone();
    retyped_items["properties"]["lines"]["items"] = json!({ "type": "string" });
    assert_eq!(
        incompatibilities(&old.to_string(), &retyped_items.to_string()),
        ["items of `lines` changed type from $ref=\"#/$defs/Line\" to type=\"string\""]
    );
}

#[test]
fn duplicates_and_bad_names_are_all_reported() {
    static DUPLICATE: EventDescriptor = EventDescriptor {
        rust_type: "other::OrderPlaced",
        ..descriptor::<OrderPlaced>("")
    };
    static BAD_NAME: EventDescriptor = EventDescriptor {
        event_type: "../escape",
        ..descriptor::<OrderPlaced>("tests::Escape")
    };
    static BAD_KEY: EventDescriptor = EventDescriptor {
        event_type: "Keyless",
        partition_key_field: "orderId",
        ..descriptor::<OrderPlaced>("tests::Keyless")
    };
    let err = SchemaExport::from_descriptors(&[&ORDER_PLACED, &DUPLICATE, &BAD_NAME, &BAD_KEY])
        .unwrap_err();
    let problems = err.problems();
    assert_eq!(problems.len(), 3, "{problems:#?}");
    assert!(problems[0].contains("`../escape` cannot be a schema file name"));
    assert!(problems[1].contains("partition key field `orderId`"));
    assert!(problems[2].contains(
        "`tests::OrderPlaced` and `other::OrderPlaced` both declare event type `OrderPlaced` on topic `test.orders`"
    ));
    assert!(err.to_string().starts_with("schema export failed:\n  - "));
}

#[test]
fn schemas_of_another_draft_are_rejected() {
    fn draft07() -> schemars::Schema {
        schemars::generate::SchemaSettings::draft07()
            .into_generator()
            .into_root_schema_for::<OrderPlaced>()
    }
    static OLD: EventDescriptor = EventDescriptor {
        schema: draft07,
        ..descriptor::<OrderPlaced>("tests::Old")
    };
    let err = SchemaExport::from_descriptors(&[&OLD]).unwrap_err();
    assert!(
        err.to_string()
            .contains("generate it with `txoutbox_core::schema::json_schema_for`"),
        "{err}"
    );
}

#[test]
fn options_set_ids_and_document_info() {
    let export = ExportOptions::new()
        .title("orders")
        .version("2.1.0")
        .description("Events of the orders service.")
        .id_base("https://schemas.example.com/orders/")
        .export(&[&ORDER_PLACED])
        .unwrap();
    assert_eq!(
        json_file(&export, "test.orders/OrderPlaced.json")["$id"],
        "https://schemas.example.com/orders/test.orders/OrderPlaced.json"
    );
    let doc: Value = yaml_to_json(export.file("asyncapi.yaml").unwrap());
    assert_eq!(
        doc["info"],
        json!({ "title": "orders", "version": "2.1.0", "description": "Events of the orders service." })
    );
    // The embedded payload carries no `$id`: the document is its resource.
    assert!(
        doc["components"]["schemas"]["test.orders.OrderPlaced"]
            .get("$id")
            .is_none()
    );
}

/// Parses a YAML document into JSON values (yaml-rust2), for assertions.
fn yaml_to_json(text: &str) -> Value {
    fn convert(yaml: &yaml_rust2::Yaml) -> Value {
        use yaml_rust2::Yaml;
        match yaml {
            Yaml::Null => Value::Null,
            Yaml::Boolean(b) => json!(b),
            Yaml::Integer(i) => json!(i),
            Yaml::Real(r) => json!(r.parse::<f64>().expect("a float")),
            Yaml::String(s) => json!(s),
            Yaml::Array(items) => Value::Array(items.iter().map(convert).collect()),
            Yaml::Hash(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| (k.as_str().expect("string keys").to_owned(), convert(v)))
                    .collect(),
            ),
            other => panic!("unexpected YAML node {other:?}"),
        }
    }
    let docs = yaml_rust2::YamlLoader::load_from_str(text).expect("valid YAML");
    assert_eq!(docs.len(), 1, "one document");
    convert(&docs[0])
}

#[test]
fn static_headers_are_described_in_the_message_headers() {
    static TAGGED: EventDescriptor = EventDescriptor {
        headers: &[("schema-version", "2")],
        ..descriptor::<OrderPlaced>("tests::OrderPlaced")
    };
    let export = SchemaExport::from_descriptors(&[&TAGGED]).unwrap();
    let doc: Value = yaml_to_json(export.file("asyncapi.yaml").unwrap());
    let headers = &doc["components"]["messages"]["test.orders.OrderPlaced"]["headers"];
    assert_eq!(
        headers["properties"]["schema-version"]["const"], "2",
        "{headers}"
    );
    assert!(
        headers["required"]
            .as_array()
            .unwrap()
            .contains(&json!("schema-version"))
    );
}

#[test]
fn the_cloudevents_headers_are_described_when_on() {
    let off = ExportOptions::new().export(&[&ORDER_PLACED]).unwrap();
    let on = ExportOptions::new()
        .cloudevents(true)
        .export(&[&ORDER_PLACED])
        .unwrap();
    let headers = |export: &SchemaExport| {
        yaml_to_json(export.file("asyncapi.yaml").unwrap())["components"]["messages"]
            ["test.orders.OrderPlaced"]["headers"]
            .clone()
    };
    assert!(headers(&off)["properties"].get("ce_id").is_none());
    let on = headers(&on);
    assert_eq!(on["properties"]["ce_type"]["const"], "OrderPlaced");
    let required = on["required"].as_array().unwrap();
    assert!(required.contains(&json!("ce_specversion")) && required.contains(&json!("ce_source")));
    assert!(!required.contains(&json!("ce_dataschema")));
    // The schemas themselves are the same.
    assert_eq!(
        off.file("test.orders/OrderPlaced.json"),
        ExportOptions::new()
            .cloudevents(true)
            .export(&[&ORDER_PLACED])
            .unwrap()
            .file("test.orders/OrderPlaced.json")
    );
}

#[test]
fn commands_are_marked_in_the_schema_file_and_the_document() {
    static RESERVE: EventDescriptor = EventDescriptor {
        topic: "test.inventory.commands",
        event_type: "ReserveStock",
        aggregate_type: "Stock",
        kind: MessageKind::Command,
        ..descriptor::<OrderPlaced>("tests::ReserveStock")
    };
    let export = SchemaExport::from_descriptors(&[&ORDER_PLACED, &RESERVE]).unwrap();

    let command = json_file(&export, "test.inventory.commands/ReserveStock.json");
    assert_eq!(command["x-kind"], "command");
    assert_eq!(command["x-event-type"], "ReserveStock");
    let event = json_file(&export, "test.orders/OrderPlaced.json");
    assert!(event.get("x-kind").is_none(), "{event}");

    let doc: Value = yaml_to_json(export.file("asyncapi.yaml").unwrap());
    let messages = &doc["components"]["messages"];
    let command = &messages["test.inventory.commands.ReserveStock"];
    assert_eq!(command["x-kind"], "command");
    assert_eq!(
        command["summary"],
        "`ReserveStock` command to aggregate `Stock`, keyed by `order_id`."
    );
    assert_eq!(
        doc["channels"]["test.inventory.commands"]["messages"]["ReserveStock"]["$ref"],
        "#/components/messages/test.inventory.commands.ReserveStock"
    );
    assert!(messages["test.orders.OrderPlaced"].get("x-kind").is_none());

    // Turning an event into a command (or back) changes who owns the topic.
    let old = export.file("test.orders/OrderPlaced.json").unwrap();
    let mut new: Value = serde_json::from_str(old).unwrap();
    new["x-kind"] = json!("command");
    assert_eq!(
        incompatibilities(old, &new.to_string()),
        ["message kind changed from none to \"command\""]
    );
}
