use schemars::JsonSchema;
use serde::Serialize;
use txoutbox_core::DomainEvent;
use uuid::Uuid;

#[derive(DomainEvent, Serialize, JsonSchema)]
#[command(topic = "order.events", aggregate = "Order")]
struct OrderCreated {
    event_id: Uuid,
    #[partition_key]
    order_id: Uuid,
}

fn main() {}
