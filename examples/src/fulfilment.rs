//! The order fulfilment saga of the orders service: reserve the stock, charge
//! the payment, confirm the order; or cancel it and give back what was taken.
//!
//! ```text
//! OrderCreated ──> ReserveStock ─┬─ StockReserved ──> ChargePayment ─┬─ PaymentCompleted ──> confirmed   (completed)
//!   + StockTimedOut scheduled    │   (ReleaseStock registered as     └─ PaymentFailed ─────> ReleaseStock,
//!                                │    its compensation)                                      cancelled payment_declined (compensated)
//!                                ├─ StockRejected ──> cancelled out_of_stock                  (completed)
//!                                └─ StockTimedOut ──> ReleaseStock, cancelled stock_timeout   (compensated)
//! ```
//!
//! Each message is one step in the orders consumer's transaction: the
//! order's row changes with the saga's state and the messages it sends.
//!
//! How the order's final state and the saga's status match:
//!
//! | order | cancel reason | saga |
//! | --- | --- | --- |
//! | `confirmed` | | `completed` |
//! | `cancelled` | `out_of_stock` | `completed`: the saga ran to one of its normal ends; nothing was reserved, so there is nothing to compensate |
//! | `cancelled` | `payment_declined` | `compensated`: the reservation is released |
//! | `cancelled` | `stock_timeout` | `compensated`: a release is sent although no answer came, since the reservation may have happened (or may still arrive); the inventory applies it once, or leaves a tombstone that makes a late reservation reserve nothing |
//!
//! A reply that arrives after the saga ended (a `StockReserved` after the
//! timeout) is ignored by the runtime; the release sent on timeout takes care
//! of that reservation.

use std::time::Duration;

use chrono::Utc;
use serde::{Deserialize, Serialize};
use sqlx::{Postgres, Transaction};
use txoutbox_runtime::saga::{SagaContext, saga};
use uuid::Uuid;

use crate::events::{
    CancellationReason, ChargePayment, OrderCancelled, OrderCreated, PaymentCompleted,
    PaymentFailed, ReleaseStock, ReserveStock, StockRejected, StockReserved, StockTimedOut,
};
use crate::orders_error::OrdersError;

/// The state of one order's fulfilment (`saga_state.state`), keyed by the
/// order id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderFulfilment {
    /// The order.
    pub order_id: Uuid,
    /// Who pays.
    pub customer_id: Uuid,
    /// What is reserved.
    pub product_id: Uuid,
    /// What is charged, in cents.
    pub amount: i64,
    /// What the saga waits for.
    pub stage: Stage,
    /// The scheduled `StockTimedOut`, cancelled once the inventory answers.
    pub timeout_id: Uuid,
}

/// What the saga waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// The inventory's answer to `ReserveStock` (or the timeout).
    ReservingStock,
    /// The payment's answer to `ChargePayment`.
    Charging,
    /// Nothing: the order is not in this service's table, the saga ended
    /// as soon as it started.
    NotOurs,
}

#[saga(
    name = "order_fulfilment",
    id = Uuid,
    correlate = order_id,
    starts_with(OrderCreated),
    handles(StockReserved, StockRejected, PaymentCompleted, PaymentFailed, StockTimedOut)
)]
impl OrderFulfilment {
    /// The order was placed: ask for its stock, and give the inventory until
    /// the configured timeout to answer.
    async fn on_order_created(
        event: OrderCreated,
        ctx: &mut SagaContext<'_>,
    ) -> Result<Self, OrdersError> {
        // The orders table is the source of truth (and always has the
        // product, which the event carries only optionally). The event is
        // written with the order's row, so the row is there; an order this
        // service does not have (an event of another service, or of an
        // earlier database, on the shared topic) is not its to fulfil.
        let order: Option<(Uuid, Uuid, i64)> =
            sqlx::query_as("SELECT customer_id, product_id, amount FROM orders WHERE id = $1")
                .bind(event.order_id)
                .fetch_optional(&mut **ctx.tx())
                .await?;
        let Some((customer_id, product_id, amount)) = order else {
            ctx.complete();
            return Ok(Self {
                order_id: event.order_id,
                customer_id: event.customer_id,
                product_id: event.product_id.unwrap_or_default(),
                amount: event.amount,
                stage: Stage::NotOurs,
                timeout_id: Uuid::nil(),
            });
        };
        let timeout_ms: i32 =
            sqlx::query_scalar("SELECT stock_timeout_ms FROM fulfilment_settings")
                .fetch_one(&mut **ctx.tx())
                .await?;
        let timeout = Duration::from_millis(timeout_ms.max(1) as u64);
        ctx.send(ReserveStock {
            event_id: Uuid::now_v7(),
            order_id: event.order_id,
            product_id,
            quantity: 1,
        });
        let timeout_id = ctx.send_after(
            StockTimedOut {
                event_id: Uuid::now_v7(),
                order_id: event.order_id,
                waited_ms: i64::from(timeout_ms),
            },
            timeout,
        );
        Ok(Self {
            order_id: event.order_id,
            customer_id,
            product_id,
            amount,
            stage: Stage::ReservingStock,
            timeout_id,
        })
    }

