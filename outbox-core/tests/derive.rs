//! Values and payloads produced by `#[derive(DomainEvent)]`.

use schemars::JsonSchema;
use serde::Serialize;
use txoutbox_core::schema::{EventDescriptor, json_schema_for, registered_events};
use txoutbox_core::{DomainEvent, OutboxRecord, PartitionKey};
use uuid::Uuid;

#[derive(DomainEvent, Serialize, JsonSchema)]
#[event(
    topic = "order.events",
    event_type = "OrderCreated",
    aggregate = "Order"
)]
struct OrderCreated {
    #[event_id]
    event_id: Uuid,
    #[partition_key]
    #[aggregate_id]
    order_id: Uuid,
    customer_id: Uuid,
    amount: i64,
}

/// `event_type` defaults to the struct name; the aggregate id defaults to the
/// partition key; the event id is found by field name.
#[derive(DomainEvent, Serialize, JsonSchema)]
#[event(topic = "customer.events", aggregate = "Customer")]
struct CustomerRenamed {
    event_id: Uuid,
    #[partition_key]
    customer: String,
    new_name: String,
}

/// Integer key, an aggregate id different from the key, an event id under
/// another name.
#[derive(DomainEvent, Serialize, JsonSchema)]
#[event(
    topic = "ledger-entries_v2",
    event_type = "ledger.entry.posted.v2",
    aggregate = "Account"
)]
struct EntryPosted {
    #[event_id]
    id: Uuid,
    #[partition_key]
    shard: u32,
    #[aggregate_id]
    account: i64,
}

/// A newtype key with its own `PartitionKey` implementation.
#[derive(Serialize, JsonSchema, Clone, Copy)]
struct Sku(u64);

impl PartitionKey for Sku {
    fn to_partition_key(&self) -> String {
        format!("sku-{:06}", self.0)
    }
}

/// serde renames: the container's `rename_all` and a field's `rename`.
#[derive(DomainEvent, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[event(topic = "stock.events", aggregate = "Stock")]
struct StockAdjusted {
    event_id: Uuid,
    #[partition_key]
    stock_item: Sku,
    delta_units: i32,
}

#[derive(DomainEvent, Serialize, JsonSchema)]
#[event(topic = "stock.events", aggregate = "Stock")]
struct StockCounted {
    event_id: Uuid,
    #[partition_key]
    #[serde(rename = "SKU")]
    sku: Sku,
}

/// Re-exporting crates point the derive at their re-export.
mod platform {
    pub(crate) use ::txoutbox_core as events;
}

#[derive(DomainEvent, Serialize, JsonSchema)]
#[event(
    crate = "crate::platform::events",
    topic = "audit",
    aggregate = "Audit"
)]
struct Audited {
    event_id: Uuid,
    #[partition_key]
    r#type: String,
}

