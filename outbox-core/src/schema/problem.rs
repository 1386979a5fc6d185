//! What can be wrong with the registered events when their schemas are
//! exported: a leaf, used by the JSON Schema builder and the export.

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum ExportProblem {
    #[error(
        "`{first}` and `{second}` both declare event type `{event_type}` on topic `{topic}`; give one of them another `event_type`"
    )]
    Duplicate {
        topic: &'static str,
        event_type: &'static str,
        first: &'static str,
        second: &'static str,
    },
    #[error(
        "`{rust_type}`: {what} `{name}` cannot be a schema file name; use only ASCII letters, digits, `.`, `_` and `-`"
    )]
    UnsafeName {
        rust_type: &'static str,
        what: &'static str,
        name: String,
    },
    #[error(
        "`{rust_type}`: its JSON Schema is not an object schema; events serialize to JSON objects"
    )]
    SchemaNotObject { rust_type: &'static str },
    #[error(
        "`{rust_type}`: its JSON Schema declares `$schema` {found}; generate it with `txoutbox_core::schema::json_schema_for` (draft 2020-12)"
    )]
    WrongDraft {
        rust_type: &'static str,
        found: String,
    },
    #[error(
        "`{rust_type}`: partition key field `{field}` is not among the schema's top-level properties; it must be the field's serialized name"
    )]
    MissingPartitionKeyField {
        rust_type: &'static str,
        field: &'static str,
    },
    #[error("the AsyncAPI document could not be rendered: {0}")]
    Yaml(String),
}