    /// The stock is held: from now on a failure must give it back. Charge.
    async fn on_stock_reserved(
        &mut self,
        _event: StockReserved,
        ctx: &mut SagaContext<'_>,
    ) -> Result<(), OrdersError> {
        if self.stage != Stage::ReservingStock {
            return Ok(());
        }
        ctx.on_compensate(self.release());
        ctx.cancel_scheduled(self.timeout_id).await?;
        ctx.send(ChargePayment {
            event_id: Uuid::now_v7(),
            order_id: self.order_id,
            customer_id: self.customer_id,
            amount: self.amount,
        });
        self.stage = Stage::Charging;
        Ok(())
    }

    /// Nothing was reserved: the order cannot be fulfilled. The saga ends
    /// completed (there is nothing to compensate).
    async fn on_stock_rejected(
        &mut self,
        _event: StockRejected,
        ctx: &mut SagaContext<'_>,
    ) -> Result<(), OrdersError> {
        if self.stage != Stage::ReservingStock {
            return Ok(());
        }
        ctx.cancel_scheduled(self.timeout_id).await?;
        let cancelled =
            cancel_order(ctx.tx(), self.order_id, CancellationReason::OutOfStock).await?;
        ctx.send(cancelled);
        ctx.complete();
        Ok(())
    }

    /// Paid: the order is confirmed, the reservation stays.
    async fn on_payment_completed(
        &mut self,
        event: PaymentCompleted,
        ctx: &mut SagaContext<'_>,
    ) -> Result<(), OrdersError> {
        if self.stage != Stage::Charging {
            return Ok(());
        }
        sqlx::query(
            "UPDATE orders SET status = 'confirmed', payment_status = 'paid', paid_at = $2,
                               finished_at = now()
             WHERE id = $1 AND status = 'pending'",
        )
        .bind(self.order_id)
        .bind(event.completed_at)
        .execute(&mut **ctx.tx())
        .await?;
        ctx.complete();
        Ok(())
    }

    /// Declined: give the stock back and cancel the order.
    async fn on_payment_failed(
        &mut self,
        _event: PaymentFailed,
        ctx: &mut SagaContext<'_>,
    ) -> Result<(), OrdersError> {
        if self.stage != Stage::Charging {
            return Ok(());
        }
        let cancelled =
            cancel_order(ctx.tx(), self.order_id, CancellationReason::PaymentDeclined).await?;
        ctx.send(cancelled);
        ctx.compensate();
        Ok(())
    }

    /// The inventory did not answer in time: give up on the order. Whether
    /// the stock was reserved is unknown (the answer may be on its way, or
    /// the command may not have been applied yet), so the release is
    /// registered as this step's compensation and sent: the inventory
    /// applies it once if the stock was reserved, or leaves a tombstone so
    /// that a late reservation takes nothing. Ignored once the inventory
    /// has answered (a timeout that was due before it could be cancelled).
    #[correlate(order_id)]
    async fn on_stock_timed_out(
        &mut self,
        _event: StockTimedOut,
        ctx: &mut SagaContext<'_>,
    ) -> Result<(), OrdersError> {
        if self.stage != Stage::ReservingStock {
            return Ok(());
        }
        ctx.on_compensate(self.release());
        let cancelled =
            cancel_order(ctx.tx(), self.order_id, CancellationReason::StockTimeout).await?;
        ctx.send(cancelled);
        ctx.compensate();
        Ok(())
    }
}

impl OrderFulfilment {
    /// The compensation of `ReserveStock`.
    fn release(&self) -> ReleaseStock {
        ReleaseStock {
            event_id: Uuid::now_v7(),
            order_id: self.order_id,
            product_id: self.product_id,
        }
    }
}

/// Marks the order cancelled for `reason` and returns the event that says so.
async fn cancel_order(
    tx: &mut Transaction<'static, Postgres>,
    order_id: Uuid,
    reason: CancellationReason,
) -> Result<OrderCancelled, sqlx::Error> {
    let reason_text = match reason {
        CancellationReason::CustomerRequest => "customer_request",
        CancellationReason::PaymentDeclined => "payment_declined",
        CancellationReason::OutOfStock => "out_of_stock",
        CancellationReason::StockTimeout => "stock_timeout",
    };
    sqlx::query(
        "UPDATE orders SET status = 'cancelled', cancel_reason = $2, finished_at = now()
         WHERE id = $1 AND status = 'pending'",
    )
    .bind(order_id)
    .bind(reason_text)
    .execute(&mut **tx)
    .await?;
    Ok(OrderCancelled {
        event_id: Uuid::now_v7(),
        order_id,
        reason,
        cancelled_at: Utc::now(),
    })
}
