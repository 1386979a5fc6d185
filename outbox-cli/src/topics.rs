//! `outbox topics plan | apply`: the topics a service needs against the
//! cluster; `apply` creates what is missing (never deletes or shrinks).
//!
//! Which topics a service needs comes from its registries (the events it
//! links, the topics its `#[event_handler]`s consume), which only a binary of
//! the service can read: `--exporter` runs it with `topics` and reads the
//! JSON it prints (`txoutbox_runtime::topics::Registered`). `--topic` and
//! `--consumes` add topics by hand.

use std::collections::BTreeMap;
use std::process::{Command, ExitCode};

use txoutbox_runtime::topics::{self, Plan, Registered, TopicDefaults};

use crate::error::CliError;
use crate::kafka::KafkaArgs;
use crate::output;

/// What to do.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Action {
    /// Show each needed topic and whether the cluster has it.
    Plan,
    /// Create the missing topics.
    Apply,
}

/// Plan or create the topics a service needs.
#[derive(Debug, clap::Args)]
pub(crate) struct TopicsArgs {
    /// `plan` or `apply`.
    #[arg(value_enum)]
    action: Action,
    /// The command that runs your exporter binary (it is run with `topics`
    /// and prints the registered topics as JSON), e.g.
    /// 'cargo run -q -p my-service --bin schemas --'; run through `sh -c`.
    #[arg(long, env = "OUTBOX_SCHEMA_EXPORTER", value_name = "COMMAND")]
    exporter: Option<String>,
    /// An event topic, besides the exporter's; repeatable.
    #[arg(long, value_name = "TOPIC")]
    topic: Vec<String>,
    /// A consumed topic (it needs a dead-letter topic), besides the
    /// exporter's; repeatable.
    #[arg(long, value_name = "TOPIC")]
    consumes: Vec<String>,
    /// Partitions of event topics.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(i32).range(1..))]
    partitions: i32,
    /// Replication factor of every topic.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i32).range(1..))]
    replication_factor: i32,
    /// A topic config for every topic, e.g. `retention.ms=604800000`; repeatable.
    #[arg(long = "config", value_name = "KEY=VALUE")]
    configs: Vec<String>,
    /// Partitions of dead-letter topics.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i32).range(1..))]
    dlq_partitions: i32,
    /// Suffix of dead-letter topics (the consumers' `dlq_suffix`).
    #[arg(long, default_value = ".dlq")]
    dlq_suffix: String,
    /// With `plan`: exit 1 when a topic is missing (for CI and start-up checks).
    #[arg(long)]
    check: bool,
    #[command(flatten)]
    kafka: KafkaArgs,
}

pub(crate) async fn run(args: TopicsArgs, json: bool) -> Result<ExitCode, CliError> {
    let mut registered = match &args.exporter {
        Some(exporter) => from_exporter(exporter)?,
        None => Registered::default(),
    };
    registered.events.extend(args.topic.iter().cloned());
    registered.consumed.extend(args.consumes.iter().cloned());
    if registered.events.is_empty() && registered.consumed.is_empty() {
        return Err(CliError::Usage(
            "no topics: pass --exporter '<command>' (or set OUTBOX_SCHEMA_EXPORTER) to read your service's registries, or name them with --topic / --consumes".into(),
        ));
    }
    let mut defaults = TopicDefaults::default()
        .partitions(args.partitions)
        .replication(args.replication_factor)
        .dead_letter_partitions(args.dlq_partitions)
        .dead_letter_suffix(&args.dlq_suffix);
    for pair in &args.configs {
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| CliError::Usage(format!("--config expects key=value, got `{pair}`")))?;
        defaults = defaults.config(key.trim(), value.trim());
    }
    let settings = args.kafka.settings()?;
    let kafka = settings.client_config();
    let wanted = registered.required(&defaults);
    let redact = |e: topics::TopicsError| settings.redact(&e.to_string());
    let plan = topics::plan(&kafka, &wanted)
        .await
        .map_err(|e| CliError::Usage(format!("cannot read the cluster's topics: {}", redact(e))))?;
    match args.action {
        Action::Plan => {
            report(&plan, None, json)?;
            Ok(if args.check && !plan.is_complete() {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            })
        }
        Action::Apply => {
            let created = topics::apply(&kafka, &plan)
                .await
                .map_err(|e| CliError::Failed(redact(e)))?;
            report(&plan, Some(&created), json)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Runs the exporter with `topics` and parses what it prints.
fn from_exporter(exporter: &str) -> Result<Registered, CliError> {
    let output = Command::new("sh")
        .arg("-c")
        .arg(format!("{exporter} topics"))
        .output()
        .map_err(|e| CliError::Usage(format!("cannot run the exporter `{exporter}`: {e}")))?;
    if !output.status.success() {
        return Err(CliError::Usage(format!(
            "the exporter `{exporter} topics` failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    serde_json::from_slice(&output.stdout).map_err(|e| {
        CliError::Usage(format!(
            "the exporter `{exporter} topics` printed no topic list ({e}); does it support `topics`?"
        ))
    })
}

fn report(plan: &Plan, created: Option<&[String]>, json: bool) -> Result<(), CliError> {
    if json {
        let mut document = serde_json::to_value(plan)
            .map_err(|e| CliError::Failed(format!("cannot write JSON: {e}")))?;
        if let Some(created) = created {
            document["created"] = serde_json::json!(created);
        }
        return output::json(&document);
    }
    let created: BTreeMap<&str, ()> = created
        .unwrap_or_default()
        .iter()
        .map(|t| (t.as_str(), ()))
        .collect();
    let rows: Vec<Vec<String>> = plan
        .entries
        .iter()
        .map(|entry| {
            let spec = &entry.spec;
            let state = match entry.existing_partitions {
                _ if created.contains_key(spec.name.as_str()) => "created".to_owned(),
                None => "missing".to_owned(),
                Some(existing) if existing < spec.partitions => format!(
                    "exists with {existing} partitions (fewer; left alone: adding partitions moves keys)"
                ),
                Some(existing) => format!("exists ({existing} partitions)"),
            };
            vec![
                format!("  {}", spec.name),
                format!("{:?}", spec.role).to_lowercase(),
                format!(
                    "{} partitions, replication {}",
                    spec.partitions, spec.replication
                ),
                state,
            ]
        })
        .collect();
    print!("{}", output::table(&rows));
    Ok(())
}
