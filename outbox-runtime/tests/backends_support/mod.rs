//! What the consumer tests that run one body on both databases share: a
//! scratch database of either backend with the `effect` table, a consumer
//! spawned on it with the settings a test changes, and portable reads.
#![allow(dead_code, missing_docs)]

use std::collections::HashMap;
use std::time::Duration;

use sqlx::{MySql, PgPool, Postgres};
use txoutbox_core::Backoff;
use txoutbox_runtime::consumer::{
    Consumer, ConsumerBuilder, ConsumerDatabase, ConsumerHandle, EventHandler, Mode,
    UnknownEventPolicy,
};
use txoutbox_testkit::db::{connect, create_database, drop_databases, unique_name};
use txoutbox_testkit::mysql::MySqlScratch;
use uuid::Uuid;

use super::consumer_support::kafka_config;

/// The consumer settings a test changes.
#[derive(Clone, Copy)]
pub(crate) struct Setup {
    pub(crate) mode: Mode,
    pub(crate) max_attempts: u32,
    pub(crate) handler_timeout: Duration,
    pub(crate) processors: usize,
    pub(crate) processor_batch_size: usize,
    pub(crate) handle_on_receipt: bool,
    pub(crate) unknown: UnknownEventPolicy,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            mode: Mode::Dedup,
            max_attempts: 3,
            handler_timeout: Duration::from_secs(30),
            processors: 2,
            processor_batch_size: 500,
            handle_on_receipt: true,
            unknown: UnknownEventPolicy::Skip,
        }
    }
}

impl Setup {
    /// Inbox mode with the defaults otherwise.
    pub(crate) fn inbox() -> Self {
        Self {
            mode: Mode::Inbox,
            ..Self::default()
        }
    }

    fn apply<DB: ConsumerDatabase>(self, builder: ConsumerBuilder<DB>) -> ConsumerBuilder<DB> {
        builder
            .mode(self.mode)
            .max_attempts(self.max_attempts)
            .handler_timeout(self.handler_timeout)
            .processors(self.processors)
            .processor_batch_size(self.processor_batch_size)
            .handle_on_receipt(self.handle_on_receipt)
            .unknown_events(self.unknown)
            .processor_poll_interval(Duration::from_millis(20))
            .backoff(Backoff::new(
                Duration::from_millis(10),
                Duration::from_millis(50),
            ))
    }
}

/// A scratch database of either backend, migrated, with the effect table:
/// one row per handler call that committed, `id` in commit order within a
/// key.
pub(crate) enum Db {
    Postgres { pool: PgPool, name: String },
    MariaDb(Box<MySqlScratch>),
}

