//! The inventory's commands against PostgreSQL, called directly (no broker):
//! reservations take stock or are rejected, a release gives it back exactly
//! once, and a release that comes before its reservation leaves a tombstone
//! so that the late reservation takes nothing.

use std::time::Duration;

use outbox_examples::events::{ReleaseStock, ReserveStock, StockRejected, StockRejection};
use outbox_examples::inventory::{self, Release, Reservation};
use sqlx::PgPool;
use txoutbox_core::Events;
use txoutbox_testkit::db::ScratchDatabase;
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

/// Applies a reservation in a transaction of its own; what it did and the
/// events it recorded.
async fn reserve(pool: &PgPool, command: &ReserveStock) -> (Reservation, Events) {
    let mut tx = pool.begin().await.unwrap();
    let mut events = Events::new();
    let done = inventory::reserve(&mut tx, &mut events, command)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    (done, events)
}

async fn release(pool: &PgPool, command: &ReleaseStock) -> Release {
    let mut tx = pool.begin().await.unwrap();
    let done = inventory::release(&mut tx, command).await.unwrap();
    tx.commit().await.unwrap();
    done
}

async fn stock(pool: &PgPool, product: Uuid) -> (i32, i32) {
    sqlx::query_as("SELECT available, reserved FROM stock WHERE product_id = $1")
        .bind(product)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn movements(pool: &PgPool, order: Uuid) -> Vec<String> {
    sqlx::query_scalar("SELECT kind FROM stock_movement WHERE order_id = $1 ORDER BY id")
        .bind(order)
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn reservations_and_releases_apply_once_and_never_before_each_other() {
    let db = ScratchDatabase::create("outbox_inventory", 4).await;
    let pool = db.pool.clone();
    inventory::migrate(&pool).await.unwrap();
    let product = Uuid::now_v7();
    inventory::stock_product(&pool, product, 2, Duration::ZERO)
        .await
        .unwrap();

    // Reserved, then released twice (a redelivered compensation under a
    // new id, or a second one): the stock comes back once.
    let order = Uuid::now_v7();
    let (done, events) = reserve(&pool, &reserve_command(order, product)).await;
    assert_eq!(done, Reservation::Reserved);
    assert_eq!(events.records()[0].event_type, "StockReserved");
    assert_eq!(stock(&pool, product).await, (1, 1));
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

    // Released before its reservation arrives: a tombstone, and the late
    // reservation takes nothing (and says so).
    let late = Uuid::now_v7();
    assert_eq!(
        release(&pool, &release_command(late, product)).await,
        Release::Tombstone
    );
    let (done, events) = reserve(&pool, &reserve_command(late, product)).await;
    assert_eq!(done, Reservation::AfterRelease);
    let answer = events.of_type::<StockRejected>();
    assert_eq!(answer.len(), 1);
    assert_eq!(answer[0].reason, StockRejection::AlreadyReleased);
    assert_eq!(stock(&pool, product).await, (2, 0));
    assert_eq!(
        release(&pool, &release_command(late, product)).await,
        Release::Nothing
    );
    assert_eq!(
        movements(&pool, late).await,
        ["tombstone", "late_reserve", "release_nothing"]
    );

    // Not enough stock: rejected, and a release of the rejected order
    // gives nothing back.
    let (first, second, third) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
    assert_eq!(
        reserve(&pool, &reserve_command(first, product)).await.0,
        Reservation::Reserved
    );
    assert_eq!(
        reserve(&pool, &reserve_command(second, product)).await.0,
        Reservation::Reserved
    );
    let (done, events) = reserve(&pool, &reserve_command(third, product)).await;
    assert_eq!(done, Reservation::Rejected);
    assert_eq!(
        events.of_type::<StockRejected>()[0].reason,
        StockRejection::OutOfStock
    );
    assert_eq!(
        release(&pool, &release_command(third, product)).await,
        Release::Nothing
    );
    assert_eq!(stock(&pool, product).await, (0, 2));
    assert_eq!(movements(&pool, third).await, ["reject", "release_nothing"]);

    // An unknown product is out of stock.
    let (done, _) = reserve(&pool, &reserve_command(Uuid::now_v7(), Uuid::now_v7())).await;
    assert_eq!(done, Reservation::Rejected);

    db.drop().await;
}

/// Two commands of one order at once (say, a release racing its
/// reservation from two consumers): they apply one after the other, so the
/// stock ends where one order would leave it.
#[tokio::test]
async fn concurrent_commands_of_one_order_apply_one_after_the_other() {
    let db = ScratchDatabase::create("outbox_inventory_race", 8).await;
    let pool = db.pool.clone();
    inventory::migrate(&pool).await.unwrap();
    let product = Uuid::now_v7();
    inventory::stock_product(&pool, product, 100, Duration::ZERO)
        .await
        .unwrap();
    let mut tasks = Vec::new();
    let orders: Vec<Uuid> = (0..20).map(|_| Uuid::now_v7()).collect();
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
    // Whichever came first, every order ends with nothing reserved.
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

/// A backlogged warehouse puts a reservation back for later (once per
/// order); when it comes back it is applied, unless the saga's release came
/// first, in which case it takes nothing.
#[tokio::test]
async fn a_backlogged_warehouse_applies_reservations_later_and_never_after_a_release() {
    let db = ScratchDatabase::create("outbox_inventory_backlog", 4).await;
    let pool = db.pool.clone();
    inventory::migrate(&pool).await.unwrap();
    let product = Uuid::now_v7();
    inventory::stock_product(&pool, product, 5, Duration::ZERO)
        .await
        .unwrap();
    inventory::backlog_product(&pool, product, Duration::from_secs(4))
        .await
        .unwrap();

    // Put back, then applied when it comes back.
    let order = Uuid::now_v7();
    let (done, events) = reserve(&pool, &reserve_command(order, product)).await;
    assert_eq!(done, Reservation::Deferred);
    assert!(events.records().is_empty());
    assert_eq!(events.scheduled().len(), 1);
    let again = events.of_type::<ReserveStock>()[0].clone();
    assert_eq!((again.order_id, again.product_id), (order, product));
    assert_eq!(stock(&pool, product).await, (5, 0));
    let (done, _) = reserve(&pool, &again).await;
    assert_eq!(done, Reservation::Reserved);
    assert_eq!(stock(&pool, product).await, (4, 1));
    assert_eq!(movements(&pool, order).await, ["defer", "reserve"]);

    // Released while put back: the reservation takes nothing.
    let late = Uuid::now_v7();
    let (done, events) = reserve(&pool, &reserve_command(late, product)).await;
    assert_eq!(done, Reservation::Deferred);
    let again = events.of_type::<ReserveStock>()[0].clone();
    assert_eq!(
        release(&pool, &release_command(late, product)).await,
        Release::Tombstone
    );
    let (done, _) = reserve(&pool, &again).await;
    assert_eq!(done, Reservation::AfterRelease);
    assert_eq!(stock(&pool, product).await, (4, 1));
    assert_eq!(
        movements(&pool, late).await,
        ["defer", "tombstone", "late_reserve"]
    );
    db.drop().await;
}
