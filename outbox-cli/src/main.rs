//! `outbox`: the operator's tool for the outbox framework's tables.
//!
//! See `docs/cli.md` for the commands, their exit codes and examples.

mod args;
mod cleanup;
mod db;
mod dead_letters;
mod error;
mod kafka;
mod migrate;
mod notify;
mod output;
mod progress;
mod replay;
mod sagas;
mod schemas;
mod status;
mod topics;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use txoutbox_runtime::ops::Database;

use crate::error::CliError;

/// Operate the transactional outbox: health, retention, dead letters, replay,
/// sagas.
///
/// Exit codes: 0 success; 1 a health threshold was exceeded or an operation
/// failed midway; 2 bad input, unreachable database or missing schema.
#[derive(Debug, Parser)]
#[command(name = "outbox", version)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

/// Options every command accepts.
#[derive(Debug, clap::Args)]
struct Global {
    /// URL of the service database holding the outbox tables: postgres://..,
    /// or mysql:// / mariadb:// (MariaDB >= 10.6) for every command but
    /// notify.
    #[arg(
        long,
        env = "DATABASE_URL",
        global = true,
        hide_env_values = true,
        help_heading = "Global options"
    )]
    database_url: Option<String>,

    /// How long to wait for the database connection (at most 1h).
    #[arg(long, global = true, default_value = "5s", value_parser = args::wait, value_name = "DURATION", help_heading = "Global options")]
    connect_timeout: std::time::Duration,

    /// Print machine-readable JSON on stdout instead of text.
    #[arg(long, global = true, help_heading = "Global options")]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Apply the framework's migrations (tables, indexes, extension columns).
    ///
    /// On MariaDB >= 10.6 (`--database-url mysql://..` or `mariadb://..`)
    /// it creates the MySQL schema; there every command but notify works.
    Migrate,
    /// Show backlog, failing and parked rows; a health check with thresholds.
    ///
    /// With --max-* thresholds, exits 1 when one is exceeded and names it on stderr.
    Status(status::StatusArgs),
    /// Retention job: delete finished rows older than a duration.
    ///
    /// Deletes in small batches (one short transaction each), safely while relays
    /// and consumers run; never an unpublished, parked or unprocessed row.
    Cleanup(cleanup::CleanupArgs),
    /// List, retry or discard parked rows ("dead letters").
    #[command(subcommand)]
    DeadLetters(dead_letters::DeadLettersCommand),
    /// Re-publish published events to Kafka, e.g. to rebuild a projection.
    ///
    /// Into the live topic, the old events land between the live ones: a
    /// consumer group rebuilding a projection from them sees a key's old and
    /// new versions out of order. To rebuild in order while the service
    /// runs, use --rebuild-topic (and --rebuild-group): one database
    /// snapshot into a topic of its own, then the live topic from recorded
    /// hand-over offsets.
    Replay(replay::ReplayArgs),
    /// List and inspect sagas; find running sagas that stopped moving.
    ///
    /// `stuck` is a health check: it exits 1 when it finds a saga.
    #[command(subcommand)]
    Sagas(sagas::SagasCommand),
    /// Cross-process relay wake-ups through LISTEN/NOTIFY (off by default;
    /// PostgreSQL only).
    #[command(subcommand)]
    Notify(notify::NotifyCommand),
    /// Export or check event schemas (runs your service's exporter).
    Schemas(schemas::SchemasArgs),
    /// Plan or create the topics your service needs (from its exporter).
    Topics(topics::TopicsArgs),
}

fn main() -> ExitCode {
    let cli = args::parse::<Cli>();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return CliError::Failed(format!("cannot start the async runtime: {e}")).report(),
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(error) => error.report(),
    }
}

async fn run(cli: Cli) -> Result<ExitCode, CliError> {
    let Cli { global, command } = cli;
    let command = match command {
        Command::Schemas(args) => return schemas::run(args),
        Command::Topics(args) => return topics::run(args, global.json).await,
        command => command,
    };
    let json = global.json;
    // MariaDB: every command but `notify` (refused by `db::connect`: MariaDB
    // has no LISTEN / NOTIFY).
    let on_mariadb = !matches!(command, Command::Notify(_));
    if on_mariadb && db::is_mysql(global.database_url.as_deref()) {
        let url = global.database_url.as_deref().unwrap_or_default();
        let pool = db::connect_mysql(url, global.connect_timeout).await?;
        let database = Database::from(&pool);
        return match command {
            Command::Migrate => migrate::run_mysql(&pool, json).await,
            Command::Status(args) => status::run(database, args, json).await,
            Command::Cleanup(args) => cleanup::run(database, args, json).await,
            Command::DeadLetters(command) => dead_letters::run(database, command, json).await,
            Command::Replay(args) => replay::run(database, args, json).await,
            Command::Sagas(command) => sagas::run(database, command, json).await,
            Command::Notify(_) | Command::Schemas(_) | Command::Topics(_) => {
                unreachable!("not run on MariaDB, or need no database")
            }
        };
    }
    let pool = db::connect(global.database_url.as_deref(), global.connect_timeout).await?;
    let database = Database::from(&pool);
    match command {
        Command::Migrate => migrate::run(&pool, json).await,
        Command::Status(args) => status::run(database, args, json).await,
        Command::Cleanup(args) => cleanup::run(database, args, json).await,
        Command::DeadLetters(command) => dead_letters::run(database, command, json).await,
        Command::Replay(args) => replay::run(database, args, json).await,
        Command::Sagas(command) => sagas::run(database, command, json).await,
        Command::Notify(command) => notify::run(&pool, command, json).await,
        Command::Schemas(_) | Command::Topics(_) => unreachable!("need no database"),
    }
}
