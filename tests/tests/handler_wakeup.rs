//! The in-process wake-up fires after a commit that wrote events, and only
//! then, and only for the relays of the database committed to. Its own
//! binary, and its tests one at a time: the wake-up is process-wide, so
//! other tests committing in parallel would make "no wake-up" unobservable.

mod handler_support;

use std::time::Duration;

use handler_support::*;
use sqlx::PgPool;
use txoutbox_core::__private::wakeup::{self, Scope};
use txoutbox_core::{AfterCommit, Events, transaction};

/// Held by each test: one at a time.
static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Long enough for a wake-up already sent to be seen; nothing else commits here.
const QUIET: Duration = Duration::from_millis(100);

async fn woken(listener: &mut wakeup::CommitListener) -> bool {
    tokio::time::timeout(QUIET, listener.committed())
        .await
        .is_ok()
}

#[sqlx::test(migrations = false)]
async fn wakes_after_commit_and_not_after_rollback(pool: PgPool) {
    let _alone = ALONE.lock().await;
    setup(&pool).await;
    let mut listener = wakeup::listener();

    let result = transaction(&pool)
        .run(async |tx, events| {
            let order_id = insert_order(tx, 1, 1).await?;
            events.record(order_created(order_id, 1));
            Err::<(), _>(AppError::Rejected("rolled back"))
        })
        .await;
    assert!(result.is_err());
    assert!(
        !woken(&mut listener).await,
        "no wake-up after a handler error"
    );

    let result = transaction(&pool)
        .run(async |tx, events| {
            let order_id = insert_order(tx, 1, 99).await?; // fails at COMMIT
            events.record(order_created(order_id, 1));
            Ok::<_, AppError>(())
        })
        .await;
    assert!(result.is_err());
    assert!(
        !woken(&mut listener).await,
        "no wake-up after a failed commit"
    );

    transaction(&pool)
        .run(async |tx, _events| insert_order(tx, 1, 1).await.map_err(AppError::from))
        .await
        .unwrap();
    assert!(
        !woken(&mut listener).await,
        "no wake-up when no event was written"
    );

    // The listener is armed before the commit; the wake-up must have been sent
    // by the time `run` returns, with the rows already visible to others.
    transaction(&pool)
        .run(async |tx, events| {
            let order_id = insert_order(tx, 1, 1).await?;
            events.record(order_created(order_id, 1));
            Ok::<_, AppError>(())
        })
        .await
        .unwrap();
    assert!(woken(&mut listener).await, "wake-up after the commit");
    assert_eq!(count(&pool, "outbox_event").await, 1);
    assert!(!woken(&mut listener).await, "one commit, one wake-up");
}

/// `AfterCommit::committed_on` and the SeaORM unit of work wake the
/// relays of the database committed to (known by its name in the pool's
/// settings), not those of another; `committed()` and a target that names
/// no database wake them all.
#[sqlx::test(migrations = false)]
async fn a_commit_wakes_the_relays_of_its_own_database(pool: PgPool) {
    let _alone = ALONE.lock().await;
    setup(&pool).await;
    let name = pool
        .connect_options()
        .get_database()
        .expect("sqlx::test names its database")
        .to_owned();
    let mut own = wakeup::listener_in(Some(Scope::named(&name)));
    let mut elsewhere = wakeup::listener_in(Some(Scope::named("another_database")));

    let mut events = Events::new();
    events.record(order_created(1, 1));
    let mut tx = pool.begin().await.unwrap();
    let after_commit = events.write(&mut tx).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(after_commit.rows(), 1);

    let mysql_same_name =
        sqlx::MySqlPool::connect_lazy(&format!("mysql://root@127.0.0.1:3306/{name}")).unwrap();
    let mysql_other =
        sqlx::MySqlPool::connect_lazy("mysql://root@127.0.0.1:3306/another_database").unwrap();
    let sea = sea_orm::SqlxPostgresConnector::from_sqlx_postgres_pool(pool.clone());
    let pool_ref = &pool;
    after_commit.committed_on(&pool);
    assert_woken(&mut own, &mut elsewhere, (true, false), "a PgPool").await;
    after_commit.committed_on(&pool_ref);
    assert_woken(&mut own, &mut elsewhere, (true, false), "a &&PgPool").await;
    after_commit.committed_on(&sea);
    assert_woken(
        &mut own,
        &mut elsewhere,
        (true, false),
        "a DatabaseConnection",
    )
    .await;
    after_commit.committed_on(&mysql_same_name);
    assert_woken(&mut own, &mut elsewhere, (true, false), "a MySqlPool").await;
    after_commit.committed_on(&mysql_other);
    assert_woken(&mut own, &mut elsewhere, (false, true), "another MySqlPool").await;
    after_commit.committed_on(&sea_orm::DatabaseConnection::default());
    assert_woken(&mut own, &mut elsewhere, (true, true), "a disconnected one").await;
    after_commit.committed();
    assert_woken(&mut own, &mut elsewhere, (true, true), "committed()").await;
    AfterCommit::default().committed_on(&pool);
    assert_woken(&mut own, &mut elsewhere, (false, false), "no rows").await;

    // The SeaORM unit of work on a DatabaseConnection names its database.
    txoutbox_core::sea_orm::transaction(&sea)
        .run(async |_txn, events| {
            events.record(order_created(2, 2));
            Ok::<_, txoutbox_core::Error>(())
        })
        .await
        .unwrap();
    assert_woken(
        &mut own,
        &mut elsewhere,
        (true, false),
        "SeaORM's unit of work",
    )
    .await;
    assert_eq!(count(&pool, "outbox_event").await, 2);
}

async fn assert_woken(
    own: &mut wakeup::CommitListener,
    elsewhere: &mut wakeup::CommitListener,
    expected: (bool, bool),
    target: &str,
) {
    let woken = (woken(own).await, woken(elsewhere).await);
    assert_eq!(
        woken, expected,
        "{target}: (own database's relay, another's) woken"
    );
}
