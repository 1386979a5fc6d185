//! Exports the JSON Schemas and the AsyncAPI document of the example events,
//! or checks that the committed ones are up to date (CI runs the check).
//!
//! ```sh
//! cargo run -p outbox-examples --bin schemas -- export            # writes schemas/
//! cargo run -p outbox-examples --bin schemas -- check             # exit 1 if schemas/ is stale
//! cargo run -p outbox-examples --bin schemas -- check --dir other/
//! cargo run -p outbox-examples --bin schemas -- topics            # the topics, as JSON, for `outbox topics`
//! ```
//!
//! Exit codes: 0 success, 1 stale schemas or a failed export, 2 usage error.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use outbox_examples::events::schema_export;

#[derive(Parser)]
#[command(about = "Export or check the event schemas (JSON Schema per event, AsyncAPI document).")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write the schemas, deleting schema files of events that no longer exist.
    Export {
        /// Output directory [default: the workspace's `schemas/`].
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Fail (exit 1), naming every differing file, when the directory is not
    /// what `export` would write.
    Check {
        /// Directory to compare [default: the workspace's `schemas/`].
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Print the topics of the registered events and event handlers as JSON
    /// (what `outbox topics plan | apply --exporter ...` reads).
    Topics,
}

fn main() -> ExitCode {
    // Usage errors exit with 2 (clap's convention).
    let cli = Cli::parse();
    if let Command::Topics = cli.command {
        return print_topics();
    }
    let export = match schema_export() {
        Ok(export) => export,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    match cli.command {
        Command::Export { dir } => {
            let dir = dir.unwrap_or_else(default_dir);
            match export.write_to(&dir) {
                Ok(report) => {
                    for path in &report.written {
                        println!("wrote    {}", dir.join(path).display());
                    }
                    for path in &report.removed {
                        println!("removed  {}", dir.join(path).display());
                    }
                    println!(
                        "{}: {} written, {} removed, {} unchanged",
                        dir.display(),
                        report.written.len(),
                        report.removed.len(),
                        report.unchanged
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: could not write {}: {e}", dir.display());
                    ExitCode::FAILURE
                }
            }
        }
        Command::Topics => unreachable!("answered before the export"),
        Command::Check { dir } => {
            let dir = dir.unwrap_or_else(default_dir);
            match export.check(&dir) {
                Ok(()) => {
                    println!("{} is up to date", dir.display());
                    ExitCode::SUCCESS
                }
                Err(differences) => {
                    eprintln!("{differences}");
                    eprintln!(
                        "hint: run `cargo run -p outbox-examples --bin schemas -- export` and commit \
                         schemas/; changes marked incompatible break consumers (docs/wire-format.md)"
                    );
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// The example services' topics: their events' and the ones their handlers
/// consume.
fn print_topics() -> ExitCode {
    let registered = txoutbox_runtime::topics::Registered::linked();
    match serde_json::to_string(&registered) {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace's `schemas/`, wherever cargo is run from.
fn default_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the examples crate lives in the workspace")
        .join("schemas")
}
