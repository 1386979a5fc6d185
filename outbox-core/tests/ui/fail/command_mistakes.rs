// The command vocabulary in every message: `command_type`, not `event_type`,
// and the same field checks as an event.
use schemars::JsonSchema;
use serde::Serialize;
use txoutbox_core::Command;
use uuid::Uuid;

#[derive(Command, Serialize, JsonSchema)]
#[command(topic = "inventory commands", aggregate = "Stock", event_type = "Reserve")]
struct ReserveStock {
    event_id: Uuid,
    sku: String,
}

#[derive(Command, Serialize, JsonSchema)]
#[command(topic = "inventory.commands", command_type = "")]
struct ReleaseStock {
    event_id: Uuid,
    #[partition_key]
    sku: String,
}

fn main() {}
