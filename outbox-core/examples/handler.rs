//! A command handler with `#[outbox_handler]`, end to end.
//!
//! Run with PostgreSQL at `DATABASE_URL`:
//! `cargo run -p txoutbox-core --example handler`.
//! It works in a scratch database that it creates and drops.

use schemars::JsonSchema;
use serde::Serialize;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgPool, Postgres, Transaction};
use txoutbox_core::{DomainEvent, Events, outbox_handler};
use uuid::Uuid;

/// The fact other services learn about: topic, aggregate and Kafka key are
/// declared with `#[derive(DomainEvent)]` (`docs/attributes.md`).
#[derive(Debug, Serialize, JsonSchema, DomainEvent)]
#[event(topic = "order.events", aggregate = "Order")]
struct OrderCreated {
    event_id: Uuid,
    #[partition_key]
    order_id: i64,
    amount: i64,
}

/// The application's error: it only needs `From<txoutbox_core::Error>`.
#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Outbox(#[from] txoutbox_core::Error),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
    #[error("amount must be positive")]
    InvalidAmount,
}

struct CreateOrder {
    amount: i64,
}

/// Creates an order and records `OrderCreated`, atomically.
#[outbox_handler]
async fn create_order(
    tx: &mut Transaction<'_, Postgres>,
    events: &mut Events,
    cmd: CreateOrder,
) -> Result<i64, AppError> {
    if cmd.amount <= 0 {
        return Err(AppError::InvalidAmount); // nothing is written
    }
    let order_id: i64 = sqlx::query_scalar("INSERT INTO orders (amount) VALUES ($1) RETURNING id")
        .bind(cmd.amount)
        .fetch_one(&mut **tx)
        .await?;
    events.record(OrderCreated {
        event_id: Uuid::new_v4(),
        order_id,
        amount: cmd.amount,
    });
    Ok(order_id)
}

async fn demo(pool: &PgPool) -> Result<(), AppError> {
    // The caller passes a pool (or `&mut PgConnection`) instead of tx + events.
    let order_id = create_order(pool, CreateOrder { amount: 42 }).await?;
    println!("created order {order_id}");

    let rejected = create_order(pool, CreateOrder { amount: 0 }).await;
    println!("rejected: {rejected:?}");

    let rows: Vec<(String, String, serde_json::Value)> =
        sqlx::query_as("SELECT event_type, partition_key, payload FROM outbox_event ORDER BY id")
            .fetch_all(pool)
            .await?;
    for (event_type, key, payload) in &rows {
        println!("outbox: {event_type} key={key} payload={payload}");
    }
    assert_eq!(rows.len(), 1, "the rejected command wrote nothing");

    // In tests: run the handler body in a transaction that is rolled back.
    let run = txoutbox_core::testing::record_events(pool, async |tx, events| {
        create_order_in_tx(tx, events, CreateOrder { amount: 7 }).await
    })
    .await?;
    let created = run.assert_count::<OrderCreated>(1);
    println!("the test run recorded {:?} and left no row", created[0]);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let options: PgConnectOptions = url.parse()?;
    let database = format!("outbox_example_handler_{}", std::process::id());
    let mut admin = sqlx::PgConnection::connect_with(&options).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {database}")))
        .execute(&mut admin)
        .await?;

    let pool = PgPoolOptions::new()
        .connect_with(options.database(&database))
        .await?;
    // In a service: `txoutbox_runtime::migrations::run(&pool)`; the SQL file is
    // used directly here to keep this example free of the Kafka runtime.
    // The outbox tables as the runtime's migrations make them: the base,
    // scheduled delivery, and the `headers` column every insert writes.
    for migration in [
        include_str!("../../outbox-runtime/migrations/0001_outbox_inbox_base.sql"),
        include_str!("../../outbox-runtime/migrations/0007_scheduled_delivery.sql"),
        include_str!("../../outbox-runtime/migrations/0014_event_headers.sql"),
    ] {
        sqlx::raw_sql(migration).execute(&pool).await?;
    }
    sqlx::raw_sql("CREATE TABLE orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, amount bigint NOT NULL)")
        .execute(&pool)
        .await?;

    let outcome = demo(&pool).await;
    pool.close().await;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE {database}")))
        .execute(&mut admin)
        .await?;
    outcome?;
    Ok(())
}
