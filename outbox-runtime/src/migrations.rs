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

use std::future::Future;

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
    Migration {
        version: 15,
        description: "inbox_store_lock",
        sql: include_str!("../migrations/0015_inbox_store_lock.sql"),
    },
    Migration {
        version: 16,
        description: "inbox_store_on_receipt",
        sql: include_str!("../migrations/0016_inbox_store_on_receipt.sql"),
    },
    Migration {
        version: 17,
        description: "inbox_key_reads_by_key",
        sql: include_str!("../migrations/0017_inbox_key_reads_by_key.sql"),
    },
];

/// Every MySQL / MariaDB migration the framework ships, in order (feature
/// `mysql`; SQL in `outbox-runtime/migrations/mysql/`). Its versions are
/// its own: the MySQL schema is not a translation of every PostgreSQL file
/// but the same tables, grown as the MySQL backend gains its parts.
#[cfg(feature = "mysql")]
pub const MYSQL_MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        description: "outbox",
        sql: include_str!("../migrations/mysql/0001_outbox.sql"),
    },
    Migration {
        version: 2,
        description: "relay",
        sql: include_str!("../migrations/mysql/0002_relay.sql"),
    },
    Migration {
        version: 3,
        description: "operator_tooling",
        sql: include_str!("../migrations/mysql/0003_operator_tooling.sql"),
    },
    Migration {
        version: 4,
        description: "consumer",
        sql: include_str!("../migrations/mysql/0004_consumer.sql"),
    },
    Migration {
        version: 5,
        description: "inbox",
        sql: include_str!("../migrations/mysql/0005_inbox.sql"),
    },
    Migration {
        version: 6,
        description: "sagas",
        sql: include_str!("../migrations/mysql/0006_sagas.sql"),
    },
    Migration {
        version: 7,
        description: "replay",
        sql: include_str!("../migrations/mysql/0007_replay.sql"),
    },
    Migration {
        version: 8,
        description: "claim_index",
        sql: include_str!("../migrations/mysql/0008_claim_index.sql"),
    },
];

/// A database [`run`] migrates: `&PgPool`, or `&MySqlPool` (feature
/// `mysql`).
pub trait Target: Send {
    /// Applies the migrations not yet applied; see [`run`].
    fn apply(self) -> impl Future<Output = Result<Vec<i64>, MigrateError>> + Send;
}

impl Target for &PgPool {
    fn apply(self) -> impl Future<Output = Result<Vec<i64>, MigrateError>> + Send {
        run_postgres(self)
    }
}

#[cfg(feature = "mysql")]
impl Target for &sqlx::MySqlPool {
    fn apply(self) -> impl Future<Output = Result<Vec<i64>, MigrateError>> + Send {
        mysql::run(self)
    }
}

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

/// Applies every migration not yet applied and returns the versions it
/// applied (empty when the schema is up to date): on PostgreSQL
/// ([`MIGRATIONS`]) each in its own transaction; on MySQL / MariaDB
/// (`&MySqlPool`, feature `mysql`: `MYSQL_MIGRATIONS`) one after the other
/// under a named lock (MySQL commits DDL implicitly; every file is
/// idempotent, so a migration cut short is applied again in full).
pub async fn run<T: Target>(database: T) -> Result<Vec<i64>, MigrateError> {
    database.apply().await
}

