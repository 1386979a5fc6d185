//! Saga steps against real PostgreSQL (and, for concurrency, the real broker
//! with two consumers): a step applies once, concurrent steps of one saga are
//! applied one after the other (no two on the same version), two starts of
//! one saga make one saga, compensations go out in reverse order exactly
//! once, a finished saga ignores its messages, and a message of a saga that
//! does not exist is retried (its start may not have committed) for the
//! consumer's retry budget, then ignored. The saga is
//! declared with `#[saga]`; its generated handlers are also run directly
//! (`txoutbox_runtime::testing`), as a consumer runs them.

#![allow(missing_docs)]

mod consumer_support;

use std::time::Duration;

use consumer_support::*;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use txoutbox_core::Backoff;
use txoutbox_core::{DomainEvent, Events};
use txoutbox_runtime::consumer::{Consumer, HandlerError, Mode};
use txoutbox_runtime::saga::{SagaContext, Step, saga};
use txoutbox_runtime::testing::{handle_in, meta_of};
use uuid::Uuid;

const TOPIC: &str = "saga-test.tally";

/// The amount whose `Add` step swallows a database error.
const SWALLOWED: i64 = -13;

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

#[saga(
    name = "tally",
    id = Uuid,
    correlate = saga_id,
    starts_with(Open),
    handles(Add, Reserve, Fail)
)]
impl Tally {
    async fn on_open(_event: Open, _ctx: &mut SagaContext<'_>) -> Result<Self, HandlerError> {
        Ok(Self { total: 0, adds: 0 })
    }

    async fn on_add(&mut self, event: Add, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        if event.amount == SWALLOWED {
            // The "already done" idiom gone wrong: the error is dropped,
            // the transaction is aborted.
            let _ = sqlx::query("SELECT 1 / 0").execute(&mut **ctx.tx()).await;
            return Ok(());
        }
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

/// The retry backoff of the consumers on `TOPIC`. They read each other's
/// messages there (the tests run at once, each with its own database), and
/// each is a step of an unknown saga to the others, retried for the retry
/// budget before it is ignored: keep that short.
const STRAYS_BACKOFF: Backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(40));

async fn prepare(pool: &PgPool) {
    txoutbox_runtime::migrations::run(pool).await.unwrap();
    sqlx::raw_sql("CREATE TABLE tally_effect (event_id uuid NOT NULL)")
        .execute(pool)
        .await
        .unwrap();
}

/// A transaction begun as the consumer begins its own (`READ COMMITTED`,
/// whatever the database's default), for steps run by hand.
async fn begin(pool: &PgPool) -> sqlx::Transaction<'static, sqlx::Postgres> {
    pool.begin_with("BEGIN ISOLATION LEVEL READ COMMITTED")
        .await
        .unwrap()
}

// Runs one message through its step in its own transaction, as the consumer
// would (the recorded messages are inserted, then commit).
use txoutbox_runtime::testing::handle as apply;

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

