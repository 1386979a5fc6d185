//! The `outbox` binary on MariaDB (`mysql://` and `mariadb://` URLs, the
//! machine's server of `MYSQL_URL`; each test creates and drops its own
//! database): `status` as a health check, with a running relay listed, the
//! inbox and the consumers' tables, and a schema migrated before them;
//! `dead-letters list | retry | discard` of the outbox and the inbox (a
//! retried inbox row's key entry back at it); `cleanup` of the outbox, the
//! dedup table, the inbox and finished sagas; `sagas list | show | stuck`
//! and the sagas part of `status`; `replay` (republish and rebuild, with
//! its hand-over); `notify` refused with exit 2.

#[path = "../../outbox-runtime/tests/ops_mysql_support/mod.rs"]
mod ops_mysql_support;
#[path = "../../outbox-runtime/tests/ops_support/mod.rs"]
mod ops_support;

use std::process::{Command, Output};
use std::time::Duration;

use ops_mysql_support::{InboxRow, Row, SagaRow, count, key_entries, rebuild_keys, url};
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
        "inbox (inbox_event)",
        "relays (outbox_relay_member)",
        "  running  0",
    ] {
        assert!(text.contains(line), "{line:?} missing from:\n{text}");
    }
    // Every part is measured (and no saga is there yet).
    assert!(!text.contains("not measured"), "{text}");
    assert!(!text.contains("sagas (saga_state)"), "{text}");
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

    let report = outbox(&url, &["status", "--json", "--sample", "1"]);
    assert_success(&report);
    let report = json(&report);
    assert_eq!(report["healthy"], true);
    assert_eq!(report["outbox"]["pending"], 2);
    assert_eq!(report["outbox"]["parked"], 1);
    assert!(report.get("not_on_this_database").is_none(), "{report}");
    assert_eq!(report["sagas"], serde_json::json!([]));
    assert_eq!(report["inbox"]["pending"], 0);
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
    // The inbox is empty and no saga runs: within any limit.
    assert_success(&outbox(
        &url,
        &[
            "status",
            "--max-inbox-backlog",
            "0",
            "--max-inbox-age",
            "1s",
            "--max-saga-age",
            "1s",
        ],
    ));

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
    assert_success(&inbox);
    assert_eq!(stdout(&inbox).trim(), "0 parked rows in inbox_event");

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
async fn notify_says_it_needs_postgresql_on_mariadb() {
    let db = migrated().await;
    let url = url(&db);
    for args in [&["notify", "status"][..], &["notify", "enable"]] {
        assert_usage_error(
            &outbox(&url, args),
            "`outbox notify` needs PostgreSQL (MariaDB has no LISTEN/NOTIFY: relays there poll",
        );
    }
    db.drop().await;
}

