use txoutbox_core::DomainEvent;
use schemars::JsonSchema;
use serde::Serialize;
use uuid::Uuid;

#[derive(DomainEvent, Serialize, JsonSchema)]
#[event(topic = "order.events", aggregate = "Order")]
enum OrderEvent {
    Created { event_id: Uuid },
    Cancelled { event_id: Uuid },
}

fn main() {}
