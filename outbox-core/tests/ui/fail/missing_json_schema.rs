use txoutbox_core::DomainEvent;
use serde::Serialize;
use uuid::Uuid;

/// Events need `schemars::JsonSchema` for the schema export.
#[derive(DomainEvent, Serialize)]
#[event(topic = "order.events", aggregate = "Order")]
struct OrderCreated {
    event_id: Uuid,
    #[partition_key]
    order_id: Uuid,
}

fn main() {}
