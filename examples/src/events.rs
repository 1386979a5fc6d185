//! The events of the example system, the seed's story: the orders service
//! publishes `OrderCreated` / `OrderCancelled` on `order.events`; the payments
//! service publishes `PaymentCompleted` on `payment.events`.
//!
//! Their schemas are exported to `schemas/` by the `schemas` binary
//! (`cargo run -p outbox-examples --bin schemas -- export`).

use chrono::{DateTime, Utc};
use outbox_core::DomainEvent;
use outbox_core::PartitionKey;
use outbox_core::schema::{
    EventDescriptor, ExportError, ExportOptions, SchemaExport, json_schema_for, registered_events,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// An order was placed. Keyed by the order, so all events of one order keep
/// their order on `order.events`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct OrderCreated {
    /// Unique id of this event; receivers deduplicate on it.
    pub event_id: Uuid,
    /// The new order (partition key and aggregate id).
    pub order_id: Uuid,
    /// Who ordered.
    pub customer_id: Uuid,
    /// What was ordered.
    pub product_id: Uuid,
    /// Price in minor currency units (cents).
    pub amount: i64,
    /// When the order was created.
    pub created_at: DateTime<Utc>,
}

/// An order was cancelled before it was paid.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct OrderCancelled {
    /// Unique id of this event; receivers deduplicate on it.
    pub event_id: Uuid,
    /// The cancelled order (partition key and aggregate id).
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
}

/// A payment for an order went through. Keyed by the order (not the payment),
/// so a consumer sees the payments of one order in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PaymentCompleted {
    /// Unique id of this event; receivers deduplicate on it.
    pub event_id: Uuid,
    /// The payment (aggregate id).
    pub payment_id: Uuid,
    /// The paid order (partition key).
    pub order_id: Uuid,
    /// Amount paid in minor currency units (cents).
    pub amount: i64,
    /// When the payment completed.
    pub completed_at: DateTime<Utc>,
}

// Hand-written until `#[derive(DomainEvent)]` lands: what the derive generates.
macro_rules! domain_event {
    ($ty:ident, topic = $topic:literal, aggregate = $aggregate:literal,
     aggregate_id = $aggregate_id:ident, partition_key = $key:ident) => {
        impl DomainEvent for $ty {
            const TOPIC: &'static str = $topic;
            const EVENT_TYPE: &'static str = stringify!($ty);
            const AGGREGATE_TYPE: &'static str = $aggregate;
            const PARTITION_KEY_FIELD: &'static str = stringify!($key);

            fn event_id(&self) -> Uuid {
                self.event_id
            }
            fn aggregate_id(&self) -> String {
                self.$aggregate_id.to_partition_key()
            }
            fn partition_key(&self) -> String {
                self.$key.to_partition_key()
            }
        }

        inventory::submit! {
            EventDescriptor {
                topic: <$ty as DomainEvent>::TOPIC,
                event_type: <$ty as DomainEvent>::EVENT_TYPE,
                aggregate_type: <$ty as DomainEvent>::AGGREGATE_TYPE,
                partition_key_field: <$ty as DomainEvent>::PARTITION_KEY_FIELD,
                rust_type: concat!(module_path!(), "::", stringify!($ty)),
                schema: json_schema_for::<$ty>,
            }
        }
    };
}

domain_event!(
    OrderCreated,
    topic = "order.events",
    aggregate = "Order",
    aggregate_id = order_id,
    partition_key = order_id
);
domain_event!(
    OrderCancelled,
    topic = "order.events",
    aggregate = "Order",
    aggregate_id = order_id,
    partition_key = order_id
);
domain_event!(
    PaymentCompleted,
    topic = "payment.events",
    aggregate = "Payment",
    aggregate_id = payment_id,
    partition_key = order_id
);

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
            "Events of the example orders and payments services. \
             Wire format: docs/wire-format.md.",
        )
        .export(&registered_events())
}
