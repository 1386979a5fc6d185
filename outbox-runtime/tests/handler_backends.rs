//! The command-handler contract on both backends (feature `mysql`): one test
//! body per behaviour, run once on PostgreSQL and once on MariaDB (each test
//! creates and drops its own database on the machine's servers), through
//! `#[outbox_handler]` and through the plain unit-of-work API
//! (`txoutbox_core::transaction` / `txoutbox_core::mysql::transaction`).
//!
//! It proves, reading the rows back from the database: a commit writes the
//! domain row and every recorded event together, and a handler without
//! events writes no outbox row; a handler's `Err` (also a `?` early return)
//! and a panic write nothing, and a panic leaves the pool's connections
//! clean; an unserializable event, an over-long partition key and a
//! duplicate event id fail the unit of work and write nothing; concurrent
//! handlers write every event once; a borrowed connection works, and inside
//! a caller's transaction the unit of work is a savepoint that follows the
//! caller's outcome; transient failures are retried within the bound, then
//! the last error is returned; a swallowed database error is reported on
//! PostgreSQL (the transaction is aborted) and commits the rest on MariaDB
//! (only the statement is rolled back); a commit with events wakes the
//! in-process listeners of its database only.
//!
//! The handlers are typed per database, so each is written twice and thin:
//! both call [`Command::handle`], which does what the test asks through
//! [`HandlerSql`], the statements that differ between the databases. Every
//! assertion is in the generic bodies, over [`Backend`].
#![allow(missing_docs)]

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Serialize, Serializer};
use sqlx::error::DatabaseError;
use sqlx::mysql::MySqlDatabaseError;
use sqlx::{MySql, MySqlConnection, PgConnection, PgPool, Postgres, Transaction};
use tokio::sync::RwLock;
use tokio::task::JoinHandle;
use txoutbox_core::__private::wakeup::{self, CommitListener, Scope};
use txoutbox_core::{DomainEvent, Events, MAX_PARTITION_KEY_BYTES, outbox_handler};
use txoutbox_testkit::db::{connect, create_database, drop_databases, unique_name};
use txoutbox_testkit::mysql::MySqlScratch;
use uuid::Uuid;

/// Connections of each test's pool.
const POOL_SIZE: u32 = 8;

/// The bound of the retrying handlers: `retries = 2` in their attributes
/// (which take a literal) and `.retries(RETRIES)` with the plain API.
const RETRIES: u32 = 2;

/// A commit without a database name (a unit of work on a bare connection)
/// wakes every listener of the process. The tests making such commits hold
/// this for reading, the wake-up test for writing, so that its "not woken"
/// assertions cannot see another test's commit.
static UNSCOPED_COMMITS: RwLock<()> = RwLock::const_new(());

// ---------------------------------------------------------------------------
// The domain: orders, customers, and the events a handler records.

#[derive(Debug, Clone, Serialize, JsonSchema, DomainEvent)]
#[event(topic = "handler-backends.orders", aggregate = "Order")]
struct OrderPlaced {
    event_id: Uuid,
    #[partition_key]
    order_id: i64,
    amount: i64,
}

#[derive(Debug, Clone, Serialize, JsonSchema, DomainEvent)]
#[event(topic = "handler-backends.stock", aggregate = "Stock")]
struct StockReserved {
    event_id: Uuid,
    #[partition_key]
    sku: String,
    quantity: i64,
}

/// Serializes to a JSON array, which the outbox refuses (a payload is an
/// object).
#[derive(Debug, JsonSchema, DomainEvent)]
#[event(topic = "handler-backends.orders", aggregate = "Order")]
struct Unstorable {
    event_id: Uuid,
    #[partition_key]
    order_id: i64,
}

impl Serialize for Unstorable {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq([self.order_id])
    }
}

/// The customer the swallowed duplicate key inserts again.
const EXISTING_CUSTOMER: &str = "INSERT INTO customers (id) VALUES (1)";

/// The handlers' error: `From<txoutbox_core::Error>` is all the framework
/// needs; for retries the `sqlx::Error` stays in the `source()` chain.
#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Outbox(#[from] txoutbox_core::Error),
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("rejected: {0}")]
    Rejected(&'static str),
    /// A transient failure of the database, with the attempt it ended.
    #[error("attempt {attempt}: {source}")]
    Attempt {
        attempt: u32,
        #[source]
        source: sqlx::Error,
    },
}

// ---------------------------------------------------------------------------
// What a handler does: a command, the same on both databases.

/// An event the handler records after inserting its order.
#[derive(Debug, Clone)]
enum Rec {
    /// An `OrderPlaced` of the order.
    Order,
    /// A `StockReserved` of this sku (its partition key).
    Stock(String),
    /// An event that serializes to a JSON array.
    Unstorable,
    /// One `OrderPlaced` recorded twice: a duplicate event id.
    OrderTwice,
}

/// How the handler ends, after its insert and its events.
#[derive(Debug, Clone, Copy)]
enum End {
    /// Returns `Ok`.
    Commit,
    /// Returns `Err(AppError::Rejected)`.
    Reject,
    /// Runs a statement that fails (an unknown table), `?` returning its
    /// error.
    FailingStatement,
    /// Panics.
    Panic,
    /// Inserts an existing customer again and ignores the duplicate key.
    SwallowDuplicateKey,
    /// Fails with the database's transient error on its first `n` attempts,
    /// then returns `Ok`.
    TransientFailures(u32),
}

/// The command of every test handler: insert an order of `amount`, record
/// `records`, then `end`.
#[derive(Debug, Clone)]
struct Command {
    amount: i64,
    records: Vec<Rec>,
    end: End,
    /// Attempts so far, shared by the clones a retrying handler runs.
    attempts: Arc<AtomicU32>,
}

impl Command {
    fn new(amount: i64) -> Self {
        Self {
            amount,
            records: Vec::new(),
            end: End::Commit,
            attempts: Arc::new(AtomicU32::new(0)),
        }
    }

