//! Sagas on both databases (feature `mysql`): the same saga and the same
//! test bodies, once on PostgreSQL and once on MariaDB, each against real
//! consumers and the real broker. Concurrent steps of one saga (two
//! consumers, four partitions) are applied one after the other, never two on
//! one version, redeliveries change nothing; compensations go out in reverse
//! order exactly once and the ended saga ignores the rest; a step whose
//! handler swallowed a database error (on MariaDB: lost its transaction, as
//! a swallowed deadlock does) leaves the saga as it was and is
//! dead-lettered while the saga goes on; the saga runs on an inbox consumer
//! too; a scheduled timeout is cancelled in a later step. Each database has
//! topics of its own, so the two runs never read each other's messages.
#![allow(missing_docs)]

mod consumer_support;

use std::time::Duration;

use consumer_support::*;
use txoutbox_core::Backoff;

/// Short retries: a step of a saga whose start has not committed is
/// retried for the consumer's retry budget.
const BACKOFF: Backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(40));

/// The amount whose `Add` step swallows a database error.
const SWALLOWED: i64 = -13;

/// The saga, its messages and the test bodies on database `$db`, in module
/// `$module`: `$insert_effect` records an applied `Add` in the service's
/// own table, `$swallow` is a statement whose error the swallowing step
/// drops (leaving the transaction unable to commit).
macro_rules! saga_suite {
    (
        $module:ident, $db:ty, pool = $pool:ty,
        tally = $tally:tt, added = $added:tt, undo = $undo:tt,
        insert_effect = $insert_effect:literal,
        swallow = $swallow:literal,
        database = $database:expr,
    ) => {
        mod $module {
            use std::time::Duration;

            use schemars::JsonSchema;
            use serde::{Deserialize, Serialize};
            use txoutbox_core::DomainEvent;
            use txoutbox_runtime::consumer::{Consumer, HandlerError, Mode};
            use txoutbox_runtime::saga::{SagaContext, saga};
            use uuid::Uuid;

            use super::*;

            #[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, DomainEvent)]
            #[event(topic = $tally, event_type = "Open", aggregate = "Tally")]
            pub(crate) struct Open {
                pub(crate) event_id: Uuid,
                #[partition_key]
                pub(crate) saga_id: Uuid,
            }

            /// Keyed by `lane`, not by the saga, so one saga's messages
            /// spread over partitions (and consumers).
            #[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, DomainEvent)]
            #[event(topic = $tally, event_type = "Add", aggregate = "Tally")]
            pub(crate) struct Add {
                pub(crate) event_id: Uuid,
                pub(crate) saga_id: Uuid,
                #[partition_key]
                pub(crate) lane: String,
                pub(crate) amount: i64,
            }

            #[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, DomainEvent)]
            #[event(topic = $tally, event_type = "Reserve", aggregate = "Tally")]
            pub(crate) struct Reserve {
                pub(crate) event_id: Uuid,
                #[partition_key]
                pub(crate) saga_id: Uuid,
                pub(crate) step_no: i64,
            }

            #[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, DomainEvent)]
            #[event(topic = $tally, event_type = "Fail", aggregate = "Tally")]
            pub(crate) struct Fail {
                pub(crate) event_id: Uuid,
                #[partition_key]
                pub(crate) saga_id: Uuid,
            }

            /// Sent by each applied `Add`: the version it was applied on.
            #[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, DomainEvent)]
            #[event(topic = $added, event_type = "Added", aggregate = "Tally")]
            pub(crate) struct Added {
                pub(crate) event_id: Uuid,
                #[partition_key]
                pub(crate) saga_id: Uuid,
                pub(crate) on_version: i64,
                pub(crate) total: i64,
            }

            /// The compensation of a `Reserve`.
            #[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, DomainEvent)]
            #[event(topic = $undo, event_type = "Undo", aggregate = "Tally")]
            pub(crate) struct Undo {
                pub(crate) event_id: Uuid,
                #[partition_key]
                pub(crate) saga_id: Uuid,
                pub(crate) step_no: i64,
            }

            /// The timeout the start schedules an hour ahead, cancelled by
            /// a `Fail`.
            #[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, DomainEvent)]
            #[event(topic = $tally, event_type = "TimedOut", aggregate = "Tally")]
            pub(crate) struct TimedOut {
                pub(crate) event_id: Uuid,
                #[partition_key]
                pub(crate) saga_id: Uuid,
            }

            #[derive(Debug, Serialize, Deserialize)]
            pub(crate) struct Tally {
                total: i64,
                adds: i64,
                timeout: Uuid,
            }

            #[saga(
                name = "tally",
                id = Uuid,
                correlate = saga_id,
                starts_with(Open),
                handles(Add, Reserve, Fail, TimedOut)
            )]
            impl Tally {
                async fn on_open(
                    event: Open,
                    ctx: &mut SagaContext<'_, $db>,
                ) -> Result<Self, HandlerError> {
                    let timeout = ctx.send_after(
                        TimedOut {
                            event_id: Uuid::new_v4(),
                            saga_id: event.saga_id,
                        },
                        Duration::from_secs(3_600),
                    );
                    Ok(Self {
                        total: 0,
                        adds: 0,
                        timeout,
                    })
                }

                async fn on_add(
                    &mut self,
                    event: Add,
                    ctx: &mut SagaContext<'_, $db>,
                ) -> Result<(), HandlerError> {
                    if event.amount == SWALLOWED {
                        // The "already done" idiom gone wrong: the error is
                        // dropped, the transaction cannot commit any more.
                        let _ = sqlx::raw_sql($swallow).execute(&mut **ctx.tx()).await;
                        return Ok(());
                    }
                    self.total += event.amount;
                    self.adds += 1;
                    // A write of the service's own in the step's transaction.
                    sqlx::query($insert_effect)
                        .bind(event.event_id)
                        .bind(event.saga_id)
                        .execute(&mut **ctx.tx())
                        .await?;
                    let on_version = ctx.version();
                    ctx.send(Added {
                        event_id: Uuid::new_v4(),
                        saga_id: event.saga_id,
                        on_version,
                        total: self.total,
                    });
                    Ok(())
                }

                async fn on_reserve(
                    &mut self,
                    event: Reserve,
                    ctx: &mut SagaContext<'_, $db>,
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
                    ctx: &mut SagaContext<'_, $db>,
                ) -> Result<(), HandlerError> {
                    let cancelled = ctx.cancel_scheduled(self.timeout).await?;
                    assert!(cancelled, "the timeout was scheduled an hour ahead");
                    ctx.compensate();
                    Ok(())
                }

                async fn on_timed_out(
                    &mut self,
                    _event: TimedOut,
                    ctx: &mut SagaContext<'_, $db>,
                ) -> Result<(), HandlerError> {
                    ctx.complete();
                    Ok(())
                }
            }

            async fn database() -> Db {
                $database.await
            }

            /// Spawns a consumer of `group` running the saga.
            fn spawn(pool: $pool, group: &str, mode: Mode) -> txoutbox_runtime::consumer::ConsumerHandle {
                Consumer::builder(pool, kafka_config(), group)
                    .mode(mode)
                    .saga::<Tally>()
                    .backoff(BACKOFF)
                    .max_attempts(3)
                    .build()
                    .unwrap()
                    .spawn()
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
                    lane: format!("lane-{}", amount.rem_euclid(30)),
                    amount,
                }
            }

            /// A started saga: its consumer has joined the group (the start
            /// is applied).
            async fn started(db: &Db, group: &str, mode: Mode) -> (Uuid, Vec<txoutbox_runtime::consumer::ConsumerHandle>) {
                create_topic(Open::TOPIC, 4).await;
                start_group_at(group, Open::TOPIC, 4, true).await;
                let consumer = spawn(db.pool(), group, mode);
                let saga_id = Uuid::new_v4();
                produce_event(&producer(), &open(saga_id)).await;
                eventually("the saga started", Duration::from_secs(60), || async {
                    db.saga(saga_id).await.is_some()
                })
                .await;
                (saga_id, vec![consumer])
            }

            /// 300 `Add`s of one saga over 30 lanes on four partitions,
            /// handled by two consumers (pools of their own) at once, every
            /// tenth sent twice: each applied exactly once, each on its own
            /// version (the `Added` each sends names it), the total the sum.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_steps_of_one_saga_never_apply_to_the_same_version() {
                let db = database().await;
                let group = unique_group("saga-backends-concurrent");
                let (saga_id, mut consumers) = started(&db, &group, Mode::Dedup).await;
                let second: $pool = db.second_pool().await;
                consumers.push(spawn(second.clone(), &group, Mode::Dedup));
                let producer = producer();
                for i in 1..=300 {
                    let event = add(saga_id, i);
                    produce_event(&producer, &event).await;
                    if i % 10 == 0 {
                        produce_event(&producer, &event).await;
                    }
                }
                eventually("every Add applied", Duration::from_secs(90), || async {
                    db.effects(saga_id).await >= 300
                })
                .await;
                for consumer in consumers {
                    consumer.shutdown().await.unwrap();
                }
                let (status, version, state) = db.saga(saga_id).await.unwrap();
                assert_eq!((status.as_str(), version), ("running", 301));
                assert_eq!(state["total"].as_i64(), Some((1..=300).sum::<i64>()));
                assert_eq!(db.effects(saga_id).await, 300);
                let mut versions = db.added_versions(saga_id).await;
                versions.sort_unstable();
                assert_eq!(versions, (1..=300).collect::<Vec<i64>>(), "one step per version");
                db.drop(second).await;
            }

            /// Three `Reserve`s, then a `Fail`: the compensations go out in
            /// reverse order, once each; the start's timeout is cancelled;
            /// the ended saga ignores a later `Add` (no effect, no message).
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn compensations_go_out_in_reverse_order_once_and_the_ended_saga_ignores_the_rest() {
                let db = database().await;
                let group = unique_group("saga-backends-compensate");
                let (saga_id, consumers) = started(&db, &group, Mode::Dedup).await;
                assert_eq!(db.of_saga("outbox_scheduled", saga_id).await, 1);
                let producer = producer();
                for step_no in 1..=3 {
                    let reserve = Reserve { event_id: Uuid::new_v4(), saga_id, step_no };
                    produce_event(&producer, &reserve).await;
                }
                eventually("the reservations applied", Duration::from_secs(60), || async {
                    db.saga(saga_id).await.is_some_and(|(_, version, _)| version == 4)
                })
                .await;
                let fail = Fail { event_id: Uuid::new_v4(), saga_id };
                produce_event(&producer, &fail).await;
                produce_event(&producer, &fail).await; // a redelivery
                // Keyed like the `Fail`, so that it comes after it.
                let late = Add {
                    lane: saga_id.to_string(),
                    ..add(saga_id, 7)
                };
                produce_event(&producer, &late).await;
                eventually("the saga compensated", Duration::from_secs(60), || async {
                    db.saga(saga_id).await.is_some_and(|(status, ..)| status == "compensated")
                })
                .await;
                // The later Add goes through its (ignored) step too.
                tokio::time::sleep(Duration::from_millis(500)).await;
                for consumer in consumers {
                    consumer.shutdown().await.unwrap();
                }
                assert_eq!(db.undo_steps(saga_id).await, vec![3, 2, 1], "reverse order, once each");
                assert_eq!(db.of_saga("outbox_scheduled", saga_id).await, 0, "the timeout cancelled");
                assert_eq!(db.effects(saga_id).await, 0);
                let (_, version, state) = db.saga(saga_id).await.unwrap();
                assert_eq!(version, 5);
                assert_eq!(state["adds"].as_i64(), Some(0));
                db.finish().await;
            }

            /// An `Add` whose handler swallows a database error and returns
            /// `Ok`: the saga's write after it is refused, the step fails
            /// saying so, and after its attempts the message is
            /// dead-lettered; the saga is left as it was by it, and the
            /// `Add`s before and after it are applied.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_step_that_swallows_a_database_error_leaves_the_saga_as_it_was() {
                let db = database().await;
                let group = unique_group("saga-backends-swallow");
                let (saga_id, consumers) = started(&db, &group, Mode::Dedup).await;
                let producer = producer();
                produce_event(&producer, &add(saga_id, 1)).await;
                produce_event(&producer, &add(saga_id, SWALLOWED)).await;
                produce_event(&producer, &add(saga_id, 2)).await;
                eventually("the two good Adds applied", Duration::from_secs(60), || async {
                    db.effects(saga_id).await == 2
                })
                .await;
                eventually("the bad one dead-lettered", Duration::from_secs(60), || async {
                    consumers[0].summary().dead_lettered == 1
                })
                .await;
                for consumer in consumers {
                    consumer.shutdown().await.unwrap();
                }
                let (status, version, state) = db.saga(saga_id).await.unwrap();
                assert_eq!((status.as_str(), version), ("running", 3));
                assert_eq!(state["total"].as_i64(), Some(3));
                assert_eq!(db.effects(saga_id).await, 2);
                db.finish().await;
            }

            /// The saga on an inbox consumer: each step commits with its
            /// inbox row processed; a redelivered message is stored once and
            /// applied once.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_saga_runs_on_an_inbox_consumer_too() {
                let db = database().await;
                let group = unique_group("saga-backends-inbox");
                let (saga_id, consumers) = started(&db, &group, Mode::Inbox).await;
                let producer = producer();
                for i in 1..=50 {
                    let event = add(saga_id, i);
                    produce_event(&producer, &event).await;
                    if i % 5 == 0 {
                        produce_event(&producer, &event).await;
                    }
                }
                eventually("every Add applied", Duration::from_secs(60), || async {
                    db.effects(saga_id).await >= 50
                })
                .await;
                for consumer in consumers {
                    consumer.shutdown().await.unwrap();
                }
                let (status, version, state) = db.saga(saga_id).await.unwrap();
                assert_eq!((status.as_str(), version), ("running", 51));
                assert_eq!(state["total"].as_i64(), Some((1..=50).sum::<i64>()));
                assert_eq!(db.effects(saga_id).await, 50);
                assert_eq!(db.of_saga("inbox_event", saga_id).await, 51, "stored once");
                db.finish().await;
            }
        }
    };
}

