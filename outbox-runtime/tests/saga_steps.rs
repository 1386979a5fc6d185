//! Saga steps against real PostgreSQL (and, for concurrency, the real broker
//! with two consumers): a step applies once, concurrent steps of one saga are
//! applied one after the other (no two on the same version), two starts of
//! one saga make one saga, compensations go out in reverse order exactly
//! once, and a finished or unknown saga ignores its messages.

#![allow(missing_docs)]

mod consumer_support;

use std::time::Duration;

use consumer_support::*;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::{PgPool, Postgres, Transaction};
use txoutbox_core::{DomainEvent, Events};
use txoutbox_runtime::consumer::{Consumer, EventMeta, HandlerError};
use txoutbox_runtime::saga::__private::Step;
use txoutbox_runtime::saga::{Saga, SagaContext};
use uuid::Uuid;

const TOPIC: &str = "saga-test.tally";

/// Starts a tally.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, DomainEvent)]
#[event(topic = "saga-test.tally", event_type = "Open", aggregate = "Tally")]
pub struct Open {
    pub event_id: Uuid,
    #[partition_key]
    pub saga_id: Uuid,
}

/// Adds to a tally. Keyed by `lane`, not by the saga, so one saga's messages
/// spread over partitions (and consumers).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, DomainEvent)]
#[event(topic = "saga-test.tally", event_type = "Add", aggregate = "Tally")]
pub struct Add {
    pub event_id: Uuid,
    pub saga_id: Uuid,
    #[partition_key]
    pub lane: String,
    pub amount: i64,
}

/// A step that registers a compensation (`Undo` of `step_no`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, DomainEvent)]
#[event(topic = "saga-test.tally", event_type = "Reserve", aggregate = "Tally")]
pub struct Reserve {
    pub event_id: Uuid,
    #[partition_key]
    pub saga_id: Uuid,
    pub step_no: i64,
}

/// Makes the saga compensate.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, DomainEvent)]
#[event(topic = "saga-test.tally", event_type = "Fail", aggregate = "Tally")]
pub struct Fail {
    pub event_id: Uuid,
    #[partition_key]
    pub saga_id: Uuid,
}

/// Sent by each applied `Add`: the version it was applied on.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, DomainEvent)]
#[event(topic = "saga-test.added", event_type = "Added", aggregate = "Tally")]
pub struct Added {
    pub event_id: Uuid,
    #[partition_key]
    pub saga_id: Uuid,
    pub on_version: i64,
    pub total: i64,
}

/// The compensation of a `Reserve`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, DomainEvent)]
#[event(topic = "saga-test.undo", event_type = "Undo", aggregate = "Tally")]
pub struct Undo {
    pub event_id: Uuid,
    #[partition_key]
    pub saga_id: Uuid,
    pub step_no: i64,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Tally {
    total: i64,
    adds: i64,
}

impl Tally {
    async fn on_open(_event: Open, _ctx: &mut SagaContext<'_>) -> Result<Self, HandlerError> {
        Ok(Self { total: 0, adds: 0 })
    }

    async fn on_add(&mut self, event: Add, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        self.total += event.amount;
        self.adds += 1;
        // A write of the service's own in the step's transaction.
        sqlx::query("INSERT INTO tally_effect (event_id) VALUES ($1)")
            .bind(event.event_id)
            .execute(&mut **ctx.tx())
            .await?;
        let saga_id = event.saga_id;
        let on_version = ctx.version();
        ctx.send(Added {
            event_id: Uuid::new_v4(),
            saga_id,
            on_version,
            total: self.total,
        });
        Ok(())
    }

    async fn on_reserve(
        &mut self,
        event: Reserve,
        ctx: &mut SagaContext<'_>,
    ) -> Result<(), HandlerError> {
        ctx.on_compensate(Undo {
            event_id: Uuid::new_v4(),
            saga_id: event.saga_id,
            step_no: event.step_no,
        });
        Ok(())
    }