    fn record(mut self, rec: Rec) -> Self {
        self.records.push(rec);
        self
    }

    fn then(mut self, end: End) -> Self {
        self.end = end;
        self
    }

    fn attempts(&self) -> u32 {
        self.attempts.load(Ordering::SeqCst)
    }

    /// The body of every test handler, on either database's connection.
    async fn handle<C: HandlerSql>(
        self,
        conn: &mut C,
        events: &mut Events,
    ) -> Result<Placed, AppError> {
        let attempt = self.attempts.fetch_add(1, Ordering::SeqCst) + 1;
        let order_id = conn.insert_order(self.amount).await?;
        let recorded = self.record_events(events, order_id);
        match self.end {
            End::Commit => {}
            End::Reject => return Err(AppError::Rejected("refused after writing")),
            End::FailingStatement => conn.run("SELECT count(*) FROM no_such_table").await?,
            End::Panic => panic!("the handler panics after its writes"),
            End::SwallowDuplicateKey => {
                let duplicate = conn.run(EXISTING_CUSTOMER).await;
                assert!(duplicate.is_err(), "customer 1 exists: a duplicate key");
            }
            End::TransientFailures(n) if attempt <= n => {
                let source = conn.transient_error().await;
                return Err(AppError::Attempt { attempt, source });
            }
            End::TransientFailures(_) => {}
        }
        Ok(Placed { order_id, recorded })
    }

    /// Records the command's events for order `order_id`; what an outbox
    /// row of each is to hold.
    fn record_events(&self, events: &mut Events, order_id: i64) -> Vec<Expected> {
        let mut expected = Vec::new();
        for (i, rec) in self.records.iter().enumerate() {
            match rec {
                Rec::Order => {
                    let event = order_placed(order_id, self.amount);
                    expected.push(Expected {
                        event_id: event.event_id,
                        topic: "handler-backends.orders",
                        partition_key: order_id.to_string(),
                        event_type: "OrderPlaced",
                        payload: ("amount", self.amount),
                    });
                    events.record(event);
                }
                Rec::Stock(sku) => {
                    let event = StockReserved {
                        event_id: Uuid::now_v7(),
                        sku: sku.clone(),
                        quantity: i as i64,
                    };
                    expected.push(Expected {
                        event_id: event.event_id,
                        topic: "handler-backends.stock",
                        partition_key: sku.clone(),
                        event_type: "StockReserved",
                        payload: ("quantity", i as i64),
                    });
                    events.record(event);
                }
                Rec::Unstorable => events.record(Unstorable {
                    event_id: Uuid::now_v7(),
                    order_id,
                }),
                Rec::OrderTwice => {
                    let event = order_placed(order_id, self.amount);
                    events.record(event.clone());
                    events.record(event);
                }
            }
        }
        expected
    }
}

fn order_placed(order_id: i64, amount: i64) -> OrderPlaced {
    OrderPlaced {
        event_id: Uuid::now_v7(),
        order_id,
        amount,
    }
}

/// What a handler that returned `Ok` did.
#[derive(Debug)]
struct Placed {
    order_id: i64,
    /// Its events, in recording order.
    recorded: Vec<Expected>,
}

/// The outbox row an event is to become.
#[derive(Debug, Clone)]
struct Expected {
    event_id: Uuid,
    topic: &'static str,
    partition_key: String,
    event_type: &'static str,
    /// A field of the payload and its value.
    payload: (&'static str, i64),
}

/// What an `outbox_event` row holds, read alike from both databases.
#[derive(Debug, sqlx::FromRow)]
struct OutboxRow {
    event_id: Uuid,
    topic: String,
    partition_key: String,
    event_type: String,
    payload: sqlx::types::Json<serde_json::Value>,
}

const OUTBOX_ROWS: &str =
    "SELECT event_id, topic, partition_key, event_type, payload FROM outbox_event ORDER BY id";

/// Asserts `rows` are the rows of `expected`, in that order.
fn assert_rows_are(rows: &[OutboxRow], expected: &[Expected]) {
    assert_eq!(
        rows.len(),
        expected.len(),
        "outbox rows {rows:#?}, expected {expected:#?}"
    );
    for (row, expected) in rows.iter().zip(expected) {
        assert_row_is(row, expected);
    }
}

fn assert_row_is(row: &OutboxRow, expected: &Expected) {
    assert_eq!(row.event_id, expected.event_id, "{row:?}");
    assert_eq!(row.topic, expected.topic, "{row:?}");
    assert_eq!(row.partition_key, expected.partition_key, "{row:?}");
    assert_eq!(row.event_type, expected.event_type, "{row:?}");
    let (field, value) = expected.payload;
    assert_eq!(row.payload.0[field], value, "{row:?}");
    assert_eq!(
        row.payload.0["event_id"],
        expected.event_id.to_string(),
        "{row:?}"
    );
}

// ---------------------------------------------------------------------------
// The per-database seam inside a handler.

/// The statements of a handler that differ between the databases.
trait HandlerSql: Send {
    /// Inserts an order of `amount`; its id.
    fn insert_order(
        &mut self,
        amount: i64,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send;

    /// Runs `sql`, written alike for both databases.
    fn run(&mut self, sql: &'static str) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Runs a statement that fails with the database's transient error,
    /// and returns that error.
    fn transient_error(&mut self) -> impl Future<Output = sqlx::Error> + Send;
}

impl HandlerSql for PgConnection {
    async fn insert_order(&mut self, amount: i64) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("INSERT INTO orders (amount) VALUES ($1) RETURNING id")
            .bind(amount)
            .fetch_one(&mut *self)
            .await
    }

    async fn run(&mut self, sql: &'static str) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(sql).execute(&mut *self).await.map(drop)
    }

    /// A serialization failure, SQLSTATE 40001.
    async fn transient_error(&mut self) -> sqlx::Error {
        sqlx::raw_sql(
            "DO $$ BEGIN RAISE EXCEPTION 'could not serialize access' USING ERRCODE = '40001'; \
             END $$",
        )
        .execute(&mut *self)
        .await
        .expect_err("RAISE fails")
    }
}

impl HandlerSql for MySqlConnection {
    async fn insert_order(&mut self, amount: i64) -> Result<i64, sqlx::Error> {
        let id = sqlx::query("INSERT INTO orders (amount) VALUES (?)")
            .bind(amount)
            .execute(&mut *self)
            .await?
            .last_insert_id();
        Ok(i64::try_from(id).expect("an order id fits in i64"))
    }

