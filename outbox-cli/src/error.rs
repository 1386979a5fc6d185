//! How the tool fails: one line on stderr and an exit code, never a backtrace.

use std::process::ExitCode;

use txoutbox_core::DbErrorDisplay;
use txoutbox_runtime::ops::OpsError;

/// A failure, classified by exit code.
#[derive(Debug)]
pub(crate) enum CliError {
    /// Exit 2: the input is wrong, or the database is unreachable or has no
    /// outbox schema; retrying the same command will not help.
    Usage(String),
    /// Exit 1: the operation itself failed (e.g. a Kafka delivery).
    Failed(String),
}

impl CliError {
    /// Prints the message and returns the exit code.
    pub(crate) fn report(self) -> ExitCode {
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
            OpsError::InboxRowsHaveNoId
            | OpsError::RebuildWithoutTopic
            | OpsError::RebuildIntoLiveTopic { .. }
            | OpsError::TopicMissing { .. }
            | OpsError::GroupHasOffsets { .. }
            | OpsError::ReplayNotFinished { .. }
            | OpsError::UnreadableHandover { .. }
            | OpsError::UnknownSagaStatus { .. }
            | OpsError::InvalidCompensation { .. } => CliError::Usage(error.to_string()),
            OpsError::ReplayFailed { ref source, .. } if matches!(&**source, OpsError::Database(e) if schema_missing(e)) => {
                CliError::Usage(format!("{error}; run `outbox migrate` first"))
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
    // PostgreSQL's message, code, detail and hint; not sqlx's "at line N".
    let shown = DbErrorDisplay(&error);
    if schema_missing(&error) {
        return CliError::Usage(format!(
            "the database has no (or an outdated) outbox schema: {shown}; run `outbox migrate` first"
        ));
    }
    match error {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::PoolTimedOut => {
            CliError::Usage(format!("database unreachable: {shown}"))
        }
        _ => CliError::Failed(format!("database error: {shown}")),
    }
}

/// undefined_table or undefined_column (PostgreSQL's 42P01, 42703;
/// MariaDB's 42S02, 42S22): not migrated, or an older schema.
fn schema_missing(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| matches!(&*code, "42P01" | "42703" | "42S02" | "42S22"))
}
