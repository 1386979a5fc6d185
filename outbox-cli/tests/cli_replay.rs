//! `outbox replay` end to end against real PostgreSQL and the broker at
//! KAFKA_BROKERS_TEST.

#[path = "../../outbox-runtime/tests/ops_support/mod.rs"]
mod ops_support;

use ops_support::{OutboxRow, brokers, new_topic, read_back};
use sqlx::PgPool;

#[sqlx::test(migrations = false)]
async fn the_binary_replays_and_reports_json(pool: PgPool) {
    use sqlx::ConnectOptions;
    outbox_runtime::migrations::run(&pool).await.unwrap();
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