    async fn run(&mut self, sql: &'static str) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(sql).execute(&mut *self).await.map(drop)
    }

    /// A real lock wait timeout, error 1205: customer 2 is held by another
    /// transaction while a retrying handler runs ([`Maria::place_retried`]),
    /// and `NOWAIT` gives up at once.
    async fn transient_error(&mut self) -> sqlx::Error {
        sqlx::query("SELECT id FROM customers WHERE id = 2 FOR UPDATE NOWAIT")
            .execute(&mut *self)
            .await
            .expect_err("customer 2 is held by another transaction")
    }
}

// ---------------------------------------------------------------------------
// The handlers, thin and typed per database.

#[outbox_handler]
async fn place_pg(
    tx: &mut Transaction<'_, Postgres>,
    events: &mut Events,
    cmd: Command,
) -> Result<Placed, AppError> {
    cmd.handle(&mut **tx, events).await
}

#[outbox_handler]
async fn place_my(
    tx: &mut Transaction<'_, MySql>,
    events: &mut Events,
    cmd: Command,
) -> Result<Placed, AppError> {
    cmd.handle(&mut **tx, events).await
}

#[outbox_handler(retries = 2)]
async fn place_retried_pg(
    tx: &mut Transaction<'_, Postgres>,
    events: &mut Events,
    cmd: Command,
) -> Result<Placed, AppError> {
    cmd.handle(&mut **tx, events).await
}

#[outbox_handler(retries = 2)]
async fn place_retried_my(
    tx: &mut Transaction<'_, MySql>,
    events: &mut Events,
    cmd: Command,
) -> Result<Placed, AppError> {
    cmd.handle(&mut **tx, events).await
}

#[outbox_handler]
async fn place_on_connection_pg(
    conn: &mut PgConnection,
    events: &mut Events,
    cmd: Command,
) -> Result<Placed, AppError> {
    cmd.handle(conn, events).await
}

#[outbox_handler]
async fn place_on_connection_my(
    conn: &mut MySqlConnection,
    events: &mut Events,
    cmd: Command,
) -> Result<Placed, AppError> {
    cmd.handle(conn, events).await
}

// ---------------------------------------------------------------------------
// The backends: a scratch database of either kind, and how a test reaches
// the handlers on it.

/// How the test calls the handler.
#[derive(Debug, Clone, Copy)]
enum Api {
    /// The wrapper `#[outbox_handler]` generates.
    Macro,
    /// `transaction(source).run(..)` (`.retries(RETRIES)` to retry).
    Plain,
}

impl Api {
    const BOTH: [Self; 2] = [Self::Macro, Self::Plain];
}

/// The caller's transaction around a unit of work: the customer it inserts
/// itself, and whether it commits.
#[derive(Debug, Clone, Copy)]
struct Caller {
    customer: i64,
    commits: bool,
}

impl Caller {
    fn own_write(self) -> sqlx::AssertSqlSafe<String> {
        sqlx::AssertSqlSafe(format!(
            "INSERT INTO customers (id) VALUES ({})",
            self.customer
        ))
    }
}

/// A unit of work inside a caller's transaction.
#[derive(Debug)]
struct InCallersTransaction {
    result: Result<Placed, AppError>,
    /// Outbox rows other connections saw before the caller ended.
    outbox_rows_seen_by_others: i64,
}

/// Units of work one after the other on one borrowed connection.
#[derive(Debug)]
struct OnOneConnection {
    results: Vec<Result<Placed, AppError>>,
    /// Whether the connection was still in a transaction afterwards.
    transaction_left_open: bool,
}

/// A scratch database, migrated, with the domain tables: `orders` and
/// `customers` 1 and 2.
trait Backend: Sized {
    /// Whether a failed statement aborts the whole transaction. PostgreSQL:
    /// yes, every later statement is refused and `COMMIT` rolls back.
    /// MariaDB: no, only the statement is rolled back and the transaction
    /// goes on.
    const A_FAILED_STATEMENT_ABORTS_THE_TRANSACTION: bool;

    /// The code of [`HandlerSql::transient_error`], as [`Backend::error_code`]
    /// gives it.
    const TRANSIENT_ERROR: &'static str;

    /// SQLSTATE on PostgreSQL, the error number on MariaDB.
    fn error_code(error: &dyn DatabaseError) -> String;

    async fn create() -> Self;

    fn database_name(&self) -> &str;

    /// Runs `cmd` in a unit of work on the pool.
    async fn place(&self, api: Api, cmd: Command) -> Result<Placed, AppError>;

    /// [`Backend::place`] in a task of its own.
    fn spawn_place(&self, api: Api, cmd: Command) -> JoinHandle<Result<Placed, AppError>>;

    /// Runs `cmd` in a unit of work on the pool retrying `RETRIES` times.
    async fn place_retried(&self, api: Api, cmd: Command) -> Result<Placed, AppError>;

    /// Runs `commands` one after the other on one connection of the pool.
    async fn place_on_one_connection(&self, api: Api, commands: Vec<Command>) -> OnOneConnection;

