//! `outbox replay` end to end against real PostgreSQL and the broker at
//! KAFKA_BROKERS_TEST.

#[path = "../../outbox-runtime/tests/ops_support/mod.rs"]
mod ops_support;

use ops_support::{OutboxRow, brokers, new_topic, read_back};
use sqlx::PgPool;

#[sqlx::test(migrations = false)]
async fn the_binary_replays_and_reports_json(pool: PgPool) {
    use sqlx::ConnectOptions;
    txoutbox_runtime::migrations::run(&pool).await.unwrap();
    let topic = new_topic().await;
    let source: &'static str = Box::leak(format!("{topic}-source").into_boxed_str());
    for _ in 0..3 {
        OutboxRow::new(source).published(60, 30).insert(&pool).await;
    }
    let url = pool.connect_options().to_url_lossy().to_string();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args([
            "--database-url",
            &url,
            "replay",
            "--json",
            "--topic",
            source,
        ])
        .args(["--target-topic", &topic])
        .env("KAFKA_BROKERS", brokers())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        (report["selected"].as_i64(), report["published"].as_i64()),
        (Some(3), Some(3))
    );
    assert_eq!(read_back(&topic).await.len(), 3);
}

/// Runs `outbox replay --json` of `source` into `target` with `extra`
/// arguments and no `KAFKA_*` variable but `env`.
fn replay(
    pool: &PgPool,
    source: &str,
    target: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> std::process::Output {
    use sqlx::ConnectOptions;
    let url = pool.connect_options().to_url_lossy().to_string();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_outbox"));
    command
        .args([
            "--database-url",
            &url,
            "replay",
            "--json",
            "--topic",
            source,
        ])
        .args(["--target-topic", target])
        .args(extra);
    for (name, _) in std::env::vars().filter(|(name, _)| name.starts_with("KAFKA_")) {
        command.env_remove(name);
    }
    command.envs(env.iter().copied()).output().unwrap()
}

/// The kcat conventions reach librdkafka: `--kafka-config` names the broker,
/// `-X` sets (and overrides) settings, and an error never shows a secret.
#[sqlx::test(migrations = false)]
async fn kafka_settings_come_from_a_file_the_environment_and_x_flags(pool: PgPool) {
    txoutbox_runtime::migrations::run(&pool).await.unwrap();
    let topic = new_topic().await;
    let source: &'static str = Box::leak(format!("{topic}-source").into_boxed_str());
    OutboxRow::new(source).published(60, 30).insert(&pool).await;
    let dir = std::env::temp_dir().join(format!("txoutbox-cli-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("client.properties");
    std::fs::write(
        &file,
        format!("# the test broker\nbootstrap.servers={}\n", brokers()),
    )
    .unwrap();

    // The file alone names the broker.
    let output = replay(
        &pool,
        source,
        &topic,
        &["--kafka-config", file.to_str().unwrap()],
        &[],
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(read_back(&topic).await.len(), 1);

    // -X reaches librdkafka: a value it refuses is reported, exit 2, and the
    // secret set beside it is not printed.
    let output = replay(
        &pool,
        source,
        &topic,
        &[
            "--kafka-config",
            file.to_str().unwrap(),
            "-X",
            "compression.codec=bogus",
            "-X",
            "sasl.password=TOPSECRET",
        ],
        &[("KAFKA_SASL_USERNAME", "orders")],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("compression.codec") && stderr.contains("bogus"),
        "{stderr}"
    );
    assert!(!stderr.contains("TOPSECRET"), "{stderr}");
    assert!(!String::from_utf8_lossy(&output.stdout).contains("TOPSECRET"));

    // No broker anywhere: a usage error naming the ways to give one.
    let output = replay(&pool, source, &topic, &[], &[]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--kafka-config"));
    let _ = std::fs::remove_dir_all(dir);
}

/// `outbox replay --rebuild-topic --rebuild-group`: the events (a pending one
/// too) go to the rebuild topic, the group starts there and at the live
/// topic's hand-over offsets, and both the JSON report and the text say
/// where the group switches.
#[sqlx::test(migrations = false)]
async fn the_binary_rebuilds_into_a_topic_of_its_own_and_starts_the_group(pool: PgPool) {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use sqlx::ConnectOptions;
    txoutbox_runtime::migrations::run(&pool).await.unwrap();
    let live: &'static str = Box::leak(new_topic().await.into_boxed_str());
    let rebuild_topic = new_topic().await;
    OutboxRow::new(live).published(60, 30).insert(&pool).await;
    OutboxRow::new(live).insert(&pool).await; // waiting for the relay
    let group = format!("{rebuild_topic}-group");
    let url = pool.connect_options().to_url_lossy().to_string();
    let run = |json: bool, group: Option<&str>| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_outbox"));
        command
            .args(["--database-url", &url, "replay", "--topic", live])
            .args(["--rebuild-topic", &rebuild_topic])
            .env("KAFKA_BROKERS", brokers());
        if let Some(group) = group {
            command.args(["--rebuild-group", group]);
        }
        if json {
            command.arg("--json");
        }
        command.output().unwrap()
    };

    let output = run(true, Some(&group));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(!stderr.contains("note:"), "no live-topic warning: {stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["published"], 2);
    let handover = &report["handover"];
    assert_eq!(handover["live_topic"], live);
    assert_eq!(handover["group"], group.as_str());
    assert_eq!(handover["replay_end"][0]["offset"], 2);
    assert_eq!(read_back(&rebuild_topic).await.len(), 2);
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("group.id", &group)
        .create()
        .unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition(&rebuild_topic, 0);
    tpl.add_partition(live, 0);
    let committed = consumer
        .committed_offsets(tpl, std::time::Duration::from_secs(10))
        .unwrap();
    let offsets: Vec<_> = committed
        .elements()
        .iter()
        .map(|e| e.offset().to_raw())
        .collect();
    assert_eq!(offsets, [Some(0), Some(0)]);

    // The same group twice: refused (exit 1, the run records the error).
    let again = run(false, Some(&group));
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("already has a committed offset"));

    // Text: where to switch.
    let text = run(false, None);
    assert!(text.status.success());
    let stdout = String::from_utf8_lossy(&text.stdout);
    assert!(
        stdout.contains(&format!("hand-over: read {rebuild_topic} from offsets 0:")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("then {live} from offsets 0:0")),
        "{stdout}"
    );
}

/// A republish into the live topic warns that a rebuilding consumer would
/// see keys out of order.
#[sqlx::test(migrations = false)]
async fn replaying_into_the_live_topic_warns_about_rebuilds(pool: PgPool) {
    use sqlx::ConnectOptions;
    txoutbox_runtime::migrations::run(&pool).await.unwrap();
    let live: &'static str = Box::leak(new_topic().await.into_boxed_str());
    OutboxRow::new(live).published(60, 30).insert(&pool).await;
    let url = pool.connect_options().to_url_lossy().to_string();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(["--database-url", &url, "replay", "--topic", live])
        .env("KAFKA_BROKERS", brokers())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("out of order") && stderr.contains("--rebuild-topic"),
        "{stderr}"
    );
    assert_eq!(read_back(live).await.len(), 1);
}
