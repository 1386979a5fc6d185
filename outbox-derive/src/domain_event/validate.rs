//! Semantic checks of the parsed input, producing the [`Event`] model that
//! [`super::expand`] turns into code.
//!
//! Every check records its error and carries on; the model keeps whatever is
//! valid (a missing part becomes `None`), so the expansion can still emit an
//! implementation that type-checks the parts the user got right.

use proc_macro2::Span;
use syn::ext::IdentExt;

use super::Kind;
use super::ast::{Field, Input, Shape};
use super::attr::FieldAttrs;
use crate::kernel::Errors;
use crate::kernel::crate_path::FrameworkCrate;

/// What the expansion needs, as far as it could be established.
pub(crate) struct Event<'a> {
    /// Path of the `txoutbox_core` crate in generated code.
    pub krate: syn::Path,
    pub topic: Option<String>,
    pub event_type: String,
    /// Event or command: decides how the schema registry lists it.
    pub kind: Kind,
    pub aggregate: Option<String>,
    pub event_id: Option<&'a Field<'a>>,
    /// The partition key field and its serialized name.
    pub partition_key: Option<(&'a Field<'a>, String)>,
    /// The explicit `#[aggregate_id]` field; `None` means "same as the partition key".
    pub aggregate_id: Option<&'a Field<'a>>,
    /// `headers(...)`: (name, value), the valid ones.
    pub headers: Vec<(String, String)>,
}

/// The payload field carrying the event type (`txoutbox_core::wire::PAYLOAD_EVENT_TYPE`).
const PAYLOAD_EVENT_TYPE: &str = "event_type";

// The rules of `txoutbox_core::wire::user_headers_problem`, at compile time
// (a proc-macro crate cannot call into txoutbox-core, which re-exports it):
// keep the two in step; `docs/wire-format.md` states them once.
const MAX_USER_HEADERS: usize = 16;
const MAX_USER_HEADER_NAME_BYTES: usize = 128;
const MAX_USER_HEADER_VALUE_BYTES: usize = 1024;
const MAX_USER_HEADERS_BYTES: usize = 8 * 1024;
const RESERVED_HEADER_NAMES: &[&str] = &[
    "event_id",
    "event_type",
    "aggregate_type",
    "aggregate_id",
    "content-type",
    "traceparent",
    "tracestate",
    "replay",
    "id",
    "eventType",
];
const RESERVED_HEADER_PREFIXES: &[&str] = &["ce_", "dlq_"];

/// Checks `headers("name" = "value", ...)`, reporting every bad pair at its
/// literal; returns the good ones.
fn check_headers(
    pairs: &[(syn::LitStr, syn::LitStr)],
    errors: &mut Errors,
) -> Vec<(String, String)> {
    let mut good: Vec<(String, String)> = Vec::new();
    let mut bytes = 0;
    for (name_lit, value_lit) in pairs {
        let (name, value) = (name_lit.value(), value_lit.value());
        if let Some(problem) = header_name_problem(&name) {
            errors.spanned(
                name_lit,
                format!(
                    "{problem}\nhelp: a header name is 1 to {MAX_USER_HEADER_NAME_BYTES} ASCII \
                     letters, digits, `-`, `_` and `.`, not one the framework sets, e.g. \
                     \"schema-version\""
                ),
            );
            continue;
        }
        if good.iter().any(|(seen, _)| *seen == name) {
            errors.spanned(
                name_lit,
                format!("header `{name}` is given twice\nhelp: give each header once"),
            );
            continue;
        }
        if value.len() > MAX_USER_HEADER_VALUE_BYTES || value.contains('\0') {
            errors.spanned(
                value_lit,
                format!(
                    "the value of header `{name}` must be at most {MAX_USER_HEADER_VALUE_BYTES} \
                     bytes without a NUL character (PostgreSQL stores it)"
                ),
            );
            continue;
        }
        bytes += name.len() + value.len();
        good.push((name, value));
    }
    if good.len() > MAX_USER_HEADERS {
        errors.spanned(
            &pairs[MAX_USER_HEADERS].0,
            format!(
                "an event has at most {MAX_USER_HEADERS} headers of its own\nhelp: \
                 put related values into one header"
            ),
        );
    } else if bytes > MAX_USER_HEADERS_BYTES {
        errors.spanned(
            &pairs[pairs.len() - 1].0,
            format!("an event's own headers are at most {MAX_USER_HEADERS_BYTES} bytes in all"),
        );
    }
    good
}