/// Fields whose schema depends on the contract: required when serialized
/// although `#[serde(default)]`, optional when skipped if empty.
#[derive(DomainEvent, Serialize, JsonSchema)]
#[event(topic = "reminders", aggregate = "Reminder")]
struct ReminderSet {
    event_id: Uuid,
    #[partition_key]
    reminder_id: u64,
    #[serde(default)]
    repeat: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

fn uuid(n: u128) -> Uuid {
    Uuid::from_u128(n)
}

#[test]
fn constants_come_from_the_attributes() {
    assert_eq!(OrderCreated::TOPIC, "order.events");
    assert_eq!(OrderCreated::EVENT_TYPE, "OrderCreated");
    assert_eq!(OrderCreated::AGGREGATE_TYPE, "Order");
    assert_eq!(OrderCreated::PARTITION_KEY_FIELD, "order_id");

    assert_eq!(CustomerRenamed::EVENT_TYPE, "CustomerRenamed");
    assert_eq!(CustomerRenamed::AGGREGATE_TYPE, "Customer");
    assert_eq!(EntryPosted::TOPIC, "ledger-entries_v2");
    assert_eq!(EntryPosted::EVENT_TYPE, "ledger.entry.posted.v2");
    assert_eq!(Audited::PARTITION_KEY_FIELD, "type");
}

#[test]
fn uuid_key_and_explicit_aggregate_id() {
    let event = OrderCreated {
        event_id: uuid(1),
        order_id: uuid(2),
        customer_id: uuid(3),
        amount: 42,
    };
    assert_eq!(event.event_id(), uuid(1));
    assert_eq!(
        event.partition_key(),
        "00000000-0000-0000-0000-000000000002"
    );
    assert_eq!(event.aggregate_id(), event.partition_key());
}

#[test]
fn string_key_is_also_the_aggregate_id_by_default() {
    let event = CustomerRenamed {
        event_id: uuid(7),
        customer: "cust-17".into(),
        new_name: "Ada".into(),
    };
    assert_eq!(event.event_id(), uuid(7));
    assert_eq!(event.partition_key(), "cust-17");
    assert_eq!(event.aggregate_id(), "cust-17");
}

#[test]
fn integer_key_and_separate_aggregate_id() {
    let event = EntryPosted {
        id: uuid(9),
        shard: 3,
        account: -12,
    };
    assert_eq!(event.event_id(), uuid(9));
    assert_eq!(event.partition_key(), "3");
    assert_eq!(event.aggregate_id(), "-12");
}

#[test]
fn newtype_key_uses_its_partition_key_impl() {
    let event = StockAdjusted {
        event_id: uuid(4),
        stock_item: Sku(42),
        delta_units: -1,
    };
    assert_eq!(event.partition_key(), "sku-000042");
    assert_eq!(event.aggregate_id(), "sku-000042");
}

#[test]
fn partition_key_field_is_the_serialized_name() {
    assert_eq!(StockAdjusted::PARTITION_KEY_FIELD, "stockItem");
    assert_eq!(StockCounted::PARTITION_KEY_FIELD, "SKU");
    // And the payload really has the key under that name.
    let event = StockCounted {
        event_id: uuid(5),
        sku: Sku(1),
    };
    let payload = serde_json::to_value(&event).unwrap();
    assert_eq!(payload[StockCounted::PARTITION_KEY_FIELD], 1);
}

#[test]
fn payload_is_the_serde_output() {
    let event = OrderCreated {
        event_id: uuid(11),
        order_id: uuid(12),
        customer_id: uuid(13),
        amount: 99,
    };
    let record = OutboxRecord::from_event(&event).unwrap();
    let mut expected = serde_json::to_value(&event).unwrap();
    // The framework names the type in the value, for readers of the value alone.
    expected["event_type"] = "OrderCreated".into();
    assert_eq!(record.payload, expected);
    assert_eq!(record.payload["event_id"], uuid(11).to_string());
    assert_eq!(record.event_id, uuid(11));
    assert_eq!(record.topic, "order.events");
    assert_eq!(record.event_type, "OrderCreated");
    assert_eq!(record.aggregate_type, "Order");
    assert_eq!(record.aggregate_id, uuid(12).to_string());
    assert_eq!(record.partition_key, uuid(12).to_string());
}

#[test]
fn payload_gains_event_id_when_the_id_field_has_another_name() {
    let event = EntryPosted {
        id: uuid(21),
        shard: 0,
        account: 5,
    };
    let record = OutboxRecord::from_event(&event).unwrap();
    let mut expected = serde_json::to_value(&event).unwrap();
    expected["event_id"] = uuid(21).to_string().into();
    expected["event_type"] = "ledger.entry.posted.v2".into();
    assert_eq!(record.payload, expected);
    assert_eq!(record.payload["id"], uuid(21).to_string());
}

/// A flattened struct is out of the derive's sight: it can put its own
/// `event_type` in the payload, which the recording then refuses (unless it
/// names the event's own type).
#[derive(serde::Serialize)]
struct Envelope {
    event_type: &'static str,
}

#[derive(DomainEvent, serde::Serialize, schemars::JsonSchema)]
#[event(topic = "order.events", aggregate = "Order")]
struct OrderFlattened {
    event_id: Uuid,
    #[partition_key]
    order_id: Uuid,
    #[serde(flatten)]
    #[schemars(skip)]
    envelope: Envelope,
}

#[test]
fn a_flattened_event_type_must_name_the_events_own_type() {
    let mut event = OrderFlattened {
        event_id: uuid(31),
        order_id: uuid(32),
        envelope: Envelope {
            event_type: "OrderFlattened",
        },
    };
    let record = OutboxRecord::from_event(&event).unwrap();
    assert_eq!(record.payload["event_type"], "OrderFlattened");

    event.envelope.event_type = "SomethingElse";
    let error = OutboxRecord::from_event(&event).unwrap_err();
    assert!(
        matches!(
            &error,
            txoutbox_core::Error::ReservedPayloadField { event_type: "OrderFlattened", field: "event_type", found }
                if found == "\"SomethingElse\""
        ),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("puts the event type there"),
        "{error}"
    );
}

#[test]
fn every_event_is_registered_for_the_schema_export() {
    let events = registered_events();
    let find = |event_type: &str| {
        events
            .iter()
            .find(|e| e.event_type == event_type)
            .unwrap_or_else(|| panic!("{event_type} not registered"))
    };
    let order = find("OrderCreated");
    assert_eq!(order.topic, "order.events");
    assert_eq!(order.aggregate_type, "Order");
    assert_eq!(order.partition_key_field, "order_id");
    assert_eq!(order.rust_type, "derive::OrderCreated");
    let schema = (order.schema)();
    assert_eq!(
        schema.get("$schema").and_then(|s| s.as_str()),
        Some("https://json-schema.org/draft/2020-12/schema")
    );
    assert_eq!(
        schema.get("title").and_then(|s| s.as_str()),
        Some("OrderCreated")
    );
    let properties = schema.get("properties").expect("properties");
    for field in ["event_id", "order_id", "customer_id", "amount"] {
        assert!(properties.get(field).is_some(), "{field} in {schema:?}");
    }

    let stock = find("StockAdjusted");
    assert_eq!(stock.partition_key_field, "stockItem");
    let audited = find("Audited");
    assert_eq!(audited.rust_type, "derive::Audited");

    // Each event type derived above is registered exactly once.
    for event_type in [
        "OrderCreated",
        "CustomerRenamed",
        "ledger.entry.posted.v2",
        "StockAdjusted",
        "StockCounted",
        "Audited",
    ] {
        assert_eq!(
            events.iter().filter(|e| e.event_type == event_type).count(),
            1
        );
    }
}

#[test]
fn the_derive_registers_the_schema_of_json_schema_for() {
    let events = registered_events();
    let registered = |event_type: &str| -> &EventDescriptor {
        events
            .iter()
            .find(|e| e.event_type == event_type)
            .unwrap_or_else(|| panic!("{event_type} not registered"))
    };
    let pairs = [
        ("OrderCreated", json_schema_for::<OrderCreated>()),
        ("CustomerRenamed", json_schema_for::<CustomerRenamed>()),
        ("ledger.entry.posted.v2", json_schema_for::<EntryPosted>()),
        ("StockAdjusted", json_schema_for::<StockAdjusted>()),
        ("StockCounted", json_schema_for::<StockCounted>()),
        ("Audited", json_schema_for::<Audited>()),
        ("ReminderSet", json_schema_for::<ReminderSet>()),
    ];
    for (event_type, expected) in pairs {
        assert_eq!((registered(event_type).schema)(), expected, "{event_type}");
    }
    // The serialize contract: what consumers receive.
    let reminder = (registered("ReminderSet").schema)();
    assert_eq!(
        reminder.get("required").unwrap(),
        &serde_json::json!(["event_id", "reminder_id", "repeat"])
    );
}
