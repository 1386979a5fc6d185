use txoutbox_core::DomainEvent;
use schemars::JsonSchema;
use serde::Serialize;
use uuid::Uuid;

#[derive(DomainEvent, Serialize, JsonSchema)]
#[event(topic = "order.events", aggregate = "Order")]
struct OrderCreated {
    #[event_id]
    id: Uuid,
    /// Would shadow the event id in `payload["event_id"]`.
    event_id: u64,
    #[partition_key]
    order_id: Uuid,
}

fn main() {}
