//! `outbox status`: what waits, what fails, what is parked; thresholds for
//! health checks.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use serde::Serialize;
use txoutbox_runtime::ops::Database;
use txoutbox_runtime::ops::sagas::SagaTypeOverview;
use txoutbox_runtime::ops::status::ConsumerDeadLetters;
use txoutbox_runtime::ops::status::{
    self, Breach, HeldTopic, ProblemRow, QueueStatus, RelayMember, Status, Thresholds,
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
    /// Exit 1 when more than N rows are parked (outbox, inbox and the
    /// consumers' dead letters their topic refused, together).
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

pub(crate) async fn run(
    database: Database<'_>,
    args: StatusArgs,
    json: bool,
) -> Result<ExitCode, CliError> {
    let thresholds = Thresholds {
        max_backlog: args.max_backlog,
        max_age: args.max_age,
        max_parked: args.max_parked,
        max_inbox_backlog: args.max_inbox_backlog,
        max_inbox_age: args.max_inbox_age,
        max_saga_age: args.max_saga_age,
    };
    let status = status::collect(database, args.sample.max(0)).await?;
    // A threshold on a part this database does not have could never be
    // exceeded: say so instead of passing the check.
    for (flag, set, table) in [
        (
            "--max-inbox-backlog",
            args.max_inbox_backlog.is_some(),
            "inbox_event",
        ),
        (
            "--max-inbox-age",
            args.max_inbox_age.is_some(),
            "inbox_event",
        ),
        ("--max-saga-age", args.max_saga_age.is_some(), "saga_state"),
    ] {
        if set && status.not_on_this_database.contains(&table) {
            return Err(CliError::Usage(format!(
                "{flag}: {table} is not measured on this database ({WHY_MISSING})"
            )));
        }
    }
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
    out.push_str(&held_topics(&status.relays));
    out.push_str("\ninbox (inbox_event)\n");
    if status.not_on_this_database.contains(&"inbox_event") {
        out.push_str(&format!("  not on this database ({WHY_MISSING})\n"));
    } else {
        out.push_str(&queue(&status.inbox, "unprocessed", false));
    }
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
    out.push_str(&missing(&status.not_on_this_database));
    out
}

/// Why a framework table is not measured: the schema was migrated before
/// it (on MariaDB, the consumer and saga tables came in later migrations).
const WHY_MISSING: &str = "the schema predates it: run `outbox migrate`";

/// The framework's tables status does not measure on this database, each
/// with why (nothing when it measures them all): their parts above are
/// empty.
fn missing(tables: &[&str]) -> String {
    if tables.is_empty() {
        return String::new();
    }
    let mut out = "\nnot measured on this database\n".to_owned();
    let rows: Vec<Vec<String>> = tables
        .iter()
        .map(|table| vec![format!("  {table}"), WHY_MISSING.to_owned()])
        .collect();
    out.push_str(&output::table(&rows));
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

/// The topics relays hold because the broker refuses them as a whole
/// (nothing when none is held): one line per topic, whichever relays hold
/// it, with the oldest hold's reason.
fn held_topics(relays: &[RelayMember]) -> String {
    let mut topics: BTreeMap<&str, (&HeldTopic, usize, u64)> = BTreeMap::new();
    for held in relays.iter().flat_map(|r| &r.held_topics) {
        let entry = topics.entry(&held.topic).or_insert((held, 0, 0));
        if held.since < entry.0.since {
            entry.0 = held;
        }
        entry.1 += 1;
        entry.2 += held.refusals;
    }
    if topics.is_empty() {
        return String::new();
    }
    let mut out = "  held topics (refused by the broker as a whole; their events wait, \
                   no attempt counted):\n"
        .to_owned();
    let rows: Vec<Vec<String>> = topics
        .into_iter()
        .map(|(topic, (held, relays, refusals))| {
            vec![
                format!("    {topic}"),
                format!("since {}", output::time(held.since)),
                format!(
                    "{} by {}",
                    output::plural(refusals as i64, "refusal"),
                    output::plural(relays as i64, "relay")
                ),
                output::short(Some(&held.reason), 80),
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
            if !r.held_topics.is_empty() {
                let names: Vec<&str> = r.held_topics.iter().map(|h| h.topic.as_str()).collect();
                state.push(format!("holding {}", names.join(", ")));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn relay(process_id: i64, held: &[(&str, &str, i64, u64)]) -> RelayMember {
        RelayMember {
            host: "vm".into(),
            process_id,
            backend_pid: 100 + process_id,
            lanes: 64,
            lanes_owned: 32,
            renewed_secs_ago: 0.5,
            lease_secs: 10.0,
            lease_expired: false,
            broker_failing_since: None,
            held_topics: held
                .iter()
                .map(|(topic, reason, since, refusals)| HeldTopic {
                    topic: (*topic).into(),
                    reason: (*reason).into(),
                    since: chrono::DateTime::from_timestamp(*since, 0).unwrap(),
                    refusals: *refusals,
                })
                .collect(),
        }
    }

    #[test]
    fn held_topics_are_listed_once_per_topic_with_the_oldest_reason() {
        let relays = [
            relay(
                1,
                &[(
                    "orders-v2",
                    "UnknownTopicOrPartition (Broker: Unknown topic or partition)",
                    1_800_000_100,
                    7,
                )],
            ),
            relay(
                2,
                &[
                    ("orders-v2", "Local: Unknown topic", 1_800_000_000, 3),
                    (
                        "payments",
                        "Broker: Topic authorization failed",
                        1_800_000_050,
                        1,
                    ),
                ],
            ),
        ];
        let text = held_topics(&relays);
        assert!(text.contains("held topics"), "{text}");
        let lines: Vec<&str> = text.lines().skip(1).collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].contains("orders-v2"), "{text}");
        assert!(lines[0].contains("10 refusals by 2 relays"), "{text}");
        assert!(
            lines[0].contains("Local: Unknown topic"),
            "the oldest hold's reason: {text}"
        );
        assert!(lines[1].contains("payments"), "{text}");
        assert!(lines[1].contains("authorization"), "{text}");
        let table = super::relays(&relays);
        assert!(table.contains("holding orders-v2, payments"), "{table}");
        assert!(held_topics(&[relay(3, &[])]).is_empty());
    }
}
