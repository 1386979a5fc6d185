//! The AsyncAPI 3.0 document (`asyncapi.yaml`): one channel per topic, one
//! message per event type, a `send` operation per channel, Kafka bindings.
//!
//! Payloads are embedded (the document stands alone, no external `$ref`s) as
//! `components.schemas.<topic>.<event_type>`. AsyncAPI's default schema format
//! is a superset of JSON Schema draft-07, so the embedded copy is the event's
//! 2020-12 schema converted with schemars' own draft-07 transforms and its
//! `$defs` moved to `definitions` with every `$ref` rebased onto the new path.

use std::collections::BTreeMap;

use schemars::transform::{
    RemoveRefSiblings, ReplacePrefixItems, ReplaceUnevaluatedProperties, Transform,
    transform_subschemas,
};
use serde::Serialize;
use serde_json::{Value, json};

use super::{EventDescriptor, MessageKind};
use crate::wire;

/// Version of the AsyncAPI Kafka bindings used for channels and messages.
const KAFKA_BINDING_VERSION: &str = "0.5.0";

/// One event as the document needs it: its descriptor and its 2020-12 schema.
pub(super) struct DocumentEvent<'a> {
    pub(super) descriptor: &'a EventDescriptor,
    pub(super) schema: &'a Value,
}

