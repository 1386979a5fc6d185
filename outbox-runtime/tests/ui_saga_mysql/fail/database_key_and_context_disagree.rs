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

#[saga(id = Uuid, correlate = order_id, starts_with(OrderCreated), database = Postgres)]
impl Fulfilment {
    async fn on_created(event: OrderCreated, _ctx: &mut SagaContext<'_, MySql>) -> Result<Self, sqlx::Error> {
        Ok(Self { order_id: event.order_id })
    }
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Audit {
    reference: String,
}

#[saga(id = String, correlate = reference, starts_with(StockTimedOut), database = Oracle)]
impl Audit {
    async fn on_timeout(event: StockTimedOut) -> Result<Self, std::io::Error> {
        Ok(Self { reference: event.reference })
    }
}

fn main() {}
