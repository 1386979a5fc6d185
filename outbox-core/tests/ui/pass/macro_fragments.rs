//! Events declared by a `macro_rules!` macro: its `literal` fragments reach
//! the derive wrapped in invisible groups, which the derive looks through.
use txoutbox_core::DomainEvent;

macro_rules! order_event {
    ($name:ident, $topic:literal, $event_type:literal) => {
        #[derive(DomainEvent, serde::Serialize, schemars::JsonSchema)]
        #[event(topic = $topic, event_type = $event_type, aggregate = "Order")]
        pub struct $name {
            pub event_id: uuid::Uuid,
            #[partition_key]
            pub order_id: u64,
        }
    };
}

order_event!(Made, "made.events", "MadeByAMacro");

fn main() {
    assert_eq!(Made::TOPIC, "made.events");
    assert_eq!(Made::EVENT_TYPE, "MadeByAMacro");
}