under_every_isolation! {
async fn compensations_go_out_in_reverse_order_once_and_the_ended_saga_ignores_the_rest(
    pool: PgPool,
) {
    prepare(&pool).await;
    let saga_id = Uuid::new_v4();
    apply(&pool, Tally::on_open_handler(), open(saga_id)).await.unwrap();
    for step_no in 1..=3 {
        let reserve = Reserve {
            event_id: Uuid::new_v4(),
            saga_id,
            step_no,
        };
        apply(&pool, Tally::on_reserve_handler(), reserve).await.unwrap();
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
    apply(&pool, Tally::on_fail_handler(), fail.clone()).await.unwrap();
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
        Tally::on_fail_handler(),
        Fail {
            event_id: Uuid::new_v4(),
            saga_id,
        },
    )
    .await
    .unwrap();
    apply(&pool, Tally::on_add_handler(), add(saga_id, 5)).await.unwrap();
    apply(&pool, Tally::on_open_handler(), open(saga_id)).await.unwrap();
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
}

under_every_isolation! {
async fn a_message_of_an_unknown_saga_changes_nothing(pool: PgPool) {
    prepare(&pool).await;
    apply(&pool, Tally::on_add_handler(), add(Uuid::new_v4(), 5)).await.unwrap();
    assert_eq!(count(&pool, "SELECT count(*) FROM saga_state").await, 0);
    assert_eq!(count(&pool, "SELECT count(*) FROM tally_effect").await, 0);
    assert_eq!(count(&pool, "SELECT count(*) FROM outbox_event").await, 0);
}
}

under_every_isolation! {
async fn a_failed_step_leaves_the_saga_as_it_was(pool: PgPool) {
    prepare(&pool).await;
    let saga_id = Uuid::new_v4();
    apply(&pool, Tally::on_open_handler(), open(saga_id)).await.unwrap();
    sqlx::raw_sql("DROP TABLE tally_effect")
        .execute(&pool)
        .await
        .unwrap();
    let error = apply(&pool, Tally::on_add_handler(), add(saga_id, 5)).await.unwrap_err();
    assert!(error.to_string().contains("tally_effect"), "{error}");
    let (status, version, state) = saga_row(&pool, saga_id).await;
    assert_eq!(
        (status.as_str(), version, state["total"].as_i64()),
        ("running", 1, Some(0))
    );
    assert_eq!(count(&pool, "SELECT count(*) FROM outbox_event").await, 0);
}
}

under_every_isolation! {
/// Issue 22 item 1, a saga step: a step handler that swallowed a database
/// error returned `Ok` on an aborted transaction. The saga's own write after
/// it is refused, and the step fails saying what happened and how to fix it
/// (before: "current transaction is aborted" from the saga's write, as if
/// the framework had failed); the saga is left as it was.
async fn a_step_that_swallows_a_database_error_fails_and_says_why(pool: PgPool) {
    prepare(&pool).await;
    let saga_id = Uuid::new_v4();
    apply(&pool, Tally::on_open_handler(), open(saga_id)).await.unwrap();
    let error = apply(&pool, Tally::on_add_handler(), add(saga_id, SWALLOWED))
        .await
        .unwrap_err()
        .to_string();
    for hint in ["`Add` step of saga tally", "returned Ok, but", "aborted", "savepoint"] {
        assert!(error.contains(hint), "{error:?} should mention {hint:?}");
    }
    let (status, version, state) = saga_row(&pool, saga_id).await;
    assert_eq!(
        (status.as_str(), version, state["total"].as_i64()),
        ("running", 1, Some(0))
    );
}
}

under_every_isolation! {
/// Two starts of one saga at once: the second waits on the first's row, then
/// its attempt fails (to be retried) and, retried, is ignored as a second start.
async fn two_starts_of_one_saga_at_once_make_one_saga(pool: PgPool) {
    prepare(&pool).await;
    let saga_id = Uuid::new_v4();
    let (first, second) = (open(saga_id), open(saga_id));
    let meta1 = meta_of(&first);
    let mut tx1 = begin(&pool).await;
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
            let mut tx2 = begin(&pool).await;
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
    apply(&pool, Tally::on_open_handler(), second).await.unwrap();
    let (status, version, state) = saga_row(&pool, saga_id).await;
    assert_eq!(
        (status.as_str(), version, state["total"].as_i64()),
        ("running", 1, Some(1))
    );
}
}

under_every_isolation! {
/// 300 `Add`s of one saga, keyed over 30 lanes on a 4-partition topic, handled
/// by two consumers (own pools) at once: every one is applied exactly once,
/// each on its own version (the `Added` each sends names it), and the total
/// is the sum. Some are sent twice: redelivery changes nothing.
async fn concurrent_steps_of_one_saga_never_apply_to_the_same_version(pool: PgPool) {
    prepare(&pool).await;
    create_topic(TOPIC, 4).await;
    let group = unique_group("saga");
    start_group_at(&group, TOPIC, 4, true).await;
    let saga_id = Uuid::new_v4();
    apply(&pool, Tally::on_open_handler(), open(saga_id)).await.unwrap();

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
                .backoff(STRAYS_BACKOFF)
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
}

under_every_isolation! {
/// The same saga on an inbox-mode consumer: each step commits with its inbox
/// row marked processed; a redelivered message is stored once and applied once.
async fn a_saga_runs_on_an_inbox_consumer_too(pool: PgPool) {
    prepare(&pool).await;
    create_topic(TOPIC, 4).await;
    let group = unique_group("saga-inbox");
    start_group_at(&group, TOPIC, 4, true).await;
    let saga_id = Uuid::new_v4();
    apply(&pool, Tally::on_open_handler(), open(saga_id)).await.unwrap();
    let consumer = Consumer::builder(pool.clone(), kafka_config(), &group)
        .mode(txoutbox_runtime::consumer::Mode::Inbox)
        .saga::<Tally>()
        .backoff(STRAYS_BACKOFF)
        .build()
        .unwrap()
        .spawn();
    let producer = producer();
    for i in 1..=50 {
        let add = Add {
            event_id: Uuid::new_v4(),
            saga_id,
            lane: format!("lane-{}", i % 7),
            amount: i,
        };
        produce_event(&producer, &add).await;
        if i % 5 == 0 {
            produce_event(&producer, &add).await;
        }
    }
    // The topic is shared with the other tests of this file (running at the
    // same time): only this saga's rows count.
    let ours = || async {
        let counts: (i64, i64) = sqlx::query_as(
            "SELECT count(*), count(*) FILTER (WHERE processed) FROM inbox_event
             WHERE payload->>'saga_id' = $1",
        )
        .bind(saga_id.to_string())
        .fetch_one(&pool)
        .await
        .unwrap();
        counts
    };
    eventually("every Add applied", Duration::from_secs(60), || async {
        ours().await.1 >= 50
    })
    .await;
    consumer.shutdown().await.unwrap();
    let (status, version, state) = saga_row(&pool, saga_id).await;
    assert_eq!((status.as_str(), version), ("running", 51));
    assert_eq!(state["total"].as_i64(), Some((1..=50).sum::<i64>()));
    assert_eq!(count(&pool, "SELECT count(*) FROM tally_effect").await, 50);
    assert_eq!(ours().await, (50, 50), "stored once, applied once");
}
}

const LATE_TOPIC: &str = "saga-test.late";

/// Starts a `Late` saga.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, DomainEvent)]
#[event(
    topic = "saga-test.late",
    event_type = "LateOpened",
    aggregate = "Late"
)]
pub struct LateOpened {
    pub event_id: Uuid,
    #[partition_key]
    pub saga_id: Uuid,
}

