//! The scenario's two databases: the source (writers, outbox, relays), on
//! PostgreSQL or MariaDB, and the receiver (consumers' dedup / inbox tables
//! and effects), on PostgreSQL.

use std::collections::HashSet;

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
    /// `MySqlPool`); the receiver stays on PostgreSQL.
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
    /// PostgreSQL only (frozen connections, consumer-side liveness).
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

/// The databases of one scenario; dropped by [`Databases::drop_all`].
#[derive(Debug)]
pub struct Databases {
    names: [String; 2],
    /// Source database URL.
    pub source_url: String,
    /// Receiver database URL.
    pub receiver_url: String,
    /// The source database (for the harness and the checker).
    pub source: SourceDb,
    /// A pool on the receiver database.
    pub receiver: PgPool,
}

impl Databases {
    /// Creates `faults_<scenario>_<id>_{src,rx}` with the workload's tables
    /// and `keys` keys: the source on `backend` (PostgreSQL at
    /// `DATABASE_URL`, MariaDB at `MYSQL_URL`), the receiver on PostgreSQL.
    pub async fn create(scenario: &str, keys: usize, backend: SourceBackend) -> Self {
        let id = &Uuid::new_v4().simple().to_string()[..8];
        let names = [
            format!("faults_{scenario}_{id}_src"),
            format!("faults_{scenario}_{id}_rx"),
        ];
        let (source, source_url) = match backend {
            SourceBackend::Postgres => {
                create_database(&names[0]).await;
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
        create_database(&names[1]).await;
        let receiver = connect(&names[1], 4).await;
        model::migrate_receiver(&receiver)
            .await
            .expect("migrate receiver");
        Self {
            receiver_url: url_of(&names[1]),
            source_url,
            names,
            source,
            receiver,
        }
    }

    /// Drops both databases (after every process using them stopped);
    /// failures are ignored.
    pub async fn drop_all(self) {
        self.source.close().await;
        self.receiver.close().await;
        match self.source {
            SourceDb::Postgres(_) => {
                let _ = drop_databases(&self.names).await;
            }
            SourceDb::MariaDb(scratch) => {
                let _ = drop_databases(&self.names[1..]).await;
                (*scratch).drop().await;
            }
        }
    }
}

/// Whether `url` names a MariaDB / MySQL server.
pub fn is_mysql_url(url: &str) -> bool {
    url.starts_with("mysql://") || url.starts_with("mariadb://")
}
