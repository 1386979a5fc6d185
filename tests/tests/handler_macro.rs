//! `#[outbox_handler]` end to end: free functions, methods, generics,
//! arguments, and the generated `*_in_tx` function with the testing helper.

mod handler_support;

use std::sync::atomic::{AtomicU32, Ordering};

use handler_support::*;
use sqlx::{PgConnection, PgPool, Postgres, Transaction};
use txoutbox_core::testing::record_events;
use txoutbox_core::{DomainEvent, Events, outbox_handler};

/// The command.
#[derive(Debug, Clone)]
pub(crate) struct PlaceOrder {
    /// Order total.
    pub amount: i64,
    /// Must exist (deferred foreign key).
    pub customer_id: i64,
    /// One `StockReserved` per sku.
    pub skus: Vec<String>,
}

/// Places an order: one row, one `OrderCreated`, one `StockReserved` per sku.
#[outbox_handler]
pub(crate) async fn place_order(
    tx: &mut Transaction<'_, Postgres>,
    events: &mut Events,
    cmd: PlaceOrder,
) -> Result<i64, AppError> {
    if cmd.amount <= 0 {
        return Err(AppError::Rejected("amount must be positive"));
    }
    let order_id = insert_order(tx, cmd.amount, cmd.customer_id).await?;
    events.record(order_created(order_id, cmd.amount));
    for sku in &cmd.skus {
        events.record(stock_reserved(sku, 1));
    }
    Ok(order_id)
}

fn cmd(amount: i64, skus: &[&str]) -> PlaceOrder {
    PlaceOrder {
        amount,
        customer_id: 1,
        skus: skus.iter().map(|s| s.to_string()).collect(),
    }
}

#[sqlx::test(migrations = false)]
async fn free_function_commits_rows_and_events(pool: PgPool) {
    setup(&pool).await;
    let order_id = place_order(&pool, cmd(10, &["a", "b"])).await.unwrap();
    let rows = outbox_rows(&pool).await;
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0].event_type, OrderCreated::EVENT_TYPE);
    assert_eq!(rows[0].aggregate_id, order_id.to_string());
    assert_eq!(rows[1].partition_key, "a");
    assert_eq!(rows[2].partition_key, "b");
    assert_eq!(count(&pool, "orders").await, 1);
}

#[sqlx::test(migrations = false)]
async fn free_function_rolls_back_on_error(pool: PgPool) {
    setup(&pool).await;
    let result = place_order(&pool, cmd(0, &["a"])).await;
    assert!(matches!(result, Err(AppError::Rejected(_))));
    // Failing at COMMIT (unknown customer, deferred foreign key).
    let result = place_order(
        &pool,
        PlaceOrder {
            customer_id: 99,
            ..cmd(5, &["a"])
        },
    )
    .await;
    assert!(matches!(result, Err(AppError::Outbox(_))), "{result:?}");
    assert_eq!(count(&pool, "orders").await, 0);
    assert_eq!(count(&pool, "outbox_event").await, 0);
}

#[sqlx::test(migrations = false)]
async fn generated_handlers_are_send(pool: PgPool) {
    setup(&pool).await;
    let tasks: Vec<_> = (1..=8)
        .map(|i| tokio::spawn(place_order(pool.clone(), cmd(i, &["x"]))))
        .collect();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert_eq!(count(&pool, "outbox_event").await, 16);
}

#[sqlx::test(migrations = false)]
async fn in_tx_function_with_the_testing_helper(pool: PgPool) {
    setup(&pool).await;
    let run = record_events(&pool, async |tx, events| {
        place_order_in_tx(tx, events, cmd(7, &["a", "b"])).await
    })
    .await
    .unwrap();
    let order_id = *run.output.as_ref().unwrap();
    assert_eq!(run.assert_count::<OrderCreated>(1)[0].order_id, order_id);
    assert_eq!(run.assert_count::<StockReserved>(2)[1].sku, "b");
    assert_eq!(count(&pool, "orders").await, 0);
    assert_eq!(count(&pool, "outbox_event").await, 0);
}

/// A service with its handlers as methods.
struct OrderService {
    calls: AtomicU32,
    default_sku: String,
}

