//! The inventory's commands on MariaDB, called directly (no broker): the
//! decisions of `inventory.rs`'s PostgreSQL tests over MariaDB's statements
//! (`outbox_examples::inventory::mysql`). A release is applied once, a
//! release before its reservation leaves a tombstone, a backlogged
//! warehouse puts the reservation back once; and two commands of one order
//! at once apply one after the other, which MariaDB gets from the order's
//! `reservation_lock` row (its named locks belong to the session, not to
//! the transaction).

use std::time::Duration;

use outbox_examples::events::{ReleaseStock, ReserveStock, StockRejected, StockRejection};
use outbox_examples::inventory::{self, Release, Reservation};
use sqlx::MySqlPool;
use txoutbox_core::Events;
use txoutbox_testkit::mysql::MySqlScratch;
use uuid::Uuid;

fn reserve_command(order_id: Uuid, product_id: Uuid) -> ReserveStock {
    ReserveStock {
        event_id: Uuid::now_v7(),
        order_id,
        product_id,
        quantity: 1,
    }
}

fn release_command(order_id: Uuid, product_id: Uuid) -> ReleaseStock {
    ReleaseStock {
        event_id: Uuid::now_v7(),
        order_id,
        product_id,
    }
}

/// Applies a reservation in a transaction of its own, at the consumers'
/// isolation (READ COMMITTED).
async fn reserve(pool: &MySqlPool, command: &ReserveStock) -> (Reservation, Events) {
    let mut tx = begin(pool).await;
    let mut events = Events::new();
    let done = inventory::reserve(&mut tx, &mut events, command)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    (done, events)
}

async fn release(pool: &MySqlPool, command: &ReleaseStock) -> Release {
    let mut tx = begin(pool).await;
    let done = inventory::release(&mut tx, command).await.unwrap();
    tx.commit().await.unwrap();
    done
}

async fn begin(pool: &MySqlPool) -> sqlx::Transaction<'static, sqlx::MySql> {
    pool.begin_with("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION")
        .await
        .unwrap()
}

async fn stock(pool: &MySqlPool, product: Uuid) -> (i32, i32) {
    sqlx::query_as("SELECT available, reserved FROM stock WHERE product_id = ?")
        .bind(product)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn movements(pool: &MySqlPool, order: Uuid) -> Vec<String> {
    sqlx::query_scalar("SELECT kind FROM stock_movement WHERE order_id = ? ORDER BY id")
        .bind(order)
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn reservations_and_releases_apply_once_and_never_before_each_other_on_mariadb() {
    let db = MySqlScratch::create(4).await;
    let pool = db.pool.clone();
    inventory::migrate(&pool).await.unwrap();
    let product = Uuid::now_v7();
    inventory::stock_product(&pool, product, 2, Duration::ZERO)
        .await
        .unwrap();

    // Reserved, a second reservation of the order changes nothing, a
    // second release gives nothing back.
    let order = Uuid::now_v7();
    let (done, events) = reserve(&pool, &reserve_command(order, product)).await;
    assert_eq!(done, Reservation::Reserved);
    assert_eq!(events.records()[0].event_type, "StockReserved");
    let (again, events) = reserve(&pool, &reserve_command(order, product)).await;
    assert_eq!(again, Reservation::Duplicate);
    assert!(events.is_empty());
    assert_eq!(stock(&pool, product).await, (1, 1));
    assert_eq!(
        release(&pool, &release_command(order, product)).await,
        Release::Released
    );
    assert_eq!(
        release(&pool, &release_command(order, product)).await,
        Release::Nothing
    );
    assert_eq!(stock(&pool, product).await, (2, 0));
    assert_eq!(
        movements(&pool, order).await,
        ["reserve", "release", "release_nothing"]
    );

    // Released before its reservation: a tombstone, and the late
    // reservation takes nothing.
    let late = Uuid::now_v7();
    assert_eq!(
        release(&pool, &release_command(late, product)).await,
        Release::Tombstone
    );
    let (done, events) = reserve(&pool, &reserve_command(late, product)).await;
    assert_eq!(done, Reservation::AfterRelease);
    assert_eq!(
        events.of_type::<StockRejected>()[0].reason,
        StockRejection::AlreadyReleased
    );
    assert_eq!(stock(&pool, product).await, (2, 0));

    // Out of stock: rejected.
    for _ in 0..2 {
        let (done, _) = reserve(&pool, &reserve_command(Uuid::now_v7(), product)).await;
        assert_eq!(done, Reservation::Reserved);
    }
    let (done, events) = reserve(&pool, &reserve_command(Uuid::now_v7(), product)).await;
    assert_eq!(done, Reservation::Rejected);
    assert_eq!(
        events.of_type::<StockRejected>()[0].reason,
        StockRejection::OutOfStock
    );
    assert_eq!(stock(&pool, product).await, (0, 2));

    // A backlogged warehouse puts the reservation back once; when it comes
    // back it is applied.
    let backlogged = Uuid::now_v7();
    inventory::stock_product(&pool, backlogged, 5, Duration::ZERO)
        .await
        .unwrap();
    inventory::backlog_product(&pool, backlogged, Duration::from_secs(4))
        .await
        .unwrap();
    let order = Uuid::now_v7();
    let (done, events) = reserve(&pool, &reserve_command(order, backlogged)).await;
    assert_eq!(done, Reservation::Deferred);
    assert_eq!(events.scheduled().len(), 1);
    let again = events.of_type::<ReserveStock>()[0].clone();
    let (done, _) = reserve(&pool, &again).await;
    assert_eq!(done, Reservation::Reserved);
    assert_eq!(stock(&pool, backlogged).await, (4, 1));
    assert_eq!(movements(&pool, order).await, ["defer", "reserve"]);
    db.drop().await;
}

/// A release racing its reservation (two consumers): whichever comes first,
/// the order ends with nothing reserved, and no command failed on a
/// duplicate key.
#[tokio::test]
async fn concurrent_commands_of_one_order_apply_one_after_the_other_on_mariadb() {
    let db = MySqlScratch::create(8).await;
    let pool = db.pool.clone();
    inventory::migrate(&pool).await.unwrap();
    let product = Uuid::now_v7();
    inventory::stock_product(&pool, product, 100, Duration::ZERO)
        .await
        .unwrap();
    let orders: Vec<Uuid> = (0..20).map(|_| Uuid::now_v7()).collect();
    let mut tasks = Vec::new();
    for &order in &orders {
        let (a, b) = (pool.clone(), pool.clone());
        tasks.push(tokio::spawn(async move {
            reserve(&a, &reserve_command(order, product)).await;
        }));
        tasks.push(tokio::spawn(async move {
            release(&b, &release_command(order, product)).await;
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(stock(&pool, product).await, (100, 0));
    for order in orders {
        let kinds = movements(&pool, order).await;
        assert!(
            kinds == ["reserve", "release"] || kinds == ["tombstone", "late_reserve"],
            "{kinds:?}"
        );
    }
    db.drop().await;
}
