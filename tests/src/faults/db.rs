//! The scenario's two databases: the source (writers, outbox, relays) and
//! the receiver (consumers' dedup / inbox tables and effects), each on
//! PostgreSQL or MariaDB.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use txoutbox_testkit::db::{connect, create_database, drop_databases, url_of};
use txoutbox_testkit::mysql::MySqlScratch;
use uuid::Uuid;

use super::model;

/// Which database the source service runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SourceBackend {
    /// PostgreSQL (every scenario's default).
    #[default]
    Postgres,
    /// MariaDB (the writers' `#[outbox_handler]` and the relays on a
    /// `MySqlPool`).
    MariaDb,
}

/// Which database the receiving service runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReceiverBackend {
    /// PostgreSQL (every scenario's default).
    #[default]
    Postgres,
    /// MariaDB (the consumers on a `MySqlPool`).
    MariaDb,
}

/// One outbox row as the checker reads it.
#[derive(Debug, sqlx::FromRow)]
pub struct OutboxRow {
    /// The event id.
    pub event_id: Uuid,
    /// The key.
    pub partition_key: String,
    /// When the relay marked it.
    pub published_at: Option<DateTime<Utc>>,
    /// When the relay parked it.
    pub parked_at: Option<DateTime<Utc>>,
}

/// The source database, as the harness and the checker read it.
#[derive(Debug)]
pub enum SourceDb {
    /// On PostgreSQL.
    Postgres(PgPool),
    /// On MariaDB (the scratch database it lives in).
    MariaDb(Box<MySqlScratch>),
}

macro_rules! on_source {
    ($source:expr, |$pool:ident| $body:expr) => {
        match $source {
            SourceDb::Postgres($pool) => $body,
            SourceDb::MariaDb(scratch) => {
                let $pool = &scratch.pool;
                $body
            }
        }
    };
}

impl SourceDb {
    /// The PostgreSQL pool, for the parts of the suite that run on
    /// PostgreSQL only (frozen connections, the partial broker outage).
    ///
    /// # Panics
    /// On a MariaDB source.
    pub fn postgres(&self) -> &PgPool {
        match self {
            Self::Postgres(pool) => pool,
            Self::MariaDb(_) => panic!("this fault runs with a PostgreSQL source only"),
        }
    }

    /// Every committed ledger row: `(event_id, key, seq)`.
    pub async fn ledger(&self) -> sqlx::Result<Vec<(Uuid, String, i64)>> {
        match self {
            Self::Postgres(pool) => {
                sqlx::query_as("SELECT event_id, key, seq FROM ledger")
                    .fetch_all(pool)
                    .await
            }
            Self::MariaDb(scratch) => {
                sqlx::query_as("SELECT event_id, `key`, seq FROM ledger")
                    .fetch_all(&scratch.pool)
                    .await
            }
        }
    }

    /// The ledger rows committed in `[from, until)`: `(event_id, key,
    /// committed_at)` (the commit clock is the database's on PostgreSQL and
    /// UTC on MariaDB, as the writers record it).
    pub async fn ledger_committed(
        &self,
        from: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> sqlx::Result<Vec<(Uuid, String, DateTime<Utc>)>> {
        match self {
            Self::Postgres(pool) => {
                sqlx::query_as(
                    "SELECT event_id, key, committed_at FROM ledger
                     WHERE committed_at >= $1 AND committed_at < $2",
                )
                .bind(from)
                .bind(until)
                .fetch_all(pool)
                .await
            }
            Self::MariaDb(scratch) => {
                sqlx::query_as(
                    "SELECT event_id, `key`, committed_at FROM ledger
                     WHERE committed_at >= ? AND committed_at < ?",
                )
                .bind(from)
                .bind(until)
                .fetch_all(&scratch.pool)
                .await
            }
        }
    }

    /// Every outbox row.
    pub async fn outbox(&self) -> sqlx::Result<Vec<OutboxRow>> {
        let sql = "SELECT event_id, partition_key, published_at, parked_at FROM outbox_event";
        on_source!(self, |pool| sqlx::query_as(sql).fetch_all(pool).await)
    }

    /// The event ids of commands that meant to roll back.
    pub async fn rolled_back(&self) -> sqlx::Result<HashSet<Uuid>> {
        let sql = "SELECT event_id FROM intended_rollback";
        let ids: Vec<Uuid> =
            on_source!(self, |pool| sqlx::query_scalar(sql).fetch_all(pool).await)?;
        Ok(ids.into_iter().collect())
    }

    /// `(unpublished healthy rows, parked rows, committed commands)`.
    pub async fn backlog(&self) -> sqlx::Result<(i64, i64, i64)> {
        let sql = "SELECT (SELECT COUNT(*) FROM outbox_event
                           WHERE published_at IS NULL AND parked_at IS NULL),
                          (SELECT COUNT(*) FROM outbox_event WHERE parked_at IS NOT NULL),
                          (SELECT COUNT(*) FROM ledger)";
        on_source!(self, |pool| sqlx::query_as(sql).fetch_one(pool).await)
    }

