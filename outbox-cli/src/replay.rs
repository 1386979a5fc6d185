//! `outbox replay`: re-publish published events.

use std::process::ExitCode;

use chrono::{DateTime, Utc};
use txoutbox_runtime::ops::Database;
use txoutbox_runtime::ops::dead_letters::{self, Table};
use txoutbox_runtime::ops::replay::{self, Replay, ReplayFilter};

use crate::args;
use crate::error::CliError;
use crate::output;
use crate::progress::Progress;

/// Selects published events (every given filter must match) and sends them again, in id order, with their original key, value and headers plus a
/// `replay` header naming the run. Outbox rows are not modified; each run is
/// recorded in outbox_replay_run. Receivers dedup on event_id: rebuild a
/// projection with a fresh consumer group.
///
/// Replayed into the live topic, old events land between the live ones: a
/// group rebuilding a projection from that sees a key's versions out of
/// order. To rebuild in order while the service runs, use --rebuild-topic.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  outbox replay --topic orders --from 2026-11-01 --to 2026-11-02 --dry-run\n  \
    outbox replay --aggregate-type Order --aggregate-id 42 --brokers kafka:9092 --rate 200\n  \
    outbox replay --topic orders --rebuild-topic orders.rebuild-7 --rebuild-group orders-projection-v2"
)]
pub(crate) struct ReplayArgs {
    /// Events created at or after this time.
    ///
    /// RFC 3339 (2026-11-30T09:00:00Z), a date (2026-11-30, midnight UTC) or a
    /// duration ago (2h); years 0000 to 9999, durations up to 1000y.
    #[arg(long, value_name = "TIME", value_parser = args::time_point)]
    from: Option<DateTime<Utc>>,
    /// Events created before this time (same forms as --from).
    #[arg(long, value_name = "TIME", value_parser = args::time_point)]
    to: Option<DateTime<Utc>>,
    /// Only events of this topic.
    #[arg(long)]
    topic: Option<String>,
    /// Only events of this type.
    #[arg(long)]
    event_type: Option<String>,
    /// Only events of this aggregate type.
    #[arg(long)]
    aggregate_type: Option<String>,
    /// Only events of this aggregate id.
    #[arg(long)]
    aggregate_id: Option<String>,
    /// Replay every published event (required when no filter is given).
    #[arg(long)]
    all: bool,
    /// Send to this topic instead of each event's own.
    #[arg(long, value_name = "TOPIC")]
    target_topic: Option<String>,
    /// Rebuild a projection in order: send the --topic's events to this topic
    /// (created beforehand, dedicated to this run) from one database
    /// snapshot, including events still waiting for the relay, and record
    /// where a rebuilding consumer group switches to the live topic (printed,
    /// and kept in outbox_replay_run.handover). The group reads this topic
    /// to its end, then --topic from those offsets; see docs/cli.md.
    #[arg(
        long,
        value_name = "TOPIC",
        requires = "topic",
        conflicts_with = "target_topic"
    )]
    rebuild_topic: Option<String>,
    /// With --rebuild-topic: commit this new consumer group's start offsets
    /// (the rebuild topic where the run starts, the live topic at the
    /// hand-over) before sending, so its consumer can start at once. Refused
    /// if the group has offsets on either topic.
    #[arg(long, value_name = "GROUP", requires = "rebuild_topic")]
    rebuild_group: Option<String>,
    #[command(flatten)]
    kafka: crate::kafka::KafkaArgs,
    /// Send at most N events per second on average.
    #[arg(long, value_name = "N", value_parser = args::positive)]
    rate: Option<i64>,
    /// Events enqueued before awaiting their deliveries.
    #[arg(long, value_name = "N", default_value_t = Replay::DEFAULT_BATCH_SIZE as i64, value_parser = args::positive)]
    batch_size: i64,
    /// The names of the event's headers: `default` (event_id, event_type,
    /// ...) or `debezium` (id, eventType), as the service's relay sends
    /// them (RelayBuilder::header_names).
    #[arg(long, value_name = "NAMES", default_value = "default", value_parser = ["default", "debezium"])]
    header_names: String,
    /// Only count the selected events.
    #[arg(long)]
    dry_run: bool,
}