    async fn on_fail(
        &mut self,
        _event: Fail,
        ctx: &mut SagaContext<'_>,
    ) -> Result<(), HandlerError> {
        ctx.compensate();
        Ok(())
    }
}

// What `#[saga]` generates, written out: the runtime is tested on its own here.
macro_rules! step_handler {
    ($handler:ident, $message:ty, $method:ident, start) => {
        step_handler!(@impl $handler, $message, |step, event| {
            if let Some(ctx) = step.starting() {
                let state = Tally::$method(event, ctx).await?;
                step.started(state);
            }
        });
    };
    ($handler:ident, $message:ty, $method:ident) => {
        step_handler!(@impl $handler, $message, |step, event| {
            if let Some((state, ctx)) = step.running() {
                state.$method(event, ctx).await?;
            }
        });
    };
    (@impl $handler:ident, $message:ty, |$step:ident, $event:ident| $body:block) => {
        #[derive(Clone, Copy, Default)]
        struct $handler;
        impl txoutbox_runtime::consumer::EventHandler for $handler {
            type Event = $message;
            const NAME: &'static str = stringify!($handler);
            fn handle<'a>(
                &'a self,
                tx: &'a mut Transaction<'static, Postgres>,
                $event: $message,
                meta: &'a EventMeta,
                events: &'a mut Events,
            ) -> futures::future::BoxFuture<'a, Result<(), HandlerError>> {
                Box::pin(async move {
                    let id = txoutbox_runtime::saga::__private::correlation(&$event.saga_id);
                    let mut $step = Step::<Tally>::load(tx, events, meta, id).await?;
                    $body
                    $step.save().await
                })
            }
        }
    };
}

step_handler!(OnOpen, Open, on_open, start);
step_handler!(OnAdd, Add, on_add);
step_handler!(OnReserve, Reserve, on_reserve);
step_handler!(OnFail, Fail, on_fail);

impl Saga for Tally {
    const NAME: &'static str = "tally";
    fn register(
        consumer: txoutbox_runtime::consumer::ConsumerBuilder,
    ) -> txoutbox_runtime::consumer::ConsumerBuilder {
        consumer
            .handler(OnOpen)
            .handler(OnAdd)
            .handler(OnReserve)
            .handler(OnFail)
    }
}

async fn prepare(pool: &PgPool) {
    txoutbox_runtime::migrations::run(pool).await.unwrap();
    sqlx::raw_sql("CREATE TABLE tally_effect (event_id uuid NOT NULL)")
        .execute(pool)
        .await
        .unwrap();
}

fn meta_of<E: DomainEvent>(event: &E) -> EventMeta {
    EventMeta::new(event.event_id(), E::EVENT_TYPE, E::TOPIC)
}

/// Runs one message through its step in its own transaction, as the consumer
/// would (the recorded messages are inserted, then commit).
async fn apply<H: txoutbox_runtime::consumer::EventHandler>(
    pool: &PgPool,
    handler: H,
    event: H::Event,
) -> Result<(), HandlerError> {
    let meta = meta_of(&event);
    let mut tx = pool.begin().await.unwrap();
    let mut events = Events::new();
    handler.handle(&mut tx, event, &meta, &mut events).await?;
    txoutbox_core::insert_records(&mut tx, events.records())
        .await
        .unwrap();
    tx.commit().await.unwrap();
    Ok(())
}

async fn saga_row(pool: &PgPool, id: Uuid) -> (String, i64, serde_json::Value) {
    sqlx::query_as(
        "SELECT status, version, state FROM saga_state WHERE saga_type = 'tally' AND saga_id = $1",
    )
    .bind(id.to_string())
    .fetch_one(pool)
    .await
    .unwrap()
}

fn open(saga_id: Uuid) -> Open {
    Open {
        event_id: Uuid::new_v4(),
        saga_id,
    }
}

fn add(saga_id: Uuid, amount: i64) -> Add {
    Add {
        event_id: Uuid::new_v4(),
        saga_id,
        lane: format!("lane-{amount}"),
        amount,
    }
}

