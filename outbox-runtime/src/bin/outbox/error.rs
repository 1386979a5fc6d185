//! How the tool fails: one line on stderr and an exit code, never a backtrace.

use std::process::ExitCode;

use outbox_runtime::ops::OpsError;

/// A failure, classified by exit code.
#[derive(Debug)]
pub enum CliError {
    /// Exit 2: the input is wrong, or the database is unreachable or has no
    /// outbox schema; retrying the same command will not help.
    Usage(String),
    /// Exit 1: the operation itself failed (e.g. a Kafka delivery).
    Failed(String),
}

impl CliError {
    /// Prints the message and returns the exit code.
    pub fn report(self) -> ExitCode {
        let (message, code) = match self {
            CliError::Usage(message) => (message, 2),
            CliError::Failed(message) => (message, 1),
        };
        // One line, whatever the underlying error printed.
        eprintln!("error: {}", message.replace('\n', " "));
        ExitCode::from(code)
    }
}

impl From<OpsError> for CliError {
    fn from(error: OpsError) -> Self {
        match error {
            OpsError::Database(e) => database(e),
            OpsError::InvalidRequest(message) => CliError::Usage(message),
            OpsError::ReplayFailed { ref source, .. } if is_schema_error(source) => {
                CliError::Usage(error.to_string())
            }
            other => CliError::Failed(other.to_string()),
        }
    }
}

impl From<sqlx::Error> for CliError {
    fn from(error: sqlx::Error) -> Self {
        database(error)
    }
}

fn database(error: sqlx::Error) -> CliError {
    let code = error
        .as_database_error()
        .and_then(|e| e.code())
        .map(|code| code.into_owned());
    match code.as_deref() {
        // undefined_table, undefined_column: not migrated, or an older schema.
        Some("42P01" | "42703") => CliError::Usage(format!(
            "the database has no (or an outdated) outbox schema: {error}; run `outbox migrate` first"
        )),
        _ => match error {
            sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::PoolTimedOut => {
                CliError::Usage(format!("database unreachable: {error}"))
            }
            other => CliError::Failed(format!("database error: {other}")),
        },
    }
}

fn is_schema_error(error: &OpsError) -> bool {
    matches!(database_code(error).as_deref(), Some("42P01" | "42703"))
}

fn database_code(error: &OpsError) -> Option<String> {
    match error {
        OpsError::Database(e) => e
            .as_database_error()
            .and_then(|e| e.code())
            .map(|c| c.into_owned()),
        _ => None,
    }
}