/// A scratch database of either backend with the saga's effect table.
pub(crate) enum Db {
    Postgres { pool: sqlx::PgPool, name: String },
    MariaDb(Box<txoutbox_testkit::mysql::MySqlScratch>),
}

/// The pool a consumer of a [`Db`] takes.
pub(crate) trait PoolOf {
    fn of(db: &Db) -> Self;
}

impl PoolOf for sqlx::PgPool {
    fn of(db: &Db) -> Self {
        match db {
            Db::Postgres { pool, .. } => pool.clone(),
            Db::MariaDb(_) => unreachable!("a PostgreSQL suite"),
        }
    }
}

impl PoolOf for sqlx::MySqlPool {
    fn of(db: &Db) -> Self {
        match db {
            Db::MariaDb(scratch) => scratch.pool.clone(),
            Db::Postgres { .. } => unreachable!("a MariaDB suite"),
        }
    }
}

impl Db {
    async fn postgres() -> Self {
        txoutbox_testkit::init_tracing();
        let name = txoutbox_testkit::db::unique_name("saga_backends");
        txoutbox_testkit::db::create_database(&name).await;
        let pool = txoutbox_testkit::db::connect(&name, 8).await;
        txoutbox_runtime::migrations::run(&pool).await.unwrap();
        sqlx::raw_sql("CREATE TABLE tally_effect (event_id uuid NOT NULL, saga_id uuid NOT NULL)")
            .execute(&pool)
            .await
            .unwrap();
        Self::Postgres { pool, name }
    }

