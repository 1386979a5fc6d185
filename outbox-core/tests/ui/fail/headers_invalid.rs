use txoutbox_core::DomainEvent;
use schemars::JsonSchema;
use serde::Serialize;
use uuid::Uuid;

#[derive(DomainEvent, Serialize, JsonSchema)]
#[event(
    topic = "order.events",
    aggregate = "Order",
    headers("event_type" = "x", "tenant id" = "y", "ce_source" = "z", "team" = "a", "team" = "b")
)]
#[event(headers("schema-version" = "a\0b", "Traceparent" = "t", "" = "e"))]
struct OrderCreated {
    event_id: Uuid,
    #[partition_key]
    order_id: Uuid,
}

#[derive(DomainEvent, Serialize, JsonSchema)]
#[event(topic = "order.events", aggregate = "Order", headers = "tenant")]
struct OrderPaid {
    event_id: Uuid,
    #[partition_key]
    order_id: Uuid,
}

#[derive(DomainEvent, Serialize, JsonSchema)]
#[event(topic = "order.events", aggregate = "Order", headers("tenant": "acme"))]
struct OrderShipped {
    event_id: Uuid,
    #[partition_key]
    order_id: Uuid,
}

fn main() {}