fn header_name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("a header name cannot be empty".into());
    }
    if name.len() > MAX_USER_HEADER_NAME_BYTES {
        return Some(format!(
            "header name of {} bytes; at most {MAX_USER_HEADER_NAME_BYTES}",
            name.len()
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Some(format!("{bad:?} is not allowed in a header name"));
    }
    if let Some(taken) = RESERVED_HEADER_NAMES
        .iter()
        .find(|reserved| reserved.eq_ignore_ascii_case(name))
    {
        return Some(format!("`{taken}` is a header the framework sets itself"));
    }
    if let Some(prefix) = RESERVED_HEADER_PREFIXES.iter().find(|prefix| {
        name.len() >= prefix.len() && name[..prefix.len()].eq_ignore_ascii_case(prefix)
    }) {
        return Some(format!(
            "names starting with `{prefix}` are the framework's (CloudEvents attributes, \
             dead-letter bookkeeping)"
        ));
    }
    None
}

fn supported(kind: Kind) -> String {
    format!(
        "`#[derive({})]` supports structs with named fields and no generic parameters",
        kind.derive()
    )
}

pub(crate) fn event<'a>(input: &'a Input<'a>, errors: &mut Errors) -> Event<'a> {
    let kind = input.attrs.kind;
    let (noun, derive, attr) = (kind.noun(), kind.derive(), kind.attr());
    let supported = supported(kind);
    check_generics(input, errors);
    let attrs = &input.attrs;
    let struct_name = input.ident.unraw().to_string();

    if attrs.event_attr.is_none() {
        errors.spanned(
            input.ident,
            format!(
                "missing `#[{attr}(topic = \"...\", aggregate = \"...\")]` on the {noun} struct\n\
                 help: `topic` (the Kafka topic) and `aggregate` (the aggregate type, e.g. \"{}\") \
                 are required",
                kind.example_aggregate()
            ),
        );
    }
    let missing_key = |errors: &mut Errors, key: &str, help: &str| {
        if attrs.malformed || attrs.misspelt.contains(&key) {
            return;
        }
        if let Some(written) = attrs.event_attr {
            errors.spanned(
                written,
                format!("missing `{key}` in `#[{attr}(...)]`\nhelp: {help}"),
            );
        }
    };

    if attrs.topic.present.is_none() {
        missing_key(
            errors,
            "topic",
            &format!(
                "add the Kafka topic, e.g. `topic = \"{}\"`",
                kind.example_topic()
            ),
        );
    }
    let topic = attrs.topic.value.as_ref().and_then(|lit| {
        let topic = lit.value();
        match kafka_topic_problem(&topic) {
            None => Some(topic),
            Some(problem) => {
                errors.spanned(lit, problem);
                None
            }
        }
    });

    let event_type = match &attrs.event_type.value {
        Some(lit) => {
            let value = lit.value();
            if let Some(problem) = event_type_problem(&value, &struct_name, kind) {
                errors.spanned(lit, problem);
            }
            value
        }
        None => struct_name,
    };

    if attrs.aggregate.present.is_none() {
        missing_key(
            errors,
            "aggregate",
            &format!(
                "name the aggregate type the {noun} belongs to, e.g. `aggregate = \"{}\"`; \
                 it fills the `aggregate_type` column and header",
                kind.example_aggregate()
            ),
        );
    }
    let aggregate = attrs.aggregate.value.as_ref().and_then(|lit| {
        let value = lit.value();
        if value.trim().is_empty() {
            errors.spanned(
                lit,
                format!(
                    "`aggregate` must not be empty\n\
                     help: name the aggregate type the {noun} belongs to, e.g. `aggregate = \"{}\"`",
                    kind.example_aggregate()
                ),
            );
            None
        } else {
            Some(value)
        }
    });

    let krate = FrameworkCrate::Core.path(attrs.krate.value.as_ref());

    let mut event = Event {
        krate,
        topic,
        event_type,
        kind,
        aggregate,
        event_id: None,
        partition_key: None,
        aggregate_id: None,
        headers: check_headers(&attrs.headers, errors),
    };
    match &input.shape {
        Shape::Named(fields) => check_fields(input, fields, &mut event, errors),
        Shape::Tuple(span) => errors.at(
            *span,
            format!(
                "`#[derive({derive})]` does not support tuple structs\n\
                 help: {supported}: the payload is a JSON object keyed by field name"
            ),
        ),
        Shape::Unit(span) => errors.at(
            *span,
            format!(
                "`#[derive({derive})]` does not support unit structs\n\
                 help: {supported}; {} needs at least an `event_id: Uuid` and a \
                 `#[partition_key]` field",
                kind.a_noun()
            ),
        ),
        Shape::Enum(span) => errors.at(
            *span,
            format!(
                "`#[derive({derive})]` does not support enums\n\
                 help: {supported}; declare one struct per {noun} type"
            ),
        ),
        Shape::Union(span) => errors.at(
            *span,
            format!("`#[derive({derive})]` does not support unions\nhelp: {supported}"),
        ),
    }
    event
}

fn check_generics(input: &Input<'_>, errors: &mut Errors) {
    let kind = input.attrs.kind;
    let (noun, supported) = (kind.noun(), supported(kind));
    for param in &input.generics.params {
        match param {
            syn::GenericParam::Lifetime(def) => errors.spanned(
                def,
                format!(
                    "{noun}s cannot borrow data: `DomainEvent` requires `'static`\n\
                     help: {supported}; remove `{}` and own the data (e.g. `String` instead of `&str`)",
                    def.lifetime
                ),
            ),
            syn::GenericParam::Type(_) | syn::GenericParam::Const(_) => errors.spanned(
                param,
                format!(
                    "generic {noun}s are not supported: {} type has one topic and one JSON schema\n\
                     help: {supported}; use a concrete type instead of the parameter",
                    kind.a_noun()
                ),
            ),
        }
    }
}

fn check_fields<'a>(
    input: &'a Input<'a>,
    fields: &'a [Field<'a>],
    event: &mut Event<'a>,
    errors: &mut Errors,
) {
    let serialized = |field: &Field<'_>| -> String {
        let name = field.ident.unraw().to_string();
        match (&field.attrs.serde_rename, input.attrs.rename_all) {
            (Some(renamed), _) => renamed.clone(),
            (None, Some(rule)) => rule.apply_to_field(&name),
            (None, None) => name,
        }
    };

    // #[partition_key]: exactly one.
    let key = first_marked(
        fields,
        |attrs| attrs.partition_key,
        "partition_key",
        "a Kafka record has one key: keep `#[partition_key]` on one field (to key by several \
         values, implement `txoutbox_core::PartitionKey` on a newtype)",
        errors,
    );
    match key {
        None => errors.spanned(
            input.ident,
            "no `#[partition_key]` field\n\
             help: mark the field whose value decides the Kafka partition (usually the aggregate \
             id) with `#[partition_key]`; events with the same key keep their order",
        ),
        Some(first) => {
            if let Some((span, key)) = &first.attrs.serde_hidden {
                errors.at(
                    *span,
                    format!(
                        "`#[serde({key})]` keeps the `#[partition_key]` field out of the payload\n\
                         help: consumers and the schema expect the key field in the JSON; remove \
                         `{key}` or put `#[partition_key]` on another field"
                    ),
                );
            }
            event.partition_key = Some((first, serialized(first)));
        }
    }

    // #[event_id]: exactly one, or a field named `event_id`.
    let id = first_marked(
        fields,
        |attrs| attrs.event_id,
        "event_id",
        "an event has one id: remove `#[event_id]` from all fields but one",
        errors,
    );
    event.event_id = id.or_else(|| fields.iter().find(|f| f.ident.unraw() == "event_id"));
    if event.event_id.is_none() {
        errors.spanned(
            input.ident,
            "no event id field\n\
             help: add a field `event_id: Uuid`, or mark the field holding the event's \
             unique UUID with `#[event_id]`",
        );
    }
    // Receivers dedup on payload["event_id"]: it must be the event id, not
    // another field that happens to serialize under that name.
    if let Some(id) = event.event_id {
        for field in fields {
            // A skipped field is not in the payload; a flattened one has no key of its own.
            let in_payload = field.attrs.serde_hidden.is_none();
            if !std::ptr::eq(field, id) && in_payload && serialized(field) == "event_id" {
                errors.spanned(
                    field.ident,
                    format!(
                        "this field is serialized as `event_id`, but the event id is `{}`\n\
                         help: consumers deduplicate on `payload[\"event_id\"]`; rename this \
                         field or put `#[event_id]` on it",
                        id.ident
                    ),
                );
            }
        }
    }

    // The framework adds the event type under `event_type`, so that readers
    // of the value alone can tell the events of one topic apart; a field of
    // that name would contradict it.
    for field in fields {
        if field.attrs.serde_hidden.is_none() && serialized(field) == PAYLOAD_EVENT_TYPE {
            errors.spanned(
                field.ident,
                format!(
                    "this field is serialized as `event_type`, which the framework fills with \
                     the {noun}'s type (`{}`)\n\
                     help: readers of the value alone tell events apart by \
                     `payload[\"event_type\"]`; rename the field or give it \
                     `#[serde(rename = \"...\")]`",
                    event.event_type,
                    noun = input.attrs.kind.noun(),
                ),
            );
        }
    }
    if let Some(span) = input.attrs.deny_unknown_fields {
        errors.at(
            span,
            "`#[serde(deny_unknown_fields)]` would refuse the payload's own fields: the \
             framework adds `event_id` and `event_type` to every payload, and an added optional \
             field is a compatible change only for readers that ignore fields they do not know\n\
             help: remove `deny_unknown_fields`",
        );
    }

    // #[aggregate_id]: at most one; defaults to the partition key.
    event.aggregate_id = first_marked(
        fields,
        |attrs| attrs.aggregate_id,
        "aggregate_id",
        "an event belongs to one aggregate instance: keep `#[aggregate_id]` on one field \
         (without it, the partition key is the aggregate id)",
        errors,
    );
}

