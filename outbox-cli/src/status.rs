//! `outbox status`: what waits, what fails, what is parked; thresholds for
//! health checks.

use std::process::ExitCode;
use std::time::Duration;

use serde::Serialize;
use sqlx::PgPool;
use txoutbox_runtime::ops::sagas::SagaTypeOverview;
use txoutbox_runtime::ops::status::ConsumerDeadLetters;
use txoutbox_runtime::ops::status::{
    self, Breach, ProblemRow, QueueStatus, RelayMember, Status, Thresholds,
};

use crate::args;
use crate::error::CliError;
use crate::output;

/// Thresholds make the command exit 1 when exceeded, naming each one.
#[derive(Debug, clap::Args)]
pub(crate) struct StatusArgs {
    /// Exit 1 when more than N events wait for the relay.
    #[arg(long, value_name = "N")]
    max_backlog: Option<i64>,
    /// Exit 1 when the oldest unpublished event is older than this (e.g. 30s).
    #[arg(long, value_name = "DURATION", value_parser = args::duration)]
    max_age: Option<Duration>,
    /// Exit 1 when more than N rows are parked (outbox and inbox together).
    #[arg(long, value_name = "N")]
    max_parked: Option<i64>,
    /// Exit 1 when more than N inbox events wait for the processor.
    #[arg(long, value_name = "N")]
    max_inbox_backlog: Option<i64>,
    /// Exit 1 when the oldest unprocessed inbox event is older than this.
    #[arg(long, value_name = "DURATION", value_parser = args::duration)]
    max_inbox_age: Option<Duration>,
    /// Exit 1 when a running saga has not moved (taken a step) for longer than this.
    #[arg(long, value_name = "DURATION", value_parser = args::duration)]
    max_saga_age: Option<Duration>,
    /// How many failing / parked rows to show of each kind.
    #[arg(long, value_name = "N", default_value_t = 5)]
    sample: i64,
}

/// The `--json` document: the verdict first, then the status.
#[derive(Serialize)]
struct Report<'a> {
    healthy: bool,
    breaches: &'a [Breach],
    #[serde(flatten)]
    status: &'a Status,
}

