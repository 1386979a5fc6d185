//! The framework's schema migrations.
//!
//! The SQL lives in `outbox-runtime/migrations/*.sql`, embedded into the binary,
//! and is also usable as plain files by teams with another migration tool (each
//! file is idempotent: `IF NOT EXISTS` everywhere).
//!
//! Applied versions are tracked in `outbox_schema_migrations`, a table of the
//! framework's own, so they never collide with your application's sqlx (or
//! other) migration history. Concurrent runners serialize on an advisory lock.
//!
//! ```no_run
//! # async fn run(pool: sqlx::PgPool) -> Result<(), txoutbox_runtime::migrations::MigrateError> {
//! let applied = txoutbox_runtime::migrations::run(&pool).await?;
//! println!("applied {} outbox migrations", applied.len());
//! # Ok(()) }
//! ```

use sqlx::PgPool;

/// One embedded migration.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Monotonic version number (the file's numeric prefix).
    pub version: i64,
    /// Short description (the file name without prefix and extension).
    pub description: &'static str,
    /// The SQL, possibly several statements.
    pub sql: &'static str,
}

/// Every migration the framework ships, in order.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        description: "outbox_inbox_base",
        sql: include_str!("../migrations/0001_outbox_inbox_base.sql"),
    },
    Migration {
        version: 2,
        description: "relay_indexes",
        sql: include_str!("../migrations/0002_relay_indexes.sql"),
    },
    Migration {
        version: 3,
        description: "inbox_key_order",
        sql: include_str!("../migrations/0003_inbox_key_order.sql"),
    },
    Migration {
        version: 4,
        description: "operator_tooling",
        sql: include_str!("../migrations/0004_operator_tooling.sql"),
    },
    Migration {
        version: 5,
        description: "inbox_liveness",
        sql: include_str!("../migrations/0005_inbox_liveness.sql"),
    },
    Migration {
        version: 6,
        description: "relay_membership",
        sql: include_str!("../migrations/0006_relay_membership.sql"),
    },
    Migration {
        version: 7,
        description: "scheduled_delivery",
        sql: include_str!("../migrations/0007_scheduled_delivery.sql"),
    },
    Migration {
        version: 8,
        description: "sagas",
        sql: include_str!("../migrations/0008_sagas.sql"),
    },
    Migration {
        version: 9,
        description: "consumer_dead_letters",
        sql: include_str!("../migrations/0009_consumer_dead_letters.sql"),
    },
    Migration {
        version: 10,
        description: "claim_index",
        sql: include_str!("../migrations/0010_claim_index.sql"),
    },
    Migration {
        version: 11,
        description: "held_topics",
        sql: include_str!("../migrations/0011_held_topics.sql"),
    },
    Migration {
        version: 12,
        description: "replay_rebuild",
        sql: include_str!("../migrations/0012_replay_rebuild.sql"),
    },
    Migration {
        version: 13,
        description: "inbox_payload_bytes",
        sql: include_str!("../migrations/0013_inbox_payload_bytes.sql"),
    },
    Migration {
        version: 14,
        description: "event_headers",
        sql: include_str!("../migrations/0014_event_headers.sql"),
    },
];

/// Failure to migrate.
#[derive(Debug, thiserror::Error)]
#[error(
    "outbox migration {version} ({description}) failed: {}",
    txoutbox_core::DbErrorDisplay(.source)
)]
pub struct MigrateError {
    /// The version that failed (0 for the bookkeeping table itself).
    pub version: i64,
    /// Its description.
    pub description: &'static str,
    /// The database error.
    #[source]
    pub source: sqlx::Error,
}

/// Arbitrary constant for `pg_advisory_xact_lock`: "outbox migrate".
const MIGRATION_LOCK_KEY: i64 = 0x6f75_7462_6f78_6d69;

/// Applies every migration not yet applied, each in its own transaction, and
/// returns the versions it applied (empty when the schema is up to date).
pub async fn run(pool: &PgPool) -> Result<Vec<i64>, MigrateError> {
    let bookkeeping = |source| MigrateError {
        version: 0,
        description: "outbox_schema_migrations",
        source,
    };
    let mut applied = Vec::new();
    for migration in MIGRATIONS {
        let mut tx = crate::txn::begin(pool).await.map_err(bookkeeping)?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(MIGRATION_LOCK_KEY)
            .execute(&mut *tx)
            .await
            .map_err(bookkeeping)?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS outbox_schema_migrations (
                 version bigint PRIMARY KEY,
                 description text NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT now())",
        )
        .execute(&mut *tx)
        .await
        .map_err(bookkeeping)?;
        let done: Option<i64> =
            sqlx::query_scalar("SELECT version FROM outbox_schema_migrations WHERE version = $1")
                .bind(migration.version)
                .fetch_optional(&mut *tx)
                .await
                .map_err(bookkeeping)?;
        if done.is_some() {
            continue;
        }
        let failed = |source| MigrateError {
            version: migration.version,
            description: migration.description,
            source,
        };
        sqlx::raw_sql(migration.sql)
            .execute(&mut *tx)
            .await
            .map_err(failed)?;
        sqlx::query("INSERT INTO outbox_schema_migrations (version, description) VALUES ($1, $2)")
            .bind(migration.version)
            .bind(migration.description)
            .execute(&mut *tx)
            .await
            .map_err(failed)?;
        tx.commit().await.map_err(failed)?;
        applied.push(migration.version);
    }
    Ok(applied)
}