#[sqlx::test(migrations = false)]
async fn compensations_go_out_in_reverse_order_once_and_the_ended_saga_ignores_the_rest(
    pool: PgPool,
) {
    prepare(&pool).await;
    let saga_id = Uuid::new_v4();
    apply(&pool, OnOpen, open(saga_id)).await.unwrap();
    for step_no in 1..=3 {
        let reserve = Reserve {
            event_id: Uuid::new_v4(),
            saga_id,
            step_no,
        };
        apply(&pool, OnReserve, reserve).await.unwrap();
    }
    assert_eq!(count(&pool, "SELECT count(*) FROM outbox_event").await, 0);
    let pending: i64 = sqlx::query_scalar(
        "SELECT jsonb_array_length(compensations)::int8 FROM saga_state WHERE saga_id = $1",
    )
    .bind(saga_id.to_string())
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(pending, 3);

    let fail = Fail {
        event_id: Uuid::new_v4(),
        saga_id,
    };
    apply(&pool, OnFail, fail.clone()).await.unwrap();
    let undone: Vec<serde_json::Value> = sqlx::query_scalar(
        "SELECT payload FROM outbox_event WHERE event_type = 'Undo' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let order: Vec<i64> = undone
        .iter()
        .map(|p| p["step_no"].as_i64().unwrap())
        .collect();
    assert_eq!(order, vec![3, 2, 1], "the last step done is undone first");
    let (status, version, _) = saga_row(&pool, saga_id).await;
    assert_eq!((status.as_str(), version), ("compensated", 5));

    // A second failure, a late step and a second start change nothing.
    apply(
        &pool,
        OnFail,
        Fail {
            event_id: Uuid::new_v4(),
            saga_id,
        },
    )
    .await
    .unwrap();
    apply(&pool, OnAdd, add(saga_id, 5)).await.unwrap();
    apply(&pool, OnOpen, open(saga_id)).await.unwrap();
    let (status, version, state) = saga_row(&pool, saga_id).await;
    assert_eq!((status.as_str(), version), ("compensated", 5));
    assert_eq!(state["total"], 0);
    assert_eq!(count(&pool, "SELECT count(*) FROM outbox_event").await, 3);
    assert_eq!(count(&pool, "SELECT count(*) FROM tally_effect").await, 0);
    let finished: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("SELECT finished_at FROM saga_state WHERE saga_id = $1")
            .bind(saga_id.to_string())
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(finished.is_some());
}

#[sqlx::test(migrations = false)]
async fn a_message_of_an_unknown_saga_changes_nothing(pool: PgPool) {
    prepare(&pool).await;
    apply(&pool, OnAdd, add(Uuid::new_v4(), 5)).await.unwrap();
    assert_eq!(count(&pool, "SELECT count(*) FROM saga_state").await, 0);
    assert_eq!(count(&pool, "SELECT count(*) FROM tally_effect").await, 0);
    assert_eq!(count(&pool, "SELECT count(*) FROM outbox_event").await, 0);
}

#[sqlx::test(migrations = false)]
async fn a_failed_step_leaves_the_saga_as_it_was(pool: PgPool) {
    prepare(&pool).await;
    let saga_id = Uuid::new_v4();
    apply(&pool, OnOpen, open(saga_id)).await.unwrap();
    sqlx::raw_sql("DROP TABLE tally_effect")
        .execute(&pool)
        .await
        .unwrap();
    let error = apply(&pool, OnAdd, add(saga_id, 5)).await.unwrap_err();
    assert!(error.to_string().contains("tally_effect"), "{error}");
    let (status, version, state) = saga_row(&pool, saga_id).await;
    assert_eq!(
        (status.as_str(), version, state["total"].as_i64()),
        ("running", 1, Some(0))
    );
    assert_eq!(count(&pool, "SELECT count(*) FROM outbox_event").await, 0);
}

/// Two starts of one saga at once: the second waits on the first's row, then
/// its attempt fails (to be retried) and, retried, is ignored as a second start.
#[sqlx::test(migrations = false)]
async fn two_starts_of_one_saga_at_once_make_one_saga(pool: PgPool) {
    prepare(&pool).await;
    let saga_id = Uuid::new_v4();
    let (first, second) = (open(saga_id), open(saga_id));
    let meta1 = meta_of(&first);
    let mut tx1 = pool.begin().await.unwrap();
    let mut events1 = Events::new();
    let mut step1 = Step::<Tally>::load(&mut tx1, &mut events1, &meta1, saga_id.to_string())
        .await
        .unwrap();
    assert!(step1.starting().is_some());
    step1.started(Tally { total: 1, adds: 0 });
    step1.save().await.unwrap(); // inserted, not committed
    let second_save = tokio::spawn({
        let (pool, second) = (pool.clone(), second.clone());
        async move {
            let meta2 = meta_of(&second);
            let mut tx2 = pool.begin().await.unwrap();
            let mut events2 = Events::new();
            let mut step2 =
                Step::<Tally>::load(&mut tx2, &mut events2, &meta2, saga_id.to_string())
                    .await
                    .unwrap();
            assert!(
                step2.starting().is_some(),
                "the first start is not committed yet"
            );
            step2.started(Tally { total: 2, adds: 0 });
            step2.save().await // waits for the first transaction
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !second_save.is_finished(),
        "the second start waits for the first"
    );
    tx1.commit().await.unwrap();
    let error = second_save.await.unwrap().unwrap_err();
    assert!(error.to_string().contains("concurrent step"), "{error}");
    // The retry sees the saga and ignores the second start.
    apply(&pool, OnOpen, second).await.unwrap();
    let (status, version, state) = saga_row(&pool, saga_id).await;
    assert_eq!(
        (status.as_str(), version, state["total"].as_i64()),
        ("running", 1, Some(1))
    );
}

/// 300 `Add`s of one saga, keyed over 30 lanes on a 4-partition topic, handled
/// by two consumers (own pools) at once: every one is applied exactly once,
/// each on its own version (the `Added` each sends names it), and the total
/// is the sum. Some are sent twice: redelivery changes nothing.
#[sqlx::test(migrations = false)]
async fn concurrent_steps_of_one_saga_never_apply_to_the_same_version(pool: PgPool) {
    prepare(&pool).await;
    create_topic(TOPIC, 4).await;
    let group = unique_group("saga");
    start_group_at(&group, TOPIC, 4, true).await;
    let saga_id = Uuid::new_v4();
    apply(&pool, OnOpen, open(saga_id)).await.unwrap();

    let producer = producer();
    let adds: Vec<Add> = (1..=300)
        .map(|i| Add {
            event_id: Uuid::new_v4(),
            saga_id,
            lane: format!("lane-{}", i % 30),
            amount: i,
        })
        .collect();
    let second_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(5)
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap();
    let consumers: Vec<_> = [pool.clone(), second_pool.clone()]
        .into_iter()
        .map(|pool| {
            Consumer::builder(pool, kafka_config(), &group)
                .saga::<Tally>()
                .build()
                .unwrap()
                .spawn()
        })
        .collect();
    for (i, add) in adds.iter().enumerate() {
        produce_event(&producer, add).await;
        if i % 10 == 0 {
            produce_event(&producer, add).await; // a redelivery
        }
    }
    eventually("every Add applied", Duration::from_secs(60), || async {
        count(&pool, "SELECT count(*) FROM tally_effect").await >= 300
    })
    .await;
    for consumer in consumers {
        consumer.shutdown().await.unwrap();
    }
    second_pool.close().await;

    let (status, version, state) = saga_row(&pool, saga_id).await;
    assert_eq!(status, "running");
    assert_eq!(version, 301);
    assert_eq!(state["total"].as_i64(), Some((1..=300).sum::<i64>()));
    assert_eq!(count(&pool, "SELECT count(*) FROM tally_effect").await, 300);
    let versions: Vec<i64> = sqlx::query_scalar(
        "SELECT (payload->>'on_version')::int8 FROM outbox_event WHERE event_type = 'Added' ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        versions,
        (1..=300).collect::<Vec<i64>>(),
        "one step per version"
    );
}
