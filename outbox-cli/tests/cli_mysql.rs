//! The `outbox` binary on MariaDB (`mysql://` and `mariadb://` URLs, the
//! machine's server of `MYSQL_URL`; each test creates and drops its own
//! database): `status` as a health check, with a running relay listed;
//! `dead-letters list | retry | discard`; `cleanup`; the consumer tables
//! and the PostgreSQL-only commands refused with exit 2.

#[path = "../../outbox-runtime/tests/ops_mysql_support/mod.rs"]
mod ops_mysql_support;

use std::process::{Command, Output};
use std::time::Duration;

use ops_mysql_support::{Row, count, url};
use serde_json::Value;
use txoutbox_runtime::relay::Relay;
use txoutbox_testkit::broker::{brokers, client_config, create_topic, unique_topic};
use txoutbox_testkit::eventually;
use txoutbox_testkit::mysql::MySqlScratch;

/// Runs `outbox --database-url <url> <args>`.
fn outbox(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_outbox"))
        .env_remove("DATABASE_URL")
        .env_remove("KAFKA_BROKERS")
        .env("RUST_BACKTRACE", "1")
        .arg("--database-url")
        .arg(url)
        .args(args)
        .output()
        .unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).unwrap()
}

fn json(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(output)))
}

#[track_caller]
fn assert_success(output: &Output) {
    assert_eq!(output.status.code(), Some(0), "stderr: {}", stderr(output));
}

/// Exit code 2 and exactly one line on stderr containing `needle`.
#[track_caller]
fn assert_usage_error(output: &Output, needle: &str) {
    let err = stderr(output);
    assert_eq!(output.status.code(), Some(2), "stderr: {err}");
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains(needle), "{err:?} lacks {needle:?}");
    assert!(!err.contains("panicked"), "{err}");
}

/// The words of the first line of `text` that starts with `label`.
fn cells<'a>(text: &'a str, label: &str) -> Vec<&'a str> {
    text.lines()
        .map(str::trim_start)
        .find(|line| line.starts_with(label))
        .unwrap_or_else(|| panic!("no line starts with {label:?}:\n{text}"))
        .split_whitespace()
        .collect()
}

async fn migrated() -> MySqlScratch {
    let db = MySqlScratch::create(4).await;
    txoutbox_runtime::migrations::run(&db.pool).await.unwrap();
    db
}

