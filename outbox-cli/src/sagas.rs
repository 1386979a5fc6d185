//! `outbox sagas list | show | stuck`.

use std::process::ExitCode;
use std::time::Duration;

use serde::Serialize;
use txoutbox_runtime::ops::Database;
use txoutbox_runtime::ops::sagas::{self, SagaDetail, SagaFilter, SagaSummary};
use txoutbox_runtime::saga::SagaStatus;

use crate::args;
use crate::error::CliError;
use crate::output;

#[derive(Debug, clap::Subcommand)]
pub(crate) enum SagasCommand {
    /// List sagas, the most recently moved first.
    List {
        /// Only sagas of this type.
        #[arg(long = "type", value_name = "TYPE")]
        saga_type: Option<String>,
        /// Only sagas in this status.
        #[arg(long, value_enum)]
        status: Option<StatusArg>,
        /// Show at most N sagas.
        #[arg(long, value_name = "N", default_value_t = SagaFilter::DEFAULT_LIMIT, value_parser = args::positive)]
        limit: i64,
    },
    /// Show one saga: its state and the compensations it would send.
    Show {
        /// The saga type.
        #[arg(value_name = "TYPE")]
        saga_type: String,
        /// The saga's id (its correlation value).
        #[arg(value_name = "ID")]
        saga_id: String,
    },
    /// Running sagas that have not moved for longer than a duration, the
    /// longest waiting first; a health check.
    ///
    /// Exits 1 when there is such a saga (and says so on stderr), 0 when
    /// there is none.
    #[command(
        after_help = "Example:\n  outbox sagas stuck --older-than 10m --type OrderFulfilment"
    )]
    Stuck {
        /// Running sagas whose last step is older than this (at most 1000y).
        #[arg(long, value_name = "DURATION", value_parser = args::age)]
        older_than: Duration,
        /// Only sagas of this type.
        #[arg(long = "type", value_name = "TYPE")]
        saga_type: Option<String>,
        /// Show at most N sagas (all are counted).
        #[arg(long, value_name = "N", default_value_t = 100, value_parser = args::positive)]
        limit: i64,
    },
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum StatusArg {
    /// Started, waiting for its next message.
    Running,
    /// Ended by completing.
    Completed,
    /// Ended by sending its compensations.
    Compensated,
}

impl From<StatusArg> for SagaStatus {
    fn from(status: StatusArg) -> Self {
        match status {
            StatusArg::Running => SagaStatus::Running,
            StatusArg::Completed => SagaStatus::Completed,
            StatusArg::Compensated => SagaStatus::Compensated,
        }
    }
}

/// The `--json` document of `stuck`.
#[derive(Serialize)]
struct StuckReport<'a> {
    older_than_secs: f64,
    saga_type: Option<&'a str>,
    total: i64,
    sagas: &'a [SagaSummary],
}