    /// Runs `cmd` on the connection of `caller`'s transaction.
    async fn place_in_callers_transaction(
        &self,
        api: Api,
        cmd: Command,
        caller: Caller,
    ) -> InCallersTransaction;

    /// The single integer `sql` returns, written alike for both databases.
    async fn count(&self, sql: &str) -> i64;

    async fn outbox_rows(&self) -> Vec<OutboxRow>;

    async fn drop(self);

    async fn rows(&self, table: &str) -> i64 {
        self.count(&format!("SELECT count(*) FROM {table}")).await
    }

    /// Whether order `order_id` of `amount` is there.
    async fn has_order(&self, order_id: i64, amount: i64) -> bool {
        let sql =
            format!("SELECT count(*) FROM orders WHERE id = {order_id} AND amount = {amount}");
        self.count(&sql).await == 1
    }
}

struct Pg {
    pool: PgPool,
    name: String,
}

impl Pg {
    async fn place_on(pool: &PgPool, api: Api, cmd: Command) -> Result<Placed, AppError> {
        match api {
            Api::Macro => place_pg(pool, cmd).await,
            Api::Plain => {
                txoutbox_core::transaction(pool)
                    .run(async move |tx, events| cmd.handle(&mut **tx, events).await)
                    .await
            }
        }
    }
}

impl Backend for Pg {
    const A_FAILED_STATEMENT_ABORTS_THE_TRANSACTION: bool = true;
    const TRANSIENT_ERROR: &'static str = "40001";

    fn error_code(error: &dyn DatabaseError) -> String {
        error.code().unwrap_or_default().into_owned()
    }

    async fn create() -> Self {
        txoutbox_testkit::init_tracing();
        let name = unique_name("handler_backends");
        create_database(&name).await;
        let pool = connect(&name, POOL_SIZE).await;
        txoutbox_runtime::migrations::run(&pool).await.unwrap();
        sqlx::raw_sql(
            "CREATE TABLE orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                                  amount bigint NOT NULL);
             CREATE TABLE customers (id bigint PRIMARY KEY);
             INSERT INTO customers (id) VALUES (1), (2);",
        )
        .execute(&pool)
        .await
        .unwrap();
        Self { pool, name }
    }

    fn database_name(&self) -> &str {
        &self.name
    }

    async fn place(&self, api: Api, cmd: Command) -> Result<Placed, AppError> {
        Self::place_on(&self.pool, api, cmd).await
    }

    fn spawn_place(&self, api: Api, cmd: Command) -> JoinHandle<Result<Placed, AppError>> {
        let pool = self.pool.clone();
        tokio::spawn(async move { Self::place_on(&pool, api, cmd).await })
    }

    async fn place_retried(&self, api: Api, cmd: Command) -> Result<Placed, AppError> {
        match api {
            Api::Macro => place_retried_pg(&self.pool, cmd).await,
            Api::Plain => {
                txoutbox_core::transaction(&self.pool)
                    .retries(RETRIES)
                    .run(async |tx, events| cmd.clone().handle(&mut **tx, events).await)
                    .await
            }
        }
    }

    async fn place_on_one_connection(&self, api: Api, commands: Vec<Command>) -> OnOneConnection {
        let mut conn = self.pool.acquire().await.unwrap();
        let mut results = Vec::new();
        for cmd in commands {
            results.push(match api {
                Api::Macro => place_on_connection_pg(&mut *conn, cmd).await,
                Api::Plain => {
                    txoutbox_core::transaction(&mut *conn)
                        .run(async move |tx, events| cmd.handle(&mut **tx, events).await)
                        .await
                }
            });
        }
        // A transaction left open would still hold the id of its writes.
        let transaction_left_open =
            sqlx::query_scalar("SELECT pg_current_xact_id_if_assigned() IS NOT NULL")
                .fetch_one(&mut *conn)
                .await
                .unwrap();
        OnOneConnection {
            results,
            transaction_left_open,
        }
    }

    async fn place_in_callers_transaction(
        &self,
        api: Api,
        cmd: Command,
        caller: Caller,
    ) -> InCallersTransaction {
        let mut outer = self.pool.begin().await.unwrap();
        sqlx::raw_sql(caller.own_write())
            .execute(&mut *outer)
            .await
            .unwrap();
        let result = match api {
            Api::Macro => place_pg(&mut *outer, cmd).await,
            Api::Plain => {
                txoutbox_core::transaction(&mut *outer)
                    .run(async move |tx, events| cmd.handle(&mut **tx, events).await)
                    .await
            }
        };
        let outbox_rows_seen_by_others = self.rows("outbox_event").await;
        if caller.commits {
            outer.commit().await.unwrap();
        } else {
            outer.rollback().await.unwrap();
        }
        InCallersTransaction {
            result,
            outbox_rows_seen_by_others,
        }
    }

