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
//!
//! The saga runs on PostgreSQL and on MariaDB. Its transitions are written
//! once, generic over the statements they need ([`FulfilmentSql`], which
//! the orders service implements for each database next to its own);
//! `#[saga]` registers handlers of one concrete database (their
//! `SagaContext<'_, Postgres>` or `SagaContext<'_, MySql>`), so the saga is
//! declared for each database by one `macro_rules!` (`order_fulfilment_on!`,
//! at the end of this file), whose handlers each call the transition of
//! their message. `OrderFulfilment<Postgres>` (the default) and
//! `OrderFulfilment<MySql>` are the two saga types, with the same name
//! (`order_fulfilment`) and the same state in `saga_state`.

use std::future::Future;
use std::marker::PhantomData;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{Postgres, Transaction};
use txoutbox_runtime::saga::SagaContext;
use uuid::Uuid;

use crate::database::ExampleDatabase;
use crate::events::{
    CancellationReason, ChargePayment, OrderCancelled, OrderCreated, PaymentCompleted,
    PaymentFailed, ReleaseStock, ReserveStock, StockRejected, StockReserved, StockTimedOut,
};
use crate::orders_error::OrdersError;

/// The statements of the saga's steps on one database, on the orders
/// service's tables (`orders`, `fulfilment_settings`) in the step's
/// transaction. Implemented with the rest of the orders service's SQL
/// (`crate::orders::postgres`, `crate::orders::mysql`).
pub trait FulfilmentSql: ExampleDatabase {
    /// What the saga fulfils: the order's `(customer_id, product_id,
    /// amount)`, or `None` if this service does not have the order.
    fn order_to_fulfil(
        conn: &mut Self::Connection,
        order_id: Uuid,
    ) -> impl Future<Output = sqlx::Result<Option<(Uuid, Uuid, i64)>>> + Send;