/// A step of a `Late` saga, keyed by `lane`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, DomainEvent)]
#[event(topic = "saga-test.late", event_type = "LateStep", aggregate = "Late")]
pub struct LateStep {
    pub event_id: Uuid,
    pub saga_id: Uuid,
    #[partition_key]
    pub lane: String,
    pub amount: i64,
}

/// A saga of its own topic, so that the tests of early and stray messages
/// do not see the other tests' messages (each one an unknown saga here,
/// retried before it is ignored).
#[derive(Debug, Serialize, Deserialize)]
pub struct Late {
    total: i64,
}

#[saga(name = "late", id = Uuid, correlate = saga_id, starts_with(LateOpened), handles(LateStep))]
impl Late {
    async fn on_opened(_event: LateOpened) -> Result<Self, HandlerError> {
        Ok(Self { total: 0 })
    }

    async fn on_step(
        &mut self,
        event: LateStep,
        ctx: &mut SagaContext<'_>,
    ) -> Result<(), HandlerError> {
        self.total += event.amount;
        sqlx::query("INSERT INTO late_effect (event_id, amount) VALUES ($1, $2)")
            .bind(event.event_id)
            .bind(event.amount)
            .execute(&mut **ctx.tx())
            .await?;
        Ok(())
    }
}

async fn prepare_late(pool: &PgPool) {
    prepare(pool).await;
    sqlx::raw_sql(
        "CREATE TABLE late_effect (
             event_id uuid NOT NULL, amount bigint NOT NULL,
             at timestamptz NOT NULL DEFAULT clock_timestamp())",
    )
    .execute(pool)
    .await
    .unwrap();
}

