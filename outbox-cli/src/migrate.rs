//! `outbox migrate`.

use std::process::ExitCode;

use serde::Serialize;
use sqlx::PgPool;
use txoutbox_runtime::migrations::{self, MIGRATIONS};

use crate::error::CliError;
use crate::output;

#[derive(Serialize)]
struct Applied {
    version: i64,
    description: &'static str,
}

pub(crate) async fn run(pool: &PgPool, json: bool) -> Result<ExitCode, CliError> {
    let versions = migrations::run(pool).await.map_err(|e| match e.source {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::PoolTimedOut => {
            CliError::Usage(format!("database unreachable: {e}"))
        }
        _ => CliError::Failed(e.to_string()),
    })?;
    let applied: Vec<Applied> = MIGRATIONS
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
        println!("schema is up to date ({} migrations)", MIGRATIONS.len());
    } else {
        for m in &applied {
            println!("applied {:04} {}", m.version, m.description);
        }
    }
    Ok(ExitCode::SUCCESS)
}