pub(crate) async fn run(pool: &PgPool, args: StatusArgs, json: bool) -> Result<ExitCode, CliError> {
    let thresholds = Thresholds {
        max_backlog: args.max_backlog,
        max_age: args.max_age,
        max_parked: args.max_parked,
        max_inbox_backlog: args.max_inbox_backlog,
        max_inbox_age: args.max_inbox_age,
        max_saga_age: args.max_saga_age,
    };
    let status = status::collect(pool, args.sample.max(0)).await?;
    let breaches = thresholds.check(&status);
    if json {
        output::json(&Report {
            healthy: breaches.is_empty(),
            breaches: &breaches,
            status: &status,
        })?;
    } else {
        print!("{}", render(&status));
    }
    for breach in &breaches {
        eprintln!("unhealthy: {breach}");
    }
    Ok(if breaches.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn render(status: &Status) -> String {
    let mut out = String::new();
    out.push_str("outbox (outbox_event)\n");
    out.push_str(&queue(&status.outbox, "unpublished", true));
    out.push_str("\ninbox (inbox_event)\n");
    out.push_str(&queue(&status.inbox, "unprocessed", false));
    if !status.inbox_unclaimed.is_empty() {
        out.push_str("  waiting for a processor that handles their event type:\n");
        let rows: Vec<Vec<String>> = status
            .inbox_unclaimed
            .iter()
            .map(|w| {
                vec![
                    format!("    group {:?}", w.consumer_group),
                    format!(
                        "{} on {}",
                        w.event_type.as_deref().unwrap_or("(no event type)"),
                        w.topic
                    ),
                    output::plural(w.keys, "key"),
                    output::plural(w.rows, "row"),
                    w.oldest_received_at
                        .map(|at| format!("oldest {}", output::time(at)))
                        .unwrap_or_default(),
                ]
            })
            .collect();
        out.push_str(&output::table(&rows));
    }
    out.push_str("\ntables\n");
    let rows: Vec<Vec<String>> = status
        .tables
        .iter()
        .map(|t| {
            let approx = if t.estimated { "~" } else { "" };
            vec![
                format!("  {}", t.table),
                format!("{approx}{}", output::plural(t.rows, "row")),
                output::bytes(t.total_bytes),
            ]
        })
        .collect();
    out.push_str(&output::table(&rows));
    out.push_str(&relays(&status.relays));
    out.push_str(&sagas(&status.sagas));
    out.push_str(&consumer_dead_letters(&status.consumer_dead_letters));
    out
}

/// Messages consumers could not publish to their dead-letter topics (nothing
/// when there is none): they wait in `consumer_dead_letter` for an operator.
fn consumer_dead_letters(dead: &ConsumerDeadLetters) -> String {
    if dead.unpublished == 0 {
        return String::new();
    }
    let mut out = format!(
        "
dead letters their topic refused (consumer_dead_letter)
  {}{}
",
        output::plural(dead.unpublished, "message"),
        dead.oldest_parked_at
            .map(|at| format!(", oldest kept {}", output::time(at)))
            .unwrap_or_default()
    );
    let rows: Vec<Vec<String>> = dead
        .rows
        .iter()
        .map(|r| {
            vec![
                format!("  group {:?}", r.consumer_group),
                format!("{}/{}@{}", r.topic, r.partition, r.offset),
                r.reason.clone(),
                format!("{} refused: {}", r.dead_letter_topic, r.publish_error),
            ]
        })
        .collect();
    out.push_str(&output::table(&rows));
    out
}

/// Sagas per type (nothing when the database has none): how many run, how
/// many finished and wait for retention, how long the oldest running one
/// has not moved.
fn sagas(sagas: &[SagaTypeOverview]) -> String {
    if sagas.is_empty() {
        return String::new();
    }
    let mut out = "\nsagas (saga_state)\n".to_owned();
    let rows: Vec<Vec<String>> = sagas
        .iter()
        .map(|s| {
            vec![
                format!("  {}", s.saga_type),
                format!("running {}", s.running),
                format!("completed {}", s.completed),
                format!("compensated {}", s.compensated),
                s.oldest_running_age_secs
                    .map(|age| format!("oldest running moved {} ago", output::age(age)))
                    .unwrap_or_default(),
            ]
        })
        .collect();
    out.push_str(&output::table(&rows));
    out
}

/// The relays and their leases: a frozen or vanished relay shows as an
/// expired lease, one cut from the broker as such.
fn relays(relays: &[RelayMember]) -> String {
    let mut out = format!(
        "\nrelays (outbox_relay_member)\n  running  {}\n",
        relays.len()
    );
    let rows: Vec<Vec<String>> = relays
        .iter()
        .map(|r| {
            let mut state = Vec::new();
            if r.lease_expired {
                state.push(format!(
                    "LEASE EXPIRED (lease {}): frozen or vanished",
                    output::age(r.lease_secs)
                ));
            }
            if let Some(since) = r.broker_failing_since {
                state.push(format!(
                    "cannot reach the broker since {}",
                    output::time(since)
                ));
            }
            vec![
                format!("    {} process {}", r.host, r.process_id),
                format!("backend {}", r.backend_pid),
                format!("{} of {} lanes", r.lanes_owned, r.lanes),
                format!("renewed {} ago", output::age(r.renewed_secs_ago)),
                state.join("; "),
            ]
        })
        .collect();
    out.push_str(&output::table(&rows));
    out
}

fn queue(q: &QueueStatus, pending: &str, with_id: bool) -> String {
    let oldest = |at: Option<chrono::DateTime<chrono::Utc>>| {
        at.map(|at| format!("oldest {}", output::time(at)))
            .unwrap_or_default()
    };
    let mut rows = vec![vec![
        format!("  {pending}"),
        q.pending.to_string(),
        match q.oldest_pending_age_secs {
            Some(age) => format!("{} ({} ago)", oldest(q.oldest_pending_at), output::age(age)),
            None => String::new(),
        },
    ]];
    for topic in &q.topics {
        rows.push(vec![
            format!("    {}", topic.topic.as_deref().unwrap_or("(no topic)")),
            topic.pending.to_string(),
            oldest(topic.oldest_pending_at),
        ]);
    }
    rows.push(vec![
        "  failing, will retry".into(),
        q.failing.to_string(),
        String::new(),
    ]);
    rows.push(vec![
        "  parked".into(),
        q.parked.to_string(),
        if q.parked > 0 {
            "see `outbox dead-letters list`".into()
        } else {
            String::new()
        },
    ]);
    rows.push(vec![
        "  discarded".into(),
        q.discarded.to_string(),
        String::new(),
    ]);
    let mut out = output::table(&rows);
    for (title, sample) in [("failing", &q.failing_rows), ("parked", &q.parked_rows)] {
        if !sample.is_empty() {
            out.push_str(&format!("  {title} rows (oldest first):\n"));
            out.push_str(&problems(sample, with_id));
        }
    }
    out
}

fn problems(rows: &[ProblemRow], with_id: bool) -> String {
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut cells = Vec::new();
            if with_id {
                cells.push(format!("    id {}", r.id.unwrap_or_default()));
            }
            cells.extend([
                format!("{}event {}", if with_id { "" } else { "    " }, r.event_id),
                r.topic.clone().unwrap_or_default(),
                r.event_type.clone().unwrap_or_default(),
                format!("attempts {}", r.attempts),
                output::short(r.last_error.as_deref(), 80),
            ]);
            cells
        })
        .collect();
    output::table(&table)
}
