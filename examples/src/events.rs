//! The messages of the example system. The seed's story: the orders service
//! publishes `OrderCreated` / `OrderCancelled` on `order.events`; the payments
//! service publishes `PaymentCompleted` on `payment.events`. The order
//! fulfilment saga of the orders service adds commands and replies:
//!
//! | message | topic | from | to |
//! | --- | --- | --- | --- |
//! | `ReserveStock`, `ReleaseStock` | `inventory.commands` | orders (saga) | inventory |
//! | `StockReserved`, `StockRejected` | `inventory.events` | inventory | orders (saga) |
//! | `ChargePayment` | `payment.commands` | orders (saga) | payments |
//! | `PaymentCompleted`, `PaymentFailed` | `payment.events` | payments | orders (saga) |
//! | `StockTimedOut` | `order.saga` | orders (saga, scheduled) | orders (saga) |
//!
//! Every message is keyed by the order id: all messages of one order keep
//! their order on each topic, and the saga is correlated by it.
//!
//! Their schemas are exported to `schemas/` by the `schemas` binary
//! (`cargo run -p outbox-examples --bin schemas -- export`).

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use txoutbox_core::schema::{ExportError, ExportOptions, SchemaExport, registered_events};
use txoutbox_core::{Command, DomainEvent};
use uuid::Uuid;

/// An order was placed. Keyed by the order, so all events of one order keep
/// their order on `order.events`.
///
/// The fields the design seed defines (`event_id`, `order_id`, `customer_id`,
/// `amount`, `created_at`) are required; what this example adds is optional,
/// so that events of services written from the seed are read as well
/// (`docs/wire-format.md`, "Working with seed-format services").
#[derive(Debug, Clone, PartialEq, DomainEvent, Serialize, Deserialize, JsonSchema)]
#[event(
    topic = "order.events",
    event_type = "OrderCreated",
    aggregate = "Order"
)]
pub struct OrderCreated {
    /// Unique id of this event; receivers deduplicate on it.
    #[event_id]
    pub event_id: Uuid,
    /// The new order (partition key and aggregate id).
    #[partition_key]
    #[aggregate_id]
    pub order_id: Uuid,
    /// Who ordered.
    pub customer_id: Uuid,
    /// What was ordered (not in the seed's event: optional).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub product_id: Option<Uuid>,
    /// Price in minor currency units (cents).
    pub amount: i64,
    /// When the order was created.
    pub created_at: DateTime<Utc>,
}

/// An order was cancelled before it was paid.
#[derive(Debug, Clone, PartialEq, DomainEvent, Serialize, Deserialize, JsonSchema)]
#[event(
    topic = "order.events",
    event_type = "OrderCancelled",
    aggregate = "Order"
)]
pub struct OrderCancelled {
    /// Unique id of this event; receivers deduplicate on it.
    #[event_id]
    pub event_id: Uuid,
    /// The cancelled order (partition key and aggregate id).
    #[partition_key]
    #[aggregate_id]
    pub order_id: Uuid,
    /// Why it was cancelled.
    pub reason: CancellationReason,
    /// When it was cancelled.
    pub cancelled_at: DateTime<Utc>,
}

/// Why an order was cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CancellationReason {
    /// The customer withdrew the order.
    CustomerRequest,
    /// The payment was declined.
    PaymentDeclined,
    /// The product is no longer available.
    OutOfStock,
    /// The inventory did not answer the reservation in time.
    StockTimeout,
}

/// A payment for an order went through. Keyed by the order (not the payment),
/// so a consumer sees the payments of one order in order.
#[derive(Debug, Clone, PartialEq, DomainEvent, Serialize, Deserialize, JsonSchema)]
#[event(
    topic = "payment.events",
    event_type = "PaymentCompleted",
    aggregate = "Payment"
)]
pub struct PaymentCompleted {
    /// Unique id of this event; receivers deduplicate on it.
    #[event_id]
    pub event_id: Uuid,
    /// The payment (aggregate id).
    #[aggregate_id]
    pub payment_id: Uuid,
    /// The paid order (partition key).
    #[partition_key]
    pub order_id: Uuid,
    /// Amount paid in minor currency units (cents).
    pub amount: i64,
    /// When the payment completed.
    pub completed_at: DateTime<Utc>,
}

