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

#[saga(id = Uuid, correlate = order_id, colour = "red", handles(StockReserved, PaymentFailed))]
impl Fulfil {
    async fn on_created(&mut self, event: OrderCreated) -> Result<Self, MyError> {
        Ok(Self { order_id: event.order_id })
    }
    fn on_reserved(&mut self, _event: StockReserved) -> Result<(), MyError> {
        Ok(())
    }
    async fn on_timeout(_event: &StockTimedOut, _n: u32) -> Result<(), MyError> {
        Ok(())
    }
}

fn main() {}
