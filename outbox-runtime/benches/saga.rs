//! Saga steps per second: the framework's step (the code `#[saga]`
//! generates: load and lock the saga row, deserialize, run the handler,
//! serialize, write the row back with its version, insert the messages it
//! sent) against a hand-written sqlx transaction doing the same reads and
//! writes, in the same run, round after round.
//!
//! ```text
//! scripts/services.sh up   # only PostgreSQL is used
//! cargo bench -p txoutbox-runtime --bench saga
//! SAGA_BENCH_STEPS=20000 SAGA_BENCH_SAGAS=1000 SAGA_BENCH_WORKERS=4 SAGA_BENCH_ROUNDS=5 \
//!     cargo bench -p txoutbox-runtime --bench saga     # the defaults
//! ```
//!
//! Each step is one transaction, as a consumer runs it for one message: the
//! dedup row (`processed_event`, the same statement on both sides), the
//! saga's row (`SELECT ... FOR UPDATE`, then `UPDATE`), one outgoing command
//! in `outbox_event`, commit. `SAGA_BENCH_WORKERS` tasks step sagas
//! concurrently, each over its own sagas (as consumers do over partitions).
//! Both sides run on the same database; which goes first alternates by round.
#![allow(missing_docs)]

mod charts;
mod support;

use std::time::Instant;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::{PgPool, Postgres, Transaction};
use txoutbox_core::{DomainEvent, Events, OutboxRecord};
use txoutbox_runtime::consumer::{EventHandler, EventMeta, HandlerError};
use txoutbox_runtime::saga::{SagaContext, saga};
use uuid::Uuid;

const GROUP: &str = "bench-saga";

/// Starts a saga.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, DomainEvent)]
#[event(topic = "bench.saga", event_type = "Begin", aggregate = "Order")]
pub struct Begin {
    pub event_id: Uuid,
    #[partition_key]
    pub order_id: Uuid,
}

/// One step of a saga (a participant's reply).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, DomainEvent)]
#[event(topic = "bench.saga", event_type = "Reply", aggregate = "Order")]
pub struct Reply {
    pub event_id: Uuid,
    #[partition_key]
    pub order_id: Uuid,
    pub amount: i64,
}

/// The command each step sends.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, DomainEvent)]
#[event(topic = "bench.commands", event_type = "Next", aggregate = "Order")]
pub struct Next {
    pub event_id: Uuid,
    #[partition_key]
    pub order_id: Uuid,
    pub step: i64,
    pub total: i64,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Fulfilment {
    order_id: Uuid,
    steps: i64,
    total: i64,
    note: String,
}

#[saga(
    name = "bench_fulfilment",
    id = Uuid,
    correlate = order_id,
    starts_with(Begin),
    handles(Reply)
)]
impl Fulfilment {
    async fn on_begin(event: Begin) -> Result<Self, HandlerError> {
        Ok(Self::new(event.order_id))
    }

    async fn on_reply(
        &mut self,
        event: Reply,
        ctx: &mut SagaContext<'_>,
    ) -> Result<(), HandlerError> {
        self.advance(event.amount);
        ctx.send(self.next());
        Ok(())
    }
}

impl Fulfilment {
    fn new(order_id: Uuid) -> Self {
        Self {
            order_id,
            steps: 0,
            total: 0,
            note: "x".repeat(100),
        }
    }

    fn advance(&mut self, amount: i64) {
        self.steps += 1;
        self.total += amount;
    }

    fn next(&self) -> Next {
        Next {
            event_id: Uuid::now_v7(),
            order_id: self.order_id,
            step: self.steps,
            total: self.total,
        }
    }
}

// The consumer handlers `#[saga]` generated (`Fulfilment::on_begin_handler()`
// and `on_reply_handler()`) are called here as the consumer calls them,
// without Kafka in the way.