/// Command to the inventory: reserve stock for an order. Sent by the order
/// fulfilment saga when the order is created; answered by `StockReserved` or
/// `StockRejected`.
#[derive(Debug, Clone, PartialEq, Command, Serialize, Deserialize, JsonSchema)]
#[command(
    topic = "inventory.commands",
    command_type = "ReserveStock",
    aggregate = "Reservation"
)]
pub struct ReserveStock {
    /// Unique id of this command; the inventory deduplicates on it.
    #[event_id]
    pub event_id: Uuid,
    /// The order the stock is for (partition key; a reservation per order).
    #[partition_key]
    #[aggregate_id]
    pub order_id: Uuid,
    /// The product to reserve.
    pub product_id: Uuid,
    /// How many units.
    pub quantity: i32,
}

/// Command to the inventory: give back the stock reserved for an order. The
/// saga's compensation of `ReserveStock`. Applied at most once per order; a
/// release that arrives before its reservation leaves a tombstone, so the
/// late `ReserveStock` reserves nothing.
#[derive(Debug, Clone, PartialEq, Command, Serialize, Deserialize, JsonSchema)]
#[command(
    topic = "inventory.commands",
    command_type = "ReleaseStock",
    aggregate = "Reservation"
)]
pub struct ReleaseStock {
    /// Unique id of this command; the inventory deduplicates on it.
    #[event_id]
    pub event_id: Uuid,
    /// The order whose reservation is released (partition key).
    #[partition_key]
    #[aggregate_id]
    pub order_id: Uuid,
    /// The product that was to be reserved.
    pub product_id: Uuid,
}

/// Reply of the inventory: the stock of an order is reserved.
#[derive(Debug, Clone, PartialEq, DomainEvent, Serialize, Deserialize, JsonSchema)]
#[event(
    topic = "inventory.events",
    event_type = "StockReserved",
    aggregate = "Reservation"
)]
pub struct StockReserved {
    /// Unique id of this event; receivers deduplicate on it.
    #[event_id]
    pub event_id: Uuid,
    /// The order (partition key).
    #[partition_key]
    #[aggregate_id]
    pub order_id: Uuid,
    /// The reserved product.
    pub product_id: Uuid,
    /// How many units.
    pub quantity: i32,
    /// When the stock was reserved.
    pub reserved_at: DateTime<Utc>,
}

/// Reply of the inventory: no stock was reserved for an order.
#[derive(Debug, Clone, PartialEq, DomainEvent, Serialize, Deserialize, JsonSchema)]
#[event(
    topic = "inventory.events",
    event_type = "StockRejected",
    aggregate = "Reservation"
)]
pub struct StockRejected {
    /// Unique id of this event; receivers deduplicate on it.
    #[event_id]
    pub event_id: Uuid,
    /// The order (partition key).
    #[partition_key]
    #[aggregate_id]
    pub order_id: Uuid,
    /// The product asked for.
    pub product_id: Uuid,
    /// Why nothing was reserved.
    pub reason: StockRejection,
    /// When the inventory decided.
    pub rejected_at: DateTime<Utc>,
}

/// Why the inventory reserved nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StockRejection {
    /// Not enough units available (or an unknown product).
    OutOfStock,
    /// The reservation was released before it arrived (the saga gave up
    /// waiting): nothing is reserved for this order any more.
    AlreadyReleased,
}

/// Command to the payments service: charge an order. Sent by the saga once
/// the stock is reserved; answered by `PaymentCompleted` or `PaymentFailed`.
#[derive(Debug, Clone, PartialEq, Command, Serialize, Deserialize, JsonSchema)]
#[command(
    topic = "payment.commands",
    command_type = "ChargePayment",
    aggregate = "Payment"
)]
pub struct ChargePayment {
    /// Unique id of this command; the payments service deduplicates on it.
    #[event_id]
    pub event_id: Uuid,
    /// The order to charge (partition key; one payment per order).
    #[partition_key]
    #[aggregate_id]
    pub order_id: Uuid,
    /// Who pays.
    pub customer_id: Uuid,
    /// Amount in minor currency units (cents).
    pub amount: i64,
}