pub(crate) async fn run(
    database: Database<'_>,
    command: SagasCommand,
    json: bool,
) -> Result<ExitCode, CliError> {
    match command {
        SagasCommand::List {
            saga_type,
            status,
            limit,
        } => {
            let filter = SagaFilter {
                saga_type,
                status: status.map(SagaStatus::from),
                limit,
            };
            let rows = sagas::list(database, &filter).await?;
            if rows.is_empty()
                && let Some(saga_type) = &filter.saga_type
            {
                known_type(database, saga_type).await?;
            }
            if json {
                output::json(&serde_json::json!({ "sagas": rows }))?;
            } else {
                print!("{}", summaries(&rows, false));
                let more = if rows.len() as i64 == limit {
                    " (the limit; raise --limit to see more)"
                } else {
                    ""
                };
                println!(
                    "{}, the most recently moved first{more}",
                    output::plural(rows.len() as i64, "saga")
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        SagasCommand::Show { saga_type, saga_id } => {
            let Some(saga) = sagas::show(database, &saga_type, &saga_id).await? else {
                known_type(database, &saga_type).await?;
                return Err(CliError::Usage(format!(
                    "no {saga_type} saga has id '{saga_id}' (never started, or removed by retention after it finished)"
                )));
            };
            if json {
                output::json(&saga)?;
            } else {
                print!("{}", detail(&saga));
            }
            Ok(ExitCode::SUCCESS)
        }
        SagasCommand::Stuck {
            older_than,
            saga_type,
            limit,
        } => {
            let saga_type = saga_type.as_deref();
            let rows = sagas::stuck(database, older_than, saga_type, limit).await?;
            let total = if (rows.len() as i64) < limit {
                rows.len() as i64
            } else {
                sagas::count_stuck(database, older_than, saga_type).await?
            };
            let which = match saga_type {
                Some(saga_type) => format!("running {saga_type} saga"),
                None => "running saga".to_owned(),
            };
            let age_text = humantime::format_duration(older_than);
            if json {
                output::json(&StuckReport {
                    older_than_secs: older_than.as_secs_f64(),
                    saga_type,
                    total,
                    sagas: &rows,
                })?;
            } else if total == 0 {
                println!("no {which} has gone without a step for more than {age_text}");
            } else {
                // The table on stdout, the verdict on stderr (like `status`).
                print!("{}", summaries(&rows, true));
                if (rows.len() as i64) < total {
                    println!("{} of {total} shown; raise --limit to see more", rows.len());
                }
            }
            if total == 0 {
                return Ok(ExitCode::SUCCESS);
            }
            eprintln!(
                "unhealthy: {} not moved for more than {age_text}",
                has_have(total, &which)
            );
            Ok(ExitCode::from(1))
        }
    }
}

/// `1 running saga has`, `2 running sagas have`.
fn has_have(n: i64, noun: &str) -> String {
    format!(
        "{} {}",
        output::plural(n, noun),
        if n == 1 { "has" } else { "have" }
    )
}

/// A usage error when no saga has the type at all: a misspelt type is not
/// mistaken for "no such saga".
async fn known_type(database: Database<'_>, saga_type: &str) -> Result<(), CliError> {
    let any = SagaFilter {
        saga_type: Some(saga_type.to_owned()),
        status: None,
        limit: 1,
    };
    if sagas::list(database, &any).await?.is_empty() {
        return Err(CliError::Usage(format!(
            "no saga has type '{saga_type}' (check the spelling)"
        )));
    }
    Ok(())
}

/// The sagas as a table; `waiting` puts the time since the last step first
/// (for `stuck`).
fn summaries(rows: &[SagaSummary], waiting: bool) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut header = vec!["TYPE", "ID", "STATUS", "VERSION", "LAST MESSAGE"];
    header.extend(if waiting {
        ["STARTED", "LAST STEP", "WAITING", "COMPENSATIONS"]
    } else {
        ["STARTED", "LAST STEP", "FINISHED", "COMPENSATIONS"]
    });
    let mut lines = vec![header.into_iter().map(String::from).collect::<Vec<_>>()];
    for s in rows {
        lines.push(vec![
            s.saga_type.clone(),
            s.saga_id.clone(),
            s.status.to_string(),
            s.version.to_string(),
            s.last_message_type.clone().unwrap_or_default(),
            output::time(s.started_at),
            output::time(s.updated_at),
            if waiting {
                output::age(s.idle_secs)
            } else {
                s.finished_at.map(output::time).unwrap_or_default()
            },
            s.pending_compensations.to_string(),
        ]);
    }
    output::table(&lines)
}

fn detail(saga: &SagaDetail) -> String {
    let s = &saga.summary;
    let mut fields = vec![
        vec!["  status".to_owned(), s.status.to_string()],
        vec!["  version".to_owned(), format!("{} steps", s.version)],
        vec!["  started".to_owned(), output::time(s.started_at)],
        vec![
            "  last step".to_owned(),
            format!(
                "{} ({} ago)",
                output::time(s.updated_at),
                output::age(s.idle_secs)
            ),
        ],
        vec![
            "  last message".to_owned(),
            match (&s.last_message_type, saga.last_event_id) {
                (Some(kind), Some(id)) => format!("{kind}, event {id}"),
                (Some(kind), None) => kind.clone(),
                (None, Some(id)) => format!("event {id}"),
                (None, None) => String::new(),
            },
        ],
    ];
    if let Some(finished) = s.finished_at {
        fields.push(vec!["  finished".to_owned(), output::time(finished)]);
    }
    let mut out = format!("saga {} {}\n", s.saga_type, s.saga_id);
    out.push_str(&output::table(&fields));
    out.push_str("state\n");
    let state = serde_json::to_string_pretty(&saga.state).unwrap_or_else(|_| "null".into());
    for line in state.lines() {
        out.push_str(&format!("  {line}\n"));
    }
    if saga.compensations.is_empty() {
        out.push_str("pending compensations: none\n");
    } else {
        out.push_str(&format!(
            "pending compensations: {}, sent last first if the saga is compensated\n",
            saga.compensations.len()
        ));
        let mut rows = vec![
            ["  EVENT TYPE", "TOPIC", "KEY", "EVENT ID"]
                .map(String::from)
                .to_vec(),
        ];
        for c in &saga.compensations {
            rows.push(vec![
                format!("  {}", c.event_type),
                c.topic.clone(),
                c.partition_key.clone(),
                c.event_id.to_string(),
            ]);
        }
        out.push_str(&output::table(&rows));
    }
    out
}
