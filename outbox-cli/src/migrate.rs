//! `outbox migrate`.

use std::process::ExitCode;

use serde::Serialize;
use sqlx::{MySqlPool, PgPool};
use txoutbox_runtime::migrations::{self, MIGRATIONS, MYSQL_MIGRATIONS, MigrateError, Migration};

use crate::error::CliError;
use crate::output;

#[derive(Serialize)]
struct Applied {
    version: i64,
    description: &'static str,
}

pub(crate) async fn run(pool: &PgPool, json: bool) -> Result<ExitCode, CliError> {
    let versions = migrations::run(pool).await.map_err(failure)?;
    report(MIGRATIONS, &versions, json)
}

/// `outbox migrate` on MariaDB: the MySQL schema (`MYSQL_MIGRATIONS`).
pub(crate) async fn run_mysql(pool: &MySqlPool, json: bool) -> Result<ExitCode, CliError> {
    let versions = migrations::run(pool).await.map_err(failure)?;
    report(MYSQL_MIGRATIONS, &versions, json)
}

fn failure(e: MigrateError) -> CliError {
    match e.source {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::PoolTimedOut => {
            CliError::Usage(format!("database unreachable: {e}"))
        }
        _ => CliError::Failed(e.to_string()),
    }
}

fn report(all: &[Migration], versions: &[i64], json: bool) -> Result<ExitCode, CliError> {
    let applied: Vec<Applied> = all
        .iter()
        .filter(|m| versions.contains(&m.version))
        .map(|m| Applied {
            version: m.version,
            description: m.description,
        })
        .collect();
    if json {
        output::json(&serde_json::json!({ "applied": applied }))?;
    } else if applied.is_empty() {
        println!("schema is up to date ({} migrations)", all.len());
    } else {
        for m in &applied {
            println!("applied {:04} {}", m.version, m.description);
        }
    }
    Ok(ExitCode::SUCCESS)
}
