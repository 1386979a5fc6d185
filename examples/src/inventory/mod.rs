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

use std::time::Duration;

use chrono::Utc;
use sqlx::{PgPool, Postgres, Transaction};
use txoutbox_core::{DomainEvent, Events};
use txoutbox_runtime::consumer::{ConsumerBuilder, event_handler};
use uuid::Uuid;

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

/// Applies a `ReserveStock` in `tx` and records the reply in `events`.
///
/// The reply goes out at once, or `reply_delay_ms` of the product later (a
/// slow warehouse).
pub async fn reserve(
    tx: &mut Transaction<'_, Postgres>,
    events: &mut Events,
    command: &ReserveStock,
) -> Result<Reservation, InventoryError> {
    let status = lock_reservation(tx, command.order_id).await?;
    let (delay, backlog): (i32, i32) =
        sqlx::query_as("SELECT reply_delay_ms, apply_delay_ms FROM stock WHERE product_id = $1")
            .bind(command.product_id)
            .fetch_optional(&mut **tx)
            .await?
            .unwrap_or((0, 0));
    let rejected = |reason| StockRejected {
        event_id: Uuid::now_v7(),
        order_id: command.order_id,
        product_id: command.product_id,
        reason,
        rejected_at: Utc::now(),
    };
    match status.as_deref() {
        None => {}
        Some("tombstone") => {
            movement(
                tx,
                command.order_id,
                command.product_id,
                "late_reserve",
                command.quantity,
                command.event_id,
            )
            .await?;
            reply(events, rejected(StockRejection::AlreadyReleased), delay);
            return Ok(Reservation::AfterRelease);
        }
        Some(_) => return Ok(Reservation::Duplicate),
    }
    if backlog > 0 {
        // A backlogged warehouse gets to the order later: the command comes
        // back (as a new message) after the delay, once per order.
        let first = changes_one_row(
            tx,
            sqlx::query(
                "INSERT INTO deferred_reservation (order_id, command_id) VALUES ($1, $2)
                 ON CONFLICT (order_id) DO NOTHING",
            )
            .bind(command.order_id)
            .bind(command.event_id),
        )
        .await?;
        if first {
            movement(
                tx,
                command.order_id,
                command.product_id,
                "defer",
                0,
                command.event_id,
            )
            .await?;
            let later = ReserveStock {
                event_id: Uuid::now_v7(),
                ..command.clone()
            };
            events.record_after(later, Duration::from_millis(backlog as u64));
            return Ok(Reservation::Deferred);
        }
    }
    let taken = changes_one_row(
        tx,
        sqlx::query(
            "UPDATE stock SET available = available - $2, reserved = reserved + $2
             WHERE product_id = $1 AND available >= $2",
        )
        .bind(command.product_id)
        .bind(command.quantity),
    )
    .await?;
    let (status, kind) = if taken {
        ("reserved", "reserve")
    } else {
        ("rejected", "reject")
    };
    sqlx::query(
        "INSERT INTO reservation (order_id, product_id, quantity, status) VALUES ($1, $2, $3, $4)",
    )
    .bind(command.order_id)
    .bind(command.product_id)
    .bind(command.quantity)
    .bind(status)
    .execute(&mut **tx)
    .await?;
    movement(
        tx,
        command.order_id,
        command.product_id,
        kind,
        command.quantity,
        command.event_id,
    )
    .await?;
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

/// Runs `query` in `tx`; whether it changed exactly one row.
async fn changes_one_row(
    tx: &mut Transaction<'_, Postgres>,
    query: sqlx::query::Query<'_, Postgres, sqlx::postgres::PgArguments>,
) -> sqlx::Result<bool> {
    Ok(query.execute(&mut **tx).await?.rows_affected() == 1)
}

/// Applies a `ReleaseStock` in `tx`: at most once per order, and a
/// tombstone if nothing was reserved yet. Sends no reply (a compensation
/// cannot fail).
pub async fn release(
    tx: &mut Transaction<'_, Postgres>,
    command: &ReleaseStock,
) -> Result<Release, InventoryError> {
    match lock_reservation(tx, command.order_id).await?.as_deref() {
        None => {
            // The reservation has not arrived (or never will): nothing to
            // give back, and nothing may be taken for this order later.
            sqlx::query(
                "INSERT INTO reservation (order_id, product_id, quantity, status)
                 VALUES ($1, $2, 0, 'tombstone')",
            )
            .bind(command.order_id)
            .bind(command.product_id)
            .execute(&mut **tx)
            .await?;
            movement(
                tx,
                command.order_id,
                command.product_id,
                "tombstone",
                0,
                command.event_id,
            )
            .await?;
            Ok(Release::Tombstone)
        }
        Some("reserved") => {
            let (product_id, quantity): (Uuid, i32) = sqlx::query_as(
                "UPDATE reservation SET status = 'released', updated_at = now()
                 WHERE order_id = $1 RETURNING product_id, quantity",
            )
            .bind(command.order_id)
            .fetch_one(&mut **tx)
            .await?;
            sqlx::query(
                "UPDATE stock SET available = available + $2, reserved = reserved - $2
                 WHERE product_id = $1",
            )
            .bind(product_id)
            .bind(quantity)
            .execute(&mut **tx)
            .await?;
            movement(
                tx,
                command.order_id,
                product_id,
                "release",
                quantity,
                command.event_id,
            )
            .await?;
            Ok(Release::Released)
        }
        Some(_) => {
            movement(
                tx,
                command.order_id,
                command.product_id,
                "release_nothing",
                0,
                command.event_id,
            )
            .await?;
            Ok(Release::Nothing)
        }
    }
}

/// The order's reservation status, its row locked until `tx` ends. With no
/// row, the order's advisory lock is taken instead, so that two commands of
/// an order that has none yet still apply one after the other.
async fn lock_reservation(
    tx: &mut Transaction<'_, Postgres>,
    order_id: Uuid,
) -> Result<Option<String>, sqlx::Error> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1::text, 0))")
        .bind(order_id)
        .execute(&mut **tx)
        .await?;
    sqlx::query_scalar("SELECT status FROM reservation WHERE order_id = $1 FOR UPDATE")
        .bind(order_id)
        .fetch_optional(&mut **tx)
        .await
}

