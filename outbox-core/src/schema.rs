//! Registry of the event types linked into a binary, and the schema export
//! built on it.
//!
//! `#[derive(DomainEvent)]` submits one [`EventDescriptor`] per event type
//! (`#[derive(Command)]` one per command type, marked [`MessageKind::Command`]);
//! [`registered_events`] lists them. `SchemaExport` turns that list into the
//! files consumers read: one JSON Schema (draft 2020-12) per event at
//! `<topic>/<event_type>.json` and one AsyncAPI 3.0 document `asyncapi.yaml`.
//! Its `check` mode compares them with committed files,
//! so CI notices when the code and `schemas/` drift apart. The export is the
//! feature `schema-export` (off by default): only the tool that writes
//! `schemas/` needs it.
//!
//! ```no_run
//! # #[cfg(feature = "schema-export")]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use txoutbox_core::schema::{ExportOptions, SchemaExport};
//!
//! let export = ExportOptions::new()
//!     .title("orders")
//!     .version("1.0.0")
//!     .export(&txoutbox_core::schema::registered_events())?;
//! export.write_to("schemas")?;
//! export.check("schemas")?;
//! # Ok(()) }
//! # #[cfg(not(feature = "schema-export"))]
//! # fn main() {}
//! ```

#[cfg(feature = "schema-export")]
mod asyncapi;
#[cfg(feature = "schema-export")]
mod check;
#[cfg(feature = "schema-export")]
mod export;
#[cfg(feature = "schema-export")]
mod json;
#[cfg(feature = "schema-export")]
mod problem;
#[cfg(all(test, feature = "schema-export"))]
mod tests;

#[cfg(feature = "schema-export")]
pub use check::{Difference, DifferenceKind, Differences};
#[cfg(feature = "schema-export")]
pub use export::{ExportError, ExportOptions, SchemaExport, WriteReport};

/// Static description of one event type.
#[derive(Debug, Clone, Copy)]
pub struct EventDescriptor {
    /// Kafka topic.
    pub topic: &'static str,
    /// Event type name.
    pub event_type: &'static str,
    /// Aggregate type.
    pub aggregate_type: &'static str,
    /// Serialized name of the field holding the partition key.
    pub partition_key_field: &'static str,
    /// Rust type path of the event, for messages (`module_path!()::Name`).
    pub rust_type: &'static str,
    /// Whether the type is an event or a command (which derive declared it).
    pub kind: MessageKind,
    /// Its static headers ([`DomainEvent::HEADERS`](crate::DomainEvent::HEADERS)),
    /// described in the AsyncAPI document's message headers.
    pub headers: &'static [(&'static str, &'static str)],
    /// The event's JSON Schema (schemars); [`json_schema_for`] builds the
    /// one the export expects.
    pub schema: fn() -> schemars::Schema,
}

inventory::collect!(EventDescriptor);

/// What a registered message is. Both kinds travel the same way (recorded with
/// `Events::record`, relayed, dispatched to handlers); the kind tells readers
/// of the schema export who owns the topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum MessageKind {
    /// A fact that happened, published by its aggregate's service to anyone
    /// interested (`#[derive(DomainEvent)]`).
    #[default]
    Event,
    /// A request addressed to one service, whose topic that service consumes
    /// (`#[derive(Command)]`).
    Command,
}

impl MessageKind {
    /// `"event"` or `"command"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            MessageKind::Event => "event",
            MessageKind::Command => "command",
        }
    }
}

/// Every event type registered in this binary, sorted by topic then event type.
pub fn registered_events() -> Vec<&'static EventDescriptor> {
    let mut events: Vec<_> = inventory::iter::<EventDescriptor>.into_iter().collect();
    events.sort_by_key(|e| (e.topic, e.event_type));
    events
}

/// The JSON Schema (draft 2020-12) of `T` as it appears on the wire.
///
/// Uses schemars' serialize contract: the schema describes what
/// `serde_json::to_value(&event)` produces, which is what consumers receive
/// (a field with `skip_serializing_if` is optional, one with only
/// `#[serde(default)]` is still required).
///
/// ```
/// #[derive(serde::Serialize, schemars::JsonSchema)]
/// struct Ping { n: u32 }
///
/// let schema = txoutbox_core::schema::json_schema_for::<Ping>();
/// assert_eq!(schema.get("$schema").unwrap(), "https://json-schema.org/draft/2020-12/schema");
/// assert_eq!(schema.get("required").unwrap(), &serde_json::json!(["n"]));
/// ```
pub fn json_schema_for<T: schemars::JsonSchema + ?Sized>() -> schemars::Schema {
    schemars::generate::SchemaSettings::draft2020_12()
        .for_serialize()
        .into_generator()
        .into_root_schema_for::<T>()
}
