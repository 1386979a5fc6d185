// Messages shared by the `#[saga]` UI test cases.
#![allow(dead_code)]

use uuid::Uuid;

#[derive(Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema, txoutbox_core::DomainEvent)]
#[event(topic = "order.events", aggregate = "Order")]
pub struct OrderCreated {
    pub event_id: Uuid,
    #[partition_key]
    pub order_id: Uuid,
    pub sku: String,
    pub amount: i64,
}

#[derive(Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema, txoutbox_core::DomainEvent)]
#[event(topic = "inventory.events", aggregate = "Stock")]
pub struct StockReserved {
    pub event_id: Uuid,
    #[partition_key]
    pub order_id: Uuid,
}

#[derive(Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema, txoutbox_core::DomainEvent)]
#[event(topic = "payment.events", aggregate = "Payment")]
pub struct PaymentFailed {
    pub event_id: Uuid,
    #[partition_key]
    pub order_id: Uuid,
}

// Correlated by another field, of another name (`saga_id`) or type (`String`).
#[derive(Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema, txoutbox_core::DomainEvent)]
#[event(topic = "saga.timeouts", aggregate = "Saga")]
pub struct StockTimedOut {
    pub event_id: Uuid,
    #[partition_key]
    pub saga_id: Uuid,
    pub reference: String,
}

#[derive(Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema, txoutbox_core::Command)]
#[command(topic = "inventory.commands", aggregate = "Stock")]
pub struct ReserveStock {
    pub event_id: Uuid,
    #[partition_key]
    pub sku: String,
    #[aggregate_id]
    pub order_id: Uuid,
}

#[derive(Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema, txoutbox_core::Command)]
#[command(topic = "inventory.commands", aggregate = "Stock")]
pub struct ReleaseStock {
    pub event_id: Uuid,
    #[partition_key]
    pub sku: String,
}

#[derive(Debug)]
pub struct MyError(pub String);

impl std::fmt::Display for MyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
