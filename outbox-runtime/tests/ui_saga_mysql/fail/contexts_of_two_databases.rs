#[path = "../../ui_saga/messages.rs"]
mod messages;

use messages::*;
use sqlx::MySql;
use txoutbox_runtime::saga::{SagaContext, saga};
use uuid::Uuid;

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Fulfilment {
    order_id: Uuid,
}

#[saga(id = Uuid, correlate = order_id, starts_with(OrderCreated), handles(StockReserved))]
impl Fulfilment {
    async fn on_created(event: OrderCreated, _ctx: &mut SagaContext<'_, MySql>) -> Result<Self, sqlx::Error> {
        Ok(Self { order_id: event.order_id })
    }

    // PostgreSQL's context in a saga on MySQL.
    async fn on_reserved(&mut self, _event: StockReserved, _ctx: &mut SagaContext<'_>) -> Result<(), sqlx::Error> {
        Ok(())
    }
}

fn main() {}
