//! Fixtures of the operator tooling's tests on MariaDB (the `ops`
//! library's in `ops_mysql.rs`, the `outbox` binary's in `txoutbox-cli`):
//! outbox and inbox rows in every state the tooling distinguishes, written
//! with plain SQL, the inbox's key entries as its consumer keeps them, and
//! a row held locked as a relay or a processor holds one.

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

/// An inbox row to insert, as the inbox consumer stores and settles one;
/// ages are seconds before the database's clock.
#[derive(Debug, Clone)]
pub(crate) struct InboxRow {
    pub group: String,
    pub topic: Option<String>,
    pub key: Option<String>,
    pub event_type: String,
    pub received_ago: i64,
    pub processed_ago: Option<i64>,
    pub attempts: i32,
    pub last_error: Option<&'static str>,
    pub retry_in: Option<i64>,
    pub parked_ago: Option<i64>,
    pub discarded_ago: Option<i64>,
}

impl InboxRow {
    /// A pending row of `group` on `topic` with `key`, received now.
    pub(crate) fn new(group: &str, topic: &str, key: Option<&str>) -> Self {
        Self {
            group: group.to_owned(),
            topic: Some(topic.to_owned()),
            key: key.map(str::to_owned),
            event_type: "PaymentTaken".to_owned(),
            received_ago: 0,
            processed_ago: None,
            attempts: 0,
            last_error: None,
            retry_in: None,
            parked_ago: None,
            discarded_ago: None,
        }
    }

    pub(crate) fn received(mut self, ago: i64) -> Self {
        self.received_ago = ago;
        self
    }

    pub(crate) fn event_type(mut self, event_type: &str) -> Self {
        self.event_type = event_type.to_owned();
        self
    }

    pub(crate) fn processed(mut self, ago: i64) -> Self {
        self.processed_ago = Some(ago);
        self
    }

    /// Failed `attempts` times, the next attempt in `retry_in` seconds.
    pub(crate) fn failing(mut self, attempts: i32, error: &'static str, retry_in: i64) -> Self {
        self.attempts = attempts;
        self.last_error = Some(error);
        self.retry_in = Some(retry_in);
        self
    }

    /// Parked as the processor parks: `parked_at`, attempts, last error.
    pub(crate) fn parked(mut self, ago: i64, attempts: i32, error: &'static str) -> Self {
        self.parked_ago = Some(ago);
        self.attempts = attempts;
        self.last_error = Some(error);
        self
    }

    pub(crate) fn discarded(mut self, ago: i64) -> Self {
        self.discarded_ago = Some(ago);
        self
    }

    /// Inserts the row (no `inbox_key` entry: see [`rebuild_keys`]);
    /// returns `(event_id, seq)`.
    pub(crate) async fn insert(&self, pool: &MySqlPool) -> (Uuid, i64) {
        let event_id = Uuid::now_v7();
        let done = sqlx::query(
            "INSERT INTO inbox_event (consumer_group, event_id, received_at, payload,
                 payload_bytes, event_type, topic, partition_key, headers, processed,
                 processed_at, attempts, last_error, next_attempt_at, parked_at, discarded_at)
             VALUES (?, ?, UTC_TIMESTAMP(6) - INTERVAL ? SECOND, '{}', 2, ?, ?, ?, '{}', ?,
                 UTC_TIMESTAMP(6) - INTERVAL ? SECOND, ?, ?,
                 UTC_TIMESTAMP(6) + INTERVAL ? SECOND,
                 UTC_TIMESTAMP(6) - INTERVAL ? SECOND,
                 UTC_TIMESTAMP(6) - INTERVAL ? SECOND)",
        )
        .bind(self.group.as_bytes())
        .bind(event_id)
        .bind(self.received_ago)
        .bind(&self.event_type)
        .bind(self.topic.as_deref())
        .bind(self.key.as_deref().map(str::as_bytes))
        .bind(self.processed_ago.is_some())
        .bind(self.processed_ago)
        .bind(self.attempts)
        .bind(self.last_error)
        .bind(self.retry_in)
        .bind(self.parked_ago)
        .bind(self.discarded_ago)
        .execute(pool)
        .await
        .unwrap();
        (event_id, done.last_insert_id() as i64)
    }
}

/// Writes `inbox_key` as the inbox consumer keeps it: one entry per key
/// with pending rows (its oldest pending row), one per pending row
/// without a key.
pub(crate) async fn rebuild_keys(pool: &MySqlPool) {
    sqlx::query("DELETE FROM inbox_key")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO inbox_key
             (consumer_group, topic, partition_key, head_seq, head_event_type, not_before)
         SELECT i.consumer_group, i.topic, i.partition_key, i.seq, i.event_type,
                i.next_attempt_at
         FROM inbox_event i
         WHERE i.processed = FALSE AND i.parked_at IS NULL AND i.topic IS NOT NULL
           AND (i.partition_key IS NULL
                OR i.seq = (SELECT MIN(j.seq) FROM inbox_event j
                            WHERE j.consumer_group = i.consumer_group AND j.topic = i.topic
                              AND j.partition_key = i.partition_key AND j.processed = FALSE
                              AND j.parked_at IS NULL))",
    )
    .execute(pool)
    .await
    .unwrap();
}

