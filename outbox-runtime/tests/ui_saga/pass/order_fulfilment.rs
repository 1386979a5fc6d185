// A saga as the docs show it: start and step handlers, with and without
// `ctx`, a per-handler correlation, a helper fn left alone, commands sent.
#![deny(warnings)]

#[path = "../messages.rs"]
mod messages;

use messages::*;
use txoutbox_runtime::saga::saga;
use txoutbox_runtime::consumer::EventHandler;
use txoutbox_runtime::saga::{Saga, SagaContext};
use uuid::Uuid;

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
enum Stage {
    Reserving,
    Paying,
    Failed,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct OrderFulfilment {
    order_id: Uuid,
    sku: String,
    amount: i64,
    stage: Stage,
}

#[saga(
    id = Uuid,
    correlate = order_id,
    starts_with(OrderCreated),
    handles(StockReserved, PaymentFailed, StockTimedOut),
)]
impl OrderFulfilment {
    /// Doc comments and other attributes stay on the handlers.
    async fn on_order_created(event: OrderCreated, ctx: &mut SagaContext<'_>) -> Result<Self, MyError> {
        ctx.send(ReserveStock {
            event_id: Uuid::now_v7(),
            sku: event.sku.clone(),
            order_id: event.order_id,
        });
        Ok(Self {
            order_id: event.order_id,
            sku: event.sku,
            amount: event.amount,
            stage: Stage::Reserving,
        })
    }

    async fn on_stock_reserved(&mut self, _event: StockReserved, ctx: &mut SagaContext<'_>) -> Result<(), MyError> {
        ctx.on_compensate(ReleaseStock {
            event_id: Uuid::now_v7(),
            sku: self.sku.clone(),
        });
        self.stage = Stage::Paying;
        Ok(())
    }

    // No `ctx`: a handler may take only the message.
    async fn on_payment_failed(&mut self, _event: PaymentFailed) -> Result<(), MyError> {
        self.stage = Stage::Failed;
        Ok(())
    }

    #[correlate(saga_id)]
    async fn on_timeout(&mut self, event: StockTimedOut, ctx: &mut SagaContext<'_>) -> Result<(), MyError> {
        if self.stage != Stage::Reserving {
            return Err(MyError(format!("late timeout {}", event.reference)));
        }
        ctx.compensate();
        Ok(())
    }

    fn total(&self) -> i64 {
        self.amount
    }
}

// A saga with a name of its own, a `String` id and a start handler without `ctx`.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Audit {
    reference: String,
}

#[saga(name = "audit.v2", id = String, correlate = reference, starts_with(StockTimedOut))]
impl Audit {
    async fn on_timeout(event: StockTimedOut) -> Result<Self, std::io::Error> {
        Ok(Self { reference: event.reference })
    }
}

fn main() {
    assert_eq!(<OrderFulfilment as Saga>::NAME, "order_fulfilment");
    assert_eq!(<Audit as Saga>::NAME, "audit.v2");

    let state = OrderFulfilment {
        order_id: Uuid::nil(),
        sku: "sku".into(),
        amount: 7,
        stage: Stage::Reserving,
    };
    assert_eq!(state.total(), 7);
    assert_eq!(state.stage, Stage::Reserving);
    let audit = Audit { reference: "r".into() };
    assert_eq!(audit.reference, "r");

    // One consumer handler per message, registered for the dead-letter topics.
    let consumed: Vec<String> = txoutbox_runtime::topics::Registered::linked()
        .consumed
        .into_iter()
        .collect();
    assert_eq!(
        consumed,
        ["inventory.events", "order.events", "payment.events", "saga.timeouts"]
    );
    fn handles<H: EventHandler>(_: H) -> (&'static str, &'static str, &'static str) {
        use txoutbox_core::DomainEvent;
        (<H::Event as DomainEvent>::TOPIC, <H::Event as DomainEvent>::EVENT_TYPE, H::NAME)
    }
    let mut names = vec![
        handles(OrderFulfilment::on_stock_reserved_handler()),
        handles(OrderFulfilment::on_order_created_handler()),
        handles(OrderFulfilment::on_payment_failed_handler()),
        handles(Audit::on_timeout_handler()),
        handles(OrderFulfilment::on_timeout_handler()),
    ];
    names.sort();
    assert_eq!(
        names,
        [
            ("inventory.events", "StockReserved", "OrderFulfilment::on_stock_reserved"),
            ("order.events", "OrderCreated", "OrderFulfilment::on_order_created"),
            ("payment.events", "PaymentFailed", "OrderFulfilment::on_payment_failed"),
            ("saga.timeouts", "StockTimedOut", "Audit::on_timeout"),
            ("saga.timeouts", "StockTimedOut", "OrderFulfilment::on_timeout"),
        ]
    );
    fn handler_name<H: EventHandler>(_: H) -> &'static str {
        H::NAME
    }
    assert_eq!(handler_name(Audit::on_timeout_handler()), "Audit::on_timeout");
}
