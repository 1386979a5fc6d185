//! `outbox schemas export | check`: delegates to the service's exporter.
//!
//! Event schemas come from the event types themselves (collected at link
//! time), which this generic binary cannot link: the export runs in a binary
//! of the service (e.g. `cargo run -p outbox-examples --bin schemas`).

use std::process::{Command, ExitCode};

use crate::error::CliError;

const NO_EXPORTER: &str = "the schema export must link your event types, which this tool cannot: \
    run your exporter binary (e.g. `cargo run -p outbox-examples --bin schemas -- export`), \
    or pass it as --exporter '<command>' (or OUTBOX_SCHEMA_EXPORTER) and this command runs it";

/// Runs your exporter with `export` or `check` and the remaining arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct SchemasArgs {
    /// What to do.
    #[arg(value_enum)]
    action: Action,
    /// The command that runs your exporter binary, e.g.
    /// 'cargo run -q -p my-service --bin schemas --'; run through `sh -c`.
    #[arg(long, env = "OUTBOX_SCHEMA_EXPORTER", value_name = "COMMAND")]
    exporter: Option<String>,
    /// Arguments passed on to the exporter after the action.
    #[arg(last = true)]
    rest: Vec<String>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Action {
    /// Write the JSON Schemas (and AsyncAPI document) of every event.
    Export,
    /// Fail if the checked-in schemas differ or changed incompatibly.
    Check,
}

pub(crate) fn run(args: SchemasArgs) -> Result<ExitCode, CliError> {
    let exporter = args
        .exporter
        .ok_or_else(|| CliError::Usage(NO_EXPORTER.into()))?;
    let action = match args.action {
        Action::Export => "export",
        Action::Check => "check",
    };
    // `"$@"` hands the arguments over unsplit; `sh -c` lets the exporter be
    // any command line (cargo run ..., a path, a wrapper script).
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!("{exporter} \"$@\""))
        .arg("outbox-schemas")
        .arg(action)
        .args(&args.rest)
        .status()
        .map_err(|e| CliError::Usage(format!("cannot run the exporter `{exporter}`: {e}")))?;
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        None => ExitCode::from(1),
    })
}
