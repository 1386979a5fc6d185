//! The `outbox` binary on MariaDB (`mysql://` and `mariadb://` URLs, the
//! machine's server of `MYSQL_URL`; each test creates and drops its own
//! database): `status` as a health check, with a running relay listed, the
//! inbox and the consumers' tables, and a schema migrated before them;
//! `dead-letters list | retry | discard` of the outbox and the inbox (a
//! retried inbox row's key entry back at it); `cleanup` of the outbox, the
//! dedup table and the inbox; sagas and the PostgreSQL-only commands
//! refused with exit 2.

#[path = "../../outbox-runtime/tests/ops_mysql_support/mod.rs"]
mod ops_mysql_support;

use std::process::{Command, Output};
use std::time::Duration;

use ops_mysql_support::{InboxRow, Row, count, key_entries, rebuild_keys, url};
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
        "not measured on this database",
        "  saga_state  the saga operations are PostgreSQL-only so far",
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

    let report = outbox(&url, &["status", "--json", "--sample", "1"]);
    assert_success(&report);
    let report = json(&report);
    assert_eq!(report["healthy"], true);
    assert_eq!(report["outbox"]["pending"], 2);
    assert_eq!(report["outbox"]["parked"], 1);
    assert_eq!(
        report["not_on_this_database"],
        serde_json::json!(["saga_state"])
    );
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
    // The inbox is empty, within any limit; sagas are not on MariaDB.
    assert_success(&outbox(
        &url,
        &[
            "status",
            "--max-inbox-backlog",
            "0",
            "--max-inbox-age",
            "1s",
        ],
    ));
    assert_usage_error(
        &outbox(&url, &["status", "--max-saga-age", "1m"]),
        "--max-saga-age: saga_state is not measured on this database (the saga operations are PostgreSQL-only so far)",
    );

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

    // A part of the job this database lacks: refused before anything is
    // deleted.
    let refused = outbox(
        &url,
        &["cleanup", "--older-than", "7d", "--sagas-older-than", "14d"],
    );
    assert_usage_error(
        &refused,
        "--sagas-older-than: saga_state is not read on this database: the saga operations are PostgreSQL-only so far",
    );
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
        "  saga_state            the saga operations are PostgreSQL-only so far",
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
