//! The inventory service: a dedup-mode consumer of `inventory.commands`
//! reserves stock for orders (`ReserveStock`, answered by `StockReserved` or
//! `StockRejected` through its own outbox) and gives it back
//! (`ReleaseStock`, the order fulfilment saga's compensation). A small HTTP
//! server answers `/metrics`, `/health/live` and `/health/ready`.
//!
//! Each command of an order locks that order's `reservation` row, so the
//! commands of one order apply one after the other, and decides from the
//! row's status:
//!
//! | status before | `ReserveStock` | `ReleaseStock` |
//! | --- | --- | --- |
//! | (none) | reserve (`reserved`) or reject (`rejected`), and reply; for a backlogged warehouse, first put the command back for later | leave a `tombstone`: nothing was reserved, and nothing will be |
//! | `reserved` | nothing (already answered) | give the stock back (`released`) |
//! | `rejected` | nothing | nothing |
//! | `released` | nothing | nothing (released once) |
//! | `tombstone` | reserve nothing, reply `StockRejected` (`already_released`) | nothing |
//!
//! So a release is applied at most once per order, never for a reservation
//! that did not happen, and a reservation that arrives after its release
//! (the saga gave up waiting) leaks no stock. Every change is also written to
//! `stock_movement`, which the demo and the tests read.

//!
//! The decisions are written once, here, over [`InventorySql`]: the
//! inventory's statements, which each database implements in its own
//! module ([`postgres`], [`mysql`]), with the two `#[event_handler]`s of
//! that database (one line each, calling [`reserve`] and [`release`]).

pub mod mysql;
pub mod postgres;

use std::future::Future;
use std::time::Duration;

use chrono::Utc;
use sqlx::{Pool, Transaction};
use txoutbox_core::{DomainEvent, Events};
use txoutbox_runtime::consumer::ConsumerBuilder;
use uuid::Uuid;

use crate::database::ExampleDatabase;
use crate::events::{ReleaseStock, ReserveStock, StockRejected, StockRejection, StockReserved};
use crate::service::{RunningService, ServiceError, ServiceKind, Tuning};

/// Errors of the inventory handlers.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    /// The outbox write path failed.
    #[error(transparent)]
    Outbox(#[from] txoutbox_core::Error),
    /// The handler's own statements failed.
    #[error("database error: {}", txoutbox_core::DbErrorDisplay(.0))]
    Database(#[from] sqlx::Error),
}

/// What a `ReserveStock` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reservation {
    /// The stock is reserved; `StockReserved` was recorded.
    Reserved,
    /// Not enough stock; `StockRejected` (`out_of_stock`) was recorded.
    Rejected,
    /// The order's stock was released before this command arrived;
    /// nothing reserved, `StockRejected` (`already_released`) recorded.
    AfterRelease,
    /// The order was answered already (another command for it); nothing done.
    Duplicate,
    /// The product's warehouse is backlogged: the command is put back, to
    /// be applied (and answered) after the product's `apply_delay_ms`.
    Deferred,
}

/// What a `ReleaseStock` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// The reserved stock was given back.
    Released,
    /// Nothing was reserved yet: a tombstone makes a later reservation of
    /// this order reserve nothing.
    Tombstone,
    /// Nothing to do: rejected, or released already.
    Nothing,
}

/// The inventory's statements on one database (`stock`, `reservation`,
/// `deferred_reservation`, `stock_movement`), and its consumer's handlers
/// there. The statements of a command run on the consumer's transaction
/// (`conn`); [`reserve`] and [`release`] decide which.
pub trait InventorySql: ExampleDatabase {
    /// The inventory's tables, an idempotent script.
    const SCHEMA: &'static str;

    /// `consumer` with this database's handlers of `ReserveStock` and
    /// `ReleaseStock`.
    fn handlers(consumer: ConsumerBuilder<Self>) -> ConsumerBuilder<Self>;

    /// The order's reservation status, its row locked until the transaction
    /// ends; with no row yet, the order is locked some other way, so that
    /// two commands of an order that has none still apply one after the
    /// other.
    fn lock_reservation(
        conn: &mut Self::Connection,
        order_id: Uuid,
    ) -> impl Future<Output = sqlx::Result<Option<String>>> + Send;

