//! The scenario's two databases: the source (writers, outbox, relays) and the
//! receiver (consumers' dedup / inbox tables and effects).

use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use uuid::Uuid;

use super::model;

/// The databases of one scenario; dropped by [`Databases::drop_all`].
#[derive(Debug)]
pub struct Databases {
    admin_url: String,
    names: [String; 2],
    /// Source database URL.
    pub source_url: String,
    /// Receiver database URL.
    pub receiver_url: String,
    /// A pool on the source database (for the harness and the checker).
    pub source: PgPool,
    /// A pool on the receiver database.
    pub receiver: PgPool,
}

fn with_database(url: &str, name: &str) -> String {
    let base = url.split('?').next().unwrap_or(url);
    let root = base.rsplit_once('/').map_or(base, |(root, _)| root);
    format!("{root}/{name}")
}

async fn pool(url: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(30))
        .connect(url)
        .await
        .expect("connect to the scenario database")
}

impl Databases {
    /// Creates `faults_<scenario>_<id>_{src,rx}` on the server of `DATABASE_URL`
    /// with the workload's tables and `keys` keys.
    pub async fn create(scenario: &str, keys: usize) -> Self {
        let admin_url = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
        let id = &Uuid::new_v4().simple().to_string()[..8];
        let names = [
            format!("faults_{scenario}_{id}_src"),
            format!("faults_{scenario}_{id}_rx"),
        ];
        let admin: PgConnectOptions = admin_url.parse().expect("DATABASE_URL");
        let admin = PgPoolOptions::new()
            .max_connections(1)
            .connect_with(admin)
            .await
            .expect("connect to DATABASE_URL");
        for name in &names {
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
                .execute(&admin)
                .await
                .expect("create database");
        }
        admin.close().await;
        let source_url = with_database(&admin_url, &names[0]);
        let receiver_url = with_database(&admin_url, &names[1]);
        let source = pool(&source_url).await;
        let receiver = pool(&receiver_url).await;
        model::migrate_source(&source, keys)
            .await
            .expect("migrate source");
        model::migrate_receiver(&receiver)
            .await
            .expect("migrate receiver");
        Self {
            admin_url,
            names,
            source_url,
            receiver_url,
            source,
            receiver,
        }
    }

    /// Drops both databases (after every process using them stopped).
    pub async fn drop_all(self) {
        self.source.close().await;
        self.receiver.close().await;
        let Ok(admin) = PgPoolOptions::new()
            .max_connections(1)
            .connect(&self.admin_url)
            .await
        else {
            return;
        };
        for name in &self.names {
            let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
            )))
            .execute(&admin)
            .await;
        }
        admin.close().await;
    }
}
