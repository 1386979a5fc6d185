//! The scenario's two databases: the source (writers, outbox, relays) and the
//! receiver (consumers' dedup / inbox tables and effects).

use sqlx::PgPool;
use txoutbox_testkit::db::{connect, create_database, drop_databases, url_of};
use uuid::Uuid;

use super::model;

/// The databases of one scenario; dropped by [`Databases::drop_all`].
#[derive(Debug)]
pub struct Databases {
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

impl Databases {
    /// Creates `faults_<scenario>_<id>_{src,rx}` on the server of `DATABASE_URL`
    /// with the workload's tables and `keys` keys.
    pub async fn create(scenario: &str, keys: usize) -> Self {
        let id = &Uuid::new_v4().simple().to_string()[..8];
        let names = [
            format!("faults_{scenario}_{id}_src"),
            format!("faults_{scenario}_{id}_rx"),
        ];
        for name in &names {
            create_database(name).await;
        }
        let source = connect(&names[0], 4).await;
        let receiver = connect(&names[1], 4).await;
        model::migrate_source(&source, keys)
            .await
            .expect("migrate source");
        model::migrate_receiver(&receiver)
            .await
            .expect("migrate receiver");
        Self {
            source_url: url_of(&names[0]),
            receiver_url: url_of(&names[1]),
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
        let _ = drop_databases(&self.names).await;
    }
}