    async fn count(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_one(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    async fn outbox_rows(&self) -> Vec<OutboxRow> {
        sqlx::query_as(OUTBOX_ROWS)
            .fetch_all(&self.pool)
            .await
            .unwrap()
    }

    async fn drop(self) {
        self.pool.close().await;
        drop_databases(&[self.name]).await.unwrap();
    }
}

struct Maria(MySqlScratch);

impl Maria {
    async fn place_on(pool: &sqlx::MySqlPool, api: Api, cmd: Command) -> Result<Placed, AppError> {
        match api {
            Api::Macro => place_my(pool, cmd).await,
            Api::Plain => {
                txoutbox_core::mysql::transaction(pool)
                    .run(async move |tx, events| cmd.handle(&mut **tx, events).await)
                    .await
            }
        }
    }
}

impl Backend for Maria {
    const A_FAILED_STATEMENT_ABORTS_THE_TRANSACTION: bool = false;
    const TRANSIENT_ERROR: &'static str = "1205";

    fn error_code(error: &dyn DatabaseError) -> String {
        error
            .try_downcast_ref::<MySqlDatabaseError>()
            .map(|error| error.number().to_string())
            .unwrap_or_default()
    }

    async fn create() -> Self {
        txoutbox_testkit::init_tracing();
        let scratch = MySqlScratch::create(POOL_SIZE).await;
        txoutbox_runtime::migrations::run(&scratch.pool)
            .await
            .unwrap();
        sqlx::raw_sql(
            "CREATE TABLE orders (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
                                  amount BIGINT NOT NULL) ENGINE = InnoDB;
             CREATE TABLE customers (id BIGINT NOT NULL PRIMARY KEY) ENGINE = InnoDB;
             INSERT INTO customers (id) VALUES (1), (2);",
        )
        .execute(&scratch.pool)
        .await
        .unwrap();
        Self(scratch)
    }

    fn database_name(&self) -> &str {
        &self.0.name
    }

    async fn place(&self, api: Api, cmd: Command) -> Result<Placed, AppError> {
        Self::place_on(&self.0.pool, api, cmd).await
    }

    fn spawn_place(&self, api: Api, cmd: Command) -> JoinHandle<Result<Placed, AppError>> {
        let pool = self.0.pool.clone();
        tokio::spawn(async move { Self::place_on(&pool, api, cmd).await })
    }

    /// While another transaction holds customer 2, which the failing
    /// attempts lock with `NOWAIT` ([`HandlerSql::transient_error`]).
    async fn place_retried(&self, api: Api, cmd: Command) -> Result<Placed, AppError> {
        let mut holder = self.0.pool.begin().await.unwrap();
        sqlx::query("SELECT id FROM customers WHERE id = 2 FOR UPDATE")
            .execute(&mut *holder)
            .await
            .unwrap();
        let result = match api {
            Api::Macro => place_retried_my(&self.0.pool, cmd).await,
            Api::Plain => {
                txoutbox_core::mysql::transaction(&self.0.pool)
                    .retries(RETRIES)
                    .run(async |tx, events| cmd.clone().handle(&mut **tx, events).await)
                    .await
            }
        };
        holder.rollback().await.unwrap();
        result
    }

    async fn place_on_one_connection(&self, api: Api, commands: Vec<Command>) -> OnOneConnection {
        let mut conn = self.0.pool.acquire().await.unwrap();
        let mut results = Vec::new();
        for cmd in commands {
            results.push(match api {
                Api::Macro => place_on_connection_my(&mut *conn, cmd).await,
                Api::Plain => {
                    txoutbox_core::mysql::transaction(&mut *conn)
                        .run(async move |tx, events| cmd.handle(&mut **tx, events).await)
                        .await
                }
            });
        }
        let open: i64 = sqlx::query_scalar("SELECT CAST(@@in_transaction AS SIGNED)")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        OnOneConnection {
            results,
            transaction_left_open: open == 1,
        }
    }

    async fn place_in_callers_transaction(
        &self,
        api: Api,
        cmd: Command,
        caller: Caller,
    ) -> InCallersTransaction {
        let mut outer = self.0.pool.begin().await.unwrap();
        sqlx::raw_sql(caller.own_write())
            .execute(&mut *outer)
            .await
            .unwrap();
        let result = match api {
            Api::Macro => place_my(&mut *outer, cmd).await,
            Api::Plain => {
                txoutbox_core::mysql::transaction(&mut *outer)
                    .run(async move |tx, events| cmd.handle(&mut **tx, events).await)
                    .await
            }
        };
        let outbox_rows_seen_by_others = self.rows("outbox_event").await;
        if caller.commits {
            outer.commit().await.unwrap();
        } else {
            outer.rollback().await.unwrap();
        }
        InCallersTransaction {
            result,
            outbox_rows_seen_by_others,
        }
    }

    async fn count(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_one(&self.0.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    async fn outbox_rows(&self) -> Vec<OutboxRow> {
        sqlx::query_as(OUTBOX_ROWS)
            .fetch_all(&self.0.pool)
            .await
            .unwrap()
    }

    async fn drop(self) {
        self.0.drop().await;
    }
}

/// Two tests of the generic `body`: on PostgreSQL and on MariaDB.
macro_rules! on_both {
    ($body:ident: $postgres:ident, $mariadb:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $postgres() {
            $body::<Pg>().await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $mariadb() {
            $body::<Maria>().await;
        }
    };
}

// ---------------------------------------------------------------------------
// The behaviours.

on_both!(
    commit_writes_the_row_and_every_event:
    commit_writes_the_row_and_every_event_postgres,
    commit_writes_the_row_and_every_event_mariadb
);

/// The domain row and every recorded event commit together, the outbox rows
/// in recording order and holding what was recorded; a handler that records
/// nothing commits its writes and no outbox row.
async fn commit_writes_the_row_and_every_event<B: Backend>() {
    let db = B::create().await;
    let mut written = Vec::new();
    for api in Api::BOTH {
        let cmd = Command::new(42)
            .record(Rec::Order)
            .record(Rec::Stock("sku-1".into()))
            .record(Rec::Order);
        let placed = db.place(api, cmd).await.unwrap();
        assert!(db.has_order(placed.order_id, 42).await, "{api:?}");
        assert_eq!(placed.recorded.len(), 3);
        written.extend(placed.recorded);
        assert_rows_are(&db.outbox_rows().await, &written);

        let quiet = db.place(api, Command::new(5)).await.unwrap();
        assert!(quiet.recorded.is_empty());
        assert!(db.has_order(quiet.order_id, 5).await, "{api:?}");
        assert_rows_are(&db.outbox_rows().await, &written);
    }
    assert_eq!(db.rows("orders").await, 4);
    assert_eq!(db.rows("outbox_event").await, 6);
    db.drop().await;
}

on_both!(
    an_error_writes_nothing:
    an_error_writes_nothing_postgres,
    an_error_writes_nothing_mariadb
);

/// A handler that returns `Err` after writing and recording, itself or by a
/// `?` on a failed statement, writes nothing, and its error reaches the
/// caller.
async fn an_error_writes_nothing<B: Backend>() {
    let db = B::create().await;
    for api in Api::BOTH {
        let cmd = Command::new(10).record(Rec::Order).then(End::Reject);
        let result = db.place(api, cmd).await;
        assert!(
            matches!(result, Err(AppError::Rejected("refused after writing"))),
            "{api:?}: {result:?}"
        );

        let cmd = Command::new(11)
            .record(Rec::Order)
            .record(Rec::Stock("sku-2".into()))
            .then(End::FailingStatement);
        let result = db.place(api, cmd).await;
        let Err(AppError::Db(sqlx::Error::Database(error))) = &result else {
            panic!("{api:?}: expected the failed statement's error, got {result:?}");
        };
        assert!(error.message().contains("no_such_table"), "{error}");
    }
    assert_eq!(db.rows("orders").await, 0);
    assert_eq!(db.rows("outbox_event").await, 0);
    db.drop().await;
}

on_both!(
    a_panic_writes_nothing_and_leaves_the_pool_clean:
    a_panic_writes_nothing_and_leaves_the_pool_clean_postgres,
    a_panic_writes_nothing_and_leaves_the_pool_clean_mariadb
);

/// Handlers that panic after their writes (as many at once as the pool has
/// connections, by each API) write nothing, and then every connection of
/// the pool commits again: `POOL_SIZE + 1` commits at once.
async fn a_panic_writes_nothing_and_leaves_the_pool_clean<B: Backend>() {
    let db = B::create().await;
    for api in Api::BOTH {
        let panicking: Vec<_> = (0..POOL_SIZE)
            .map(|_| {
                let cmd = Command::new(13).record(Rec::Order).then(End::Panic);
                db.spawn_place(api, cmd)
            })
            .collect();
        for task in panicking {
            let outcome = task.await;
            assert!(
                outcome.as_ref().is_err_and(|e| e.is_panic()),
                "{api:?}: {outcome:?}"
            );
        }
    }
    assert_eq!(db.rows("orders").await, 0);
    assert_eq!(db.rows("outbox_event").await, 0);

    let commits: Vec<_> = (0..=POOL_SIZE)
        .map(|i| {
            let cmd = Command::new(i64::from(i)).record(Rec::Order);
            db.spawn_place(Api::BOTH[i as usize % 2], cmd)
        })
        .collect();
    let mut written = Vec::new();
    for task in commits {
        let placed = task
            .await
            .unwrap()
            .expect("the pool's connections are clean");
        written.extend(placed.recorded);
    }
    let expected = i64::from(POOL_SIZE) + 1;
    assert_eq!(db.rows("orders").await, expected);
    assert_eq!(db.rows("outbox_event").await, expected);
    let rows: HashSet<Uuid> = db.outbox_rows().await.iter().map(|r| r.event_id).collect();
    assert_eq!(rows, written.iter().map(|e| e.event_id).collect());
    db.drop().await;
}

on_both!(
    refused_events_fail_the_unit_of_work:
    refused_events_fail_the_unit_of_work_postgres,
    refused_events_fail_the_unit_of_work_mariadb
);

/// An event that cannot be serialized (to a JSON object), a partition key
/// longer than `MAX_PARTITION_KEY_BYTES` and a duplicate event id each fail
/// the unit of work, which writes nothing; a key at the limit is accepted.
async fn refused_events_fail_the_unit_of_work<B: Backend>() {
    let db = B::create().await;
    let too_long = "k".repeat(MAX_PARTITION_KEY_BYTES + 1);
    for api in Api::BOTH {
        let cmd = Command::new(1).record(Rec::Order).record(Rec::Unstorable);
        let result = db.place(api, cmd).await;
        assert!(
            matches!(
                result,
                Err(AppError::Outbox(txoutbox_core::Error::PayloadNotObject {
                    event_type: "Unstorable",
                    ..
                }))
            ),
            "{api:?}: {result:?}"
        );

        let cmd = Command::new(2)
            .record(Rec::Order)
            .record(Rec::Stock(too_long.clone()));
        let result = db.place(api, cmd).await;
        assert!(
            matches!(
                &result,
                Err(AppError::Outbox(txoutbox_core::Error::PartitionKeyTooLong {
                    event_type: "StockReserved",
                    len,
                    max: MAX_PARTITION_KEY_BYTES,
                })) if *len == too_long.len()
            ),
            "{api:?}: {result:?}"
        );

        let cmd = Command::new(3).record(Rec::OrderTwice);
        let result = db.place(api, cmd).await;
        let Err(AppError::Outbox(txoutbox_core::Error::Database(sqlx::Error::Database(error)))) =
            &result
        else {
            panic!("{api:?}: expected the outbox insert's duplicate key, got {result:?}");
        };
        assert_eq!(
            error.kind(),
            sqlx::error::ErrorKind::UniqueViolation,
            "{error}"
        );
    }
    assert_eq!(db.rows("orders").await, 0);
    assert_eq!(db.rows("outbox_event").await, 0);

    let at_limit = "k".repeat(MAX_PARTITION_KEY_BYTES);
    let cmd = Command::new(4).record(Rec::Stock(at_limit));
    let placed = db.place(Api::Macro, cmd).await.unwrap();
    assert_rows_are(&db.outbox_rows().await, &placed.recorded);
    db.drop().await;
}

on_both!(
    concurrent_handlers_write_all_their_events:
    concurrent_handlers_write_all_their_events_postgres,
    concurrent_handlers_write_all_their_events_mariadb
);

/// 16 handlers at once, 5 events each (the two APIs alternating): every
/// event is written once, each transaction's in recording order.
async fn concurrent_handlers_write_all_their_events<B: Backend>() {
    const HANDLERS: usize = 16;
    const EVENTS: usize = 5;
    let db = B::create().await;
    let tasks: Vec<_> = (0..HANDLERS)
        .map(|i| {
            let mut cmd = Command::new(i as i64);
            for k in 0..EVENTS {
                cmd = cmd.record(if k % 2 == 0 {
                    Rec::Order
                } else {
                    Rec::Stock(format!("sku-{i}-{k}"))
                });
            }
            db.spawn_place(Api::BOTH[i % 2], cmd)
        })
        .collect();
    let mut placed = Vec::new();
    for task in tasks {
        placed.push(task.await.unwrap().unwrap());
    }
    let orders: HashSet<i64> = placed.iter().map(|p| p.order_id).collect();
    assert_eq!(orders.len(), HANDLERS);
    assert_eq!(db.rows("orders").await, HANDLERS as i64);

    let rows = db.outbox_rows().await;
    assert_eq!(rows.len(), HANDLERS * EVENTS);
    let position: HashMap<Uuid, usize> = rows
        .iter()
        .enumerate()
        .map(|(i, row)| (row.event_id, i))
        .collect();
    assert_eq!(position.len(), HANDLERS * EVENTS, "each event id once");
    for handler in &placed {
        assert_eq!(handler.recorded.len(), EVENTS);
        let mut previous = None;
        for expected in &handler.recorded {
            let at = position[&expected.event_id];
            assert_row_is(&rows[at], expected);
            assert!(previous < Some(at), "recording order: {handler:?}");
            previous = Some(at);
        }
    }
    db.drop().await;
}

on_both!(
    runs_on_a_borrowed_connection:
    runs_on_a_borrowed_connection_postgres,
    runs_on_a_borrowed_connection_mariadb
);

/// On a borrowed connection (`&mut PgConnection` / `&mut MySqlConnection`)
/// units of work commit, roll back and commit again, one after the other,
/// leaving no transaction open on it.
async fn runs_on_a_borrowed_connection<B: Backend>() {
    let _unscoped = UNSCOPED_COMMITS.read().await;
    let db = B::create().await;
    let mut written = Vec::new();
    for api in Api::BOTH {
        let commands = vec![
            Command::new(1).record(Rec::Order),
            Command::new(2).record(Rec::Order).then(End::Reject),
            Command::new(3),
        ];
        let run = db.place_on_one_connection(api, commands).await;
        assert!(!run.transaction_left_open, "{api:?}");
        let [committed, rejected, quiet]: [_; 3] = run.results.try_into().unwrap();
        let committed = committed.unwrap();
        assert!(db.has_order(committed.order_id, 1).await, "{api:?}");
        written.extend(committed.recorded);
        assert!(
            matches!(rejected, Err(AppError::Rejected(_))),
            "{rejected:?}"
        );
        assert!(db.has_order(quiet.unwrap().order_id, 3).await, "{api:?}");
    }
    assert_eq!(db.rows("orders").await, 4);
    assert_rows_are(&db.outbox_rows().await, &written);
    db.drop().await;
}

on_both!(
    inside_a_callers_transaction_it_is_a_savepoint:
    inside_a_callers_transaction_it_is_a_savepoint_postgres,
    inside_a_callers_transaction_it_is_a_savepoint_mariadb
);

/// Inside a transaction the caller opened, the unit of work is a savepoint:
/// its rows and events commit or roll back with the caller's own write, and
/// a handler failing in it (by a failed statement) rolls back to the
/// savepoint only, the caller's transaction still committing.
async fn inside_a_callers_transaction_it_is_a_savepoint<B: Backend>() {
    let _unscoped = UNSCOPED_COMMITS.read().await;
    let db = B::create().await;
    let mut written = Vec::new();
    let mut customer = 100;
    let mut caller = |commits| {
        customer += 1;
        Caller { customer, commits }
    };
    for api in Api::BOTH {
        let cmd = Command::new(1).record(Rec::Order);
        let run = db
            .place_in_callers_transaction(api, cmd, caller(false))
            .await;
        let rolled_back = run.result.unwrap();
        assert_eq!(run.outbox_rows_seen_by_others, written.len() as i64);
        assert!(!db.has_order(rolled_back.order_id, 1).await, "{api:?}");

        let cmd = Command::new(2).record(Rec::Order);
        let run = db
            .place_in_callers_transaction(api, cmd, caller(true))
            .await;
        let committed = run.result.unwrap();
        assert_eq!(
            run.outbox_rows_seen_by_others,
            written.len() as i64,
            "{api:?}: not visible before the caller commits"
        );
        assert!(db.has_order(committed.order_id, 2).await, "{api:?}");
        written.extend(committed.recorded);

        let cmd = Command::new(3)
            .record(Rec::Order)
            .then(End::FailingStatement);
        let run = db
            .place_in_callers_transaction(api, cmd, caller(true))
            .await;
        assert!(
            matches!(run.result, Err(AppError::Db(_))),
            "{api:?}: {:?}",
            run.result
        );
    }
    assert_eq!(db.rows("orders").await, 2);
    assert_rows_are(&db.outbox_rows().await, &written);
    // 1 and 2, and the own write of the four callers that committed.
    assert_eq!(db.rows("customers").await, 2 + 4);
    db.drop().await;
}

on_both!(
    transient_failures_are_retried_within_the_bound:
    transient_failures_are_retried_within_the_bound_postgres,
    transient_failures_are_retried_within_the_bound_mariadb
);

/// With `retries = 2`, a handler failing with the database's transient
/// error (PostgreSQL: SQLSTATE 40001; MariaDB: a real lock wait timeout,
/// 1205) on its first two attempts commits once on the third; failing on
/// three it gives up with the last attempt's error; another error is not
/// retried.
async fn transient_failures_are_retried_within_the_bound<B: Backend>() {
    let db = B::create().await;
    let mut written = Vec::new();
    for api in Api::BOTH {
        let cmd = Command::new(7)
            .record(Rec::Order)
            .then(End::TransientFailures(RETRIES));
        let placed = db.place_retried(api, cmd.clone()).await.unwrap();
        assert_eq!(cmd.attempts(), RETRIES + 1, "{api:?}");
        assert!(db.has_order(placed.order_id, 7).await, "{api:?}");
        written.extend(placed.recorded);

        let cmd = Command::new(8)
            .record(Rec::Order)
            .then(End::TransientFailures(RETRIES + 1));
        let error = db.place_retried(api, cmd.clone()).await.unwrap_err();
        assert_eq!(cmd.attempts(), RETRIES + 1, "{api:?}: {error}");
        assert!(txoutbox_core::is_transient_error(&error), "{error:?}");
        let AppError::Attempt {
            attempt,
            source: sqlx::Error::Database(db_error),
        } = &error
        else {
            panic!("{api:?}: expected the transient error, got {error:?}");
        };
        assert_eq!(*attempt, RETRIES + 1, "the last attempt's error");
        assert_eq!(B::error_code(&**db_error), B::TRANSIENT_ERROR);

        let cmd = Command::new(9)
            .record(Rec::Order)
            .then(End::FailingStatement);
        let error = db.place_retried(api, cmd.clone()).await.unwrap_err();
        assert_eq!(cmd.attempts(), 1, "{api:?}: not retried: {error}");
    }
    assert_eq!(db.rows("orders").await, 2);
    assert_rows_are(&db.outbox_rows().await, &written);
    db.drop().await;
}

on_both!(
    a_swallowed_database_error:
    a_swallowed_database_error_postgres,
    a_swallowed_database_error_mariadb
);

/// A handler that swallows a database error (a duplicate key) and returns
/// `Ok`, with events and without. Where the databases differ:
/// PostgreSQL aborts the transaction at the failed statement and would
/// answer `COMMIT` with a silent rollback, so the unit of work reports
/// `Error::TransactionAborted` and nothing is written; MariaDB rolls back
/// the failed statement only and the transaction goes on, so the order and
/// its events commit ([`Backend::A_FAILED_STATEMENT_ABORTS_THE_TRANSACTION`]).
async fn a_swallowed_database_error<B: Backend>() {
    let db = B::create().await;
    let mut orders = 0;
    let mut written = Vec::new();
    for api in Api::BOTH {
        for with_events in [false, true] {
            let mut cmd = Command::new(10).then(End::SwallowDuplicateKey);
            if with_events {
                cmd = cmd.record(Rec::Order);
            }
            let result = db.place(api, cmd).await;
            if B::A_FAILED_STATEMENT_ABORTS_THE_TRANSACTION {
                assert!(
                    matches!(
                        result,
                        Err(AppError::Outbox(txoutbox_core::Error::TransactionAborted))
                    ),
                    "{api:?}, events {with_events}: {result:?}"
                );
            } else {
                let placed = result.unwrap();
                assert!(db.has_order(placed.order_id, 10).await, "{api:?}");
                orders += 1;
                written.extend(placed.recorded);
            }
        }
    }
    assert_eq!(db.rows("orders").await, orders);
    assert_rows_are(&db.outbox_rows().await, &written);
    assert_eq!(db.rows("customers").await, 2, "the duplicate never went in");
    db.drop().await;
}

on_both!(
    a_commit_with_events_wakes_its_databases_listeners:
    a_commit_with_events_wakes_its_databases_listeners_postgres,
    a_commit_with_events_wakes_its_databases_listeners_mariadb
);

/// Long enough for a wake-up already sent to be seen.
const QUIET: Duration = Duration::from_millis(100);

async fn woken(listener: &mut CommitListener) -> bool {
    tokio::time::timeout(QUIET, listener.committed())
        .await
        .is_ok()
}

/// The in-process wake-up: a listener scoped to the pool's database is
/// woken by a commit that wrote events, once, and not by a rollback, a
/// failed outbox insert or a commit without events; a listener scoped to
/// another database is not woken by any of them.
async fn a_commit_with_events_wakes_its_databases_listeners<B: Backend>() {
    // Alone: an unscoped commit of another test would wake both listeners.
    let _alone = UNSCOPED_COMMITS.write().await;
    let db = B::create().await;
    let own = Scope::of_database(Some(db.database_name()));
    let elsewhere_name = format!("{}_elsewhere", db.database_name());
    let elsewhere = Scope::of_database(Some(elsewhere_name.as_str()));
    let mut relay = wakeup::listener_in(own);
    let mut other_relay = wakeup::listener_in(elsewhere);
    for api in Api::BOTH {
        let cmd = Command::new(1).record(Rec::Order).then(End::Reject);
        assert!(db.place(api, cmd).await.is_err());
        assert!(!woken(&mut relay).await, "{api:?}: after a rollback");

        let cmd = Command::new(2).record(Rec::OrderTwice);
        assert!(db.place(api, cmd).await.is_err());
        assert!(!woken(&mut relay).await, "{api:?}: after a failed insert");

        db.place(api, Command::new(3)).await.unwrap();
        assert!(!woken(&mut relay).await, "{api:?}: after no event");

        db.place(api, Command::new(4).record(Rec::Order))
            .await
            .unwrap();
        assert!(
            woken(&mut relay).await,
            "{api:?}: after a commit with events"
        );
        assert!(!woken(&mut relay).await, "{api:?}: one commit, one wake-up");
        assert!(!woken(&mut other_relay).await, "{api:?}: another database");
    }
    assert_eq!(db.rows("orders").await, 4);
    assert_eq!(db.rows("outbox_event").await, 2);
    // The other listener is live: its own database's commit wakes it.
    wakeup::notify_committed_in(elsewhere);
    assert!(woken(&mut other_relay).await);
    assert!(!woken(&mut relay).await);
    db.drop().await;
}