async fn late_row(pool: &PgPool, id: Uuid) -> Option<(String, i64, i64)> {
    sqlx::query_as(
        "SELECT status, version, (state->>'total')::int8 FROM saga_state
         WHERE saga_type = 'late' AND saga_id = $1",
    )
    .bind(id.to_string())
    .fetch_optional(pool)
    .await
    .unwrap()
}

fn late_step(saga_id: Uuid, lane: &str, amount: i64) -> LateStep {
    LateStep {
        event_id: Uuid::new_v4(),
        saga_id,
        lane: lane.to_owned(),
        amount,
    }
}

/// A consumer of the `Late` saga, with a first saga of its own applied, so
/// that it has joined its group and reads the topic.
async fn late_consumer(
    pool: &PgPool,
    mode: Mode,
    tune: impl FnOnce(
        txoutbox_runtime::consumer::ConsumerBuilder,
    ) -> txoutbox_runtime::consumer::ConsumerBuilder,
) -> txoutbox_runtime::consumer::ConsumerHandle {
    create_topic(LATE_TOPIC, 2).await;
    let group = unique_group("saga-late");
    start_group_at(&group, LATE_TOPIC, 2, true).await;
    let builder = Consumer::builder(pool.clone(), kafka_config(), &group)
        .mode(mode)
        .processor_poll_interval(Duration::from_millis(20))
        .saga::<Late>();
    let running = tune(builder).build().unwrap().spawn();
    let warm_up = Uuid::new_v4();
    let producer = producer();
    produce_event(
        &producer,
        &LateOpened {
            event_id: Uuid::new_v4(),
            saga_id: warm_up,
        },
    )
    .await;
    eventually("the consumer runs", Duration::from_secs(30), || async {
        late_row(pool, warm_up).await.is_some()
    })
    .await;
    running
}

/// A step whose saga's start is still being committed (its transaction held
/// open here) when the step is handled: the step's attempt fails and is
/// retried, and once the start has committed it is applied. It used to be
/// ignored at once as `unknown_saga`, and the saga ended without it.
async fn a_step_ahead_of_its_start_is_applied_once_the_start_commits(pool: PgPool, mode: Mode) {
    prepare_late(&pool).await;
    let running = late_consumer(&pool, mode, |builder| builder).await;
    let saga_id = Uuid::new_v4();
    let start = LateOpened {
        event_id: Uuid::new_v4(),
        saga_id,
    };
    let mut starting = begin(&pool).await;
    let after_commit = handle_in(&mut starting, Late::on_opened_handler(), start)
        .await
        .unwrap();
    let step = late_step(saga_id, &format!("lane-{}", Uuid::new_v4()), 7);
    produce_event(&producer(), &step).await;
    // Handled meanwhile (within a fetch of the live consumer), not applied.
    tokio::time::sleep(Duration::from_millis(300)).await;
    starting.commit().await.unwrap();
    after_commit.committed_on(&pool);
    eventually("the step applied", Duration::from_secs(30), || async {
        late_row(&pool, saga_id).await == Some(("running".into(), 2, 7))
    })
    .await;
    running.shutdown().await.unwrap();
    let applied: Vec<Uuid> = sqlx::query_scalar("SELECT event_id FROM late_effect")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(applied, vec![step.event_id], "applied once");
}

under_every_isolation! {
async fn a_step_ahead_of_its_start_is_applied_once_the_start_commits_in_dedup_mode(pool: PgPool) {
    a_step_ahead_of_its_start_is_applied_once_the_start_commits(pool, Mode::Dedup).await;
}
}

under_every_isolation! {
async fn a_step_ahead_of_its_start_is_applied_once_the_start_commits_in_inbox_mode(pool: PgPool) {
    a_step_ahead_of_its_start_is_applied_once_the_start_commits(pool, Mode::Inbox).await;
}
}

