use txoutbox_core::DomainEvent;
use schemars::JsonSchema;
use serde::Serialize;
use uuid::Uuid;

#[derive(DomainEvent, Serialize, JsonSchema)]
#[event(
    topic = "order.events.order.events.order.events.order.events.order.events.order.events.order.events.order.events.order.events.order.events.order.events.order.events.order.events.order.events.order.events.order.events.order.events.order.events.order.events.xxx",
    aggregate = "Order"
)]
struct OrderCreated {
    event_id: Uuid,
    #[partition_key]
    order_id: Uuid,
}

fn main() {}