async fn run_postgres(pool: &PgPool) -> Result<Vec<i64>, MigrateError> {
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

#[cfg(feature = "mysql")]
mod mysql {
    use sqlx::MySqlPool;

    use super::{MYSQL_MIGRATIONS, MigrateError};

    /// The oldest MariaDB with `FOR UPDATE SKIP LOCKED`.
    const MARIADB_MIN: (u32, u32) = (10, 6);

    fn bookkeeping(source: sqlx::Error) -> MigrateError {
        MigrateError {
            version: 0,
            description: "outbox_schema_migrations",
            source,
        }
    }

    /// Refuses a MariaDB without `SKIP LOCKED` (< 10.6), and MySQL, which
    /// has no `@@in_transaction` for the outbox insert's guard.
    fn check_version(version: &str) -> Result<(), sqlx::Error> {
        if !version.contains("MariaDB") {
            return Err(sqlx::Error::Protocol(format!(
                "MySQL {version} is not supported yet: the outbox insert guards itself with \
                 MariaDB's @@in_transaction, which MySQL lacks; use MariaDB >= {}.{}",
                MARIADB_MIN.0, MARIADB_MIN.1
            )));
        }
        let mut parts = version.split(|c: char| !c.is_ascii_digit());
        let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        if (major, minor) < MARIADB_MIN {
            return Err(sqlx::Error::Protocol(format!(
                "MariaDB {version} is too old for the outbox: it needs MariaDB >= {}.{} \
                 (FOR UPDATE SKIP LOCKED)",
                MARIADB_MIN.0, MARIADB_MIN.1
            )));
        }
        Ok(())
    }

    pub(super) async fn run(pool: &MySqlPool) -> Result<Vec<i64>, MigrateError> {
        let mut conn = pool.acquire().await.map_err(bookkeeping)?;
        let version: String = sqlx::query_scalar("SELECT VERSION()")
            .fetch_one(&mut *conn)
            .await
            .map_err(bookkeeping)?;
        check_version(&version).map_err(bookkeeping)?;
        // Lock names are server-wide: the database's name keeps two
        // services on one server apart.
        let locked: Option<i64> =
            sqlx::query_scalar("SELECT GET_LOCK(CONCAT('outbox_migrate:', DATABASE()), 60)")
                .fetch_one(&mut *conn)
                .await
                .map_err(bookkeeping)?;
        if locked != Some(1) {
            return Err(bookkeeping(sqlx::Error::Protocol(
                "another `outbox migrate` held the migration lock for 60 s".into(),
            )));
        }
        let applied = apply(&mut conn).await;
        let _ = sqlx::query("SELECT RELEASE_LOCK(CONCAT('outbox_migrate:', DATABASE()))")
            .execute(&mut *conn)
            .await;
        applied
    }

    async fn apply(conn: &mut sqlx::MySqlConnection) -> Result<Vec<i64>, MigrateError> {
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS outbox_schema_migrations (
                 version BIGINT NOT NULL PRIMARY KEY,
                 description TEXT NOT NULL,
                 applied_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
             ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
        )
        .execute(&mut *conn)
        .await
        .map_err(bookkeeping)?;
        let mut applied = Vec::new();
        for migration in MYSQL_MIGRATIONS {
            let done: Option<i64> = sqlx::query_scalar(
                "SELECT version FROM outbox_schema_migrations WHERE version = ?",
            )
            .bind(migration.version)
            .fetch_optional(&mut *conn)
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
                .execute(&mut *conn)
                .await
                .map_err(failed)?;
            sqlx::query(
                "INSERT INTO outbox_schema_migrations (version, description) VALUES (?, ?)",
            )
            .bind(migration.version)
            .bind(migration.description)
            .execute(&mut *conn)
            .await
            .map_err(failed)?;
            applied.push(migration.version);
        }
        Ok(applied)
    }

    #[cfg(test)]
    mod tests {
        use super::check_version;

        #[test]
        fn servers_without_skip_locked_are_refused() {
            assert!(check_version("10.11.19-MariaDB-0+deb12u1").is_ok());
            assert!(check_version("10.6.0-MariaDB").is_ok());
            let old = check_version("10.5.22-MariaDB").unwrap_err().to_string();
            assert!(old.contains("MariaDB >= 10.6"), "{old}");
            let mysql = check_version("8.0.36").unwrap_err().to_string();
            assert!(
                mysql.contains("not supported yet") && mysql.contains("@@in_transaction"),
                "{mysql}"
            );
        }
    }
}