under_every_isolation! {
/// A step of a saga that never starts, on an inbox consumer: it is retried
/// for the consumer's retry budget (attempts and backoff), holding back only
/// its own key, then ignored as `unknown_saga`; the other keys' steps go on
/// meanwhile, and the key's next step follows it.
async fn a_step_of_a_saga_that_never_starts_is_ignored_after_its_retries_holding_back_its_key_only(
    pool: PgPool,
) {
    prepare_late(&pool).await;
    // Backoff 400 ms doubling to 1.6 s, with equal jitter: the four retries
    // of the stray step take at least 0.2 + 0.4 + 0.8 + 0.8 = 2.2 s.
    let running = late_consumer(&pool, Mode::Inbox, |builder| {
        builder.backoff(Backoff::new(Duration::from_millis(400), Duration::from_millis(1600)))
    })
    .await;
    let saga_id = Uuid::new_v4();
    apply(
        &pool,
        Late::on_opened_handler(),
        LateOpened {
            event_id: Uuid::new_v4(),
            saga_id,
        },
    )
    .await
    .unwrap();
    let lanes = Uuid::new_v4();
    let lane = |n: &str| format!("lane-{lanes}-{n}");
    let stray = late_step(Uuid::new_v4(), &lane("stray"), 1000);
    let producer = producer();
    produce_event(&producer, &stray).await;
    for amount in 1..=5 {
        produce_event(
            &producer,
            &late_step(saga_id, &lane(&amount.to_string()), amount),
        )
        .await;
    }
    let behind = late_step(saga_id, &lane("stray"), 100);
    produce_event(&producer, &behind).await;

    let applied = |amount: i64| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM late_effect WHERE amount = $1")
                .bind(amount)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let stray_row = || async {
        sqlx::query_as::<_, (bool, i32, Option<String>, Option<f64>)>(
            "SELECT processed, attempts, last_error,
                    EXTRACT(EPOCH FROM processed_at - received_at)::float8
             FROM inbox_event WHERE event_id = $1",
        )
        .bind(stray.event_id)
        .fetch_optional(&pool)
        .await
        .unwrap()
    };
    eventually(
        "the other keys' steps applied",
        Duration::from_secs(20),
        || async {
            let mut all = true;
            for amount in 1..=5 {
                all &= applied(amount).await == 1;
            }
            all
        },
    )
    .await;
    let (processed, ..) = stray_row().await.expect("the stray step is in the inbox");
    assert!(!processed, "the other keys did not wait for the stray step");
    assert_eq!(applied(100).await, 0, "its key's next step waits behind it");

    eventually(
        "the stray step ignored, its key's next step applied",
        Duration::from_secs(30),
        || async { stray_row().await.is_some_and(|row| row.0) && applied(100).await == 1 },
    )
    .await;
    running.shutdown().await.unwrap();
    let (_, attempts, last_error, took) = stray_row().await.unwrap();
    let (last_error, took) = (last_error.unwrap_or_default(), took.unwrap());
    println!("the stray step was ignored after {attempts} failed attempts, {took:.2} s");
    assert_eq!(attempts, 4, "failed on each attempt but the last (of 5)");
    assert!(last_error.contains("does not exist (yet)"), "{last_error}");
    assert!(
        (2.2..20.0).contains(&took),
        "bounded by the retry budget: {took} s"
    );
    assert_eq!(
        late_row(&pool, stray.saga_id).await,
        None,
        "no saga made up"
    );
    assert_eq!(applied(1000).await, 0);
    assert_eq!(
        late_row(&pool, saga_id).await,
        Some(("running".into(), 7, 115))
    );
    let in_order: bool = sqlx::query_scalar(
        "SELECT (SELECT processed_at FROM inbox_event WHERE event_id = $1)
                <= (SELECT at FROM late_effect WHERE amount = 100)",
    )
    .bind(stray.event_id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(in_order, "its key's next step after it");
}
}

under_every_isolation! {
/// A saga id `saga_state`'s primary key cannot index is refused by the step,
/// saying so (instead of PostgreSQL's "index row size" error on the insert).
async fn a_saga_id_too_long_to_store_is_refused_with_the_reason(pool: PgPool) {
    prepare(&pool).await;
    let event = open(Uuid::new_v4());
    let meta = meta_of(&event);
    let mut tx = begin(&pool).await;
    let mut events = Events::new();
    let long_id = "s".repeat(txoutbox_core::MAX_PARTITION_KEY_BYTES + 1);
    let error = Step::<Tally>::load(&mut tx, &mut events, &meta, long_id)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("1025 bytes") && error.contains("shorter id"),
        "{error}"
    );
}
}