/// A dedup row of `group` processed `ago` seconds ago.
async fn processed_row(db: &MySqlScratch, group: &str, ago: i64) {
    sqlx::query(
        "INSERT INTO processed_event (consumer_group, event_id, processed_at)
         VALUES (?, ?, UTC_TIMESTAMP(6) - INTERVAL ? SECOND)",
    )
    .bind(group.as_bytes())
    .bind(uuid::Uuid::now_v7())
    .bind(ago)
    .execute(&db.pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn status_of_the_inbox_on_mariadb_and_of_a_schema_before_it() {
    let db = migrated().await;
    let url = url(&db);
    InboxRow::new("billing", "payments", Some("k1"))
        .received(600)
        .insert(&db.pool)
        .await;
    InboxRow::new("billing", "payments", Some("k1"))
        .received(60)
        .insert(&db.pool)
        .await;
    InboxRow::new("billing", "payments", Some("k2"))
        .received(300)
        .parked(200, 3, "handler panicked")
        .insert(&db.pool)
        .await;
    InboxRow::new("billing", "payments", Some("k3"))
        .received(300)
        .processed(200)
        .insert(&db.pool)
        .await;
    rebuild_keys(&db.pool).await;
    processed_row(&db, "billing", 10).await;
    sqlx::query(
        "INSERT INTO consumer_dead_letter (consumer_group, topic, `partition`, `offset`,
             headers, reason, error, dead_letter_topic, publish_error)
         VALUES ('billing', 'payments', 0, 7, '[]', 'not_json', 'expected value',
                 'payments.dlq', 'Broker: Unknown topic or partition')",
    )
    .execute(&db.pool)
    .await
    .unwrap();

    let text = outbox(&url, &["status"]);
    assert_success(&text);
    let text = stdout(&text);
    let inbox = &text[text.find("inbox (inbox_event)").expect(&text)..];
    assert_eq!(
        cells(inbox, "unprocessed")[..2],
        ["unprocessed", "2"],
        "{text}"
    );
    assert_eq!(cells(inbox, "payments")[..2], ["payments", "2"], "{text}");
    assert_eq!(cells(inbox, "parked")[..2], ["parked", "1"], "{text}");
    for line in [
        "handler panicked",
        "waiting for a processor that handles their event type:",
        "group \"billing\"  PaymentTaken on payments  1 key  2 rows",
        "dead letters their topic refused (consumer_dead_letter)",
        "  1 message",
        "payments/0@7",
    ] {
        assert!(text.contains(line), "{line:?} missing from:\n{text}");
    }
    assert_eq!(
        cells(&text, "inbox_event")[..3],
        ["inbox_event", "4", "rows"],
        "{text}"
    );
    assert_eq!(
        cells(&text, "processed_event")[..3],
        ["processed_event", "1", "row"],
        "{text}"
    );
    let report = json(&outbox(&url, &["status", "--json"]));
    assert_eq!(report["inbox"]["pending"], 2);
    assert_eq!(report["inbox"]["parked"], 1);
    assert_eq!(report["consumer_dead_letters"]["unpublished"], 1);
    assert_eq!(report["inbox_unclaimed"][0]["consumer_group"], "billing");

    let unhealthy = outbox(
        &url,
        &[
            "status",
            "--max-inbox-backlog",
            "1",
            "--max-inbox-age",
            "5m",
            "--max-parked",
            "1",
        ],
    );
    assert_eq!(unhealthy.status.code(), Some(1), "{}", stderr(&unhealthy));
    let breaches: Vec<String> = stderr(&unhealthy).lines().map(str::to_owned).collect();
    assert_eq!(breaches.len(), 3, "{breaches:?}");
    assert_eq!(
        breaches[0],
        "unhealthy: max-parked exceeded: 2 parked events (limit 1)"
    );
    assert_eq!(
        breaches[1],
        "unhealthy: max-inbox-backlog exceeded: 2 unprocessed inbox events (limit 1)"
    );
    assert!(
        breaches[2]
            .starts_with("unhealthy: max-inbox-age exceeded: oldest unprocessed inbox event is 6"),
        "{breaches:?}"
    );
    db.drop().await;

    // A schema of MySQL migrations 1 to 3: the consumer tables missing.
    let old = MySqlScratch::create(2).await;
    for migration in &txoutbox_runtime::migrations::MYSQL_MIGRATIONS[..3] {
        sqlx::raw_sql(migration.sql)
            .execute(&old.pool)
            .await
            .unwrap();
    }
    let url = ops_mysql_support::url(&old);
    let text = outbox(&url, &["status"]);
    assert_success(&text);
    let text = stdout(&text);
    for line in [
        "inbox (inbox_event)\n  not on this database (the schema predates it: run `outbox migrate`)",
        "  processed_event       the schema predates it: run `outbox migrate`",
        "  consumer_dead_letter  the schema predates it: run `outbox migrate`",
        "  saga_state            the schema predates it: run `outbox migrate`",
    ] {
        assert!(text.contains(line), "{line:?} missing from:\n{text}");
    }
    assert_usage_error(
        &outbox(&url, &["status", "--max-inbox-backlog", "0"]),
        "--max-inbox-backlog: inbox_event is not measured on this database (the schema predates it: run `outbox migrate`)",
    );
    for args in [
        &["cleanup", "--processed-older-than", "1d"][..],
        &["dead-letters", "list", "--table", "inbox"],
    ] {
        assert_usage_error(&outbox(&url, args), "run `outbox migrate` first");
    }
    old.drop().await;
}

#[tokio::test]
async fn inbox_dead_letters_on_mariadb() {
    let db = migrated().await;
    let url = url(&db);
    // Key k: a parked row, then a pending one (its head); a parked row
    // without a key; a parked row of key k2.
    let (parked, parked_seq) = InboxRow::new("billing", "payments", Some("k"))
        .received(600)
        .parked(500, 3, "handler failed")
        .insert(&db.pool)
        .await;
    let (_, head) = InboxRow::new("billing", "payments", Some("k"))
        .received(400)
        .insert(&db.pool)
        .await;
    let (keyless, keyless_seq) = InboxRow::new("billing", "payments", None)
        .received(300)
        .parked(200, 3, "handler failed")
        .insert(&db.pool)
        .await;
    let (other, _) = InboxRow::new("billing", "payments", Some("k2"))
        .received(300)
        .parked(100, 3, "handler failed")
        .insert(&db.pool)
        .await;
    rebuild_keys(&db.pool).await;
    let entry = |key: Option<&str>, seq| {
        (
            key.map(str::to_owned),
            seq,
            Some("PaymentTaken".to_owned()),
            false,
        )
    };
    assert_eq!(
        key_entries(&db.pool, "billing").await,
        [entry(Some("k"), head)]
    );

    let list = outbox(
        &url,
        &["dead-letters", "list", "--table", "inbox", "--json"],
    );
    assert_success(&list);
    let listed = json(&list);
    assert_eq!(listed["table"], "inbox");
    assert_eq!(listed["total"], 3);
    assert_eq!(listed["rows"][0]["event_id"], parked.to_string());
    assert_eq!(listed["rows"][0]["id"], Value::Null);
    assert_eq!(listed["rows"][0]["last_error"], "handler failed");
    let text = stdout(&outbox(&url, &["dead-letters", "list", "--table", "inbox"]));
    assert!(text.starts_with("EVENT ID "), "no ID column: {text}");
    assert!(text.contains("3 parked rows in inbox_event"), "{text}");
    assert_usage_error(
        &outbox(
            &url,
            &["dead-letters", "retry", "--table", "inbox", "--id", "1"],
        ),
        "inbox rows have no numeric id; select them by event id",
    );
    assert_usage_error(
        &outbox(
            &url,
            &[
                "dead-letters",
                "retry",
                "--table",
                "inbox",
                "--topic",
                "paymnets",
            ],
        ),
        "no inbox_event row has topic 'paymnets'",
    );
    let dry = outbox(
        &url,
        &[
            "dead-letters",
            "retry",
            "--table",
            "inbox",
            "--topic",
            "payments",
            "--dry-run",
        ],
    );
    assert_success(&dry);
    assert!(
        stdout(&dry).contains("would retry 3 parked rows in inbox_event"),
        "{}",
        stdout(&dry)
    );
    assert_eq!(
        key_entries(&db.pool, "billing").await.len(),
        1,
        "a dry run changes nothing"
    );

    let retry = outbox(
        &url,
        &[
            "dead-letters",
            "retry",
            "--table",
            "inbox",
            "--event-id",
            &parked.to_string(),
            "--json",
        ],
    );
    assert_success(&retry);
    assert_eq!(json(&retry)["event_ids"], serde_json::json!([parked]));
    assert_eq!(
        key_entries(&db.pool, "billing").await,
        [entry(Some("k"), parked_seq)],
        "key k's head is back at the retried row, older than the pending one"
    );
    let discard = outbox(
        &url,
        &[
            "dead-letters",
            "discard",
            "--table",
            "inbox",
            "--event-id",
            &other.to_string(),
        ],
    );
    assert_success(&discard);
    let text = stdout(&discard);
    assert!(
        text.contains("discarded 1 parked row in inbox_event") && text.contains(&other.to_string()),
        "{text}"
    );
    let all = outbox(
        &url,
        &["dead-letters", "retry", "--table", "inbox", "--all"],
    );
    assert_success(&all);
    assert!(
        stdout(&all).contains("retried 1 parked row in inbox_event")
            && stdout(&all).contains(&keyless.to_string()),
        "{}",
        stdout(&all)
    );
    assert_eq!(
        key_entries(&db.pool, "billing").await,
        [entry(Some("k"), parked_seq), entry(None, keyless_seq)],
        "the row without a key has an entry of its own; the discarded row none"
    );
    let report = json(&outbox(&url, &["status", "--json"]));
    assert_eq!(report["inbox"]["pending"], 3);
    assert_eq!(report["inbox"]["parked"], 0);
    assert_eq!(report["inbox"]["discarded"], 1);
    db.drop().await;
}

#[tokio::test]
async fn cleanup_of_the_consumer_tables_on_mariadb() {
    let db = migrated().await;
    let url = url(&db);
    let day = 86_400;
    for ago in [9 * day, 9 * day, 8 * day, 60] {
        processed_row(&db, "billing", ago).await;
    }
    for ago in [9 * day, 8 * day, 60] {
        InboxRow::new("billing", "payments", Some("k"))
            .received(ago + 10)
            .processed(ago)
            .insert(&db.pool)
            .await;
    }
    InboxRow::new("billing", "payments", Some("k"))
        .received(10 * day)
        .insert(&db.pool)
        .await;
    InboxRow::new("billing", "payments", Some("d"))
        .received(10 * day)
        .parked(9 * day, 3, "boom")
        .discarded(8 * day)
        .insert(&db.pool)
        .await;
    rebuild_keys(&db.pool).await;

    let dry = outbox(
        &url,
        &[
            "cleanup",
            "--processed-older-than",
            "7d",
            "--inbox-older-than",
            "7d",
            "--dry-run",
            "--json",
        ],
    );
    assert_success(&dry);
    let report = json(&dry);
    let targets: Vec<(&str, i64)> = report["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["target"].as_str().unwrap(),
                t["matched"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        targets,
        [
            ("processed_event", 3),
            ("processed_inbox", 2),
            ("discarded_inbox", 1)
        ]
    );
    let run = outbox(
        &url,
        &[
            "cleanup",
            "--processed-older-than",
            "7d",
            "--inbox-older-than",
            "7d",
            "--batch-size",
            "2",
        ],
    );
    assert_success(&run);
    let text = stdout(&run);
    for line in [
        "deleted 3 processed_event rows",
        "deleted 2 processed inbox rows",
        "deleted 1 discarded inbox rows",
    ] {
        assert!(text.contains(line), "{line:?} missing from:\n{text}");
    }
    assert_eq!(
        count(&db.pool, "SELECT COUNT(*) FROM processed_event").await,
        1
    );
    let left: (i64, i64) = sqlx::query_as(
        "SELECT CAST(SUM(processed) AS SIGNED), CAST(SUM(NOT processed) AS SIGNED)
         FROM inbox_event",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        left,
        (1, 1),
        "kept: the recently processed row and the pending one"
    );
    db.drop().await;
}

/// Rows of a saga table printed by `outbox sagas`: the lines after the
/// header, split on runs of spaces.
fn table_rows(text: &str) -> Vec<Vec<String>> {
    text.lines()
        .skip(1)
        .take_while(|line| !line.is_empty() && !line.contains(", the most recently"))
        .map(|line| {
            line.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(String::from)
                .collect()
        })
        .collect()
}

/// `outbox sagas list | show | stuck`, the sagas part of `status` and
/// `cleanup --sagas-older-than` on MariaDB, on `saga_state` rows as its
/// saga runtime writes them: the same text and JSON as on PostgreSQL
/// (`cli_bin.rs`).
#[tokio::test]
async fn sagas_on_mariadb() {
    let db = migrated().await;
    let url = url(&db);
    let pool = &db.pool;
    let mut reserving = SagaRow::running("OrderFulfilment", "o-1", 3_600);
    reserving.compensations = vec![
        ("ReleaseStock", "inventory.commands", "o-1".into()),
        ("RefundPayment", "payment.commands", "o-1".into()),
    ];
    let (compensation_ids, last_event_id) = reserving.insert(pool).await;
    SagaRow::running("OrderFulfilment", "o-2", 1_200)
        .insert(pool)
        .await;
    SagaRow::running("Refund", "r-1", 30).insert(pool).await;
    SagaRow::finished("OrderFulfilment", "o-3", "compensated", 60)
        .insert(pool)
        .await;

    let list = outbox(&url, &["sagas", "list"]);
    assert_success(&list);
    let text = stdout(&list);
    let header = text.lines().next().unwrap();
    assert!(
        header.starts_with("TYPE             ID   STATUS       VERSION  LAST MESSAGE"),
        "aligned columns: {text}"
    );
    let rows = table_rows(&text);
    let listed: Vec<(&str, &str, &str)> = rows
        .iter()
        .map(|r| (r[0].as_str(), r[1].as_str(), r[2].as_str()))
        .collect();
    assert_eq!(
        listed,
        [
            ("Refund", "r-1", "running"),
            ("OrderFulfilment", "o-3", "compensated"),
            ("OrderFulfilment", "o-2", "running"),
            ("OrderFulfilment", "o-1", "running"),
        ],
        "most recently moved first: {text}"
    );
    assert_eq!(
        rows[3].last(),
        Some(&"2".to_owned()),
        "pending compensations"
    );
    assert!(
        text.ends_with("4 sagas, the most recently moved first\n"),
        "{text}"
    );
    let filtered = outbox(
        &url,
        &[
            "sagas",
            "list",
            "--type",
            "OrderFulfilment",
            "--status",
            "running",
            "--limit",
            "1",
            "--json",
        ],
    );
    assert_success(&filtered);
    let filtered = json(&filtered);
    let sagas = filtered["sagas"].as_array().unwrap();
    assert_eq!(sagas.len(), 1);
    assert_eq!(sagas[0]["saga_id"], "o-2");
    assert_eq!(sagas[0]["status"], "running");
    assert_eq!(sagas[0]["version"], 2);
    assert_usage_error(
        &outbox(&url, &["sagas", "list", "--type", "OrderFulfillment"]),
        "no saga has type 'OrderFulfillment' (check the spelling)",
    );

    let show = outbox(&url, &["sagas", "show", "OrderFulfilment", "o-1"]);
    assert_success(&show);
    let text = stdout(&show);
    assert!(
        text.starts_with("saga OrderFulfilment o-1\n  status        running\n"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "  last message  StockReserved, event {last_event_id}\n"
        )),
        "{text}"
    );
    assert!(
        text.contains("state\n  {\n    \"id\": \"o-1\",\n"),
        "{text}"
    );
    assert!(
        text.contains("pending compensations: 2, sent last first if the saga is compensated\n"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "  ReleaseStock   inventory.commands  o-1  {}\n  RefundPayment  payment.commands    o-1  {}\n",
            compensation_ids[0], compensation_ids[1]
        )),
        "{text}"
    );
    let detail = json(&outbox(
        &url,
        &["sagas", "show", "OrderFulfilment", "o-1", "--json"],
    ));
    assert_eq!(detail["version"], 2);
    assert_eq!(detail["state"]["stage"], "waiting");
    assert_eq!(detail["last_event_id"], last_event_id.to_string());
    assert_eq!(detail["compensations"][0]["topic"], "inventory.commands");
    let finished = stdout(&outbox(&url, &["sagas", "show", "OrderFulfilment", "o-3"]));
    assert!(finished.contains("\n  finished      20"), "{finished}");
    assert!(
        finished.contains("pending compensations: none"),
        "{finished}"
    );
    assert_usage_error(
        &outbox(&url, &["sagas", "show", "OrderFulfilment", "o-9"]),
        "no OrderFulfilment saga has id 'o-9' (never started, or removed by retention",
    );
    assert_usage_error(
        &outbox(&url, &["sagas", "show", "Nope", "o-1"]),
        "no saga has type 'Nope'",
    );

    let stuck = outbox(&url, &["sagas", "stuck", "--older-than", "10m"]);
    assert_eq!(stuck.status.code(), Some(1), "{}", stderr(&stuck));
    let text = stdout(&stuck);
    assert!(text.lines().next().unwrap().contains("WAITING"), "{text}");
    let rows = table_rows(&text);
    let waiting: Vec<&str> = rows.iter().map(|r| r[1].as_str()).collect();
    assert_eq!(waiting, ["o-1", "o-2"], "oldest first: {text}");
    assert!(
        rows[0][7].starts_with("1h") && rows[1][7].starts_with("20m"),
        "{text}"
    );
    assert_eq!(
        stderr(&stuck),
        "unhealthy: 2 running sagas have not moved for more than 10m\n"
    );
    let one = outbox(
        &url,
        &[
            "sagas",
            "stuck",
            "--older-than",
            "10m",
            "--limit",
            "1",
            "--json",
        ],
    );
    assert_eq!(one.status.code(), Some(1));
    let report = json(&one);
    assert_eq!(report["total"], 2, "counted beyond the limit");
    assert_eq!(report["older_than_secs"], 600.0);
    assert_eq!(report["sagas"][0]["saga_id"], "o-1");
    assert_eq!(report["sagas"].as_array().unwrap().len(), 1);
    let of_type = outbox(
        &url,
        &["sagas", "stuck", "--older-than", "1m", "--type", "Refund"],
    );
    assert_success(&of_type);
    assert_eq!(
        stdout(&of_type),
        "no running Refund saga has gone without a step for more than 1m\n"
    );
    assert_success(&outbox(&url, &["sagas", "stuck", "--older-than", "2h"]));

    // The sagas part of status, and its threshold.
    let healthy = outbox(&url, &["status", "--max-saga-age", "2h"]);
    assert_success(&healthy);
    let text = stdout(&healthy);
    let (_, part) = text.split_once("\nsagas (saga_state)\n").expect(&text);
    let lines: Vec<&str> = part.lines().take_while(|l| !l.is_empty()).collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].starts_with(
            "  OrderFulfilment  running 2  completed 0  compensated 1  oldest running moved 1h"
        ),
        "{text}"
    );
    assert!(
        lines[1].starts_with(
            "  Refund           running 1  completed 0  compensated 0  oldest running moved 3"
        ),
        "{text}"
    );
    assert!(!text.contains("not measured"), "{text}");
    let unhealthy = outbox(&url, &["status", "--max-saga-age", "10m", "--json"]);
    assert_eq!(unhealthy.status.code(), Some(1));
    let report = json(&unhealthy);
    assert_eq!(report["healthy"], false);
    assert_eq!(report["breaches"][0]["threshold"], "max-saga-age");
    assert_eq!(report["sagas"][0]["saga_type"], "OrderFulfilment");
    assert_eq!(report["sagas"][0]["running"], 2);
    assert_eq!(report["sagas"][0]["compensated"], 1);
    let err = stderr(&unhealthy);
    assert!(
        err.starts_with(
            "unhealthy: max-saga-age exceeded: a running OrderFulfilment saga has not moved for 36"
        ) && err.ends_with("s (limit 600s)\n"),
        "{err}"
    );

    // Retention: finished sagas older than the age, never a running one.
    let day = 86_400;
    for (saga_type, id, status, ago) in [
        ("OrderFulfilment", "old-completed", "completed", 10 * day),
        ("OrderFulfilment", "old-compensated", "compensated", 9 * day),
        ("Refund", "old-refund", "completed", 8 * day),
    ] {
        SagaRow::finished(saga_type, id, status, ago)
            .insert(pool)
            .await;
    }
    SagaRow::running("OrderFulfilment", "running", 30 * day)
        .insert(pool)
        .await;
    let dry = outbox(
        &url,
        &["cleanup", "--sagas-older-than", "7d", "--dry-run", "--json"],
    );
    assert_success(&dry);
    let report = json(&dry);
    assert_eq!(report["targets"][0]["target"], "finished_saga");
    assert_eq!(report["targets"][0]["matched"], 3);
    let sagas_left = "SELECT COUNT(*) FROM saga_state";
    assert_eq!(count(pool, sagas_left).await, 8);
    let run = outbox(
        &url,
        &["cleanup", "--sagas-older-than", "7d", "--batch-size", "2"],
    );
    assert_success(&run);
    assert!(
        stdout(&run).starts_with("deleted 3 finished sagas (before "),
        "{}",
        stdout(&run)
    );
    assert_eq!(count(pool, sagas_left).await, 5);
    let everything = outbox(&url, &["cleanup", "--sagas-older-than", "0s"]);
    assert_success(&everything);
    assert!(
        stdout(&everything).starts_with("deleted 1 finished sagas"),
        "{}",
        stdout(&everything)
    );
    let mut left: Vec<Vec<u8>> = sqlx::query_scalar("SELECT saga_id FROM saga_state")
        .fetch_all(pool)
        .await
        .unwrap();
    left.sort();
    assert_eq!(
        left,
        [
            b"o-1".to_vec(),
            b"o-2".to_vec(),
            b"r-1".to_vec(),
            b"running".to_vec()
        ],
        "running sagas are never deleted"
    );

    // A schema migrated before MySQL migration 0006.
    sqlx::query("DROP TABLE saga_state")
        .execute(pool)
        .await
        .unwrap();
    assert_usage_error(
        &outbox(&url, &["status", "--max-saga-age", "1s"]),
        "--max-saga-age: saga_state is not measured on this database (the schema predates it: run `outbox migrate`)",
    );
    assert_usage_error(
        &outbox(&url, &["sagas", "list"]),
        "run `outbox migrate` first",
    );
    db.drop().await;
}