/// The first field carrying the marker `#[name]` (`marker` reads where it was
/// written); every further one is reported as one too many, with `help`.
fn first_marked<'a>(
    fields: &'a [Field<'a>],
    marker: fn(&FieldAttrs) -> Option<Span>,
    name: &str,
    help: &str,
    errors: &mut Errors,
) -> Option<&'a Field<'a>> {
    let mut marked = fields
        .iter()
        .filter_map(|field| Some((field, marker(&field.attrs)?)));
    let (first, _) = marked.next()?;
    for (_, span) in marked {
        errors.at(
            span,
            format!(
                "more than one `#[{name}]` field (the first is `{}`)\nhelp: {help}",
                first.ident
            ),
        );
    }
    Some(first)
}

/// Why Kafka would reject `topic`, if it would (the rules of Kafka's `Topic.validate`).
pub(crate) fn kafka_topic_problem(topic: &str) -> Option<String> {
    const HELP: &str = "help: Kafka topic names use ASCII letters, digits, `.`, `_` and `-`, \
                        e.g. `order.events`";
    if topic.is_empty() {
        return Some(format!("the topic must not be empty\n{HELP}"));
    }
    if topic == "." || topic == ".." {
        return Some(format!("`{topic}` is not a valid Kafka topic name\n{HELP}"));
    }
    let len = topic.chars().count();
    if len > 249 {
        return Some(format!(
            "the topic is {len} characters long; Kafka allows at most 249\n{HELP}"
        ));
    }
    let (position, bad) = topic
        .chars()
        .enumerate()
        .find(|(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))?;
    Some(format!(
        "invalid character {bad:?} at position {} of topic \"{topic}\"\n{HELP}",
        position + 1
    ))
}

