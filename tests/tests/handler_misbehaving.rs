//! Command handlers that misbehave with their transaction: the unit of work
//! never reports success for a transaction PostgreSQL has aborted (issue 22,
//! item 1), and says what happened and how to fix it.

mod handler_support;

use handler_support::*;
use sqlx::{PgPool, Postgres, Transaction};
use txoutbox_core::{Events, outbox_handler, transaction};

/// The common idiom gone wrong: a unique violation "means already done", so
/// the error is dropped and the handler returns `Ok`. PostgreSQL has aborted
/// the transaction at the failed insert.
async fn swallow_unique_violation(tx: &mut Transaction<'_, Postgres>) {
    let duplicate = sqlx::query("INSERT INTO customers (id) VALUES (1)")
        .execute(&mut **tx)
        .await;
    assert!(duplicate.is_err(), "customer 1 exists: a unique violation");
}

#[outbox_handler]
async fn place_and_swallow(
    tx: &mut Transaction<'_, Postgres>,
    events: &mut Events,
    amount: i64,
    record: bool,
) -> Result<i64, AppError> {
    let order_id = insert_order(tx, amount, 1).await?;
    swallow_unique_violation(tx).await;
    if record {
        events.record(order_created(order_id, amount));
    }
    Ok(order_id)
}

fn assert_explains_abort(error: &AppError) {
    let text = error.to_string();
    assert!(
        matches!(
            error,
            AppError::Outbox(txoutbox_core::Error::TransactionAborted)
        ),
        "{error:?}"
    );
    for hint in ["aborted", "savepoint", "ON CONFLICT", "return the error"] {
        assert!(text.contains(hint), "{text:?} should mention {hint:?}");
    }
}

#[sqlx::test(migrations = false)]
async fn a_swallowed_database_error_is_not_reported_as_a_commit(pool: PgPool) {
    setup(&pool).await;
    for record in [false, true] {
        let result = place_and_swallow(&pool, 10, record).await;
        let written = count(&pool, "orders").await;
        let outbox = count(&pool, "outbox_event").await;
        assert!(
            result.is_err(),
            "reported success (with events: {record}) although {written} orders and {outbox} \
             outbox rows were written"
        );
        assert_explains_abort(&result.unwrap_err());
        assert_eq!((written, outbox), (0, 0));
    }
}

#[sqlx::test(migrations = false)]
async fn a_handler_that_recovers_with_a_savepoint_commits(pool: PgPool) {
    setup(&pool).await;
    let order_id = transaction(&pool)
        .run(async |tx, events| {
            let order_id = insert_order(tx, 7, 1).await?;
            sqlx::query("SAVEPOINT maybe_duplicate")
                .execute(&mut **tx)
                .await?;
            swallow_unique_violation(tx).await;
            sqlx::query("ROLLBACK TO SAVEPOINT maybe_duplicate")
                .execute(&mut **tx)
                .await?;
            events.record(order_created(order_id, 7));
            Ok::<_, AppError>(order_id)
        })
        .await
        .unwrap();
    assert!(order_id > 0);
    assert_eq!(count(&pool, "orders").await, 1);
    assert_eq!(count(&pool, "outbox_event").await, 1);
}

#[sqlx::test(migrations = false)]
async fn a_nested_unit_of_work_reports_the_abort_too(pool: PgPool) {
    setup(&pool).await;
    let mut conn = pool.acquire().await.unwrap();
    let mut outer = sqlx::Connection::begin(&mut *conn).await.unwrap();
    // On a connection already in a transaction the unit of work takes a
    // savepoint; its "commit" is a RELEASE, refused in an aborted transaction.
    let result = transaction(&mut *outer)
        .run(async |tx, _events| {
            insert_order(tx, 3, 1).await?;
            swallow_unique_violation(tx).await;
            Ok::<_, AppError>(())
        })
        .await;
    assert!(
        result.is_err(),
        "reported success inside an aborted transaction"
    );
    assert_explains_abort(&result.unwrap_err());
}

#[sqlx::test(migrations = false)]
async fn the_test_helper_reports_a_swallowed_error(pool: PgPool) {
    setup(&pool).await;
    for record in [false, true] {
        let run = txoutbox_core::testing::record_events(&pool, async |tx, events| {
            place_and_swallow_in_tx(tx, events, 5, record).await
        })
        .await;
        let error = run.expect_err("the helper must fail the test of a swallowing handler");
        assert!(
            matches!(error, txoutbox_core::Error::TransactionAborted),
            "{error:?}"
        );
    }
}
