//! The in-process wake-up fires after a commit that wrote events, and only then.
//! One test in its own binary: the wake-up is process-wide, so other tests
//! committing in parallel would make "no wake-up" unobservable.

mod handler_support;

use std::time::Duration;

use handler_support::*;
use sqlx::PgPool;
use txoutbox_core::__private::wakeup;
use txoutbox_core::transaction;

/// Long enough for a wake-up already sent to be seen; nothing else commits here.
const QUIET: Duration = Duration::from_millis(100);

async fn woken(listener: &mut wakeup::CommitListener) -> bool {
    tokio::time::timeout(QUIET, listener.committed())
        .await
        .is_ok()
}

#[sqlx::test(migrations = false)]
async fn wakes_after_commit_and_not_after_rollback(pool: PgPool) {
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
