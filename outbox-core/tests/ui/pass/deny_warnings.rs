//! The generated code compiles without a single warning, in a crate that
//! denies warnings, forbids unsafe code and requires docs, with every
//! attribute form the derive accepts.
#![deny(warnings, missing_docs, unused_qualifications, unused_results)]
#![forbid(unsafe_code)]

use txoutbox_core::DomainEvent;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The example, in full.
#[derive(DomainEvent, Debug, Serialize, Deserialize, JsonSchema)]
#[event(topic = "order.events", event_type = "OrderCreated", aggregate = "Order")]
pub struct OrderCreated {
    /// Event id.
    #[event_id]
    pub event_id: Uuid,
    /// Key and aggregate id.
    #[partition_key]
    #[aggregate_id]
    pub order_id: Uuid,
    /// Another id.
    pub customer_id: Uuid,
    /// Amount in cents.
    pub amount: i64,
    /// When.
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// Keys split over two `#[event]` attributes, defaults, a raw identifier and
/// serde attributes the derive has to read past.
#[derive(DomainEvent, Serialize, JsonSchema)]
#[event(topic = "a_b-c.9")]
#[event(aggregate = "Thing", headers("schema-version" = "2", "team" = "things"))]
#[serde(bound = "", rename_all(serialize = "kebab-case"))]
pub struct ThingHappened {
    /// Found by name.
    pub event_id: Uuid,
    /// A raw identifier as key.
    #[partition_key]
    #[serde(skip_serializing_if = "String::is_empty", rename(serialize = "kind"))]
    pub r#type: String,
    /// An integer aggregate id.
    #[aggregate_id]
    #[serde(default)]
    pub shard_no: u8,
}

fn main() {
    assert_eq!(OrderCreated::PARTITION_KEY_FIELD, "order_id");
    assert_eq!(ThingHappened::EVENT_TYPE, "ThingHappened");
    assert_eq!(ThingHappened::PARTITION_KEY_FIELD, "kind");
    let thing = ThingHappened {
        event_id: Uuid::nil(),
        r#type: "t".to_owned(),
        shard_no: 3,
    };
    assert_eq!(thing.aggregate_id(), "3");
    assert_eq!(
        ThingHappened::HEADERS,
        [("schema-version", "2"), ("team", "things")]
    );
    assert!(OrderCreated::HEADERS.is_empty());
    assert_eq!(txoutbox_core::schema::registered_events().len(), 2);
}