// Multi-threaded: the relay runs while the test waits for the binary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_on_mariadb_as_a_health_check_with_its_relays() {
    let db = MySqlScratch::create(4).await;
    let url = url(&db);
    let unmigrated = outbox(&url, &["status"]);
    assert_usage_error(&unmigrated, "run `outbox migrate` first");
    assert_usage_error(&unmigrated, "doesn't exist (SQLSTATE 42S02)");
    assert_success(&outbox(&url, &["migrate"]));

    let topic = unique_topic("cli-mysql-status");
    Row::new(&topic).created(3_600).insert(&db.pool).await;
    Row::new(&topic).insert(&db.pool).await;
    Row::new(&topic)
        .created(600)
        .parked(300, 10, "message too large")
        .insert(&db.pool)
        .await;
    Row::new(&topic).published(60, 50).insert(&db.pool).await;

    let text = outbox(&url, &["status"]);
    assert_success(&text);
    let text = stdout(&text);
    for line in [
        "outbox (outbox_event)",
        "message too large",
        "consumers (inbox_event, processed_event, saga_state, consumer_dead_letter)",
        "  not on this database: the consumer tables are PostgreSQL-only so far",
        "relays (outbox_relay_member)",
        "  running  0",
    ] {
        assert!(text.contains(line), "{line:?} missing from:\n{text}");
    }
    assert_eq!(
        cells(&text, "unpublished")[..2],
        ["unpublished", "2"],
        "{text}"
    );
    assert_eq!(cells(&text, "parked")[..2], ["parked", "1"], "{text}");
    assert_eq!(
        cells(&text, "outbox_event")[..3],
        ["outbox_event", "4", "rows"],
        "{text}"
    );
    assert_eq!(
        cells(&text, "outbox_scheduled")[..3],
        ["outbox_scheduled", "0", "rows"],
        "{text}"
    );
    assert!(!text.contains("inbox (inbox_event)"), "{text}");

    let report = outbox(&url, &["status", "--json", "--sample", "1"]);
    assert_success(&report);
    let report = json(&report);
    assert_eq!(report["healthy"], true);
    assert_eq!(report["outbox"]["pending"], 2);
    assert_eq!(report["outbox"]["parked"], 1);
    assert_eq!(
        report["not_on_this_database"],
        serde_json::json!([
            "inbox_event",
            "processed_event",
            "saga_state",
            "consumer_dead_letter"
        ])
    );
    let age = report["outbox"]["oldest_pending_age_secs"]
        .as_f64()
        .unwrap();
    assert!((3_600.0..3_700.0).contains(&age), "{age}");

    let unhealthy = outbox(
        &url,
        &[
            "status",
            "--max-backlog",
            "1",
            "--max-age",
            "30m",
            "--max-parked",
            "0",
        ],
    );
    assert_eq!(unhealthy.status.code(), Some(1), "{}", stderr(&unhealthy));
    let breaches: Vec<String> = stderr(&unhealthy).lines().map(str::to_owned).collect();
    assert_eq!(breaches.len(), 3, "{breaches:?}");
    assert_eq!(
        breaches[0],
        "unhealthy: max-backlog exceeded: 2 unpublished events (limit 1)"
    );
    assert_eq!(
        breaches[1],
        "unhealthy: max-parked exceeded: 1 parked events (limit 0)"
    );
    assert!(
        breaches[2].starts_with("unhealthy: max-age exceeded: oldest unpublished event is 36"),
        "{breaches:?}"
    );
    assert_success(&outbox(
        &url,
        &["status", "--max-backlog", "2", "--max-parked", "1"],
    ));
    for flag in ["--max-inbox-backlog", "--max-inbox-age", "--max-saga-age"] {
        let value = if flag == "--max-inbox-backlog" {
            "0"
        } else {
            "1m"
        };
        let refused = outbox(&url, &["status", flag, value]);
        assert_usage_error(&refused, &format!("{flag}: "));
        assert_usage_error(&refused, "is not on this database");
    }

    // A relay: listed with its lanes while it publishes the two rows.
    create_topic(&brokers(), &topic, 2).await;
    let relay = Relay::builder(db.pool.clone(), client_config(&brokers()))
        .lanes(8)
        .rebalance_interval(Duration::from_millis(100))
        .poll_interval(Duration::from_millis(50))
        .spawn()
        .unwrap();
    eventually(
        "the relay published the two rows and holds its 8 lanes",
        Duration::from_secs(30),
        || async {
            let report = json(&outbox(&url, &["status", "--json"]));
            report["outbox"]["pending"] == 0
                && report["relays"].as_array().unwrap().len() == 1
                && report["relays"][0]["lanes_owned"] == 8
        },
    )
    .await;
    let report = json(&outbox(&url, &["status", "--json"]));
    let member = &report["relays"][0];
    assert_eq!(member["process_id"], std::process::id());
    assert_eq!(member["lanes"], 8);
    assert_eq!(member["lease_expired"], false);
    let text = stdout(&outbox(&url, &["status", "--max-backlog", "0"]));
    assert!(text.contains("  running  1"), "{text}");
    assert!(text.contains("8 of 8 lanes"), "{text}");
    assert!(relay.shutdown().await.unwrap().clean);
    db.drop().await;
}

#[tokio::test]
async fn dead_letters_on_mariadb() {
    let db = migrated().await;
    // The mariadb:// scheme too.
    let url = url(&db).replacen("mysql://", "mariadb://", 1);
    let (id, event_id) = Row::new("orders")
        .created(600)
        .parked(300, 9, "unknown topic")
        .insert(&db.pool)
        .await;
    let (other, other_event) = Row::new("orders")
        .created(500)
        .parked(200, 9, "unknown topic")
        .insert(&db.pool)
        .await;
    Row::new("orders").insert(&db.pool).await;

    let list = outbox(&url, &["dead-letters", "list", "--json"]);
    assert_success(&list);
    let listed = json(&list);
    assert_eq!(listed["table"], "outbox");
    assert_eq!(listed["total"], 2);
    assert_eq!(listed["rows"][0]["id"], id);
    assert_eq!(listed["rows"][0]["event_id"], event_id.to_string());
    assert_eq!(listed["rows"][0]["last_error"], "unknown topic");
    let text = outbox(&url, &["dead-letters", "list", "--limit", "1"]);
    assert!(
        stdout(&text)
            .contains("2 parked rows in outbox_event (1 shown; raise --limit to see more)"),
        "{}",
        stdout(&text)
    );

    let misspelt = outbox(&url, &["dead-letters", "retry", "--topic", "ordres"]);
    assert_usage_error(&misspelt, "no outbox_event row has topic 'ordres'");
    let inbox = outbox(&url, &["dead-letters", "list", "--table", "inbox"]);
    assert_usage_error(
        &inbox,
        "inbox_event is not on this database: the consumer tables (inbox_event, processed_event, saga_state, consumer_dead_letter) are PostgreSQL-only so far",
    );

    let dry = outbox(
        &url,
        &[
            "dead-letters",
            "retry",
            "--event-id",
            &event_id.to_string(),
            "--dry-run",
        ],
    );
    assert_success(&dry);
    assert!(
        stdout(&dry).contains("would retry 1 parked row in outbox_event"),
        "{}",
        stdout(&dry)
    );
    let parked = "SELECT COUNT(*) FROM outbox_event WHERE parked_at IS NOT NULL";
    assert_eq!(
        count(&db.pool, parked).await,
        2,
        "a dry run changes nothing"
    );

    let retry = outbox(
        &url,
        &[
            "dead-letters",
            "retry",
            "--event-id",
            &event_id.to_string(),
            "--json",
        ],
    );
    assert_success(&retry);
    assert_eq!(json(&retry)["event_ids"], serde_json::json!([event_id]));
    let discard = outbox(
        &url,
        &["dead-letters", "discard", "--id", &other.to_string()],
    );
    assert_success(&discard);
    let text = stdout(&discard);
    assert!(
        text.contains("discarded 1 parked row in outbox_event")
            && text.contains(&other_event.to_string()),
        "{text}"
    );
    assert_eq!(
        count(
            &db.pool,
            "SELECT COUNT(*) FROM outbox_event WHERE parked_at IS NULL AND attempts = 0
             AND discarded_at IS NULL AND published_at IS NULL"
        )
        .await,
        2,
        "the retried row waits for the relay again, next to the pending one"
    );
    assert_eq!(
        count(
            &db.pool,
            "SELECT COUNT(*) FROM outbox_event WHERE parked_at IS NOT NULL AND discarded_at IS NOT NULL"
        )
        .await,
        1
    );
    let empty = outbox(&url, &["dead-letters", "list"]);
    assert_success(&empty);
    assert_eq!(stdout(&empty).trim(), "0 parked rows in outbox_event");
    db.drop().await;
}