/// `outbox replay` on MariaDB: a dry run counts either mode's rows, a
/// republish run sends the published rows with the run's `replay` header
/// and reports JSON, a rebuild run prints its hand-over and starts its
/// group, and both runs are recorded in `outbox_replay_run`.
#[tokio::test]
async fn replay_on_mariadb() {
    let db = migrated().await;
    let url = url(&db).replacen("mysql://", "mariadb://", 1);
    let pool = &db.pool;
    let live = unique_topic("cli-mysql-replay");
    let target = unique_topic("cli-mysql-replay-target");
    let rebuild = unique_topic("cli-mysql-replay-rebuild");
    for topic in [&live, &target, &rebuild] {
        create_topic(&brokers(), topic, 1).await;
    }
    for _ in 0..3 {
        Row::new(&live).published(60, 30).insert(pool).await;
    }
    Row::new(&live).insert(pool).await; // waiting for the relay
    let brokers = brokers();

    let dry = outbox(&url, &["replay", "--topic", &live, "--dry-run"]);
    assert_success(&dry);
    assert_eq!(stdout(&dry).trim(), "would replay 3 published events");
    let dry = outbox(
        &url,
        &[
            "replay",
            "--topic",
            &live,
            "--rebuild-topic",
            &rebuild,
            "--dry-run",
        ],
    );
    assert_success(&dry);
    assert_eq!(
        stdout(&dry).trim(),
        format!("would replay 4 events (published or waiting for the relay) into {rebuild}")
    );
    assert_usage_error(
        &outbox(&url, &["replay", "--topic", "ordres", "--dry-run"]),
        "no outbox_event row has topic 'ordres' (check the spelling)",
    );

    let republish = outbox(
        &url,
        &[
            "replay",
            "--topic",
            &live,
            "--target-topic",
            &target,
            "--brokers",
            &brokers,
            "--json",
        ],
    );
    assert_success(&republish);
    let report = json(&republish);
    assert_eq!(
        (report["selected"].as_i64(), report["published"].as_i64()),
        (Some(3), Some(3))
    );
    let run_id = report["run_id"].as_i64().unwrap();
    let received = ops_support::read_back(&target).await;
    assert_eq!(received.len(), 3);
    assert!(
        received
            .iter()
            .all(|r| r.headers["replay"] == run_id.to_string()),
        "the run's header"
    );

    let group = txoutbox_testkit::broker::unique_group("cli-mysql-rebuild");
    let rebuilt = outbox(
        &url,
        &[
            "replay",
            "--topic",
            &live,
            "--rebuild-topic",
            &rebuild,
            "--rebuild-group",
            &group,
            "--brokers",
            &brokers,
        ],
    );
    assert_success(&rebuilt);
    let text = stdout(&rebuilt);
    let max_id = count(pool, "SELECT MAX(id) FROM outbox_event").await;
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        [
            format!(
                "replayed 4 of 4 selected events (run {}, recorded in outbox_replay_run)",
                run_id + 1
            ),
            format!(
                "hand-over: read {rebuild} from offsets 0:0 up to 0:4, then {live} from offsets \
                 0:0 (partition:offset; events committed after the snapshot, id > {max_id} or \
                 committed late)"
            ),
            format!("consumer group {group} starts at those offsets"),
        ],
        "{text}"
    );
    assert_eq!(ops_support::read_back(&rebuild).await.len(), 4);
    let runs: Vec<(String, Option<String>, i64)> =
        sqlx::query_as("SELECT mode, rebuild_group, published FROM outbox_replay_run ORDER BY id")
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(
        runs,
        [
            ("republish".to_owned(), None, 3),
            ("rebuild".to_owned(), Some(group.clone()), 4)
        ]
    );
    // The group was started: a second run with it fails (exit 1, as on
    // PostgreSQL: the run is recorded, with the error).
    let again = outbox(
        &url,
        &[
            "replay",
            "--topic",
            &live,
            "--rebuild-topic",
            &rebuild,
            "--rebuild-group",
            &group,
            "--brokers",
            &brokers,
        ],
    );
    assert_eq!(again.status.code(), Some(1), "{}", stderr(&again));
    assert!(
        stderr(&again).contains("already has a committed offset"),
        "{}",
        stderr(&again)
    );
    let failed: (i64, bool, bool) = sqlx::query_as(
        "SELECT published, finished_at IS NOT NULL, error LIKE '%already has a committed offset%'
         FROM outbox_replay_run ORDER BY id DESC LIMIT 1",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(failed, (0, true, true));
    db.drop().await;
}