/// An `inbox_key` entry: `(key, head_seq, head event type, backing off)`.
pub(crate) type KeyEntry = (Option<String>, i64, Option<String>, bool);

/// The `inbox_key` entries of `group`, head first.
pub(crate) async fn key_entries(pool: &MySqlPool, group: &str) -> Vec<KeyEntry> {
    type Stored = (Option<Vec<u8>>, i64, Option<String>, bool);
    let rows: Vec<Stored> = sqlx::query_as(
        "SELECT partition_key, head_seq, head_event_type, not_before IS NOT NULL
         FROM inbox_key WHERE consumer_group = ? ORDER BY head_seq",
    )
    .bind(group.as_bytes())
    .fetch_all(pool)
    .await
    .unwrap();
    rows.into_iter()
        .map(|(key, seq, event_type, waiting)| {
            (
                key.map(|k| String::from_utf8(k).unwrap()),
                seq,
                event_type,
                waiting,
            )
        })
        .collect()
}

/// Holds the one row `sql` selects, `FOR UPDATE`, on a connection of its
/// own in a `READ COMMITTED` transaction, as an inbox processor holds the
/// rows it claimed (or a consumer its dedup rows), until [`release`] (or a
/// `COMMIT` on the connection).
pub(crate) async fn lock_where(scratch: &MySqlScratch, sql: &str) -> MySqlConnection {
    let mut conn = scratch.connection().await;
    sqlx::raw_sql("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED; BEGIN")
        .execute(&mut conn)
        .await
        .unwrap();
    let locked = sqlx::query(sqlx::AssertSqlSafe(format!("{sql} FOR UPDATE")))
        .fetch_all(&mut conn)
        .await
        .unwrap();
    assert_eq!(locked.len(), 1, "{sql}");
    conn
}

/// A `saga_state` row to insert as MariaDB's saga runtime writes one (type
/// and id as UTF-8 bytes, state and compensations as JSON text, times in
/// UTC); ages are seconds before the database's clock.
#[derive(Debug, Clone)]
pub(crate) struct SagaRow {
    pub saga_type: String,
    pub saga_id: String,
    pub status: &'static str,
    pub state: serde_json::Value,
    /// Stored compensations: `(event_type, topic, partition_key)` each, in
    /// registration order.
    pub compensations: Vec<(&'static str, &'static str, String)>,
    pub version: i64,
    pub last_message_type: Option<&'static str>,
    pub started_ago: i64,
    pub updated_ago: i64,
    pub finished_ago: Option<i64>,
}

impl SagaRow {
    /// A running saga whose last step was `updated_ago` seconds ago.
    pub(crate) fn running(saga_type: &str, saga_id: &str, updated_ago: i64) -> Self {
        Self {
            saga_type: saga_type.to_owned(),
            saga_id: saga_id.to_owned(),
            status: "running",
            state: serde_json::json!({ "id": saga_id, "stage": "waiting" }),
            compensations: Vec::new(),
            version: 2,
            last_message_type: Some("StockReserved"),
            started_ago: updated_ago + 60,
            updated_ago,
            finished_ago: None,
        }
    }

    /// A saga that ended (`completed` or `compensated`) with its last step
    /// `finished_ago` seconds ago.
    pub(crate) fn finished(
        saga_type: &str,
        saga_id: &str,
        status: &'static str,
        finished_ago: i64,
    ) -> Self {
        Self {
            status,
            finished_ago: Some(finished_ago),
            ..Self::running(saga_type, saga_id, finished_ago)
        }
    }

    /// Inserts the row; returns the event ids given to its compensations
    /// and its `last_event_id`.
    pub(crate) async fn insert(&self, pool: &MySqlPool) -> (Vec<Uuid>, Uuid) {
        let mut ids = Vec::new();
        let compensations: Vec<serde_json::Value> = self
            .compensations
            .iter()
            .map(|(event_type, topic, key)| {
                let event_id = Uuid::new_v4();
                ids.push(event_id);
                // The shape the saga runtime stores (saga::store::records_to_json).
                serde_json::json!({
                    "event_id": event_id, "aggregate_type": "Order", "aggregate_id": self.saga_id,
                    "event_type": event_type, "topic": topic, "partition_key": key,
                    "traceparent": null, "payload": { "event_id": event_id },
                })
            })
            .collect();
        let last_event_id = Uuid::new_v4();
        sqlx::query(
            "INSERT INTO saga_state (saga_type, saga_id, status, state, compensations, version,
                 last_message_type, last_event_id, started_at, updated_at, finished_at)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?,
                 UTC_TIMESTAMP(6) - INTERVAL ? SECOND,
                 UTC_TIMESTAMP(6) - INTERVAL ? SECOND,
                 UTC_TIMESTAMP(6) - INTERVAL ? SECOND)",
        )
        .bind(self.saga_type.as_bytes())
        .bind(self.saga_id.as_bytes())
        .bind(self.status)
        .bind(self.state.to_string())
        .bind(serde_json::Value::Array(compensations).to_string())
        .bind(self.version)
        .bind(self.last_message_type)
        .bind(last_event_id)
        .bind(self.started_ago)
        .bind(self.updated_ago)
        .bind(self.finished_ago)
        .execute(pool)
        .await
        .unwrap();
        (ids, last_event_id)
    }
}