#[tokio::test]
async fn cleanup_on_mariadb() {
    let db = migrated().await;
    let url = url(&db);
    for _ in 0..5 {
        Row::new("t")
            .published(10 * 86_400, 9 * 86_400)
            .insert(&db.pool)
            .await;
    }
    Row::new("t").published(60, 30).insert(&db.pool).await;
    Row::new("t").created(10 * 86_400).insert(&db.pool).await;
    Row::new("t")
        .created(10 * 86_400)
        .parked(9 * 86_400, 10, "message too large")
        .insert(&db.pool)
        .await;
    Row::new("t")
        .created(10 * 86_400)
        .parked(9 * 86_400, 10, "message too large")
        .discarded(8 * 86_400)
        .insert(&db.pool)
        .await;
    let all = "SELECT COUNT(*) FROM outbox_event";
    assert_eq!(count(&db.pool, all).await, 9);

    // A part of the job this database lacks: refused before anything is
    // deleted.
    let refused = outbox(
        &url,
        &[
            "cleanup",
            "--older-than",
            "7d",
            "--processed-older-than",
            "14d",
        ],
    );
    assert_usage_error(
        &refused,
        "--processed-older-than: processed_event is not on this database",
    );
    for (flag, table) in [
        ("--inbox-older-than", "inbox_event"),
        ("--sagas-older-than", "saga_state"),
    ] {
        let refused = outbox(&url, &["cleanup", flag, "7d"]);
        assert_usage_error(
            &refused,
            &format!("{flag}: {table} is not on this database"),
        );
    }
    assert_eq!(count(&db.pool, all).await, 9, "nothing deleted");

    let dry = outbox(
        &url,
        &["cleanup", "--older-than", "7d", "--dry-run", "--json"],
    );
    assert_success(&dry);
    let report = json(&dry);
    assert_eq!(report["dry_run"], true);
    assert_eq!(report["targets"][0]["target"], "published_outbox");
    assert_eq!(report["targets"][0]["matched"], 5);
    assert_eq!(report["targets"][1]["target"], "discarded_outbox");
    assert_eq!(report["targets"][1]["matched"], 1);
    assert_eq!(count(&db.pool, all).await, 9);

    let run = outbox(
        &url,
        &["cleanup", "--older-than", "7d", "--batch-size", "2"],
    );
    assert_success(&run);
    let text = stdout(&run);
    assert!(text.contains("deleted 5 published outbox rows"), "{text}");
    assert!(text.contains("deleted 1 discarded outbox rows"), "{text}");
    let left: (i64, i64, i64) = sqlx::query_as(
        "SELECT CAST(SUM(published_at IS NOT NULL) AS SIGNED),
                CAST(SUM(published_at IS NULL AND parked_at IS NULL) AS SIGNED),
                CAST(SUM(parked_at IS NOT NULL) AS SIGNED)
         FROM outbox_event",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        left,
        (1, 1, 1),
        "kept: the recently published, the unpublished and the parked row"
    );
    db.drop().await;
}

#[tokio::test]
async fn the_postgresql_only_commands_say_so_on_mariadb() {
    let db = migrated().await;
    let url = url(&db);
    for args in [
        &["replay", "--all", "--dry-run"][..],
        &["sagas", "list"],
        &["notify", "status"],
    ] {
        assert_usage_error(
            &outbox(&url, args),
            "on MariaDB only `outbox migrate`, `status`, `cleanup` and `dead-letters` work so far",
        );
    }
    db.drop().await;
}