    /// The product's `(reply_delay_ms, apply_delay_ms)`; `(0, 0)` for an
    /// unknown product.
    fn warehouse(
        conn: &mut Self::Connection,
        product_id: Uuid,
    ) -> impl Future<Output = sqlx::Result<(i32, i32)>> + Send;

    /// Records that the order's reservation was put back; false if it was
    /// already (the command came back).
    fn defer_once(
        conn: &mut Self::Connection,
        order_id: Uuid,
        command_id: Uuid,
    ) -> impl Future<Output = sqlx::Result<bool>> + Send;

    /// Moves `quantity` units of the product from available to reserved;
    /// false (nothing changed) if fewer are available.
    fn take_stock(
        conn: &mut Self::Connection,
        product_id: Uuid,
        quantity: i32,
    ) -> impl Future<Output = sqlx::Result<bool>> + Send;

    /// Inserts the order's reservation row with `status`.
    fn insert_reservation(
        conn: &mut Self::Connection,
        order_id: Uuid,
        product_id: Uuid,
        quantity: i32,
        status: &'static str,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// Marks the order's (locked, `reserved`) reservation `released`;
    /// its product and quantity.
    fn release_reservation(
        conn: &mut Self::Connection,
        order_id: Uuid,
    ) -> impl Future<Output = sqlx::Result<(Uuid, i32)>> + Send;

    /// Moves `quantity` units of the product from reserved back to available.
    fn give_back(
        conn: &mut Self::Connection,
        product_id: Uuid,
        quantity: i32,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// Appends a row to `stock_movement`.
    fn movement(
        conn: &mut Self::Connection,
        order_id: Uuid,
        product_id: Uuid,
        kind: &'static str,
        quantity: i32,
        command_id: Uuid,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// See [`stock_product`].
    fn stock_product(
        pool: &Pool<Self>,
        product_id: Uuid,
        available: i32,
        reply_delay_ms: i32,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// See [`backlog_product`].
    fn backlog_product(
        pool: &Pool<Self>,
        product_id: Uuid,
        apply_delay_ms: i32,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;
}

/// Applies a `ReserveStock` in `tx` and records the reply in `events`.
///
/// The reply goes out at once, or `reply_delay_ms` of the product later (a
/// slow warehouse).
pub async fn reserve<DB: InventorySql>(
    tx: &mut Transaction<'_, DB>,
    events: &mut Events,
    command: &ReserveStock,
) -> Result<Reservation, InventoryError> {
    let status = DB::lock_reservation(tx, command.order_id).await?;
    let (delay, backlog) = DB::warehouse(tx, command.product_id).await?;
    let rejected = |reason| StockRejected {
        event_id: Uuid::now_v7(),
        order_id: command.order_id,
        product_id: command.product_id,
        reason,
        rejected_at: Utc::now(),
    };
    let movement = |kind, quantity| (command.order_id, command.product_id, kind, quantity);
    match status.as_deref() {
        None => {}
        Some("tombstone") => {
            record(tx, movement("late_reserve", command.quantity), command).await?;
            reply(events, rejected(StockRejection::AlreadyReleased), delay);
            return Ok(Reservation::AfterRelease);
        }
        Some(_) => return Ok(Reservation::Duplicate),
    }
    if backlog > 0 {
        // A backlogged warehouse gets to the order later: the command comes
        // back (as a new message) after the delay, once per order.
        if DB::defer_once(tx, command.order_id, command.event_id).await? {
            record(tx, movement("defer", 0), command).await?;
            let later = ReserveStock {
                event_id: Uuid::now_v7(),
                ..command.clone()
            };
            events.record_after(later, Duration::from_millis(backlog as u64));
            return Ok(Reservation::Deferred);
        }
    }
    let taken = DB::take_stock(tx, command.product_id, command.quantity).await?;
    let (status, kind) = if taken {
        ("reserved", "reserve")
    } else {
        ("rejected", "reject")
    };
    DB::insert_reservation(
        tx,
        command.order_id,
        command.product_id,
        command.quantity,
        status,
    )
    .await?;
    record(tx, movement(kind, command.quantity), command).await?;
    if taken {
        let reserved = StockReserved {
            event_id: Uuid::now_v7(),
            order_id: command.order_id,
            product_id: command.product_id,
            quantity: command.quantity,
            reserved_at: Utc::now(),
        };
        reply(events, reserved, delay);
        Ok(Reservation::Reserved)
    } else {
        reply(events, rejected(StockRejection::OutOfStock), delay);
        Ok(Reservation::Rejected)
    }
}

/// Appends the movement `(order, product, kind, quantity)` caused by `command`.
async fn record<DB: InventorySql>(
    tx: &mut Transaction<'_, DB>,
    (order_id, product_id, kind, quantity): (Uuid, Uuid, &'static str, i32),
    command: &impl DomainEvent,
) -> sqlx::Result<()> {
    DB::movement(tx, order_id, product_id, kind, quantity, command.event_id()).await
}

/// Applies a `ReleaseStock` in `tx`: at most once per order, and a
/// tombstone if nothing was reserved yet. Sends no reply (a compensation
/// cannot fail).
pub async fn release<DB: InventorySql>(
    tx: &mut Transaction<'_, DB>,
    command: &ReleaseStock,
) -> Result<Release, InventoryError> {
    let order_id = command.order_id;
    match DB::lock_reservation(tx, order_id).await?.as_deref() {
        None => {
            // The reservation has not arrived (or never will): nothing to
            // give back, and nothing may be taken for this order later.
            DB::insert_reservation(tx, order_id, command.product_id, 0, "tombstone").await?;
            record(tx, (order_id, command.product_id, "tombstone", 0), command).await?;
            Ok(Release::Tombstone)
        }
        Some("reserved") => {
            let (product_id, quantity) = DB::release_reservation(tx, order_id).await?;
            DB::give_back(tx, product_id, quantity).await?;
            record(tx, (order_id, product_id, "release", quantity), command).await?;
            Ok(Release::Released)
        }
        Some(_) => {
            let nothing = (order_id, command.product_id, "release_nothing", 0);
            record(tx, nothing, command).await?;
            Ok(Release::Nothing)
        }
    }
}

/// Records the reply, at once or `delay_ms` later (scheduled delivery: the
/// relay moves it into the outbox when due).
fn reply<E: DomainEvent>(events: &mut Events, reply: E, delay_ms: i32) {
    match u64::try_from(delay_ms) {
        Ok(ms) if ms > 0 => events.record_after(reply, Duration::from_millis(ms)),
        _ => events.record(reply),
    }
}

/// Creates the inventory schema: the framework's tables, `stock`,
/// `reservation` and `stock_movement`.
pub async fn migrate<DB: InventorySql>(pool: &Pool<DB>) -> Result<(), ServiceError> {
    Ok(DB::migrate(pool, DB::SCHEMA).await?)
}

/// Puts `available` units of `product_id` in stock (replacing what was
/// there), answering reservations of it `reply_delay` later.
pub async fn stock_product<DB: InventorySql>(
    pool: &Pool<DB>,
    product_id: Uuid,
    available: i32,
    reply_delay: Duration,
) -> Result<(), sqlx::Error> {
    let delay_ms = i32::try_from(reply_delay.as_millis()).unwrap_or(i32::MAX);
    DB::stock_product(pool, product_id, available, delay_ms).await
}

/// Makes the warehouse of `product_id` backlogged: a reservation of it is
/// applied `apply_delay` after it arrives.
pub async fn backlog_product<DB: InventorySql>(
    pool: &Pool<DB>,
    product_id: Uuid,
    apply_delay: Duration,
) -> Result<(), sqlx::Error> {
    let delay_ms = i32::try_from(apply_delay.as_millis()).unwrap_or(i32::MAX);
    DB::backlog_product(pool, product_id, delay_ms).await
}

/// A running inventory service: the dedup-mode consumer of
/// `inventory.commands`, the relay of the inventory outbox, and the probes.
pub type InventoryService<DB = sqlx::Postgres> = RunningService<Inventory, DB>;

/// What makes the inventory service (see [`InventoryService`]).
#[derive(Debug)]
pub struct Inventory;

impl<DB: InventorySql> ServiceKind<DB> for Inventory {
    const NAME: &'static str = "InventoryService";

    fn consumer(builder: ConsumerBuilder<DB>, _: &Tuning) -> ConsumerBuilder<DB> {
        DB::handlers(builder)
    }
}