    async fn mariadb() -> Self {
        txoutbox_testkit::init_tracing();
        let scratch = txoutbox_testkit::mysql::MySqlScratch::create(8).await;
        txoutbox_runtime::migrations::run(&scratch.pool)
            .await
            .unwrap();
        sqlx::raw_sql(
            "CREATE TABLE tally_effect (event_id BINARY(16) NOT NULL, saga_id BINARY(16) NOT NULL)",
        )
        .execute(&scratch.pool)
        .await
        .unwrap();
        Self::MariaDb(Box::new(scratch))
    }

    fn pool<P: PoolOf>(&self) -> P {
        P::of(self)
    }

    /// A second pool on the same database.
    async fn second_pool<P: PoolOf + SecondPool>(&self) -> P {
        P::second(self).await
    }

    /// The effects of saga `id`'s steps. (The tests of one database share
    /// its topics: each consumer also starts and runs the other tests'
    /// sagas, so every figure is of one saga.)
    async fn effects(&self, id: uuid::Uuid) -> i64 {
        match self {
            Self::Postgres { pool, .. } => {
                sqlx::query_scalar("SELECT count(*) FROM tally_effect WHERE saga_id = $1")
                    .bind(id)
                    .fetch_one(pool)
                    .await
                    .unwrap()
            }
            Self::MariaDb(scratch) => {
                sqlx::query_scalar("SELECT count(*) FROM tally_effect WHERE saga_id = ?")
                    .bind(id)
                    .fetch_one(&scratch.pool)
                    .await
                    .unwrap()
            }
        }
    }

