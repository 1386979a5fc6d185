//! `outbox topics plan | apply` against the real broker: the exporter's
//! topic list, what is missing, creation, idempotence, exit codes.

use std::process::{Command, Output};

use txoutbox_testkit::broker::{brokers, unique_topic};

fn outbox(args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_outbox"));
    for (name, _) in std::env::vars().filter(|(name, _)| name.starts_with("KAFKA_")) {
        command.env_remove(name);
    }
    command
        .env_remove("DATABASE_URL")
        .env_remove("OUTBOX_SCHEMA_EXPORTER")
        .args(args)
        .args(["--brokers", &brokers()])
        .output()
        .unwrap()
}

fn json(output: &Output) -> serde_json::Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {} / {}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

fn states(document: &serde_json::Value) -> Vec<(String, Option<i64>)> {
    document["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["spec"]["name"].as_str().unwrap().to_owned(),
                e["existing_partitions"].as_i64(),
            )
        })
        .collect()
}

#[test]
fn plan_then_apply_creates_what_the_exporter_names_once() {
    let topic = unique_topic("cli-topics");
    // An exporter: prints the registries' topics as JSON (`# ` swallows the
    // `topics` argument the tool appends).
    let exporter = format!(r#"echo '{{"events":["{topic}"],"consumed":["{topic}"]}}' #"#);
    let plan = outbox(&[
        "--json",
        "topics",
        "plan",
        "--check",
        "--exporter",
        &exporter,
    ]);
    assert_eq!(plan.status.code(), Some(1), "missing topics fail --check");
    let dlq = format!("{topic}.dlq");
    assert_eq!(
        states(&json(&plan)),
        [(topic.clone(), None), (dlq.clone(), None)]
    );

    let apply = outbox(&[
        "--json",
        "topics",
        "apply",
        "--exporter",
        &exporter,
        "--partitions",
        "2",
    ]);
    assert!(
        apply.status.success(),
        "{}",
        String::from_utf8_lossy(&apply.stderr)
    );
    assert_eq!(json(&apply)["created"], serde_json::json!([topic, dlq]));

    // Idempotent; the cluster shows the new topics shortly.
    let mut again = outbox(&["--json", "topics", "apply", "--exporter", &exporter]);
    for _ in 0..50 {
        if json(&again)["created"] == serde_json::json!([]) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        again = outbox(&["--json", "topics", "apply", "--exporter", &exporter]);
    }
    assert_eq!(json(&again)["created"], serde_json::json!([]));
    assert_eq!(
        states(&json(&again)),
        [(topic.clone(), Some(2)), (dlq.clone(), Some(1))]
    );
    let check = outbox(&[
        "topics",
        "plan",
        "--check",
        "--topic",
        &topic,
        "--consumes",
        &topic,
    ]);
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let text = String::from_utf8_lossy(&check.stdout);
    assert!(text.contains(&dlq) && text.contains("exists"), "{text}");
}

#[test]
fn no_topic_named_is_a_usage_error() {
    let output = outbox(&["topics", "plan"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--exporter"));
}
