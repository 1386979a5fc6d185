#![allow(dead_code, unused_imports)]

#[path = "../messages.rs"]
mod messages;

use messages::*;
use txoutbox_runtime::saga::saga;
use txoutbox_runtime::saga::SagaContext;
use uuid::Uuid;

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Fulfil {
    order_id: Uuid,
}

#[saga(id = Uuid, correlate = order_id, starts_with(OrderCreated), handles(StockReserved))]
impl Fulfil {
    async fn on_created(event: OrderCreated, _ctx: &mut SagaContext<'_>) -> Result<Self, MyError> {
        Ok(Self { order_id: event.order_id })
    }
    async fn on_reserved(event: StockReserved) -> Result<Self, MyError> {
        Ok(Self { order_id: event.order_id })
    }
}

fn main() {}
