//! `txoutbox_core::testing::record_events`: runs a handler, returns its events,
//! leaves the database unchanged.

mod handler_support;

use handler_support::*;
use sqlx::{PgPool, Postgres, Transaction};
use txoutbox_core::Events;
use txoutbox_core::testing::record_events;

async fn place_order(
    tx: &mut Transaction<'_, Postgres>,
    events: &mut Events,
    amount: i64,
) -> Result<i64, AppError> {
    let order_id = insert_order(tx, amount, 1).await?;
    events.record(order_created(order_id, amount));
    events.record(stock_reserved("sku-9", 2));
    events.record(stock_reserved("sku-8", 1));
    if amount < 0 {
        return Err(AppError::Rejected("negative amount"));
    }
    Ok(order_id)
}

#[sqlx::test(migrations = false)]
async fn returns_output_and_events_and_leaves_the_database_unchanged(pool: PgPool) {
    setup(&pool).await;
    let run = record_events(&pool, async |tx, events| place_order(tx, events, 30).await)
        .await
        .unwrap();
    let order_id = *run.output.as_ref().unwrap();
    let created = run.assert_count::<OrderCreated>(1);
    assert_eq!((created[0].order_id, created[0].amount), (order_id, 30));
    let reserved = run.assert_recorded::<StockReserved>();
    let skus: Vec<_> = reserved.iter().map(|e| e.sku.as_str()).collect();
    assert_eq!(skus, ["sku-9", "sku-8"]);
    assert_eq!(run.records().len(), 3);
    // The serde output, named by its type (the framework adds `event_type`).
    let mut expected = serde_json::to_value(created[0]).unwrap();
    expected["event_type"] = "OrderCreated".into();
    assert_eq!(run.records()[0].payload, expected);
    assert_eq!(count(&pool, "orders").await, 0);
    assert_eq!(count(&pool, "outbox_event").await, 0);
}

#[sqlx::test(migrations = false)]
async fn returns_the_events_of_a_failing_handler_too(pool: PgPool) {
    setup(&pool).await;
    let run = record_events(&pool, async |tx, events| place_order(tx, events, -1).await)
        .await
        .unwrap();
    assert!(matches!(run.output, Err(AppError::Rejected(_))));
    assert_eq!(run.events.len(), 3);
    assert_eq!(count(&pool, "orders").await, 0);
}

#[sqlx::test(migrations = false)]
async fn fails_on_an_event_the_outbox_would_refuse(pool: PgPool) {
    setup(&pool).await;
    let result = record_events(&pool, async |_tx, events| {
        events.record(Malformed::new(vec![]))
    })
    .await;
    assert!(matches!(
        result,
        Err(txoutbox_core::Error::PayloadNotObject { .. })
    ));
    // A duplicate event id only fails when stored: the helper stores before rolling back.
    let result = record_events(&pool, async |_tx, events| {
        let event = order_created(1, 1);
        events.record(event.clone());
        events.record(event);
    })
    .await;
    assert!(
        matches!(result, Err(txoutbox_core::Error::Database(_))),
        "{result:?}"
    );
    assert_eq!(count(&pool, "outbox_event").await, 0);
}

/// The panic is caught rather than expected of the whole test
/// (`should_panic`): a test that panics keeps its database.
#[sqlx::test(migrations = false)]
async fn assertion_helpers_explain_what_was_recorded(pool: PgPool) {
    setup(&pool).await;
    let run = record_events(&pool, async |tx, events| place_order(tx, events, 1).await)
        .await
        .unwrap();
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run.assert_count::<OrderCreated>(2);
    }))
    .expect_err("one OrderCreated was recorded, not two");
    let message = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or_default();
    assert!(
        message.contains(
            "expected 2 `OrderCreated` event(s), recorded: \
             [\"OrderCreated\", \"StockReserved\", \"StockReserved\"]"
        ),
        "{message}"
    );
}