impl OrderService {
    /// `&self` method, serializable with retries.
    #[outbox_handler(isolation = "serializable", retries = 2)]
    async fn reserve(
        &self,
        events: &mut Events,
        quantity: i32,
        tx: &mut Transaction<'_, Postgres>,
    ) -> Result<String, AppError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let level: String = sqlx::query_scalar("SHOW transaction_isolation")
            .fetch_one(&mut **tx)
            .await?;
        events.record(stock_reserved(&self.default_sku, quantity));
        Ok(level)
    }

    /// `&mut self` method on a bare connection parameter.
    #[outbox_handler]
    async fn renumber(
        &mut self,
        conn: &mut PgConnection,
        events: &mut Events,
        sku: String,
    ) -> Result<(), AppError> {
        let order_id = insert_order(conn, 1, 1).await?;
        self.default_sku = sku;
        events.record(stock_reserved(&self.default_sku, order_id as i32));
        Ok(())
    }
}

#[sqlx::test(migrations = false)]
async fn methods_with_arguments(pool: PgPool) {
    setup(&pool).await;
    let mut service = OrderService {
        calls: AtomicU32::new(0),
        default_sku: "sku-1".into(),
    };
    let level = service.reserve(&pool, 3).await.unwrap();
    assert_eq!(level, "serializable");
    let mut conn = pool.acquire().await.unwrap();
    service.renumber(&mut *conn, "sku-2".into()).await.unwrap();
    assert_eq!(service.default_sku, "sku-2");
    let keys: Vec<_> = outbox_rows(&pool)
        .await
        .into_iter()
        .map(|r| r.partition_key)
        .collect();
    assert_eq!(keys, ["sku-1", "sku-2"]);
}

#[sqlx::test(migrations = false)]
async fn method_retries_on_a_serialization_failure(pool: PgPool) {
    setup(&pool).await;

    struct Flaky {
        attempts: AtomicU32,
    }
    impl Flaky {
        #[outbox_handler(retries = 3)]
        async fn run(
            &self,
            tx: &mut Transaction<'_, Postgres>,
            events: &mut Events,
            fail_times: u32,
        ) -> Result<u32, AppError> {
            let attempt = self.attempts.fetch_add(1, Ordering::SeqCst) + 1;
            events.record(order_created(attempt.into(), 0));
            if attempt <= fail_times {
                sqlx::raw_sql("DO $$ BEGIN RAISE EXCEPTION 'x' USING ERRCODE = '40001'; END $$")
                    .execute(&mut **tx)
                    .await?;
            }
            Ok(attempt)
        }
    }
    let flaky = Flaky {
        attempts: AtomicU32::new(0),
    };
    assert_eq!(flaky.run(&pool, 2).await.unwrap(), 3);
    let rows = outbox_rows(&pool).await;
    assert_eq!(rows.len(), 1, "only the successful attempt's event");
    assert_eq!(rows[0].aggregate_id, "3");
}

/// Generic over the event it records, with a where clause and a const parameter.
#[outbox_handler]
async fn record_all<E, const N: usize>(
    events: &mut Events,
    tx: &mut Transaction<'_, Postgres>,
    batch: [E; N],
) -> Result<usize, AppError>
where
    E: DomainEvent,
{
    insert_order(tx, N as i64, 1).await?;
    for event in batch {
        events.record(event);
    }
    Ok(N)
}

#[sqlx::test(migrations = false)]
async fn generic_function(pool: PgPool) {
    setup(&pool).await;
    let n = record_all(&pool, [stock_reserved("a", 1), stock_reserved("b", 2)])
        .await
        .unwrap();
    assert_eq!(n, 2);
    let n = record_all::<OrderCreated, 1>(&pool, [order_created(1, 1)])
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(count(&pool, "outbox_event").await, 3);
}

#[sqlx::test(migrations = false)]
async fn traceparent_flows_through_the_macro(pool: PgPool) {
    setup(&pool).await;
    txoutbox_core::trace::with_traceparent(
        Some(TRACEPARENT.to_owned()),
        place_order(&pool, cmd(1, &[])),
    )
    .await
    .unwrap();
    assert_eq!(
        outbox_rows(&pool).await[0].traceparent.as_deref(),
        Some(TRACEPARENT)
    );
}
