//! Bounded retries of the whole handler on serialization failure / deadlock.

mod handler_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use handler_support::*;
use sqlx::PgPool;
use tokio::sync::Barrier;
use txoutbox_core::{IsolationLevel, transaction};

/// Two serializable transactions that each read the bookings and then add
/// one (write skew): PostgreSQL's SSI must abort one of them with 40001.
/// A barrier makes the first attempts overlap for sure; the retried attempt
/// runs alone and succeeds.
#[sqlx::test(migrations = false)]
async fn a_real_serialization_conflict_is_retried(pool: PgPool) {
    setup(&pool).await;
    sqlx::query("CREATE TABLE bookings (slot int NOT NULL, seen bigint NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let barrier = Arc::new(Barrier::new(2));
    let attempts = Arc::new(AtomicU32::new(0));
    let book = |who: i64| {
        let (pool, barrier, attempts) = (pool.clone(), barrier.clone(), attempts.clone());
        tokio::spawn(async move {
            let mine = AtomicU32::new(0);
            transaction(&pool)
                .isolation(IsolationLevel::Serializable)
                .retries(3)
                .run(async |tx, events| {
                    let attempt = mine.fetch_add(1, Ordering::SeqCst) + 1;
                    attempts.fetch_add(1, Ordering::SeqCst);
                    let seen: i64 =
                        sqlx::query_scalar("SELECT count(*) FROM bookings WHERE slot = 1")
                            .fetch_one(&mut **tx)
                            .await?;
                    if attempt == 1 {
                        barrier.wait().await; // both have read before either writes
                    }
                    sqlx::query("INSERT INTO bookings (slot, seen) VALUES (1, $1)")
                        .bind(seen)
                        .execute(&mut **tx)
                        .await?;
                    events.record(order_created(who, seen));
                    Ok::<_, AppError>(attempt)
                })
                .await
        })
    };
    let (a, b) = (book(1), book(2));
    let (a, b) = (a.await.unwrap().unwrap(), b.await.unwrap().unwrap());
    // Usually 3 attempts; a retry that starts before the winner's commit can
    // conflict once more, which is still within the bound.
    let total = attempts.load(Ordering::SeqCst);
    assert!((3..=5).contains(&total), "{total} attempts");
    let mut per_task = [a, b];
    per_task.sort();
    assert_eq!(per_task[0], 1, "the winner ran once");
    assert!(per_task[1] >= 2, "the loser was retried");
    // Serial outcome: the retried booking saw the winner's.
    let seen: Vec<i64> = sqlx::query_scalar("SELECT seen FROM bookings ORDER BY seen")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(seen, [0, 1]);
    // Only the committed attempts' events: the aborted attempt left none.
    let rows = outbox_rows(&pool).await;
    assert_eq!(rows.len(), 2);
    let amounts: Vec<_> = rows.iter().map(|r| r.payload["amount"].clone()).collect();
    assert!(
        amounts.contains(&0.into()) && amounts.contains(&1.into()),
        "{amounts:?}"
    );
}

/// Raises a real server-side error with `sqlstate` on every attempt.
async fn always_failing(pool: &PgPool, sqlstate: &str, retries: u32) -> (u32, AppError) {
    let attempts = AtomicU32::new(0);
    let error = transaction(pool)
        .retries(retries)
        .run(async |tx, events| {
            attempts.fetch_add(1, Ordering::SeqCst);
            place(tx, events).await?;
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "DO $$ BEGIN RAISE EXCEPTION 'provoked' USING ERRCODE = '{sqlstate}'; END $$"
            )))
            .execute(&mut **tx)
            .await?;
            Ok::<_, AppError>(())
        })
        .await
        .unwrap_err();
    (attempts.into_inner(), error)
}

async fn place(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    events: &mut txoutbox_core::Events,
) -> Result<(), AppError> {
    let order_id = insert_order(tx, 1, 1).await?;
    events.record(order_created(order_id, 1));
    Ok(())
}

#[sqlx::test(migrations = false)]
async fn gives_up_after_the_bound_with_the_last_error(pool: PgPool) {
    setup(&pool).await;
    for (sqlstate, retries) in [("40001", 2), ("40P01", 1), ("40001", 0)] {
        let (attempts, error) = always_failing(&pool, sqlstate, retries).await;
        assert_eq!(attempts, retries + 1, "{sqlstate}");
        let AppError::Db(sqlx::Error::Database(db)) = error else {
            panic!("expected the database error, got {error:?}");
        };
        assert_eq!(db.code().as_deref(), Some(sqlstate));
    }
    assert_eq!(count(&pool, "orders").await, 0);
    assert_eq!(count(&pool, "outbox_event").await, 0);
}

#[sqlx::test(migrations = false)]
async fn other_errors_are_not_retried(pool: PgPool) {
    setup(&pool).await;
    let (attempts, _) = always_failing(&pool, "23505", 5).await;
    assert_eq!(attempts, 1);
    let attempts = AtomicU32::new(0);
    let result = transaction(&pool)
        .retries(5)
        .run(async |_tx, _events| {
            attempts.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>(AppError::Rejected("business rule"))
        })
        .await;
    assert!(matches!(result, Err(AppError::Rejected(_))));
    assert_eq!(attempts.into_inner(), 1);
}

/// The error can hide the `sqlx::Error` behind `#[error(transparent)]`
/// (its `source()` then skips it) and still be recognized.
#[sqlx::test(migrations = false)]
async fn recognizes_serialization_failures_through_transparent_errors(pool: PgPool) {
    #[derive(Debug, thiserror::Error)]
    enum Transparent {
        #[error(transparent)]
        Outbox(#[from] txoutbox_core::Error),
        #[error(transparent)]
        Db(#[from] sqlx::Error),
    }
    setup(&pool).await;
    let attempts = AtomicU32::new(0);
    let result = transaction(&pool)
        .retries(1)
        .run(async |tx, _events| {
            attempts.fetch_add(1, Ordering::SeqCst);
            sqlx::raw_sql("DO $$ BEGIN RAISE EXCEPTION 'x' USING ERRCODE = '40001'; END $$")
                .execute(&mut **tx)
                .await?;
            Ok::<_, Transparent>(())
        })
        .await;
    assert!(matches!(result, Err(Transparent::Db(_))));
    assert_eq!(attempts.into_inner(), 2);
}