impl Db {
    pub(crate) async fn postgres() -> Self {
        txoutbox_testkit::init_tracing();
        let name = unique_name("consumer_backends");
        create_database(&name).await;
        let pool = connect(&name, 8).await;
        txoutbox_runtime::migrations::run(&pool).await.unwrap();
        sqlx::raw_sql(
            "CREATE TABLE effect (id bigserial PRIMARY KEY, event_id uuid NOT NULL,
                 order_id uuid, amount bigint NOT NULL, note text)",
        )
        .execute(&pool)
        .await
        .unwrap();
        Self::Postgres { pool, name }
    }

    pub(crate) async fn mariadb() -> Self {
        txoutbox_testkit::init_tracing();
        let scratch = MySqlScratch::create(8).await;
        txoutbox_runtime::migrations::run(&scratch.pool)
            .await
            .unwrap();
        sqlx::raw_sql(
            "CREATE TABLE effect (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
                 event_id BINARY(16) NOT NULL, order_id BINARY(16), amount BIGINT NOT NULL,
                 note TEXT)",
        )
        .execute(&scratch.pool)
        .await
        .unwrap();
        Self::MariaDb(Box::new(scratch))
    }

    pub(crate) fn is_mariadb(&self) -> bool {
        matches!(self, Self::MariaDb(_))
    }

    /// Spawns a consumer of `group` with the database's handler.
    pub(crate) fn spawn<P, M>(
        &self,
        group: &str,
        setup: Setup,
        postgres: P,
        mysql: M,
    ) -> ConsumerHandle
    where
        P: EventHandler<Postgres>,
        M: EventHandler<MySql>,
    {
        self.spawn_with(group, setup, |b| b.handler(postgres), |b| b.handler(mysql))
    }

    /// Spawns a consumer of `group` whose handlers `postgres` or `mysql`
    /// register.
    pub(crate) fn spawn_with<P, M>(
        &self,
        group: &str,
        setup: Setup,
        postgres: P,
        mysql: M,
    ) -> ConsumerHandle
    where
        P: FnOnce(ConsumerBuilder<Postgres>) -> ConsumerBuilder<Postgres>,
        M: FnOnce(ConsumerBuilder<MySql>) -> ConsumerBuilder<MySql>,
    {
        match self {
            Self::Postgres { pool, .. } => {
                let builder = Consumer::builder(pool.clone(), kafka_config(), group);
                setup.apply(postgres(builder)).build().unwrap().spawn()
            }
            Self::MariaDb(scratch) => {
                let builder = Consumer::builder(scratch.pool.clone(), kafka_config(), group);
                setup.apply(mysql(builder)).build().unwrap().spawn()
            }
        }
    }

    /// The effects of `ids`: how many rows each has, and their notes.
    pub(crate) async fn effects(&self, ids: &[Uuid]) -> HashMap<Uuid, Vec<String>> {
        let rows: Vec<(Uuid, Option<String>)> = match self {
            Self::Postgres { pool, .. } => {
                sqlx::query_as("SELECT event_id, note FROM effect WHERE event_id = ANY($1)")
                    .bind(ids)
                    .fetch_all(pool)
                    .await
                    .unwrap()
            }
            Self::MariaDb(scratch) => sqlx::query_as("SELECT event_id, note FROM effect")
                .fetch_all(&scratch.pool)
                .await
                .unwrap(),
        };
        let mut effects: HashMap<Uuid, Vec<String>> = HashMap::new();
        for (id, note) in rows {
            if ids.contains(&id) {
                effects
                    .entry(id)
                    .or_default()
                    .push(note.unwrap_or_default());
            }
        }
        effects
    }

    /// The amounts applied for each key, in the order they committed.
    pub(crate) async fn applied_by_key(&self) -> HashMap<Uuid, Vec<i64>> {
        let sql = "SELECT order_id, amount FROM effect WHERE order_id IS NOT NULL ORDER BY id";
        let rows: Vec<(Uuid, i64)> = match self {
            Self::Postgres { pool, .. } => sqlx::query_as(sql).fetch_all(pool).await.unwrap(),
            Self::MariaDb(scratch) => sqlx::query_as(sql).fetch_all(&scratch.pool).await.unwrap(),
        };
        let mut applied: HashMap<Uuid, Vec<i64>> = HashMap::new();
        for (key, amount) in rows {
            applied.entry(key).or_default().push(amount);
        }
        applied
    }

    /// The event ids of the effects of `amount`.
    pub(crate) async fn applied_ids(&self, amount: i64) -> Vec<Uuid> {
        let sql = sqlx::AssertSqlSafe(format!(
            "SELECT event_id FROM effect WHERE amount = {amount}"
        ));
        match self {
            Self::Postgres { pool, .. } => sqlx::query_scalar(sql).fetch_all(pool).await.unwrap(),
            Self::MariaDb(scratch) => sqlx::query_scalar(sql)
                .fetch_all(&scratch.pool)
                .await
                .unwrap(),
        }
    }

    /// `SELECT count(*) FROM table`.
    pub(crate) async fn rows(&self, table: &str) -> i64 {
        self.count(&format!("SELECT count(*) FROM {table}")).await
    }

    /// A count, in SQL both databases read alike.
    pub(crate) async fn count(&self, sql: &str) -> i64 {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match self {
            Self::Postgres { pool, .. } => sqlx::query_scalar(sql).fetch_one(pool).await.unwrap(),
            Self::MariaDb(scratch) => sqlx::query_scalar(sql)
                .fetch_one(&scratch.pool)
                .await
                .unwrap(),
        }
    }

    /// Every inbox row: how many there are of each event id, and whether
    /// they are all processed.
    pub(crate) async fn inbox_rows(&self) -> HashMap<Uuid, (usize, bool)> {
        let sql = "SELECT event_id, processed FROM inbox_event";
        let rows: Vec<(Uuid, bool)> = match self {
            Self::Postgres { pool, .. } => sqlx::query_as(sql).fetch_all(pool).await.unwrap(),
            Self::MariaDb(scratch) => sqlx::query_as(sql).fetch_all(&scratch.pool).await.unwrap(),
        };
        let mut stored: HashMap<Uuid, (usize, bool)> = HashMap::new();
        for (id, processed) in rows {
            let entry = stored.entry(id).or_insert((0, true));
            entry.0 += 1;
            entry.1 &= processed;
        }
        stored
    }

    /// The inbox row of `event_id`: (attempts, processed, parked, last
    /// error).
    pub(crate) async fn inbox_row(&self, event_id: Uuid) -> (i32, bool, bool, Option<String>) {
        match self {
            Self::Postgres { pool, .. } => sqlx::query_as(
                "SELECT attempts, processed, parked_at IS NOT NULL, last_error
                 FROM inbox_event WHERE event_id = $1",
            )
            .bind(event_id)
            .fetch_one(pool)
            .await
            .unwrap(),
            Self::MariaDb(scratch) => sqlx::query_as(
                "SELECT attempts, processed, parked_at IS NOT NULL, last_error
                 FROM inbox_event WHERE event_id = ?",
            )
            .bind(event_id)
            .fetch_one(&scratch.pool)
            .await
            .unwrap(),
        }
    }

    /// Whether the inbox row of `event_id` is there and parked.
    pub(crate) async fn is_parked(&self, event_id: Uuid) -> bool {
        let sql = "SELECT count(*) FROM inbox_event WHERE parked_at IS NOT NULL AND event_id = ";
        let parked: i64 = match self {
            Self::Postgres { pool, .. } => {
                sqlx::query_scalar(sqlx::AssertSqlSafe(format!("{sql}$1")))
                    .bind(event_id)
                    .fetch_one(pool)
                    .await
                    .unwrap()
            }
            Self::MariaDb(scratch) => sqlx::query_scalar(sqlx::AssertSqlSafe(format!("{sql}?")))
                .bind(event_id)
                .fetch_one(&scratch.pool)
                .await
                .unwrap(),
        };
        parked == 1
    }

    /// Makes the parked inbox row of `event_id` pending again, by hand, as
    /// an operator's retry does: on MariaDB moving its key's `inbox_key`
    /// entry back to it too (PostgreSQL's trigger does that).
    pub(crate) async fn unpark_by_hand(&self, event_id: Uuid) {
        match self {
            Self::Postgres { pool, .. } => {
                sqlx::query(
                    "UPDATE inbox_event SET parked_at = NULL, attempts = 0, next_attempt_at = NULL
                     WHERE event_id = $1",
                )
                .bind(event_id)
                .execute(pool)
                .await
                .unwrap();
            }
            Self::MariaDb(scratch) => {
                let mut tx = scratch.pool.begin().await.unwrap();
                // The row's key and place, by a plain read; then the row by
                // its primary key and its key's entry by its unique key:
                // locking none of the rows a processor holds.
                let (group, topic, key, seq, event_type): (Vec<u8>, String, Vec<u8>, i64, String) =
                    sqlx::query_as(
                        "SELECT consumer_group, topic, partition_key, seq, event_type
                         FROM inbox_event WHERE event_id = ?",
                    )
                    .bind(event_id)
                    .fetch_one(&mut *tx)
                    .await
                    .unwrap();
                sqlx::query(
                    "UPDATE inbox_event SET parked_at = NULL, attempts = 0, next_attempt_at = NULL
                     WHERE consumer_group = ? AND event_id = ?",
                )
                .bind(&group)
                .bind(event_id)
                .execute(&mut *tx)
                .await
                .unwrap();
                let moved = sqlx::query(
                    "UPDATE inbox_key SET head_seq = ?, head_event_type = ?, not_before = NULL
                     WHERE consumer_group = ? AND topic = ? AND partition_key = ? AND head_seq > ?",
                )
                .bind(seq)
                .bind(event_type)
                .bind(group)
                .bind(topic)
                .bind(key)
                .bind(seq)
                .execute(&mut *tx)
                .await
                .unwrap()
                .rows_affected();
                if moved != 1 {
                    let keys: Vec<(i64, Option<String>)> =
                        sqlx::query_as("SELECT head_seq, head_event_type FROM inbox_key")
                            .fetch_all(&mut *tx)
                            .await
                            .unwrap();
                    let rows: Vec<(i64, bool, bool, i32)> = sqlx::query_as(
                        "SELECT seq, processed, parked_at IS NOT NULL, attempts FROM inbox_event",
                    )
                    .fetch_all(&mut *tx)
                    .await
                    .unwrap();
                    panic!(
                        "the key's entry did not point at a later row: entries (head, type) \
                         {keys:?}, rows (seq, processed, parked, attempts) {rows:?}"
                    );
                }
                tx.commit().await.unwrap();
            }
        }
    }

    /// The parked dead letters: (reason, record value, partition).
    pub(crate) async fn parked(&self) -> Vec<(String, Option<Vec<u8>>, i32)> {
        match self {
            Self::Postgres { pool, .. } => sqlx::query_as(
                r#"SELECT reason, record_value, "partition" FROM consumer_dead_letter"#,
            )
            .fetch_all(pool)
            .await
            .unwrap(),
            Self::MariaDb(scratch) => {
                sqlx::query_as("SELECT reason, record_value, `partition` FROM consumer_dead_letter")
                    .fetch_all(&scratch.pool)
                    .await
                    .unwrap()
            }
        }
    }

    pub(crate) async fn drop(self) {
        match self {
            Self::Postgres { pool, name } => {
                pool.close().await;
                drop_databases(&[name]).await.unwrap();
            }
            Self::MariaDb(scratch) => MySqlScratch::drop(*scratch).await,
        }
    }
}

/// Runs each test body once on PostgreSQL and once on MariaDB, in modules
/// `postgres` and `mariadb`.
#[macro_export]
macro_rules! on_both {
    ($($body:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $body() {
                    super::$body(super::Db::postgres().await).await;
                }
            )*
        }
        mod mariadb {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $body() {
                    super::$body(super::Db::mariadb().await).await;
                }
            )*
        }
    };
}
