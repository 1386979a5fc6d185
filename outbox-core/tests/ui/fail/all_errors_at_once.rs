use txoutbox_core::DomainEvent;
use schemars::JsonSchema;
use serde::Serialize;
use uuid::Uuid;

#[derive(DomainEvent, Serialize, JsonSchema)]
#[event(topic = "order events", aggregate_typ = "Order")]
struct OrderCreated {
    #[event_id]
    id: String,
    #[partition_key]
    order_id: f64,
    #[partition_key]
    customer_id: Uuid,
}

fn main() {}