/// Renders the document as YAML. `events` must be sorted by (topic, event type)
/// and free of duplicates; names were validated as `[A-Za-z0-9._-]+`, so they
/// are valid AsyncAPI component keys and need no JSON Pointer escaping.
pub(super) fn render(
    title: &str,
    version: &str,
    description: Option<&str>,
    events: &[DocumentEvent<'_>],
    cloudevents: bool,
) -> Result<String, String> {
    let mut channels = BTreeMap::<String, Channel>::new();
    let mut operations = BTreeMap::<String, Operation>::new();
    let mut components = Components::default();

    for event in events {
        let d = event.descriptor;
        let component_key = format!("{}.{}", d.topic, d.event_type);
        let channel = channels
            .entry(d.topic.to_owned())
            .or_insert_with(|| Channel::new(d.topic));
        channel.messages.insert(
            d.event_type.to_owned(),
            Reference::to(format!("#/components/messages/{component_key}")),
        );
        operations
            .entry(format!("{}.send", d.topic))
            .or_insert_with(|| Operation::send(d.topic))
            .messages
            .push(Reference::to(format!(
                "#/channels/{}/messages/{}",
                d.topic, d.event_type
            )));
        components.schemas.insert(
            component_key.clone(),
            draft07_payload(event.schema, &component_key),
        );
        components.messages.insert(
            component_key.clone(),
            Message::new(
                d,
                Reference::to(format!("#/components/schemas/{component_key}")),
                cloudevents,
            ),
        );
    }

    let document = serde_json::to_value(Document {
        asyncapi: "3.0.0",
        info: Info {
            title: title.to_owned(),
            version: version.to_owned(),
            description: description.map(str::to_owned),
        },
        default_content_type: wire::CONTENT_TYPE_JSON,
        channels,
        operations,
        components,
    })
    .map_err(|e| e.to_string())?;
    to_yaml(&document)
}

/// Keys that come first in a mapping, in this order (AsyncAPI's usual
/// layout: what the document is, then what it holds); other keys follow
/// sorted, as in the value.
const LEADING_KEYS: [&str; 14] = [
    "asyncapi",
    "info",
    "title",
    "version",
    "description",
    "defaultContentType",
    "address",
    "action",
    "channel",
    "summary",
    "channels",
    "operations",
    "messages",
    "components",
];

/// Writes a JSON value as a YAML document with yaml-rust2's emitter.
fn to_yaml(document: &Value) -> Result<String, String> {
    fn convert(value: &Value) -> yaml_rust2::Yaml {
        use yaml_rust2::Yaml;
        match value {
            Value::Null => Yaml::Null,
            Value::Bool(b) => Yaml::Boolean(*b),
            Value::Number(n) => match n.as_i64() {
                Some(i) => Yaml::Integer(i),
                None => Yaml::Real(n.to_string()),
            },
            Value::String(s) => Yaml::String(s.clone()),
            Value::Array(items) => Yaml::Array(items.iter().map(convert).collect()),
            Value::Object(map) => {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_by_key(|(k, _)| {
                    LEADING_KEYS
                        .iter()
                        .position(|leading| leading == k)
                        .unwrap_or(LEADING_KEYS.len())
                });
                Yaml::Hash(
                    entries
                        .into_iter()
                        .map(|(k, v)| (Yaml::String(k.clone()), convert(v)))
                        .collect(),
                )
            }
        }
    }
    let mut out = String::new();
    yaml_rust2::YamlEmitter::new(&mut out)
        .dump(&convert(document))
        .map_err(|e| e.to_string())?;
    // The emitter starts with a document marker and ends without a newline.
    let body = out.strip_prefix("---\n").unwrap_or(&out);
    Ok(format!("{body}\n"))
}

/// Converts the event's 2020-12 schema into the draft-07 dialect AsyncAPI
/// schemas use, to be stored at `#/components/schemas/<component_key>`.
fn draft07_payload(schema: &Value, component_key: &str) -> Value {
    let mut payload = schema.clone();
    if let Value::Object(map) = &mut payload {
        // The document is the resource; the standalone file keeps its own ids.
        map.remove("$schema");
        map.remove("$id");
        if let Some(defs) = map.remove("$defs") {
            map.insert("definitions".into(), defs);
        }
    }
    let mut payload =
        schemars::Schema::try_from(payload).expect("event schemas were checked to be objects");
    RebaseRefs {
        base: format!("#/components/schemas/{component_key}"),
    }
    .transform(&mut payload);
    ReplacePrefixItems::default().transform(&mut payload);
    ReplaceUnevaluatedProperties::default().transform(&mut payload);
    RemoveRefSiblings::default().transform(&mut payload);
    super::json::sorted(payload.to_value())
}

/// Rewrites `#` and `#/$defs/X` references (relative to the event's own root)
/// into absolute pointers inside the AsyncAPI document.
struct RebaseRefs {
    base: String,
}

impl Transform for RebaseRefs {
    fn transform(&mut self, schema: &mut schemars::Schema) {
        transform_subschemas(self, schema);
        if let Some(Value::String(reference)) = schema.get_mut("$ref") {
            if reference == "#" {
                *reference = self.base.clone();
            } else if let Some(rest) = reference.strip_prefix("#/$defs/") {
                *reference = format!("{}/definitions/{rest}", self.base);
            }
        }
    }
}

#[derive(Serialize)]
struct Document {
    asyncapi: &'static str,
    info: Info,
    #[serde(rename = "defaultContentType")]
    default_content_type: &'static str,
    channels: BTreeMap<String, Channel>,
    operations: BTreeMap<String, Operation>,
    components: Components,
}

#[derive(Serialize)]
struct Info {
    title: String,
    version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<String>,
}

#[derive(Serialize)]
struct Channel {
    address: String,
    messages: BTreeMap<String, Reference>,
    bindings: KafkaBinding<ChannelBinding>,
}

impl Channel {
    fn new(topic: &str) -> Self {
        Self {
            address: topic.to_owned(),
            messages: BTreeMap::new(),
            bindings: KafkaBinding::new(ChannelBinding {
                topic: topic.to_owned(),
            }),
        }
    }
}

#[derive(Serialize)]
struct ChannelBinding {
    topic: String,
}

#[derive(Serialize)]
struct Operation {
    action: &'static str,
    channel: Reference,
    summary: String,
    messages: Vec<Reference>,
}

impl Operation {
    fn send(topic: &str) -> Self {
        Self {
            action: "send",
            channel: Reference::to(format!("#/channels/{topic}")),
            summary: format!("The outbox relay publishes committed events to `{topic}`."),
            messages: Vec::new(),
        }
    }
}

#[derive(Serialize, Default)]
struct Components {
    messages: BTreeMap<String, Message>,
    schemas: BTreeMap<String, Value>,
}

#[derive(Serialize)]
struct Message {
    name: String,
    title: String,
    summary: String,
    #[serde(rename = "contentType")]
    content_type: &'static str,
    headers: Value,
    payload: Reference,
    bindings: KafkaBinding<MessageBinding>,
    #[serde(rename = "x-topic")]
    topic: String,
    #[serde(rename = "x-aggregate-type")]
    aggregate_type: String,
    #[serde(rename = "x-partition-key")]
    partition_key: String,
    /// `command` for a `#[derive(Command)]` type; absent for events, which
    /// are what a message is unless it says otherwise.
    #[serde(rename = "x-kind", skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
}

impl Message {
    fn new(d: &EventDescriptor, payload: Reference, cloudevents: bool) -> Self {
        Self {
            name: d.event_type.to_owned(),
            title: d.event_type.to_owned(),
            summary: match d.kind {
                MessageKind::Event => format!(
                    "`{}` event of aggregate `{}`, keyed by `{}`.",
                    d.event_type, d.aggregate_type, d.partition_key_field
                ),
                MessageKind::Command => format!(
                    "`{}` command to aggregate `{}`, keyed by `{}`.",
                    d.event_type, d.aggregate_type, d.partition_key_field
                ),
            },
            content_type: wire::CONTENT_TYPE_JSON,
            headers: headers_schema(d, cloudevents),
            payload,
            bindings: KafkaBinding::new(MessageBinding {
                key: json!({
                    "type": "string",
                    "description": format!(
                        "Partition key: the payload field `{}` as UTF-8 text.",
                        d.partition_key_field
                    ),
                }),
            }),
            topic: d.topic.to_owned(),
            aggregate_type: d.aggregate_type.to_owned(),
            partition_key: d.partition_key_field.to_owned(),
            kind: (d.kind == MessageKind::Command).then_some(MessageKind::Command.as_str()),
        }
    }
}

#[derive(Serialize)]
struct MessageBinding {
    key: Value,
}

#[derive(Serialize)]
struct KafkaBinding<T> {
    kafka: VersionedBinding<T>,
}

impl<T> KafkaBinding<T> {
    fn new(binding: T) -> Self {
        Self {
            kafka: VersionedBinding {
                binding,
                binding_version: KAFKA_BINDING_VERSION,
            },
        }
    }
}

#[derive(Serialize)]
struct VersionedBinding<T> {
    #[serde(flatten)]
    binding: T,
    #[serde(rename = "bindingVersion")]
    binding_version: &'static str,
}

#[derive(Serialize)]
struct Reference {
    #[serde(rename = "$ref")]
    target: String,
}

impl Reference {
    fn to(target: String) -> Self {
        Self { target }
    }
}

/// The Kafka headers of one message (see `docs/wire-format.md`); values are
/// UTF-8 text.
fn headers_schema(d: &EventDescriptor, cloudevents: bool) -> Value {
    let mut schema = json!({
        "type": "object",
        "required": [
            wire::HEADER_EVENT_ID,
            wire::HEADER_EVENT_TYPE,
            wire::HEADER_AGGREGATE_TYPE,
            wire::HEADER_AGGREGATE_ID,
            wire::HEADER_CONTENT_TYPE,
        ],
        "properties": {
            wire::HEADER_EVENT_ID: {
                "type": "string",
                "format": "uuid",
                "description": "Event id, equal to the payload's `event_id`; receivers deduplicate on it.",
            },
            wire::HEADER_EVENT_TYPE: { "type": "string", "const": d.event_type },
            wire::HEADER_AGGREGATE_TYPE: { "type": "string", "const": d.aggregate_type },
            wire::HEADER_AGGREGATE_ID: {
                "type": "string",
                "description": "Id of the aggregate instance the event belongs to.",
            },
            wire::HEADER_CONTENT_TYPE: { "type": "string", "const": wire::CONTENT_TYPE_JSON },
            wire::HEADER_TRACEPARENT: {
                "type": "string",
                "pattern": "^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$",
                "description": "W3C trace context, present when the event was recorded inside a trace.",
            },
        },
    });
    // The event type's own static headers (`#[event(headers(...))]`): on
    // every record of it.
    for (name, value) in d.headers {
        schema["properties"][*name] = json!({
            "type": "string",
            "const": value,
            "description": "A header of the event type's own (static).",
        });
        if let Some(required) = schema["required"].as_array_mut() {
            required.push((*name).into());
        }
    }
    if cloudevents {
        add_cloudevents_headers(&mut schema, d);
    }
    super::json::sorted(schema)
}

/// CloudEvents' binary content mode (`txoutbox_runtime::relay::CloudEvents`):
/// the attributes as `ce_` headers.
fn add_cloudevents_headers(schema: &mut Value, d: &EventDescriptor) {
    let text = |description: &str| json!({ "type": "string", "description": description });
    let headers = [
        (
            "ce_specversion",
            json!({ "type": "string", "const": "1.0" }),
            true,
        ),
        ("ce_id", text("CloudEvents `id`: the event id."), true),
        (
            "ce_source",
            text("CloudEvents `source`: the producing service."),
            true,
        ),
        (
            "ce_type",
            json!({ "type": "string", "const": d.event_type }),
            true,
        ),
        (
            "ce_subject",
            text("CloudEvents `subject`: the aggregate id."),
            true,
        ),
        (
            "ce_time",
            json!({ "type": "string", "format": "date-time", "description": "CloudEvents `time`: when the event was recorded." }),
            true,
        ),
        (
            "ce_partitionkey",
            text("Partitioning extension: the record key."),
            true,
        ),
        (
            "ce_dataschema",
            json!({ "type": "string", "format": "uri", "description": "CloudEvents `dataschema`, when the relay is given a base URI." }),
            false,
        ),
        (
            "ce_traceparent",
            text("Distributed tracing extension: the W3C trace context, when the record has one."),
            false,
        ),
    ];
    for (name, property, required) in headers {
        schema["properties"][name] = property;
        if required && let Some(list) = schema["required"].as_array_mut() {
            list.push(name.into());
        }
    }
}
