use txoutbox_core::DomainEvent;
use schemars::JsonSchema;
use serde::Serialize;
use uuid::Uuid;

#[derive(DomainEvent, Serialize, JsonSchema)]
#[event(topic = "order.events", aggregate = "Order")]
#[serde(deny_unknown_fields)]
struct OrderCreated {
    event_id: Uuid,
    #[partition_key]
    order_id: Uuid,
    /// The framework puts the event type under `event_type`.
    event_type: String,
    /// Renamed into the same place.
    #[serde(rename = "event_type")]
    kind: u8,
    /// Skipped: not in the payload, so not a conflict.
    #[serde(skip)]
    #[allow(dead_code)]
    hidden: u8,
}

fn main() {}