    async fn close(&self) {
        on_source!(self, |pool| pool.close().await);
    }
}

/// One effect row as the checker reads it: `(event_id, key, seq)`.
pub type Effect = (Uuid, String, i64);

/// The receiver database, as the harness, the checker and the liveness
/// figures read it: one method per query, one match arm per backend.
#[derive(Debug)]
pub enum ReceiverDb {
    /// On PostgreSQL.
    Postgres(PgPool),
    /// On MariaDB (the scratch database it lives in).
    MariaDb(Box<MySqlScratch>),
}

impl ReceiverDb {
    /// The PostgreSQL pool, for the parts of the suite that run on
    /// PostgreSQL only (frozen connections, the rolling deploy's figures).
    ///
    /// # Panics
    /// On a MariaDB receiver.
    pub fn postgres(&self) -> &PgPool {
        match self {
            Self::Postgres(pool) => pool,
            Self::MariaDb(_) => panic!("this part runs with a PostgreSQL receiver only"),
        }
    }

    /// Distinct events `group` applied.
    pub async fn applied(&self, group: &str) -> sqlx::Result<i64> {
        match self {
            Self::Postgres(pool) => {
                sqlx::query_scalar(
                    "SELECT count(DISTINCT event_id) FROM effect WHERE consumer_group = $1",
                )
                .bind(group)
                .fetch_one(pool)
                .await
            }
            Self::MariaDb(scratch) => {
                sqlx::query_scalar(
                    "SELECT COUNT(DISTINCT event_id) FROM effect WHERE consumer_group = ?",
                )
                .bind(group)
                .fetch_one(&scratch.pool)
                .await
            }
        }
    }

    /// Every effect of `group`, in the order they were inserted (`id`).
    pub async fn effects(&self, group: &str) -> sqlx::Result<Vec<Effect>> {
        match self {
            Self::Postgres(pool) => {
                sqlx::query_as(
                    "SELECT event_id, key, seq FROM effect WHERE consumer_group = $1 ORDER BY id",
                )
                .bind(group)
                .fetch_all(pool)
                .await
            }
            Self::MariaDb(scratch) => {
                sqlx::query_as(
                    "SELECT event_id, `key`, seq FROM effect WHERE consumer_group = ? ORDER BY id",
                )
                .bind(group)
                .fetch_all(&scratch.pool)
                .await
            }
        }
    }

    /// When `group` first applied each of `ids` (those it applied).
    pub async fn first_applied(
        &self,
        group: &str,
        ids: &[Uuid],
    ) -> sqlx::Result<HashMap<Uuid, DateTime<Utc>>> {
        match self {
            Self::Postgres(pool) => {
                let rows: Vec<(Uuid, DateTime<Utc>)> = sqlx::query_as(
                    "SELECT event_id, min(applied_at) FROM effect
                     WHERE consumer_group = $1 AND event_id = ANY($2) GROUP BY 1",
                )
                .bind(group)
                .bind(ids)
                .fetch_all(pool)
                .await?;
                Ok(rows.into_iter().collect())
            }
            Self::MariaDb(scratch) => {
                // No arrays: every event of the group, filtered here.
                let rows: Vec<(Uuid, DateTime<Utc>)> = sqlx::query_as(
                    "SELECT event_id, MIN(applied_at) FROM effect
                     WHERE consumer_group = ? GROUP BY event_id",
                )
                .bind(group)
                .fetch_all(&scratch.pool)
                .await?;
                let wanted: HashSet<&Uuid> = ids.iter().collect();
                Ok(rows
                    .into_iter()
                    .filter(|(id, _)| wanted.contains(id))
                    .collect())
            }
        }
    }

