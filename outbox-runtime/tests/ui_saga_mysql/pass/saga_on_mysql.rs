// A saga on MySQL: its handlers' contexts name the database, its service
// writes through `ctx.tx()` (a MySQL transaction), it registers on a
// consumer of a `MySqlPool`; one handler without `ctx` follows the others.
#![deny(warnings)]

#[path = "../../ui_saga/messages.rs"]
mod messages;

use messages::*;
use sqlx::MySql;
use txoutbox_runtime::consumer::{Consumer, EventHandler};
use txoutbox_runtime::saga::{Saga, SagaContext, saga};
use uuid::Uuid;

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Fulfilment {
    order_id: Uuid,
    reserved: bool,
}

#[saga(id = Uuid, correlate = order_id, starts_with(OrderCreated), handles(StockReserved, PaymentFailed))]
impl Fulfilment {
    async fn on_created(event: OrderCreated, ctx: &mut SagaContext<'_, MySql>) -> Result<Self, sqlx::Error> {
        sqlx::query("INSERT INTO orders_seen (order_id) VALUES (?)")
            .bind(event.order_id)
            .execute(&mut **ctx.tx())
            .await?;
        Ok(Self { order_id: event.order_id, reserved: false })
    }

    async fn on_reserved(&mut self, _event: StockReserved, ctx: &mut SagaContext<'_, MySql>) -> Result<(), sqlx::Error> {
        self.reserved = true;
        ctx.on_compensate(ReleaseStock { event_id: Uuid::now_v7(), sku: "sku".into() });
        Ok(())
    }

    async fn on_failed(&mut self, _event: PaymentFailed) -> Result<(), sqlx::Error> {
        Ok(())
    }
}

// A saga without any context on MySQL says so.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Audit {
    reference: String,
}

#[saga(name = "audit", id = String, correlate = reference, starts_with(StockTimedOut), database = MySql)]
impl Audit {
    async fn on_timeout(event: StockTimedOut) -> Result<Self, std::io::Error> {
        Ok(Self { reference: event.reference })
    }
}

fn build(pool: sqlx::MySqlPool) {
    let _ = Consumer::builder(pool, rdkafka::ClientConfig::new(), "orders")
        .saga::<Fulfilment>()
        .saga::<Audit>();
}

fn main() {
    fn on_mysql<S: Saga<Database = MySql>>() {}
    on_mysql::<Fulfilment>();
    on_mysql::<Audit>();
    fn handles<H: EventHandler<MySql>>(_: H) -> &'static str {
        H::NAME
    }
    assert_eq!(handles(Fulfilment::on_failed_handler()), "Fulfilment::on_failed");
    let _ = build;
}