async fn movement(
    tx: &mut Transaction<'_, Postgres>,
    order_id: Uuid,
    product_id: Uuid,
    kind: &str,
    quantity: i32,
    command_id: Uuid,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO stock_movement (order_id, product_id, kind, quantity, command_id)
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(order_id)
    .bind(product_id)
    .bind(kind)
    .bind(quantity)
    .bind(command_id)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Records the reply, at once or `delay_ms` later (scheduled delivery: the
/// relay moves it into the outbox when due).
fn reply<E: DomainEvent>(events: &mut Events, reply: E, delay_ms: i32) {
    match u64::try_from(delay_ms) {
        Ok(ms) if ms > 0 => events.record_after(reply, Duration::from_millis(ms)),
        _ => events.record(reply),
    }
}

#[event_handler]
async fn on_reserve_stock(
    tx: &mut Transaction<'_, Postgres>,
    event: ReserveStock,
    events: &mut Events,
) -> Result<(), InventoryError> {
    reserve(tx, events, &event).await.map(drop)
}

#[event_handler]
async fn on_release_stock(
    tx: &mut Transaction<'_, Postgres>,
    event: ReleaseStock,
) -> Result<(), InventoryError> {
    release(tx, &event).await.map(drop)
}

/// Creates the inventory schema: the framework's tables, `stock`,
/// `reservation` and `stock_movement`.
pub async fn migrate(pool: &PgPool) -> Result<(), ServiceError> {
    txoutbox_runtime::migrations::run(pool).await?;
    sqlx::raw_sql(include_str!("../migrations/inventory.sql"))
        .execute(pool)
        .await
        .map_err(ServiceError::Database)?;
    Ok(())
}

/// Puts `available` units of `product_id` in stock (replacing what was
/// there), answering reservations of it `reply_delay` later.
pub async fn stock_product(
    pool: &PgPool,
    product_id: Uuid,
    available: i32,
    reply_delay: Duration,
) -> Result<(), sqlx::Error> {
    let delay_ms = i32::try_from(reply_delay.as_millis()).unwrap_or(i32::MAX);
    sqlx::query(
        "INSERT INTO stock (product_id, available, reply_delay_ms) VALUES ($1, $2, $3)
         ON CONFLICT (product_id) DO UPDATE SET available = $2, reply_delay_ms = $3",
    )
    .bind(product_id)
    .bind(available)
    .bind(delay_ms)
    .execute(pool)
    .await?;
    Ok(())
}

/// Makes the warehouse of `product_id` backlogged: a reservation of it is
/// applied `apply_delay` after it arrives.
pub async fn backlog_product(
    pool: &PgPool,
    product_id: Uuid,
    apply_delay: Duration,
) -> Result<(), sqlx::Error> {
    let delay_ms = i32::try_from(apply_delay.as_millis()).unwrap_or(i32::MAX);
    sqlx::query("UPDATE stock SET apply_delay_ms = $2 WHERE product_id = $1")
        .bind(product_id)
        .bind(delay_ms)
        .execute(pool)
        .await?;
    Ok(())
}

/// A running inventory service: the dedup-mode consumer of
/// `inventory.commands`, the relay of the inventory outbox, and the probes.
pub type InventoryService = RunningService<Inventory>;

/// What makes the inventory service (see [`InventoryService`]).
#[derive(Debug)]
pub struct Inventory;

impl ServiceKind for Inventory {
    const NAME: &'static str = "InventoryService";

    fn consumer(builder: ConsumerBuilder, _: &Tuning) -> ConsumerBuilder {
        builder.handler(on_reserve_stock).handler(on_release_stock)
    }
}