    /// How long the saga waits for the inventory (`fulfilment_settings`).
    fn stock_timeout_ms(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = sqlx::Result<i32>> + Send;

    /// Marks the pending order confirmed and paid at `paid_at` (finished
    /// now, by the database's clock).
    fn confirm(
        conn: &mut Self::Connection,
        order_id: Uuid,
        paid_at: DateTime<Utc>,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// Marks the pending order cancelled for `reason` (finished now).
    fn cancel(
        conn: &mut Self::Connection,
        order_id: Uuid,
        reason: &'static str,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;
}

/// The state of one order's fulfilment (`saga_state.state`), keyed by the
/// order id, on database `DB` (PostgreSQL unless `MySql`).
#[derive(Debug, Serialize, Deserialize)]
pub struct OrderFulfilment<DB = Postgres> {
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
    /// Which database's saga this is (not stored).
    #[serde(skip)]
    database: PhantomData<fn() -> DB>,
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

/// The transitions, one per message, on either database.
impl<DB: FulfilmentSql> OrderFulfilment<DB> {
    /// The order was placed: ask for its stock, and give the inventory until
    /// the configured timeout to answer.
    async fn start(
        event: OrderCreated,
        ctx: &mut SagaContext<'_, DB>,
    ) -> Result<Self, OrdersError> {
        // The orders table is the source of truth (and always has the
        // product, which the event carries only optionally). The event is
        // written with the order's row, so the row is there; an order this
        // service does not have (an event of another service, or of an
        // earlier database, on the shared topic) is not its to fulfil.
        let Some((customer_id, product_id, amount)) =
            DB::order_to_fulfil(ctx.tx(), event.order_id).await?
        else {
            ctx.complete();
            return Ok(Self {
                order_id: event.order_id,
                customer_id: event.customer_id,
                product_id: event.product_id.unwrap_or_default(),
                amount: event.amount,
                stage: Stage::NotOurs,
                timeout_id: Uuid::nil(),
                database: PhantomData,
            });
        };
        let timeout_ms = DB::stock_timeout_ms(ctx.tx()).await?;
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
            database: PhantomData,
        })
    }

    /// The stock is held: from now on a failure must give it back. Charge.
    async fn stock_reserved(
        &mut self,
        _event: StockReserved,
        ctx: &mut SagaContext<'_, DB>,
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
    async fn stock_rejected(
        &mut self,
        _event: StockRejected,
        ctx: &mut SagaContext<'_, DB>,
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
    async fn payment_completed(
        &mut self,
        event: PaymentCompleted,
        ctx: &mut SagaContext<'_, DB>,
    ) -> Result<(), OrdersError> {
        if self.stage != Stage::Charging {
            return Ok(());
        }
        DB::confirm(ctx.tx(), self.order_id, event.completed_at).await?;
        ctx.complete();
        Ok(())
    }

    /// Declined: give the stock back and cancel the order.
    async fn payment_failed(
        &mut self,
        _event: PaymentFailed,
        ctx: &mut SagaContext<'_, DB>,
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
    async fn stock_timed_out(
        &mut self,
        _event: StockTimedOut,
        ctx: &mut SagaContext<'_, DB>,
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
async fn cancel_order<DB: FulfilmentSql>(
    tx: &mut Transaction<'static, DB>,
    order_id: Uuid,
    reason: CancellationReason,
) -> Result<OrderCancelled, sqlx::Error> {
    let reason_text = match reason {
        CancellationReason::CustomerRequest => "customer_request",
        CancellationReason::PaymentDeclined => "payment_declined",
        CancellationReason::OutOfStock => "out_of_stock",
        CancellationReason::StockTimeout => "stock_timeout",
    };
    DB::cancel(tx, order_id, reason_text).await?;
    Ok(OrderCancelled {
        event_id: Uuid::now_v7(),
        order_id,
        reason,
        cancelled_at: Utc::now(),
    })
}

/// Declares the saga on database `$db` (`Postgres` or `MySql`), in a module
/// `$module` of its own (the handlers `#[saga]` generates are named after
/// the saga type, the same on both databases): the message list and the
/// correlation once, each handler calling the transition of its message.
/// Invoked once per database below.
macro_rules! order_fulfilment_on {
    ($module:ident, $db:ident) => {
        mod $module {
            use sqlx::$db;
            use txoutbox_runtime::saga::{SagaContext, saga};
            use uuid::Uuid;

            use super::OrderFulfilment;
            use crate::events::{
                OrderCreated, PaymentCompleted, PaymentFailed, StockRejected, StockReserved,
                StockTimedOut,
            };
            use crate::orders_error::OrdersError;

            #[saga(
                name = "order_fulfilment",
                id = Uuid,
                correlate = order_id,
                starts_with(OrderCreated),
                handles(StockReserved, StockRejected, PaymentCompleted, PaymentFailed, StockTimedOut),
                database = $db
            )]
            impl OrderFulfilment<$db> {
                async fn on_order_created(
                    event: OrderCreated,
                    ctx: &mut SagaContext<'_, $db>,
                ) -> Result<Self, OrdersError> {
                    Self::start(event, ctx).await
                }

                async fn on_stock_reserved(
                    &mut self,
                    event: StockReserved,
                    ctx: &mut SagaContext<'_, $db>,
                ) -> Result<(), OrdersError> {
                    self.stock_reserved(event, ctx).await
                }

                async fn on_stock_rejected(
                    &mut self,
                    event: StockRejected,
                    ctx: &mut SagaContext<'_, $db>,
                ) -> Result<(), OrdersError> {
                    self.stock_rejected(event, ctx).await
                }

                async fn on_payment_completed(
                    &mut self,
                    event: PaymentCompleted,
                    ctx: &mut SagaContext<'_, $db>,
                ) -> Result<(), OrdersError> {
                    self.payment_completed(event, ctx).await
                }

                async fn on_payment_failed(
                    &mut self,
                    event: PaymentFailed,
                    ctx: &mut SagaContext<'_, $db>,
                ) -> Result<(), OrdersError> {
                    self.payment_failed(event, ctx).await
                }

                #[correlate(order_id)]
                async fn on_stock_timed_out(
                    &mut self,
                    event: StockTimedOut,
                    ctx: &mut SagaContext<'_, $db>,
                ) -> Result<(), OrdersError> {
                    self.stock_timed_out(event, ctx).await
                }
            }
        }
    };
}

order_fulfilment_on!(on_postgres, Postgres);
order_fulfilment_on!(on_mysql, MySql);