/// The dedup row, as the dedup consumer writes it (both sides).
async fn dedup(tx: &mut Transaction<'static, Postgres>, event_id: Uuid) -> bool {
    sqlx::query(
        "INSERT INTO processed_event (consumer_group, event_id) VALUES ($1, $2)
         ON CONFLICT DO NOTHING",
    )
    .bind(GROUP)
    .bind(event_id)
    .execute(&mut **tx)
    .await
    .unwrap()
    .rows_affected()
        == 1
}

/// One step through the framework, as the consumer runs it.
async fn framework_step(pool: &PgPool, reply: Reply) {
    let meta = EventMeta::new(reply.event_id, Reply::EVENT_TYPE, Reply::TOPIC);
    let mut tx = pool.begin().await.unwrap();
    assert!(dedup(&mut tx, reply.event_id).await);
    let mut events = Events::new();
    Fulfilment::on_reply_handler()
        .handle(&mut tx, reply, &meta, &mut events)
        .await
        .unwrap();
    let after_commit = events.write(&mut tx).await.unwrap();
    tx.commit().await.unwrap();
    after_commit.committed_on(pool);
}

/// The same step written by hand with sqlx: the same reads and writes.
async fn hand_step(pool: &PgPool, reply: Reply) {
    let mut tx = pool.begin().await.unwrap();
    assert!(dedup(&mut tx, reply.event_id).await);
    let (state, version): (serde_json::Value, i64) = sqlx::query_as(
        "SELECT state, version FROM saga_state WHERE saga_type = $1 AND saga_id = $2 FOR UPDATE",
    )
    .bind("hand_fulfilment")
    .bind(reply.order_id.to_string())
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    let mut saga: Fulfilment = serde_json::from_value(state).unwrap();
    saga.advance(reply.amount);
    let record = OutboxRecord::from_event(&saga.next()).unwrap();
    sqlx::query(
        "UPDATE saga_state SET state = $3, version = version + 1, updated_at = now(),
                last_message_type = $4, last_event_id = $5
         WHERE saga_type = $1 AND saga_id = $2 AND version = $6",
    )
    .bind("hand_fulfilment")
    .bind(reply.order_id.to_string())
    .bind(serde_json::to_value(&saga).unwrap())
    .bind(Reply::EVENT_TYPE)
    .bind(reply.event_id)
    .bind(version)
    .execute(&mut *tx)
    .await
    .unwrap();
    let mut events = Events::new();
    events.record_prepared(record);
    txoutbox_core::insert_events(&mut tx, &events)
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

#[derive(Clone, Copy, PartialEq)]
enum Side {
    Framework,
    Hand,
}

/// Starts `sagas` sagas on `side` (not measured).
async fn start(pool: &PgPool, side: Side, sagas: &[Uuid]) {
    for &order_id in sagas {
        match side {
            Side::Framework => {
                let begin = Begin {
                    event_id: Uuid::now_v7(),
                    order_id,
                };
                let meta = EventMeta::new(begin.event_id, Begin::EVENT_TYPE, Begin::TOPIC);
                let mut tx = pool.begin().await.unwrap();
                let mut events = Events::new();
                Fulfilment::on_begin_handler()
                    .handle(&mut tx, begin, &meta, &mut events)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
            }
            Side::Hand => {
                sqlx::query(
                    "INSERT INTO saga_state (saga_type, saga_id, state) VALUES ('hand_fulfilment', $1, $2)",
                )
                .bind(order_id.to_string())
                .bind(serde_json::to_value(Fulfilment::new(order_id)).unwrap())
                .execute(pool)
                .await
                .unwrap();
            }
        }
    }
}

/// Runs `steps` steps over `sagas` with `workers` tasks; steps per second.
async fn run(pool: &PgPool, side: Side, sagas: &[Uuid], steps: usize, workers: usize) -> f64 {
    let per_worker = steps / workers;
    let began = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..workers {
        let pool = pool.clone();
        // Worker w steps sagas w, w + workers, ...: no two workers share a saga.
        let own: Vec<Uuid> = sagas
            .iter()
            .skip(worker)
            .step_by(workers)
            .copied()
            .collect();
        tasks.push(tokio::spawn(async move {
            for i in 0..per_worker {
                let reply = Reply {
                    event_id: Uuid::now_v7(),
                    order_id: own[i % own.len()],
                    amount: i as i64,
                };
                match side {
                    Side::Framework => framework_step(&pool, reply).await,
                    Side::Hand => hand_step(&pool, reply).await,
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    (per_worker * workers) as f64 / began.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    let steps = support::env_usize("SAGA_BENCH_STEPS", 20_000);
    let saga_count = support::env_usize("SAGA_BENCH_SAGAS", 1_000);
    let workers = support::env_usize("SAGA_BENCH_WORKERS", 4);
    let rounds = support::env_usize("SAGA_BENCH_ROUNDS", 5);
    let (pool, db) = support::scratch_database("outbox_bench_saga", workers as u32 + 2).await;
    println!(
        "saga steps: {steps} steps per side per round over {saga_count} sagas, {workers} workers, \
         {rounds} rounds, commit {}",
        charts::commit()
    );
    let framework_sagas: Vec<Uuid> = (0..saga_count).map(|_| Uuid::now_v7()).collect();
    let hand_sagas: Vec<Uuid> = (0..saga_count).map(|_| Uuid::now_v7()).collect();
    start(&pool, Side::Framework, &framework_sagas).await;
    start(&pool, Side::Hand, &hand_sagas).await;
    sqlx::query("ANALYZE").execute(&pool).await.unwrap();
    // Warm-up of both paths (connections, plans).
    run(
        &pool,
        Side::Framework,
        &framework_sagas,
        workers * 50,
        workers,
    )
    .await;
    run(&pool, Side::Hand, &hand_sagas, workers * 50, workers).await;

    let (mut ours, mut theirs, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let (framework, hand) = if round % 2 == 0 {
            let f = run(&pool, Side::Framework, &framework_sagas, steps, workers).await;
            (f, run(&pool, Side::Hand, &hand_sagas, steps, workers).await)
        } else {
            let h = run(&pool, Side::Hand, &hand_sagas, steps, workers).await;
            (
                run(&pool, Side::Framework, &framework_sagas, steps, workers).await,
                h,
            )
        };
        println!(
            "round {}: framework {framework:.0} steps/s, hand-written {hand:.0} steps/s, ratio {:.3}",
            round + 1,
            framework / hand
        );
        ours.push(framework);
        theirs.push(hand);
        ratios.push(framework / hand);
        // Keep the tables from growing without bound between rounds.
        sqlx::query("DELETE FROM outbox_event")
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query("VACUUM ANALYZE outbox_event, saga_state, processed_event")
            .execute(&pool)
            .await
            .unwrap();
    }
    let (of, mf, xf) = support::spread(&ours);
    let (oh, mh, xh) = support::spread(&theirs);
    let (or, mr, xr) = support::spread(&ratios);
    println!("framework   steps/s min / median / max: {of:.0} / {mf:.0} / {xf:.0}");
    println!("hand-written steps/s min / median / max: {oh:.0} / {mh:.0} / {xh:.0}");
    println!("ratio framework / hand-written min / median / max: {or:.3} / {mr:.3} / {xr:.3}");
    let met = ratios.iter().filter(|r| **r >= 0.90).count();
    println!(
        "target (within 10%: ratio >= 0.90): {met} of {rounds} rounds; {}",
        if mr >= 0.90 {
            "met at the median"
        } else {
            "NOT met at the median"
        }
    );
    let counted: i64 = sqlx::query_scalar(
        "SELECT (sum(version) - count(*))::int8 FROM saga_state WHERE saga_type = 'bench_fulfilment'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        counted as usize,
        workers * 50 + rounds * (steps / workers) * workers,
        "every framework step applied once"
    );
    pool.close().await;
    support::drop_database(&db).await;
}
