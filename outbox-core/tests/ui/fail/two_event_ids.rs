use txoutbox_core::DomainEvent;
use schemars::JsonSchema;
use serde::Serialize;
use uuid::Uuid;

#[derive(DomainEvent, Serialize, JsonSchema)]
#[event(topic = "order.events", aggregate = "Order")]
struct OrderCreated {
    #[event_id]
    event_id: Uuid,
    #[event_id]
    #[partition_key]
    order_id: Uuid,
}

fn main() {}