    /// The rows of `table` (`outbox_scheduled`, `inbox_event`) whose
    /// payload's `saga_id` is `id`.
    async fn of_saga(&self, table: &str, id: uuid::Uuid) -> i64 {
        match self {
            Self::Postgres { pool, .. } => sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT count(*) FROM {table} WHERE payload->>'saga_id' = $1"
            )))
            .bind(id.to_string())
            .fetch_one(pool)
            .await
            .unwrap(),
            Self::MariaDb(scratch) => sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT count(*) FROM {table} WHERE JSON_VALUE(payload, '$.saga_id') = ?"
            )))
            .bind(id.to_string())
            .fetch_one(&scratch.pool)
            .await
            .unwrap(),
        }
    }

    /// The saga's status, version and state.
    async fn saga(&self, id: uuid::Uuid) -> Option<(String, i64, serde_json::Value)> {
        match self {
            Self::Postgres { pool, .. } => sqlx::query_as(
                "SELECT status, version, state FROM saga_state
                 WHERE saga_type = 'tally' AND saga_id = $1",
            )
            .bind(id.to_string())
            .fetch_optional(pool)
            .await
            .unwrap(),
            Self::MariaDb(scratch) => {
                let row: Option<(String, i64, String)> = sqlx::query_as(
                    "SELECT status, version, state FROM saga_state
                     WHERE saga_type = 'tally' AND saga_id = ?",
                )
                .bind(id.to_string())
                .fetch_optional(&scratch.pool)
                .await
                .unwrap();
                row.map(|(status, version, state)| {
                    (status, version, serde_json::from_str(&state).unwrap())
                })
            }
        }
    }

    /// The versions the `Added` messages of saga `id` in the outbox name.
    async fn added_versions(&self, id: uuid::Uuid) -> Vec<i64> {
        self.payload_numbers("Added", "on_version", id).await
    }

    /// The step numbers of saga `id`'s `Undo` messages, in the order they
    /// went in.
    async fn undo_steps(&self, id: uuid::Uuid) -> Vec<i64> {
        self.payload_numbers("Undo", "step_no", id).await
    }

    async fn payload_numbers(&self, event_type: &str, field: &str, id: uuid::Uuid) -> Vec<i64> {
        match self {
            Self::Postgres { pool, .. } => sqlx::query_scalar(
                "SELECT (payload->>$2)::int8 FROM outbox_event
                 WHERE event_type = $1 AND payload->>'saga_id' = $3 ORDER BY id",
            )
            .bind(event_type)
            .bind(field)
            .bind(id.to_string())
            .fetch_all(pool)
            .await
            .unwrap(),
            Self::MariaDb(scratch) => sqlx::query_scalar(
                "SELECT CAST(JSON_VALUE(payload, CONCAT('$.', ?)) AS SIGNED)
                 FROM outbox_event
                 WHERE event_type = ? AND JSON_VALUE(payload, '$.saga_id') = ? ORDER BY id",
            )
            .bind(field)
            .bind(event_type)
            .bind(id.to_string())
            .fetch_all(&scratch.pool)
            .await
            .unwrap(),
        }
    }

    /// Closes `second` and drops the database.
    async fn drop<P: SecondPool>(self, second: P) {
        second.close().await;
        self.finish().await;
    }

    /// Drops the database (the tests leave nothing behind).
    async fn finish(self) {
        match self {
            Self::Postgres { pool, name } => {
                pool.close().await;
                txoutbox_testkit::db::drop_databases(&[name]).await.unwrap();
            }
            Self::MariaDb(scratch) => txoutbox_testkit::mysql::MySqlScratch::drop(*scratch).await,
        }
    }
}

