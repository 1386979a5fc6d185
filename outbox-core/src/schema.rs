//! Registry of the event types linked into a binary, for the schema export.
//!
//! `#[derive(DomainEvent)]` submits one [`EventDescriptor`] per event type;
//! [`registered_events`] lists them. The export (JSON Schema per event and an
//! AsyncAPI document) is built on top of this list.

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
    /// The event's JSON Schema (schemars).
    pub schema: fn() -> schemars::Schema,
}

inventory::collect!(EventDescriptor);

/// Every event type registered in this binary, sorted by topic then event type.
pub fn registered_events() -> Vec<&'static EventDescriptor> {
    let mut events: Vec<_> = inventory::iter::<EventDescriptor>.into_iter().collect();
    events.sort_by_key(|e| (e.topic, e.event_type));
    events
}
