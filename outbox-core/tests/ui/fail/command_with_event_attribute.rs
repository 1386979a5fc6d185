use schemars::JsonSchema;
use serde::Serialize;
use txoutbox_core::Command;
use uuid::Uuid;

#[derive(Command, Serialize, JsonSchema)]
#[event(topic = "inventory.commands", aggregate = "Stock")]
struct ReserveStock {
    event_id: Uuid,
    #[partition_key]
    sku: String,
}

fn main() {}
