//! One event's JSON Schema file (`<topic>/<event_type>.json`) and the canonical
//! rendering that keeps exported files byte-for-byte stable.

use serde_json::{Map, Value, json};

use super::problem::ExportProblem;
use super::{EventDescriptor, MessageKind};
use crate::wire;

/// Meta-schema URI of JSON Schema draft 2020-12.
pub(super) const DRAFT_2020_12: &str = "https://json-schema.org/draft/2020-12/schema";

/// Annotation keywords the export adds to every event schema.
pub(super) const X_TOPIC: &str = "x-topic";
pub(super) const X_EVENT_TYPE: &str = "x-event-type";
pub(super) const X_AGGREGATE_TYPE: &str = "x-aggregate-type";
pub(super) const X_PARTITION_KEY: &str = "x-partition-key";
/// `"command"` on the schema of a `#[derive(Command)]` type; events carry no
/// `x-kind` (so the files of existing events do not change).
pub(super) const X_KIND: &str = "x-kind";

/// Builds the annotated draft 2020-12 schema of one event, with `$id` = `id`.
pub(super) fn event_schema(event: &EventDescriptor, id: &str) -> Result<Value, ExportProblem> {
    let Value::Object(mut schema) = (event.schema)().to_value() else {
        return Err(ExportProblem::SchemaNotObject {
            rust_type: event.rust_type,
        });
    };
    match schema.get("$schema") {
        None => {
            schema.insert("$schema".into(), DRAFT_2020_12.into());
        }
        Some(Value::String(s)) if s == DRAFT_2020_12 => {}
        Some(other) => {
            return Err(ExportProblem::WrongDraft {
                rust_type: event.rust_type,
                found: other.to_string(),
            });
        }
    }
    schema.insert("$id".into(), id.into());
    schema
        .entry("title")
        .or_insert_with(|| event.event_type.into());
    ensure_framework_fields(&mut schema, event.event_type);

    let has_key_field = schema
        .get("properties")
        .and_then(Value::as_object)
        .is_some_and(|p| p.contains_key(event.partition_key_field));
    if !has_key_field {
        return Err(ExportProblem::MissingPartitionKeyField {
            rust_type: event.rust_type,
            field: event.partition_key_field,
        });
    }

    schema.insert(X_TOPIC.into(), event.topic.into());
    schema.insert(X_EVENT_TYPE.into(), event.event_type.into());
    schema.insert(X_AGGREGATE_TYPE.into(), event.aggregate_type.into());
    schema.insert(X_PARTITION_KEY.into(), event.partition_key_field.into());
    if event.kind == MessageKind::Command {
        schema.insert(X_KIND.into(), MessageKind::Command.as_str().into());
    }
    Ok(Value::Object(schema))
}

/// `OutboxRecord::from_event` adds `event_id` (even when serde renamed or
/// skipped the field) and `event_type` to every payload, so the schema
/// promises both: consumers in other languages dedup on `payload["event_id"]`
/// and tell the events of a topic apart by `payload["event_type"]`.
fn ensure_framework_fields(schema: &mut Map<String, Value>, event_type: &str) {
    let properties = schema
        .entry("properties")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(properties) = properties {
        properties
            .entry(wire::PAYLOAD_EVENT_ID)
            .or_insert_with(|| json!({ "type": "string", "format": "uuid" }));
        properties.insert(
            wire::PAYLOAD_EVENT_TYPE.into(),
            json!({ "type": "string", "const": event_type }),
        );
    }
    let required = schema
        .entry("required")
        .or_insert_with(|| Value::Array(Vec::new()));
    if let Value::Array(required) = required {
        for field in [wire::PAYLOAD_EVENT_ID, wire::PAYLOAD_EVENT_TYPE] {
            if !required.iter().any(|r| r == field) {
                required.push(field.into());
            }
        }
    }
}

/// Pretty JSON with object keys sorted at every level and a trailing newline,
/// independent of serde_json's `preserve_order` feature.
pub(super) fn canonical_json(value: &Value) -> String {
    let mut text = serde_json::to_string_pretty(&sorted(value.clone()))
        .expect("a serde_json::Value always serializes");
    text.push('\n');
    text
}

/// Returns `value` with the keys of every object in sorted order.
pub(super) fn sorted(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> =
                map.into_iter().map(|(k, v)| (k, sorted(v))).collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(entries.into_iter().collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}