/// A payment for an order was declined.
#[derive(Debug, Clone, PartialEq, DomainEvent, Serialize, Deserialize, JsonSchema)]
#[event(
    topic = "payment.events",
    event_type = "PaymentFailed",
    aggregate = "Payment"
)]
pub struct PaymentFailed {
    /// Unique id of this event; receivers deduplicate on it.
    #[event_id]
    pub event_id: Uuid,
    /// The declined payment (aggregate id).
    #[aggregate_id]
    pub payment_id: Uuid,
    /// The order (partition key).
    #[partition_key]
    pub order_id: Uuid,
    /// The amount asked for, in cents.
    pub amount: i64,
    /// Why it was declined, for people.
    pub reason: String,
    /// When it was declined.
    pub failed_at: DateTime<Utc>,
}

/// The order fulfilment saga's timeout, sent to itself (scheduled) when it
/// asks for stock: if the inventory has not answered when it arrives, the
/// saga gives up, releases whatever may have been reserved and cancels the
/// order. Ignored once the saga has moved on.
#[derive(Debug, Clone, PartialEq, DomainEvent, Serialize, Deserialize, JsonSchema)]
#[event(
    topic = "order.saga",
    event_type = "StockTimedOut",
    aggregate = "Order"
)]
pub struct StockTimedOut {
    /// Unique id of this message (the id the saga cancels it by).
    #[event_id]
    pub event_id: Uuid,
    /// The order (partition key; the saga's id).
    #[partition_key]
    #[aggregate_id]
    pub order_id: Uuid,
    /// How long the saga waited, in milliseconds.
    pub waited_ms: i64,
}

/// The schema export of the example events, as the `schemas` binary writes it
/// to (and checks it against) `schemas/`.
///
/// ```
/// let export = outbox_examples::events::schema_export().unwrap();
/// assert!(export.file("order.events/OrderCreated.json").is_some());
/// assert!(export.file("payment.events/PaymentCompleted.json").is_some());
/// ```
pub fn schema_export() -> Result<SchemaExport, ExportError> {
    ExportOptions::new()
        .title("outbox-examples")
        .version(env!("CARGO_PKG_VERSION"))
        .description(
            "Events and commands of the example orders, inventory and payments services. \
             Wire format: docs/wire-format.md.",
        )
        .export(&registered_events())
}

#[cfg(test)]
mod tests {
    use super::*;
    use txoutbox_core::OutboxRecord;

    #[test]
    fn payments_are_keyed_by_order_and_belong_to_the_payment() {
        let event = PaymentCompleted {
            event_id: Uuid::new_v4(),
            payment_id: Uuid::new_v4(),
            order_id: Uuid::new_v4(),
            amount: 4_200,
            completed_at: Utc::now(),
        };
        let record = OutboxRecord::from_event(&event).unwrap();
        assert_eq!(record.topic, "payment.events");
        assert_eq!(record.event_type, "PaymentCompleted");
        assert_eq!(record.aggregate_type, "Payment");
        assert_eq!(record.aggregate_id, event.payment_id.to_string());
        assert_eq!(record.partition_key, event.order_id.to_string());
        assert_eq!(PaymentCompleted::PARTITION_KEY_FIELD, "order_id");
        assert_eq!(record.payload["event_id"], event.event_id.to_string());
        assert_eq!(record.payload["amount"], 4_200);
    }

    #[test]
    fn orders_are_keyed_by_order() {
        let event = OrderCancelled {
            event_id: Uuid::new_v4(),
            order_id: Uuid::new_v4(),
            reason: CancellationReason::OutOfStock,
            cancelled_at: Utc::now(),
        };
        assert_eq!(OrderCancelled::TOPIC, OrderCreated::TOPIC);
        assert_eq!(event.partition_key(), event.order_id.to_string());
        assert_eq!(event.aggregate_id(), event.order_id.to_string());
        let record = OutboxRecord::from_event(&event).unwrap();
        assert_eq!(record.payload["reason"], "out_of_stock");
    }
}
