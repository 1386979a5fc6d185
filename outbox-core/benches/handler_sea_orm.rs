//! `#[outbox_handler]` on SeaORM's `&DatabaseTransaction` against what a
//! SeaORM user writes by hand for the same command: `db.begin()`, the domain
//! insert, the outbox rows through an `outbox_event` entity
//! (`insert_many`, SeaORM's own multi-row insert), `commit()`; for 0, 1 and
//! 10 events per command. The sqlx path's `#[outbox_handler]` runs in the
//! same rounds, so the SeaORM path's cost shows next to it. All variants
//! run interleaved on one connection (order rotating every iteration).
//!
//! Needs PostgreSQL at `DATABASE_URL` (a scratch database is created and
//! dropped). Run:
//! `cargo bench -p txoutbox-core --features sea-orm --bench handler_sea_orm`.
//! `BENCH_ITERATIONS` (default 1000) sets the samples per variant, size and
//! round; `BENCH_ROUNDS` (default 5) the rounds, whose ratios are summarized
//! as min / median / max.

use std::time::{Duration, Instant};

use schemars::JsonSchema;
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr, EntityTrait, Set,
    SqlxPostgresConnector, Statement, TransactionTrait,
};
use serde::Serialize;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgPool, Postgres, Transaction};
use txoutbox_core::{DomainEvent, Events, outbox_handler};
use uuid::Uuid;

#[derive(Serialize, JsonSchema, DomainEvent)]
#[event(topic = "order.events", aggregate = "Order")]
struct OrderLineAdded {
    event_id: Uuid,
    #[partition_key]
    order_id: i64,
    line: usize,
    sku: String,
    quantity: i32,
}

fn line(order_id: i64, line: usize) -> OrderLineAdded {
    OrderLineAdded {
        event_id: Uuid::new_v4(),
        order_id,
        line,
        sku: format!("sku-{line}"),
        quantity: 1,
    }
}

const INSERT_ORDER: &str = "INSERT INTO bench_orders (amount) VALUES ($1) RETURNING id";

/// The outbox table as a SeaORM user maps it for a hand-written outbox.
mod outbox_event {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
    #[sea_orm(table_name = "outbox_event")]
    pub(crate) struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
        pub event_id: Uuid,
        pub aggregate_type: String,
        pub aggregate_id: String,
        pub event_type: String,
        pub payload: Json,
        pub topic: String,
        pub partition_key: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub(crate) enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

async fn insert_order<C: ConnectionTrait>(conn: &C, amount: i64) -> Result<i64, DbErr> {
    let row = conn
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            INSERT_ORDER,
            [amount.into()],
        ))
        .await?
        .ok_or(DbErr::RecordNotInserted)?;
    row.try_get_by_index(0)
}

/// The framework's way, on SeaORM.
#[outbox_handler]
async fn place_order_sea_orm(
    tx: &DatabaseTransaction,
    events: &mut Events,
    amount: i64,
    lines: usize,
) -> Result<i64, DbErr> {
    let order_id = insert_order(tx, amount).await?;
    for i in 0..lines {
        events.record(line(order_id, i));
    }
    Ok(order_id)
}

/// The same command by hand on SeaORM: an entity and `insert_many`.
async fn place_order_sea_orm_by_hand(
    db: &DatabaseConnection,
    amount: i64,
    lines: usize,
) -> Result<i64, DbErr> {
    let txn = db.begin().await?;
    let order_id = insert_order(&txn, amount).await?;
    if lines > 0 {
        let rows = (0..lines).map(|i| {
            let event = line(order_id, i);
            outbox_event::ActiveModel {
                event_id: Set(event.event_id),
                aggregate_type: Set(OrderLineAdded::AGGREGATE_TYPE.to_owned()),
                aggregate_id: Set(event.aggregate_id()),
                event_type: Set(OrderLineAdded::EVENT_TYPE.to_owned()),
                payload: Set(serde_json::to_value(&event).expect("serializable")),
                topic: Set(OrderLineAdded::TOPIC.to_owned()),
                partition_key: Set(event.partition_key()),
                ..Default::default()
            }
        });
        outbox_event::Entity::insert_many(rows)
            .exec_without_returning(&txn)
            .await?;
    }
    txn.commit().await?;
    Ok(order_id)
}

