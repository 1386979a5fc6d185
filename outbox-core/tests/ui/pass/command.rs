//! `#[derive(Command)]`: a `DomainEvent` whose type is the command type,
//! recorded like an event and registered as a command.
use schemars::JsonSchema;
use serde::Serialize;
use txoutbox_core::schema::{MessageKind, registered_events};
use txoutbox_core::{Command, DomainEvent, Events};
use uuid::Uuid;

#[derive(Command, Serialize, JsonSchema)]
#[command(topic = "inventory.commands", aggregate = "Stock")]
pub struct ReserveStock {
    #[event_id]
    pub command_id: Uuid,
    #[partition_key]
    pub sku: String,
    #[aggregate_id]
    pub order_id: Uuid,
    pub quantity: u32,
}

#[derive(Command, Serialize, JsonSchema)]
#[command(topic = "inventory.commands", aggregate = "Stock", command_type = "stock.release")]
pub struct ReleaseStock {
    pub event_id: Uuid,
    #[partition_key]
    pub sku: String,
}

#[derive(DomainEvent, Serialize, JsonSchema)]
#[event(topic = "order.events", aggregate = "Order")]
pub struct OrderCreated {
    pub event_id: Uuid,
    #[partition_key]
    pub order_id: Uuid,
}

fn main() {
    assert_eq!(<ReserveStock as DomainEvent>::TOPIC, "inventory.commands");
    assert_eq!(<ReserveStock as DomainEvent>::EVENT_TYPE, "ReserveStock");
    assert_eq!(<ReserveStock as DomainEvent>::AGGREGATE_TYPE, "Stock");
    assert_eq!(<ReleaseStock as DomainEvent>::EVENT_TYPE, "stock.release");

    let order_id = Uuid::now_v7();
    let command = ReserveStock {
        command_id: Uuid::now_v7(),
        sku: "sku-1".into(),
        order_id,
        quantity: 2,
    };
    assert_eq!(command.partition_key(), "sku-1");
    assert_eq!(command.aggregate_id(), order_id.to_string());
    let mut events = Events::new();
    events.record(command);
    assert_eq!(events.of_type::<ReserveStock>()[0].quantity, 2);

    let kinds: Vec<_> = registered_events()
        .iter()
        .map(|d| (d.event_type, d.kind))
        .collect();
    assert_eq!(
        kinds,
        [
            ("ReserveStock", MessageKind::Command),
            ("stock.release", MessageKind::Command),
            ("OrderCreated", MessageKind::Event),
        ]
    );
}
