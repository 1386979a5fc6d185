//! `outbox dead-letters list | retry | discard`.

use std::process::ExitCode;

use txoutbox_runtime::ops::Database;
use txoutbox_runtime::ops::dead_letters::{self, Selection, Table};
use txoutbox_runtime::ops::status::ProblemRow;
use uuid::Uuid;

use crate::args;
use crate::error::CliError;
use crate::output;

#[derive(Debug, clap::Subcommand)]
pub(crate) enum DeadLettersCommand {
    /// Show parked rows, oldest first, with their attempts and last error.
    List {
        #[command(flatten)]
        select: Select,
        /// Show at most N rows.
        #[arg(long, value_name = "N", default_value_t = 100, value_parser = args::positive)]
        limit: i64,
    },
    /// Put parked rows back in their queue.
    ///
    /// Clears parked_at, resets attempts and the backoff; last_error is kept
    /// until the next attempt replaces it.
    Retry {
        #[command(flatten)]
        select: Select,
        /// Only show what would be retried.
        #[arg(long)]
        dry_run: bool,
    },
    /// Give up on parked rows (they are kept for the audit trail).
    ///
    /// Sets discarded_at, so they are never published or processed; they stay
    /// until `outbox cleanup --older-than` / `--inbox-older-than` removes them.
    Discard {
        #[command(flatten)]
        select: Select,
        /// Only show what would be discarded.
        #[arg(long)]
        dry_run: bool,
    },
}

/// Which parked rows: retry and discard need one of --all, --id, --event-id,
/// --topic.
#[derive(Debug, clap::Args)]
pub(crate) struct Select {
    /// Parked rows of this table.
    #[arg(long, value_enum, default_value = "outbox")]
    table: TableArg,
    /// Every parked row of the table.
    #[arg(long, conflicts_with_all = ["id", "event_id", "topic"])]
    all: bool,
    /// Outbox row id (repeatable; outbox only).
    #[arg(long, value_name = "ID", conflicts_with_all = ["event_id", "topic"])]
    id: Vec<i64>,
    /// Event id (repeatable).
    #[arg(long, value_name = "UUID", conflicts_with = "topic")]
    event_id: Vec<Uuid>,
    /// Parked rows of this topic.
    #[arg(long)]
    topic: Option<String>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum TableArg {
    /// outbox_event: events the relay could not publish.
    Outbox,
    /// inbox_event: received events whose handler kept failing.
    Inbox,
}

impl Select {
    fn table(&self) -> Table {
        match self.table {
            TableArg::Outbox => Table::Outbox,
            TableArg::Inbox => Table::Inbox,
        }
    }

    /// The selection, or `None` when nothing was chosen.
    fn selection(&self) -> Option<Selection> {
        if self.all {
            Some(Selection::All)
        } else if !self.id.is_empty() {
            Some(Selection::Ids(self.id.clone()))
        } else if !self.event_id.is_empty() {
            Some(Selection::EventIds(self.event_id.clone()))
        } else {
            self.topic.clone().map(Selection::Topic)
        }
    }

    async fn resolve(&self, database: Database<'_>, required: bool) -> Result<Selection, CliError> {
        let selection = match self.selection() {
            Some(selection) => selection,
            None if required => {
                return Err(CliError::Usage(
                    "choose the rows: --all, --id, --event-id or --topic".into(),
                ));
            }
            None => Selection::All,
        };
        if let Selection::Topic(topic) = &selection
            && !dead_letters::topic_exists(database, self.table(), topic).await?
        {
            return Err(CliError::Usage(format!(
                "no {} row has topic '{topic}' (check the spelling)",
                table_name(self.table())
            )));
        }
        Ok(selection)
    }
}

fn table_name(table: Table) -> &'static str {
    match table {
        Table::Outbox => "outbox_event",
        Table::Inbox => "inbox_event",
    }
}

pub(crate) async fn run(
    database: Database<'_>,
    command: DeadLettersCommand,
    json: bool,
) -> Result<ExitCode, CliError> {
    match command {
        DeadLettersCommand::List { select, limit } => {
            let selection = select.resolve(database, false).await?;
            let table = select.table();
            let total = dead_letters::count(database, table, &selection).await?;
            let rows = dead_letters::list(database, table, &selection, limit).await?;
            if json {
                output::json(&serde_json::json!({ "table": table, "total": total, "rows": rows }))?;
            } else {
                print!("{}", render(&rows, table));
                println!(
                    "{} in {}{}",
                    output::plural(total, "parked row"),
                    table_name(table),
                    shown(rows.len(), total)
                );
            }
        }
        DeadLettersCommand::Retry { select, dry_run } => {
            act(database, &select, dry_run, json, "retry").await?;
        }
        DeadLettersCommand::Discard { select, dry_run } => {
            act(database, &select, dry_run, json, "discard").await?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn shown(shown: usize, total: i64) -> String {
    if (shown as i64) < total {
        format!(" ({shown} shown; raise --limit to see more)")
    } else {
        String::new()
    }
}

async fn act(
    database: Database<'_>,
    select: &Select,
    dry_run: bool,
    json: bool,
    action: &str,
) -> Result<(), CliError> {
    let selection = select.resolve(database, true).await?;
    let table = select.table();
    let event_ids: Vec<Uuid> = if dry_run {
        dead_letters::list(database, table, &selection, i64::MAX)
            .await?
            .into_iter()
            .map(|row| row.event_id)
            .collect()
    } else if action == "retry" {
        dead_letters::retry(database, table, &selection).await?
    } else {
        dead_letters::discard(database, table, &selection).await?
    };
    if json {
        output::json(&serde_json::json!({
            "action": action,
            "table": table,
            "dry_run": dry_run,
            "count": event_ids.len(),
            "event_ids": event_ids,
        }))?;
    } else {
        let verb = match (dry_run, action) {
            (true, _) => format!("would {action}"),
            (false, "retry") => "retried".to_owned(),
            (false, _) => "discarded".to_owned(),
        };
        println!(
            "{verb} {} in {}",
            output::plural(event_ids.len() as i64, "parked row"),
            table_name(table)
        );
        for id in &event_ids {
            println!("  {id}");
        }
    }
    Ok(())
}

fn render(rows: &[ProblemRow], table: Table) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut lines = vec![{
        let mut header = vec![];
        if table == Table::Outbox {
            header.push("ID".to_owned());
        }
        header.extend(
            [
                "EVENT ID",
                "TOPIC",
                "EVENT TYPE",
                "ATTEMPTS",
                "PARKED AT",
                "LAST ERROR",
            ]
            .map(String::from),
        );
        header
    }];
    for row in rows {
        let mut cells = vec![];
        if table == Table::Outbox {
            cells.push(row.id.unwrap_or_default().to_string());
        }
        cells.extend([
            row.event_id.to_string(),
            row.topic.clone().unwrap_or_default(),
            row.event_type.clone().unwrap_or_default(),
            row.attempts.to_string(),
            row.parked_at.map(output::time).unwrap_or_default(),
            output::short(row.last_error.as_deref(), 100),
        ]);
        lines.push(cells);
    }
    output::table(&lines)
}
