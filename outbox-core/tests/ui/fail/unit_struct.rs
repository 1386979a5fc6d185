use txoutbox_core::DomainEvent;
use schemars::JsonSchema;
use serde::Serialize;

#[derive(DomainEvent, Serialize, JsonSchema)]
#[event(topic = "order.events", aggregate = "Order")]
struct OrderCreated;

fn main() {}
