//! Fixtures of the operator tooling's tests on MariaDB (the `ops`
//! library's in `ops_mysql.rs`, the `outbox` binary's in `txoutbox-cli`):
//! outbox rows in every state the tooling distinguishes, written with plain
//! SQL, and a row held locked as a relay holds one.

#![allow(dead_code)] // each test binary uses a different subset

use sqlx::{MySqlConnection, MySqlPool};
use txoutbox_testkit::mysql::MySqlScratch;
use uuid::Uuid;

/// An outbox row to insert; ages are seconds before the database's clock.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub topic: String,
    pub key: String,
    pub created_ago: i64,
    pub published_ago: Option<i64>,
    pub parked_ago: Option<i64>,
    pub discarded_ago: Option<i64>,
    pub attempts: i32,
    pub last_error: Option<&'static str>,
}

impl Row {
    pub(crate) fn new(topic: &str) -> Self {
        Self {
            topic: topic.to_owned(),
            key: "k".to_owned(),
            created_ago: 0,
            published_ago: None,
            parked_ago: None,
            discarded_ago: None,
            attempts: 0,
            last_error: None,
        }
    }

    pub(crate) fn created(mut self, ago: i64) -> Self {
        self.created_ago = ago;
        self
    }

    pub(crate) fn published(mut self, created_ago: i64, published_ago: i64) -> Self {
        self.created_ago = created_ago;
        self.published_ago = Some(published_ago);
        self
    }

    /// Parked by SQL, as the relay parks: `parked_at`, attempts, last error.
    pub(crate) fn parked(mut self, ago: i64, attempts: i32, error: &'static str) -> Self {
        self.parked_ago = Some(ago);
        self.attempts = attempts;
        self.last_error = Some(error);
        self
    }

    pub(crate) fn failing(mut self, attempts: i32, error: &'static str) -> Self {
        self.attempts = attempts;
        self.last_error = Some(error);
        self
    }

    pub(crate) fn discarded(mut self, ago: i64) -> Self {
        self.discarded_ago = Some(ago);
        self
    }

    /// Inserts the row; returns `(id, event_id)`.
    pub(crate) async fn insert(&self, pool: &MySqlPool) -> (i64, Uuid) {
        let event_id = Uuid::now_v7();
        let payload = serde_json::json!({ "event_id": event_id, "key": self.key }).to_string();
        let done = sqlx::query(
            "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type,
                 payload, topic, partition_key, created_at, published_at, parked_at,
                 discarded_at, attempts, last_error)
             VALUES (?, 'Order', ?, 'OrderCreated', ?, ?, ?,
                 UTC_TIMESTAMP(6) - INTERVAL ? SECOND,
                 UTC_TIMESTAMP(6) - INTERVAL ? SECOND,
                 UTC_TIMESTAMP(6) - INTERVAL ? SECOND,
                 UTC_TIMESTAMP(6) - INTERVAL ? SECOND,
                 ?, ?)",
        )
        .bind(event_id)
        .bind(&self.key)
        .bind(payload)
        .bind(&self.topic)
        .bind(&self.key)
        .bind(self.created_ago)
        .bind(self.published_ago)
        .bind(self.parked_ago)
        .bind(self.discarded_ago)
        .bind(self.attempts)
        .bind(self.last_error)
        .execute(pool)
        .await
        .unwrap();
        (done.last_insert_id() as i64, event_id)
    }
}

pub(crate) async fn count(pool: &MySqlPool, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Holds row `id` locked (`FOR UPDATE`) on a connection of its own, as a
/// relay's claim or settlement does, until the connection is dropped.
pub(crate) async fn lock_row(scratch: &MySqlScratch, id: i64) -> MySqlConnection {
    let mut conn = scratch.connection().await;
    sqlx::raw_sql("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED; BEGIN")
        .execute(&mut conn)
        .await
        .unwrap();
    let locked: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM outbox_event WHERE id = ? FOR UPDATE")
            .bind(id)
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert_eq!(locked, [id]);
    conn
}

/// Ends the transaction of [`lock_row`]: its lock is gone when this returns.
pub(crate) async fn release(mut conn: MySqlConnection) {
    sqlx::query("ROLLBACK").execute(&mut conn).await.unwrap();
    sqlx::Connection::close(conn).await.unwrap();
}

/// The URL of the scratch database, on the server of `MYSQL_URL`.
pub(crate) fn url(scratch: &MySqlScratch) -> String {
    let server = txoutbox_testkit::mysql::mysql_url();
    let base = server.split('?').next().unwrap_or(&server);
    let server = base.rsplit_once('/').map_or(base, |(server, _)| server);
    format!("{server}/{}", scratch.name)
}
