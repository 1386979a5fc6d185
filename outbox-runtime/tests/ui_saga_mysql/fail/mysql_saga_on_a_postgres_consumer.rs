#[path = "../../ui_saga/messages.rs"]
mod messages;

use messages::*;
use sqlx::MySql;
use txoutbox_runtime::consumer::Consumer;
use txoutbox_runtime::saga::{SagaContext, saga};
use uuid::Uuid;

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Fulfilment {
    order_id: Uuid,
}

#[saga(id = Uuid, correlate = order_id, starts_with(OrderCreated))]
impl Fulfilment {
    async fn on_created(event: OrderCreated, _ctx: &mut SagaContext<'_, MySql>) -> Result<Self, sqlx::Error> {
        Ok(Self { order_id: event.order_id })
    }
}

// A saga on MySQL registered on a consumer of a PostgreSQL pool.
fn build(pool: sqlx::PgPool) {
    let _ = Consumer::builder(pool, rdkafka::ClientConfig::new(), "orders").saga::<Fulfilment>();
}

fn main() {}