pub(crate) async fn run(
    database: Database<'_>,
    args: ReplayArgs,
    json: bool,
) -> Result<ExitCode, CliError> {
    let filter = ReplayFilter {
        from: args.from,
        to: args.to,
        topic: args.topic.clone(),
        event_type: args.event_type.clone(),
        aggregate_type: args.aggregate_type.clone(),
        aggregate_id: args.aggregate_id.clone(),
    };
    if filter == ReplayFilter::default() && !args.all {
        return Err(CliError::Usage(
            "no filter given: pass --topic, --from/--to, --event-type, --aggregate-type or --aggregate-id, or --all to replay everything".into(),
        ));
    }
    if let (Some(from), Some(to)) = (filter.from, filter.to)
        && from >= to
    {
        return Err(CliError::Usage(format!(
            "empty time range: --from {} is not before --to {}",
            output::time(from),
            output::time(to)
        )));
    }
    if let Some(topic) = &filter.topic
        && !dead_letters::topic_exists(database, Table::Outbox, topic).await?
    {
        return Err(CliError::Usage(format!(
            "no outbox_event row has topic '{topic}' (check the spelling)"
        )));
    }
    let mut run = Replay::new(filter.clone()).batch_size(args.batch_size as usize);
    if let Some(topic) = &args.target_topic {
        run = run.target_topic(topic.clone());
    }
    if let Some(topic) = &args.rebuild_topic {
        run = run.rebuild(topic.clone());
    }
    if let Some(rate) = args.rate {
        run = run.rate(rate as f64);
    }
    if args.header_names == "debezium" {
        run = run.header_names(txoutbox_runtime::relay::HeaderNames::debezium());
    }
    let mode = if args.rebuild_topic.is_some() {
        "rebuild"
    } else {
        "republish"
    };
    if args.dry_run {
        let selected = run.count(database).await?;
        if json {
            output::json(&serde_json::json!({
                "dry_run": true, "mode": mode, "selected": selected, "filter": filter,
            }))?;
        } else if let Some(topic) = &args.rebuild_topic {
            println!(
                "would replay {selected} events (published or waiting for the relay) into {topic}"
            );
        } else {
            println!("would replay {selected} published events");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let settings = args.kafka.settings()?;
    let producer = producer(&settings).map_err(|e| {
        CliError::Usage(format!(
            "cannot create the Kafka producer: {}",
            settings.redact(&e.to_string())
        ))
    })?;
    if let Some(group) = &args.rebuild_group {
        run = run.start_group(group.clone(), settings.client_config());
    }
    if args.target_topic.is_none() && args.rebuild_topic.is_none() {
        eprintln!(
            "note: the replayed events go to their live topics, between the live events: a \
             consumer rebuilding a projection from them sees a key's old and new events out \
             of order (use --rebuild-topic for that, see docs/cli.md)"
        );
    }
    let total = if Progress::interactive(json) {
        Some(run.count(database).await? as u64)
    } else {
        None
    };
    let mut progress = Progress::start("replaying", total, json);
    let outcome = run
        .run(database, &producer, |sent| progress.inc(sent))
        .await;
    progress.finish();
    let report = outcome?;
    if json {
        output::json(&report)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "replayed {} of {} selected events (run {}, recorded in outbox_replay_run)",
        report.published, report.selected, report.run_id
    );
    if let Some(handover) = &report.handover {
        print_handover(handover);
    }
    Ok(ExitCode::SUCCESS)
}

/// The hand-over, for the operator who switches the rebuilding group.
fn print_handover(handover: &replay::Handover) {
    let offsets = |offsets: &[replay::PartitionOffset]| {
        offsets
            .iter()
            .map(|p| format!("{}:{}", p.partition, p.offset))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let end = handover.replay_end.as_deref().unwrap_or_default();
    println!(
        "hand-over: read {} from offsets {} up to {}, then {} from offsets {} \
         (partition:offset; events committed after the snapshot, id > {} or committed late)",
        handover.replay_topic,
        offsets(&handover.replay_start),
        offsets(end),
        handover.live_topic,
        offsets(&handover.live_offsets),
        handover.snapshot_max_id,
    );
    if let Some(group) = &handover.group {
        println!("consumer group {group} starts at those offsets");
    }
}

/// An idempotent producer (`enable.idempotence=true`, `acks=all`, as the
/// relay's) for replays: the user's settings, a 30 s delivery timeout and a
/// 5 ms linger unless they set those.
fn producer(
    settings: &txoutbox_runtime::kafka_settings::KafkaSettings,
) -> Result<rdkafka::producer::FutureProducer, rdkafka::error::KafkaError> {
    let mut config = settings.client_config();
    for (key, default) in [("message.timeout.ms", "30000"), ("linger.ms", "5")] {
        if config.get(key).is_none() {
            config.set(key, default);
        }
    }
    config
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .create()
}