/// The framework's way on sqlx, for the figure next to it.
#[outbox_handler]
async fn place_order_sqlx(
    tx: &mut Transaction<'_, Postgres>,
    events: &mut Events,
    amount: i64,
    lines: usize,
) -> Result<i64, txoutbox_core::Error> {
    let order_id: i64 = sqlx::query_scalar(INSERT_ORDER)
        .bind(amount)
        .fetch_one(&mut **tx)
        .await?;
    for i in 0..lines {
        events.record(line(order_id, i));
    }
    Ok(order_id)
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let iterations = env_or("BENCH_ITERATIONS", 1000);
    let rounds = env_or("BENCH_ROUNDS", 5).max(1);
    let database = format!("outbox_bench_handler_sea_orm_{}", std::process::id());
    let admin_options: PgConnectOptions = url.parse()?;
    let mut admin = sqlx::PgConnection::connect_with(&admin_options).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {database}")))
        .execute(&mut admin)
        .await?;
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(admin_options.clone().database(&database))
        .await?;
    for migration in [
        include_str!("../../outbox-runtime/migrations/0001_outbox_inbox_base.sql"),
        include_str!("../../outbox-runtime/migrations/0007_scheduled_delivery.sql"),
        include_str!("../../outbox-runtime/migrations/0014_event_headers.sql"),
    ] {
        sqlx::raw_sql(migration).execute(&pool).await?;
    }
    sqlx::raw_sql(
        "CREATE TABLE bench_orders (
             id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, amount bigint NOT NULL)",
    )
    .execute(&pool)
    .await?;
    // SeaORM on the very same one-connection pool.
    let db = SqlxPostgresConnector::from_sqlx_postgres_pool(pool.clone());

    println!(
        "#[outbox_handler] on SeaORM vs a hand-written SeaORM transaction (and the sqlx \
         handler), {rounds} rounds of {iterations} samples each, times in µs (p50), commit {}",
        txoutbox_testkit::measured_commit()
    );
    println!(
        "{:<5} {:>6} | {:>10} {:>10} {:>10} | {:>9} {:>9}",
        "round", "events", "sea hand", "sea macro", "sqlx macro", "sea ratio", "vs sqlx"
    );
    let mut summary: Vec<(usize, Vec<f64>, Vec<f64>)> = Vec::new();
    for round in 1..=rounds {
        for lines in [0usize, 1, 10] {
            let [mut hand, mut sea, mut sqlx_macro] =
                measure(&db, &pool, lines, iterations).await?;
            let (hand, sea, sqlx_macro) =
                (median(&mut hand), median(&mut sea), median(&mut sqlx_macro));
            let us = |d: Duration| d.as_secs_f64() * 1e6;
            let ratio = sea.as_secs_f64() / hand.as_secs_f64();
            let vs_sqlx = sea.as_secs_f64() / sqlx_macro.as_secs_f64();
            println!(
                "{round:<5} {lines:>6} | {:>10.0} {:>10.0} {:>10.0} | {ratio:>9.3} {vs_sqlx:>9.3}",
                us(hand),
                us(sea),
                us(sqlx_macro)
            );
            match summary.iter_mut().find(|(of, ..)| *of == lines) {
                Some((_, ratios, versus)) => {
                    ratios.push(ratio);
                    versus.push(vs_sqlx);
                }
                None => summary.push((lines, vec![ratio], vec![vs_sqlx])),
            }
        }
    }
    let spread = |mut seen: Vec<f64>| {
        seen.sort_by(f64::total_cmp);
        format!(
            "{:.3} / {:.3} / {:.3}",
            seen[0],
            seen[seen.len() / 2],
            seen[seen.len() - 1]
        )
    };
    println!(
        "\n| events / command | SeaORM macro / SeaORM by hand, min / median / max | SeaORM macro / sqlx macro |"
    );
    println!("|---:|---|---|");
    for (lines, ratios, versus) in summary {
        println!("| {lines} | {} | {} |", spread(ratios), spread(versus));
    }

    db.close().await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE {database}")))
        .execute(&mut admin)
        .await?;
    Ok(())
}

/// Warms up, then times the three variants in rotating order; returns
/// (SeaORM by hand, SeaORM handler, sqlx handler).
async fn measure(
    db: &DatabaseConnection,
    pool: &PgPool,
    lines: usize,
    iterations: usize,
) -> Result<[Vec<Duration>; 3], Box<dyn std::error::Error>> {
    for i in 0..200 {
        place_order_sea_orm_by_hand(db, i, lines).await?;
        place_order_sea_orm(db, i, lines).await?;
        place_order_sqlx(pool, i, lines).await?;
    }
    let mut samples: [Vec<Duration>; 3] = Default::default();
    for i in 0..iterations {
        let amount = i as i64;
        for k in 0..3 {
            let variant = (i + k) % 3;
            let start = Instant::now();
            match variant {
                0 => drop(place_order_sea_orm_by_hand(db, amount, lines).await?),
                1 => drop(place_order_sea_orm(db, amount, lines).await?),
                _ => drop(place_order_sqlx(pool, amount, lines).await?),
            }
            samples[variant].push(start.elapsed());
        }
    }
    Ok(samples)
}