/// A second pool of a [`Db`]'s kind.
pub(crate) trait SecondPool: Sized {
    async fn second(db: &Db) -> Self;
    async fn close(self);
}

impl SecondPool for sqlx::PgPool {
    async fn second(db: &Db) -> Self {
        let Db::Postgres { pool, .. } = db else {
            unreachable!("a PostgreSQL suite")
        };
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(5)
            .connect_with((*pool.connect_options()).clone())
            .await
            .unwrap()
    }

    async fn close(self) {
        sqlx::PgPool::close(&self).await;
    }
}

impl SecondPool for sqlx::MySqlPool {
    async fn second(db: &Db) -> Self {
        let Db::MariaDb(scratch) = db else {
            unreachable!("a MariaDB suite")
        };
        sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(5)
            .connect_with(scratch.options())
            .await
            .unwrap()
    }

    async fn close(self) {
        sqlx::MySqlPool::close(&self).await;
    }
}

saga_suite!(
    postgres,
    sqlx::Postgres,
    pool = sqlx::PgPool,
    tally = "saga-backends.pg.tally",
    added = "saga-backends.pg.added",
    undo = "saga-backends.pg.undo",
    insert_effect = "INSERT INTO tally_effect (event_id, saga_id) VALUES ($1, $2)",
    swallow = "SELECT 1 / 0",
    database = Db::postgres(),
);

saga_suite!(
    mariadb,
    sqlx::MySql,
    pool = sqlx::MySqlPool,
    tally = "saga-backends.my.tally",
    added = "saga-backends.my.added",
    undo = "saga-backends.my.undo",
    insert_effect = "INSERT INTO tally_effect (event_id, saga_id) VALUES (?, ?)",
    // MySQL: a failed statement leaves the transaction open; what a
    // swallowed deadlock does is roll it back, which this stands for.
    swallow = "ROLLBACK",
    database = Db::mariadb(),
);
