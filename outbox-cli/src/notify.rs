//! `outbox notify`: the optional LISTEN/NOTIFY wake-up trigger.

use std::process::ExitCode;

use sqlx::PgPool;
use txoutbox_runtime::ops::notify;

use crate::error::CliError;
use crate::output;

/// Install, remove or show the trigger that wakes relays in other processes.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum NotifyCommand {
    /// Install the trigger: every commit that inserts outbox rows sends
    /// `NOTIFY outbox_event`, waking relays started with `listen_notify`.
    Enable,
    /// Remove the trigger; listening relays fall back to polling.
    Disable,
    /// Show whether the trigger is installed.
    Status,
}

pub(crate) async fn run(
    pool: &PgPool,
    command: NotifyCommand,
    json: bool,
) -> Result<ExitCode, CliError> {
    let changed = match command {
        NotifyCommand::Enable => notify::enable(pool).await,
        NotifyCommand::Disable => notify::disable(pool).await,
        NotifyCommand::Status => Ok(()),
    };
    if let Err(error) = changed {
        return Err(without_privilege(&error).unwrap_or_else(|| error.into()));
    }
    let enabled = notify::is_enabled(pool).await?;
    if json {
        output::json(&serde_json::json!({
            "enabled": enabled,
            "trigger": notify::TRIGGER,
            "channel": notify::CHANNEL,
        }))?;
    } else if enabled {
        println!(
            "notifications on: trigger {} sends NOTIFY {} on new outbox rows",
            notify::TRIGGER,
            notify::CHANNEL
        );
    } else {
        println!("notifications off: relays in other processes poll");
    }
    Ok(ExitCode::SUCCESS)
}

/// A refusal for lack of privilege (`insufficient_privilege`, or not the
/// table's owner), with the hint to run the command as the migration role.
fn without_privilege(error: &sqlx::Error) -> Option<CliError> {
    let code = error.as_database_error()?.code()?;
    (code == "42501").then(|| {
        CliError::Usage(format!(
            "{}; creating or dropping the trigger needs the rights of the role that owns \
             outbox_event: run `outbox notify` as the role that runs your migrations",
            txoutbox_core::DbErrorDisplay(error)
        ))
    })
}