/// Why `event_type` is unusable, if it is. It travels in a Kafka header and
/// names a schema file (`schemas/<topic>/<event_type>.json`), so it must be a
/// non-empty single token that is safe as a file name.
fn event_type_problem(event_type: &str, struct_name: &str, kind: Kind) -> Option<String> {
    let (key, noun) = (kind.type_key(), kind.noun());
    let help = format!(
        "help: remove `{key}` to use the struct name `{struct_name}`, or write a name such \
         as `{key} = \"{struct_name}\"`"
    );
    if event_type.is_empty() {
        return Some(format!("`{key}` must not be empty\n{help}"));
    }
    if event_type == "." || event_type == ".." {
        return Some(format!(
            "`{event_type}` is not a usable {noun} type\n{help}"
        ));
    }
    let bad = event_type
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || matches!(c, '/' | '\\'))?;
    Some(format!(
        "invalid character {bad:?} in `{key}`: it names a schema file and travels in a \
         header, so whitespace, control characters, `/` and `\\` are not allowed\n{help}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_kafka_topics() {
        for ok in ["order.events", "a", "A-Z_0.9", "...", &"x".repeat(249)] {
            assert_eq!(kafka_topic_problem(ok), None, "{ok}");
        }
    }

    #[test]
    fn rejects_what_kafka_rejects() {
        let cases = [
            ("", "must not be empty"),
            (".", "not a valid Kafka topic"),
            ("..", "not a valid Kafka topic"),
            ("order events", "invalid character ' ' at position 6"),
            ("orders/created", "invalid character '/' at position 7"),
            ("zaĸaz", "invalid character 'ĸ' at position 3"),
        ];
        for (topic, expected) in cases {
            let problem = kafka_topic_problem(topic).expect(topic);
            assert!(problem.contains(expected), "{topic}: {problem}");
        }
        let long = "x".repeat(250);
        assert!(
            kafka_topic_problem(&long)
                .unwrap()
                .contains("250 characters")
        );
    }

    #[test]
    fn event_types_must_be_file_name_safe() {
        assert_eq!(event_type_problem("OrderCreated", "X", Kind::Event), None);
        assert_eq!(
            event_type_problem("order.created.v1", "X", Kind::Event),
            None
        );
        assert!(
            event_type_problem("", "X", Kind::Event)
                .unwrap()
                .contains("must not be empty")
        );
        assert!(
            event_type_problem("a b", "X", Kind::Event)
                .unwrap()
                .contains("' '")
        );
        assert!(
            event_type_problem("a/b", "X", Kind::Event)
                .unwrap()
                .contains("'/'")
        );
        assert!(event_type_problem("..", "X", Kind::Event).is_some());
    }
}
