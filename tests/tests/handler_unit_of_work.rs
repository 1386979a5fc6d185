//! The plain unit-of-work API against real PostgreSQL: what commits, what
//! rolls back, concurrency, trace context.

mod handler_support;

use std::collections::HashSet;

use handler_support::*;
use sqlx::{PgPool, Postgres, Transaction};
use txoutbox_core::{Events, transaction};

/// The canonical handler: one order row and `k` events of two types.
async fn place_order(
    tx: &mut Transaction<'_, Postgres>,
    events: &mut Events,
    amount: i64,
    k: usize,
) -> Result<(i64, Vec<OrderCreated>), AppError> {
    let order_id = insert_order(tx, amount, 1).await?;
    let mut created = Vec::new();
    for i in 0..k {
        if i % 2 == 0 {
            let event = order_created(order_id, amount + i as i64);
            created.push(event.clone());
            events.record(event);
        } else {
            events.record(stock_reserved(&format!("sku-{order_id}"), i as i32));
        }
    }
    Ok((order_id, created))
}

#[sqlx::test(migrations = false)]
async fn commit_writes_domain_row_and_outbox_rows(pool: PgPool) {
    setup(&pool).await;
    let (order_id, first, second) = transaction(&pool)
        .run(async |tx, events| {
            let order_id = insert_order(tx, 42, 1).await?;
            let first = order_created(order_id, 42);
            let second = stock_reserved("sku-1", 3);
            events.record(first.clone());
            events.record(second.clone());
            Ok::<_, AppError>((order_id, first, second))
        })
        .await
        .unwrap();

    let amount: i64 = sqlx::query_scalar("SELECT amount FROM orders WHERE id = $1")
        .bind(order_id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(amount, 42);
    let rows = outbox_rows(&pool).await;
    assert_eq!(rows.len(), 2);
    assert_row_is(&rows[0], &first);
    assert_row_is(&rows[1], &second);
    assert!(rows[0].id < rows[1].id, "ids follow recording order");
    assert_eq!(rows[0].traceparent, None);
    assert_eq!(rows[0].created_at, rows[1].created_at, "one transaction");
}

#[sqlx::test(migrations = false)]
async fn a_handler_without_events_commits_its_writes(pool: PgPool) {
    setup(&pool).await;
    transaction(&pool)
        .run(async |tx, _events| insert_order(tx, 5, 1).await.map_err(AppError::from))
        .await
        .unwrap();
    assert_eq!(count(&pool, "orders").await, 1);
    assert_eq!(count(&pool, "outbox_event").await, 0);
}

#[sqlx::test(migrations = false)]
async fn handler_error_writes_nothing(pool: PgPool) {
    setup(&pool).await;
    let result = transaction(&pool)
        .run(async |tx, events| {
            place_order(tx, events, 10, 2).await?;
            Err::<(), _>(AppError::Rejected("out of stock"))
        })
        .await;
    assert!(matches!(result, Err(AppError::Rejected("out of stock"))));
    assert_eq!(count(&pool, "orders").await, 0);
    assert_eq!(count(&pool, "outbox_event").await, 0);
}

#[sqlx::test(migrations = false)]
async fn question_mark_early_return_writes_nothing(pool: PgPool) {
    setup(&pool).await;
    let result = transaction(&pool)
        .run(async |tx, events| {
            place_order(tx, events, 10, 3).await?;
            // A failing statement after the writes: `?` leaves the handler early.
            sqlx::query("SELECT 1 / 0").execute(&mut **tx).await?;
            Ok::<_, AppError>(())
        })
        .await;
    let Err(AppError::Db(sqlx::Error::Database(db))) = result else {
        panic!("expected the division error, got {result:?}");
    };
    assert_eq!(db.code().as_deref(), Some("22012"));
    assert_eq!(count(&pool, "orders").await, 0);
    assert_eq!(count(&pool, "outbox_event").await, 0);
}

#[sqlx::test(migrations = false)]
async fn panic_writes_nothing_and_leaves_the_connection_clean(pool: PgPool) {
    setup(&pool).await;
    // One connection, so the next unit of work reuses the one that panicked.
    let single = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(pool.connect_options().as_ref().clone())
        .await
        .unwrap();
    let task = tokio::spawn({
        let single = single.clone();
        async move {
            transaction(&single)
                .run(async |tx, events| {
                    place_order(tx, events, 10, 2).await?;
                    if events.len() == 2 {
                        panic!("handler bug");
                    }
                    Ok::<_, AppError>(())
                })
                .await
        }
    });
    assert!(task.await.unwrap_err().is_panic());

    // The same connection serves the next unit of work, outside any old transaction.
    let visible: i64 = transaction(&single)
        .run(async |tx, _events| {
            let orders = sqlx::query_scalar("SELECT count(*) FROM orders")
                .fetch_one(&mut **tx)
                .await?;
            Ok::<_, AppError>(orders)
        })
        .await
        .unwrap();
    assert_eq!(
        visible, 0,
        "the panicked writes are gone, even on that connection"
    );
    assert_eq!(count(&pool, "orders").await, 0);
    assert_eq!(count(&pool, "outbox_event").await, 0);
}

#[sqlx::test(migrations = false)]
async fn failing_commit_writes_nothing(pool: PgPool) {
    setup(&pool).await;
    let result = transaction(&pool)
        .run(async |tx, events| {
            // Customer 99 does not exist; the deferred foreign key fails at COMMIT.
            let order_id = insert_order(tx, 10, 99).await?;
            events.record(order_created(order_id, 10));
            Ok::<_, AppError>(order_id)
        })
        .await;
    let Err(AppError::Outbox(txoutbox_core::Error::Database(sqlx::Error::Database(db)))) = result
    else {
        panic!("expected the commit's foreign key violation, got {result:?}");
    };
    assert_eq!(db.code().as_deref(), Some("23503"));
    assert_eq!(count(&pool, "orders").await, 0);
    assert_eq!(count(&pool, "outbox_event").await, 0);
}

#[sqlx::test(migrations = false)]
async fn unserializable_event_fails_the_unit_of_work_before_commit(pool: PgPool) {
    setup(&pool).await;
    let result = transaction(&pool)
        .run(async |tx, events| {
            place_order(tx, events, 10, 1).await?;
            events.record(Malformed::new(vec![1, 2]));
            Ok::<_, AppError>(())
        })
        .await;
    assert!(
        matches!(
            result,
            Err(AppError::Outbox(txoutbox_core::Error::PayloadNotObject {
                event_type: "Malformed",
                ..
            }))
        ),
        "{result:?}"
    );
    assert_eq!(count(&pool, "orders").await, 0);
    assert_eq!(count(&pool, "outbox_event").await, 0);
}

#[sqlx::test(migrations = false)]
async fn an_over_long_partition_key_fails_the_unit_of_work_and_writes_nothing(pool: PgPool) {
    setup(&pool).await;
    let too_long = "s".repeat(txoutbox_core::MAX_PARTITION_KEY_BYTES + 1);
    let result = transaction(&pool)
        .run(async |tx, events| {
            place_order(tx, events, 10, 1).await?;
            events.record(stock_reserved(&too_long, 1));
            Ok::<_, AppError>(())
        })
        .await;
    let Err(AppError::Outbox(error)) = &result else {
        panic!("expected the outbox to refuse the key, got {result:?}");
    };
    assert!(
        matches!(
            error,
            txoutbox_core::Error::PartitionKeyTooLong {
                event_type: "StockReserved",
                len,
                max: txoutbox_core::MAX_PARTITION_KEY_BYTES,
            } if *len == too_long.len()
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains("partition key"), "{error}");
    assert_eq!(count(&pool, "orders").await, 0);
    assert_eq!(count(&pool, "outbox_event").await, 0);

    // At the limit it is accepted; `insert_events` refuses a longer one
    // built by hand, before sending anything.
    let at_limit = "s".repeat(txoutbox_core::MAX_PARTITION_KEY_BYTES);
    transaction(&pool)
        .run(async |_tx, events| {
            events.record(stock_reserved(&at_limit, 1));
            Ok::<_, AppError>(())
        })
        .await
        .unwrap();
    let mut record = txoutbox_core::OutboxRecord::from_event(&stock_reserved("sku", 1)).unwrap();
    record.partition_key = too_long.clone();
    let mut prepared = txoutbox_core::Events::new();
    prepared.record_prepared(record);
    let mut conn = pool.acquire().await.unwrap();
    let refused = txoutbox_core::insert_events(&mut conn, &prepared).await;
    assert!(
        matches!(&refused, Err(sqlx::Error::InvalidArgument(message)) if message.contains("partition key")),
        "{refused:?}"
    );
    assert_eq!(count(&pool, "outbox_event").await, 1);
}

#[sqlx::test(migrations = false)]
async fn duplicate_event_id_fails_the_insert_and_writes_nothing(pool: PgPool) {
    setup(&pool).await;
    let result = transaction(&pool)
        .run(async |tx, events| {
            let order_id = insert_order(tx, 10, 1).await?;
            let event = order_created(order_id, 10);
            events.record(event.clone());
            events.record(event);
            Ok::<_, AppError>(())
        })
        .await;
    let Err(AppError::Outbox(txoutbox_core::Error::Database(sqlx::Error::Database(db)))) = result
    else {
        panic!("expected a unique violation, got {result:?}");
    };
    assert_eq!(db.code().as_deref(), Some("23505"));
    assert_eq!(count(&pool, "orders").await, 0);
    assert_eq!(count(&pool, "outbox_event").await, 0);
}

#[sqlx::test(migrations = false)]
async fn concurrent_handlers_write_all_their_events(pool: PgPool) {
    setup(&pool).await;
    const HANDLERS: usize = 64;
    const K: usize = 5;
    let tasks: Vec<_> = (0..HANDLERS)
        .map(|i| {
            let pool = pool.clone();
            tokio::spawn(async move {
                transaction(pool)
                    .run(async |tx, events| place_order(tx, events, i as i64, K).await)
                    .await
            })
        })
        .collect();
    let mut order_ids = HashSet::new();
    for task in tasks {
        let (order_id, _) = task.await.unwrap().unwrap();
        order_ids.insert(order_id);
    }
    assert_eq!(order_ids.len(), HANDLERS);
    let rows = outbox_rows(&pool).await;
    assert_eq!(rows.len(), HANDLERS * K);
    let event_ids: HashSet<_> = rows.iter().map(|r| r.event_id).collect();
    assert_eq!(event_ids.len(), HANDLERS * K, "event ids are unique");
    // Every order's events are there, and contiguous in id order per transaction.
    for order_id in order_ids {
        let of_order: Vec<_> = rows
            .iter()
            .filter(|r| {
                r.aggregate_id == order_id.to_string()
                    || r.aggregate_id == format!("sku-{order_id}")
            })
            .collect();
        assert_eq!(of_order.len(), K, "order {order_id}");
    }
}

#[sqlx::test(migrations = false)]
async fn traceparent_is_stored_when_set(pool: PgPool) {
    setup(&pool).await;
    let run = transaction(&pool).run(async |tx, events| place_order(tx, events, 1, 2).await);
    txoutbox_core::trace::with_traceparent(Some(TRACEPARENT.to_owned()), run)
        .await
        .unwrap();
    // Recorded outside any trace context: no traceparent.
    transaction(&pool)
        .run(async |tx, events| place_order(tx, events, 2, 1).await)
        .await
        .unwrap();
    let traceparents: Vec<_> = outbox_rows(&pool)
        .await
        .into_iter()
        .map(|r| r.traceparent)
        .collect();
    assert_eq!(
        traceparents,
        [
            Some(TRACEPARENT.to_owned()),
            Some(TRACEPARENT.to_owned()),
            None
        ]
    );
}

#[sqlx::test(migrations = false)]
async fn runs_on_a_borrowed_connection(pool: PgPool) {
    setup(&pool).await;
    let mut conn = pool.acquire().await.unwrap();
    transaction(&mut *conn)
        .isolation(txoutbox_core::IsolationLevel::RepeatableRead)
        .run(async |tx, events| {
            let level: String = sqlx::query_scalar("SHOW transaction_isolation")
                .fetch_one(&mut **tx)
                .await?;
            assert_eq!(level, "repeatable read");
            place_order(tx, events, 1, 1).await
        })
        .await
        .unwrap();
    // Rolled back on the same connection: the failure does not leak into it.
    let result = transaction(&mut *conn)
        .run(async |tx, events| {
            place_order(tx, events, 2, 1).await?;
            Err::<(), _>(AppError::Rejected("no"))
        })
        .await;
    assert!(result.is_err());
    // A transaction left open would still hold the xid of its writes.
    let no_xid: bool = sqlx::query_scalar("SELECT pg_current_xact_id_if_assigned() IS NULL")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert!(no_xid, "no transaction left open on the connection");
    assert_eq!(count(&pool, "orders").await, 1);
    assert_eq!(count(&pool, "outbox_event").await, 1);
}

#[sqlx::test(migrations = false)]
async fn insert_events_is_one_statement_for_many_rows(pool: PgPool) {
    setup(&pool).await;
    let events: Vec<_> = (0..100).map(|i| order_created(i, i)).collect();
    let mut records = txoutbox_core::Events::new();
    for event in &events {
        records.record_prepared(txoutbox_core::OutboxRecord::from_event(event).unwrap());
    }
    let mut conn = pool.acquire().await.unwrap();
    assert_eq!(
        txoutbox_core::insert_events(&mut conn, &txoutbox_core::Events::new())
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        txoutbox_core::insert_events(&mut conn, &records)
            .await
            .unwrap(),
        100
    );
    let rows = outbox_rows(&pool).await;
    for (row, event) in rows.iter().zip(&events) {
        assert_row_is(row, event);
    }
}

#[sqlx::test(migrations = false)]
async fn inside_an_open_transaction_it_is_a_savepoint(pool: PgPool) {
    setup(&pool).await;
    let mut outer = pool.begin().await.unwrap();
    transaction(&mut *outer)
        .run(async |tx, events| place_order(tx, events, 1, 2).await)
        .await
        .unwrap();
    // The unit of work's commit only released its savepoint: the outer
    // transaction still decides.
    assert_eq!(count(&pool, "outbox_event").await, 0);
    outer.rollback().await.unwrap();
    assert_eq!(count(&pool, "orders").await, 0);
    assert_eq!(count(&pool, "outbox_event").await, 0);
}
