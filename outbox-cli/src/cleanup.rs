//! `outbox cleanup`: the retention job.

use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use txoutbox_runtime::ops::Database;
use txoutbox_runtime::ops::cleanup::{self, Purge, Target};

use crate::args;
use crate::error::CliError;
use crate::output;
use crate::progress::Progress;

/// Each retention flag enables one part of the job; pass at least one.
/// Unpublished, parked and unprocessed rows are never deleted.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  outbox cleanup --older-than 7d --dry-run\n  \
    outbox cleanup --older-than 30d --processed-older-than 14d --inbox-older-than 14d --sagas-older-than 30d"
)]
pub(crate) struct CleanupArgs {
    /// Delete outbox rows published (or discarded) longer ago than this (at most 1000y).
    #[arg(long, value_name = "DURATION", value_parser = args::age)]
    older_than: Option<Duration>,
    /// Delete processed_event dedup rows older than this (at most 1000y).
    ///
    /// Keep it longer than a redelivery can come late (the topic's retention),
    /// or a late duplicate is processed again.
    #[arg(long, value_name = "DURATION", value_parser = args::age)]
    processed_older_than: Option<Duration>,
    /// Delete inbox rows processed (or discarded) longer ago than this (at most 1000y).
    ///
    /// Same caveat as --processed-older-than: the inbox is the dedup record.
    #[arg(long, value_name = "DURATION", value_parser = args::age)]
    inbox_older_than: Option<Duration>,
    /// Delete sagas that finished (completed or compensated) longer ago than
    /// this (at most 1000y). Running sagas are never deleted.
    ///
    /// A message of a deleted saga that still arrives is ignored (and counted
    /// as `unknown_saga`), so keep it longer than replies can come late.
    #[arg(long, value_name = "DURATION", value_parser = args::age)]
    sagas_older_than: Option<Duration>,
    /// Rows per batch; each batch is one short transaction.
    #[arg(long, value_name = "N", default_value_t = Purge::DEFAULT_BATCH_SIZE, value_parser = args::positive)]
    batch_size: i64,
    /// Pause between batches, to leave room for the relays on a busy database (at most 1h).
    #[arg(long, value_name = "DURATION", value_parser = args::wait, default_value = "0s")]
    pause: Duration,
    /// Only count what would be deleted.
    #[arg(long)]
    dry_run: bool,
}

#[derive(Serialize)]
struct Outcome {
    target: Target,
    cutoff: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    matched: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    deleted: Option<u64>,
}

pub(crate) async fn run(
    database: Database<'_>,
    args: CleanupArgs,
    json: bool,
) -> Result<ExitCode, CliError> {
    let plan: Vec<(Target, Duration, &str)> = Target::ALL
        .into_iter()
        .filter_map(|target| {
            let (age, flag) = match target {
                Target::PublishedOutbox | Target::DiscardedOutbox => {
                    (args.older_than, "--older-than")
                }
                Target::ProcessedEvent => (args.processed_older_than, "--processed-older-than"),
                Target::ProcessedInbox | Target::DiscardedInbox => {
                    (args.inbox_older_than, "--inbox-older-than")
                }
                Target::FinishedSaga => (args.sagas_older_than, "--sagas-older-than"),
            };
            age.map(|age| (target, age, flag))
        })
        .collect();
    if plan.is_empty() {
        return Err(CliError::Usage(
            "nothing to clean: pass --older-than, --processed-older-than, --inbox-older-than or --sagas-older-than"
                .into(),
        ));
    }
    // Cutoffs come from the database clock, the one that wrote the timestamps.
    let now: DateTime<Utc> = database.now().await?;
    let mut outcomes = Vec::new();
    for (target, age, flag) in plan {
        // The parser caps the age; checked anyway, as the clock is the database's.
        let cutoff = args::ago(now, age).ok_or_else(|| {
            CliError::Usage(format!(
                "{flag} {} is out of range; {}",
                humantime::format_duration(age),
                args::age_range()
            ))
        })?;
        let outcome = if args.dry_run {
            let matched = cleanup::count(database, target, cutoff).await?;
            if !json {
                println!(
                    "would delete {matched} {} (before {})",
                    describe(target),
                    output::time(cutoff)
                );
            }
            Outcome {
                target,
                cutoff,
                matched: Some(matched),
                deleted: None,
            }
        } else {
            let deleted = purge(database, target, cutoff, &args, json).await?;
            if !json {
                println!(
                    "deleted {deleted} {} (before {})",
                    describe(target),
                    output::time(cutoff)
                );
            }
            Outcome {
                target,
                cutoff,
                matched: None,
                deleted: Some(deleted),
            }
        };
        outcomes.push(outcome);
    }
    if json {
        output::json(&serde_json::json!({ "dry_run": args.dry_run, "targets": outcomes }))?;
    }
    Ok(ExitCode::SUCCESS)
}

async fn purge(
    database: Database<'_>,
    target: Target,
    cutoff: DateTime<Utc>,
    args: &CleanupArgs,
    json: bool,
) -> Result<u64, CliError> {
    // Counting costs a scan: only worth it to size a bar someone watches.
    let total = if Progress::interactive(json) {
        Some(cleanup::count(database, target, cutoff).await? as u64)
    } else {
        None
    };
    let mut progress = Progress::start(&format!("deleting {}", describe(target)), total, json);
    let mut purge = Purge::new(target, cutoff).batch_size(args.batch_size);
    let mut deleted = 0;
    while !purge.is_done() {
        let batch = purge.step(database).await?;
        deleted += batch;
        progress.inc(batch);
        if !args.pause.is_zero() && !purge.is_done() {
            tokio::time::sleep(args.pause).await;
        }
    }
    progress.finish();
    Ok(deleted)
}

/// A short human-readable name, e.g. `published outbox rows`.
fn describe(target: Target) -> &'static str {
    match target {
        Target::PublishedOutbox => "published outbox rows",
        Target::DiscardedOutbox => "discarded outbox rows",
        Target::ProcessedEvent => "processed_event rows",
        Target::ProcessedInbox => "processed inbox rows",
        Target::DiscardedInbox => "discarded inbox rows",
        Target::FinishedSaga => "finished sagas",
    }
}
