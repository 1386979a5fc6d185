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

/// A pool of one connection on `pool`'s database, so that the next
/// transaction runs on the connection the last one used.
async fn one_connection(pool: &PgPool) -> PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap()
}

/// How many connections to the test's database sit idle in an open
/// transaction.
async fn idle_in_transaction(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND state LIKE 'idle in transaction%'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Whether no connection to the test's database sits in an open
/// transaction once `single`'s connection is back in its pool: what the
/// next user of that connection would otherwise run in.
async fn no_transaction_left_open(pool: &PgPool, single: &PgPool) -> bool {
    // With one connection, this waits until the pool has taken it back
    // (and sent what was queued on it).
    let _held = single.acquire().await.unwrap();
    idle_in_transaction(pool).await == 0
}

#[sqlx::test(migrations = false)]
async fn commit_checked_commits_in_one_round_trip_and_leaves_the_connection_clean(pool: PgPool) {
    setup(&pool).await;
    let single = one_connection(&pool).await;
    for amount in [1, 2, 3] {
        let mut tx = single.begin().await.unwrap();
        insert_order(&mut tx, amount, 1).await.unwrap();
        txoutbox_core::commit_checked(tx).await.unwrap();
        // The empty transaction `COMMIT AND CHAIN` opened is gone before
        // the connection runs anything else.
        assert!(no_transaction_left_open(&pool, &single).await);
    }
    assert_eq!(count(&pool, "orders").await, 3);
    let conn = single.acquire().await.unwrap();
    assert!(!sqlx::Connection::is_in_transaction(&*conn));
}

#[sqlx::test(migrations = false)]
async fn commit_checked_refuses_an_aborted_or_ended_transaction_and_commits_nothing(pool: PgPool) {
    setup(&pool).await;
    let single = one_connection(&pool).await;
    // Aborted: a swallowed unique violation.
    let mut tx = single.begin().await.unwrap();
    insert_order(&mut tx, 10, 1).await.unwrap();
    swallow_unique_violation(&mut tx).await;
    let error = txoutbox_core::commit_checked(tx).await.unwrap_err();
    assert!(
        matches!(error, txoutbox_core::Error::TransactionAborted),
        "{error:?}"
    );
    assert!(no_transaction_left_open(&pool, &single).await);
    // Ended: the code rolled it back itself.
    let mut tx = single.begin().await.unwrap();
    insert_order(&mut tx, 11, 1).await.unwrap();
    sqlx::raw_sql("ROLLBACK").execute(&mut *tx).await.unwrap();
    let error = txoutbox_core::commit_checked(tx).await.unwrap_err();
    assert!(
        matches!(error, txoutbox_core::Error::TransactionEnded),
        "{error:?}"
    );
    assert!(no_transaction_left_open(&pool, &single).await);
    assert_eq!(count(&pool, "orders").await, 0);
}

#[sqlx::test(migrations = false)]
async fn commit_checked_reports_a_failed_commit_as_the_databases_error(pool: PgPool) {
    setup(&pool).await;
    sqlx::raw_sql("CREATE TABLE deferred (x int UNIQUE DEFERRABLE INITIALLY DEFERRED)")
        .execute(&pool)
        .await
        .unwrap();
    let single = one_connection(&pool).await;
    let mut tx = single.begin().await.unwrap();
    insert_order(&mut tx, 12, 1).await.unwrap();
    // Checked only at the commit.
    sqlx::raw_sql("INSERT INTO deferred VALUES (1), (1)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let error = txoutbox_core::commit_checked(tx).await.unwrap_err();
    let code = match &error {
        txoutbox_core::Error::Database(error) => error
            .as_database_error()
            .and_then(|error| error.code())
            .map(|code| code.into_owned()),
        other => panic!("{other:?}"),
    };
    assert_eq!(code.as_deref(), Some("23505"));
    assert!(no_transaction_left_open(&pool, &single).await);
    assert_eq!(count(&pool, "orders").await, 0);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM deferred")
        .fetch_one(&single)
        .await
        .unwrap();
    assert_eq!(rows, 0);
}

#[sqlx::test(migrations = false)]
async fn a_unit_of_work_whose_handler_ended_the_transaction_reports_it(pool: PgPool) {
    setup(&pool).await;
    let result = transaction(&pool)
        .run(async |tx, _events| {
            insert_order(tx, 4, 1).await?;
            sqlx::raw_sql("ROLLBACK").execute(&mut **tx).await?;
            Ok::<_, AppError>(())
        })
        .await;
    assert!(
        matches!(
            result,
            Err(AppError::Outbox(txoutbox_core::Error::TransactionEnded))
        ),
        "{result:?}"
    );
    assert_eq!(count(&pool, "orders").await, 0);
}

/// Nested in a transaction, a unit of work with nothing to insert releases
/// its savepoint and leaves the outer transaction open: the outer one still
/// decides.
#[sqlx::test(migrations = false)]
async fn a_nested_unit_of_work_with_no_event_commits_only_its_savepoint(pool: PgPool) {
    setup(&pool).await;
    let mut conn = pool.acquire().await.unwrap();
    let mut outer = sqlx::Connection::begin(&mut *conn).await.unwrap();
    transaction(&mut *outer)
        .run(async |tx, _events| {
            insert_order(tx, 5, 1).await?;
            Ok::<_, AppError>(())
        })
        .await
        .unwrap();
    let inside: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&mut *outer)
        .await
        .unwrap();
    assert_eq!(inside, 1);
    outer.rollback().await.unwrap();
    assert_eq!(count(&pool, "orders").await, 0);
}

/// On a connection of its own (no pool to take it back at once), a unit of
/// work with nothing to insert leaves nothing open on it once it returns.
#[sqlx::test(migrations = false)]
async fn a_unit_of_work_on_a_bare_connection_leaves_no_transaction_open(pool: PgPool) {
    setup(&pool).await;
    let mut conn = pool.acquire().await.unwrap();
    transaction(&mut *conn)
        .run(async |tx, _events| {
            insert_order(tx, 6, 1).await?;
            Ok::<_, AppError>(())
        })
        .await
        .unwrap();
    assert_eq!(
        idle_in_transaction(&pool).await,
        0,
        "the bare connection sits in a transaction"
    );
    assert_eq!(count(&pool, "orders").await, 1);
    drop(conn);
}