    /// The poison tags of the inbox rows of any group parked with the
    /// poison header `header`.
    pub async fn parked_poison(&self, header: &str) -> sqlx::Result<Vec<String>> {
        match self {
            Self::Postgres(pool) => {
                sqlx::query_scalar(
                    "SELECT headers->>$1 FROM inbox_event
                     WHERE parked_at IS NOT NULL AND headers ? $1",
                )
                .bind(header)
                .fetch_all(pool)
                .await
            }
            Self::MariaDb(scratch) => {
                let path = format!("$.\"{header}\"");
                let tags: Vec<Option<String>> = sqlx::query_scalar(
                    "SELECT JSON_VALUE(headers, ?) FROM inbox_event WHERE parked_at IS NOT NULL",
                )
                .bind(path)
                .fetch_all(&scratch.pool)
                .await?;
                Ok(tags.into_iter().flatten().collect())
            }
        }
    }

    async fn close(&self) {
        match self {
            Self::Postgres(pool) => pool.close().await,
            Self::MariaDb(scratch) => scratch.pool.close().await,
        }
    }
}

/// The databases of one scenario; dropped by [`Databases::drop_all`].
#[derive(Debug)]
pub struct Databases {
    /// The PostgreSQL databases of the scenario (to drop).
    postgres_names: Vec<String>,
    /// Source database URL.
    pub source_url: String,
    /// Receiver database URL.
    pub receiver_url: String,
    /// The source database (for the harness and the checker).
    pub source: SourceDb,
    /// The receiver database (for the harness and the checker).
    pub receiver: ReceiverDb,
}

impl Databases {
    /// Creates the scenario's databases with the workload's tables and
    /// `keys` keys: on PostgreSQL (`DATABASE_URL`)
    /// `faults_<scenario>_<id>_{src,rx}`, on MariaDB (`MYSQL_URL`) a scratch
    /// database each.
    pub async fn create(
        scenario: &str,
        keys: usize,
        source: SourceBackend,
        receiver: ReceiverBackend,
    ) -> Self {
        let id = &Uuid::new_v4().simple().to_string()[..8];
        let names = [
            format!("faults_{scenario}_{id}_src"),
            format!("faults_{scenario}_{id}_rx"),
        ];
        let mut postgres_names = Vec::new();
        let (source, source_url) = match source {
            SourceBackend::Postgres => {
                create_database(&names[0]).await;
                postgres_names.push(names[0].clone());
                let pool = connect(&names[0], 4).await;
                model::migrate_source(&pool, keys)
                    .await
                    .expect("migrate source");
                (SourceDb::Postgres(pool), url_of(&names[0]))
            }
            SourceBackend::MariaDb => {
                let scratch = MySqlScratch::create(4).await;
                model::migrate_source_mysql(&scratch.pool, keys)
                    .await
                    .expect("migrate source");
                let url = scratch.url();
                (SourceDb::MariaDb(Box::new(scratch)), url)
            }
        };
        let (receiver, receiver_url) = match receiver {
            ReceiverBackend::Postgres => {
                create_database(&names[1]).await;
                postgres_names.push(names[1].clone());
                let pool = connect(&names[1], 4).await;
                model::migrate_receiver(&pool)
                    .await
                    .expect("migrate receiver");
                (ReceiverDb::Postgres(pool), url_of(&names[1]))
            }
            ReceiverBackend::MariaDb => {
                let scratch = MySqlScratch::create(4).await;
                model::migrate_receiver_mysql(&scratch.pool)
                    .await
                    .expect("migrate receiver");
                let url = scratch.url();
                (ReceiverDb::MariaDb(Box::new(scratch)), url)
            }
        };
        Self {
            postgres_names,
            source_url,
            receiver_url,
            source,
            receiver,
        }
    }

    /// Drops both databases (after every process using them stopped);
    /// failures are ignored.
    pub async fn drop_all(self) {
        self.source.close().await;
        self.receiver.close().await;
        if !self.postgres_names.is_empty() {
            let _ = drop_databases(&self.postgres_names).await;
        }
        if let SourceDb::MariaDb(scratch) = self.source {
            (*scratch).drop().await;
        }
        if let ReceiverDb::MariaDb(scratch) = self.receiver {
            (*scratch).drop().await;
        }
    }
}

/// Whether `url` names a MariaDB / MySQL server.
pub fn is_mysql_url(url: &str) -> bool {
    url.starts_with("mysql://") || url.starts_with("mariadb://")
}
