//! The `outbox` binary end to end: exit codes, `--json` output, one-line
//! errors for bad input.

#[path = "../../outbox-runtime/tests/ops_support/mod.rs"]
mod ops_support;

use std::process::{Command, Output};

use ops_support::{OutboxRow, SagaRow, count};
use serde_json::Value;
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, PgPool};

/// The URL of the test's own database.
fn url(pool: &PgPool) -> String {
    let options: &PgConnectOptions = &pool.connect_options();
    options.to_url_lossy().to_string()
}

fn outbox(pool: Option<&PgPool>, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_outbox"));
    command
        .env_remove("DATABASE_URL")
        .env_remove("KAFKA_BROKERS")
        .env_remove("OUTBOX_SCHEMA_EXPORTER")
        .env("RUST_BACKTRACE", "1");
    if let Some(pool) = pool {
        command.arg("--database-url").arg(url(pool));
    }
    command.args(args).output().unwrap()
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

/// Exit code 2 and exactly one line on stderr containing `needle`.
#[track_caller]
fn assert_usage_error(output: &Output, needle: &str) {
    let err = stderr(output);
    assert_eq!(output.status.code(), Some(2), "stderr: {err}");
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains(needle), "{err:?} lacks {needle:?}");
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );
}

#[sqlx::test(migrations = false)]
async fn migrate_then_status_as_a_health_check(pool: PgPool) {
    let unmigrated = outbox(Some(&pool), &["status"]);
    assert_usage_error(&unmigrated, "run `outbox migrate` first");
    // PostgreSQL's message and code, without sqlx's "at line N" (a line of
    // PostgreSQL's C source).
    assert_usage_error(
        &unmigrated,
        "outbox schema: relation \"outbox_event\" does not exist (SQLSTATE 42P01); run",
    );
    assert!(
        !stderr(&unmigrated).contains("line"),
        "{}",
        stderr(&unmigrated)
    );

    let first = outbox(Some(&pool), &["migrate", "--json"]);
    assert!(first.status.success(), "{}", stderr(&first));
    let versions: Vec<i64> = json(&first)["applied"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["version"].as_i64().unwrap())
        .collect();
    let shipped: Vec<i64> = txoutbox_runtime::migrations::MIGRATIONS
        .iter()
        .map(|m| m.version)
        .collect();
    assert_eq!(versions, shipped);
    let again = outbox(Some(&pool), &["migrate"]);
    assert!(stdout(&again).contains("schema is up to date"));

    for _ in 0..3 {
        OutboxRow::new("orders").insert(&pool).await;
    }
    OutboxRow::new("orders")
        .parked(4, "message too large")
        .insert(&pool)
        .await;

    let healthy = outbox(
        Some(&pool),
        &["status", "--max-backlog", "3", "--max-age", "1h"],
    );
    assert_eq!(healthy.status.code(), Some(0), "{}", stderr(&healthy));
    let text = stdout(&healthy);
    assert!(text.contains("unpublished"), "{text}");
    assert!(text.contains("message too large"), "{text}");

    let unhealthy = outbox(
        Some(&pool),
        &[
            "status",
            "--json",
            "--max-backlog",
            "2",
            "--max-parked",
            "0",
        ],
    );
    assert_eq!(unhealthy.status.code(), Some(1));
    let report = json(&unhealthy);
    assert_eq!(report["healthy"], false);
    assert_eq!(report["outbox"]["pending"], 3);
    assert_eq!(report["outbox"]["topics"][0]["topic"], "orders");
    assert_eq!(report["outbox"]["parked_rows"][0]["attempts"], 4);
    let err = stderr(&unhealthy);
    assert!(
        err.contains("max-backlog exceeded: 3 unpublished events (limit 2)"),
        "{err}"
    );
    assert!(err.contains("max-parked exceeded"), "{err}");
}

#[sqlx::test(migrations = false)]
async fn cleanup_dry_run_then_delete(pool: PgPool) {
    txoutbox_runtime::migrations::run(&pool).await.unwrap();
    for _ in 0..5 {
        OutboxRow::new("t")
            .published(10 * 86_400, 9 * 86_400)
            .insert(&pool)
            .await;
    }
    OutboxRow::new("t").published(60, 30).insert(&pool).await;
    let mut old_unpublished = OutboxRow::new("t");
    old_unpublished.created_ago = 10 * 86_400;
    old_unpublished.insert(&pool).await;

    let none = outbox(Some(&pool), &["cleanup"]);
    assert_usage_error(&none, "nothing to clean");

    let dry = outbox(
        Some(&pool),
        &["cleanup", "--older-than", "7d", "--dry-run", "--json"],
    );
    assert!(dry.status.success(), "{}", stderr(&dry));
    let report = json(&dry);
    assert_eq!(report["targets"][0]["target"], "published_outbox");
    assert_eq!(report["targets"][0]["matched"], 5);
    assert_eq!(count(&pool, "SELECT count(*) FROM outbox_event").await, 7);

    let run = outbox(
        Some(&pool),
        &[
            "cleanup",
            "--older-than",
            "7d",
            "--batch-size",
            "2",
            "--processed-older-than",
            "30d",
        ],
    );
    assert!(run.status.success(), "{}", stderr(&run));
    let text = stdout(&run);
    assert!(text.contains("deleted 5 published outbox rows"), "{text}");
    assert!(text.contains("deleted 0 processed_event rows"), "{text}");
    assert_eq!(count(&pool, "SELECT count(*) FROM outbox_event").await, 2);
}

#[sqlx::test(migrations = false)]
async fn dead_letters_from_the_command_line(pool: PgPool) {
    txoutbox_runtime::migrations::run(&pool).await.unwrap();
    let (id, event_id) = OutboxRow::new("orders")
        .parked(9, "unknown topic")
        .insert(&pool)
        .await;
    let (other, _) = OutboxRow::new("orders")
        .parked(9, "unknown topic")
        .insert(&pool)
        .await;

    let list = outbox(Some(&pool), &["dead-letters", "list", "--json"]);
    assert!(list.status.success(), "{}", stderr(&list));
    let listed = json(&list);
    assert_eq!(listed["total"], 2);
    assert_eq!(listed["rows"][0]["id"], id);
    assert_eq!(listed["rows"][0]["last_error"], "unknown topic");

    let unselected = outbox(Some(&pool), &["dead-letters", "retry"]);
    assert_usage_error(&unselected, "choose the rows");
    let misspelt = outbox(Some(&pool), &["dead-letters", "retry", "--topic", "ordres"]);
    assert_usage_error(&misspelt, "no outbox_event row has topic 'ordres'");
    let bad_uuid = outbox(
        Some(&pool),
        &["dead-letters", "retry", "--event-id", "not-a-uuid"],
    );
    assert_usage_error(&bad_uuid, "not-a-uuid");
    let inbox_by_id = outbox(
        Some(&pool),
        &["dead-letters", "retry", "--table", "inbox", "--id", "1"],
    );
    assert_usage_error(&inbox_by_id, "event id");

    let dry = outbox(
        Some(&pool),
        &[
            "dead-letters",
            "retry",
            "--event-id",
            &event_id.to_string(),
            "--dry-run",
        ],
    );
    assert!(
        stdout(&dry).contains("would retry 1 parked row in outbox_event"),
        "{}",
        stdout(&dry)
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM outbox_event WHERE parked_at IS NOT NULL"
        )
        .await,
        2
    );

    let retry = outbox(
        Some(&pool),
        &[
            "dead-letters",
            "retry",
            "--event-id",
            &event_id.to_string(),
            "--json",
        ],
    );
    assert!(retry.status.success(), "{}", stderr(&retry));
    assert_eq!(json(&retry)["event_ids"][0], event_id.to_string());
    let discard = outbox(
        Some(&pool),
        &["dead-letters", "discard", "--id", &other.to_string()],
    );
    assert!(
        stdout(&discard).contains("discarded 1 parked row in outbox_event"),
        "{}",
        stdout(&discard)
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM outbox_event WHERE parked_at IS NULL AND discarded_at IS NULL"
        )
        .await,
        1
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM outbox_event WHERE discarded_at IS NOT NULL"
        )
        .await,
        1
    );
}

#[sqlx::test(migrations = false)]
async fn replay_checks_its_input_before_sending(pool: PgPool) {
    txoutbox_runtime::migrations::run(&pool).await.unwrap();
    for _ in 0..4 {
        OutboxRow::new("orders")
            .published(600, 500)
            .insert(&pool)
            .await;
    }
    OutboxRow::new("orders").insert(&pool).await; // unpublished: never replayed

    let unfiltered = outbox(Some(&pool), &["replay", "--dry-run"]);
    assert_usage_error(&unfiltered, "--all");
    let unknown = outbox(Some(&pool), &["replay", "--topic", "ordres", "--dry-run"]);
    assert_usage_error(&unknown, "no outbox_event row has topic 'ordres'");
    let bad_time = outbox(
        Some(&pool),
        &["replay", "--topic", "orders", "--from", "yesterday"],
    );
    assert_usage_error(&bad_time, "not a time");
    let empty_range = outbox(
        Some(&pool),
        &["replay", "--all", "--from", "1h", "--to", "2h"],
    );
    assert_usage_error(&empty_range, "empty time range");
    let no_brokers = outbox(Some(&pool), &["replay", "--topic", "orders"]);
    assert_usage_error(&no_brokers, "KAFKA_BROKERS");

    let dry = outbox(
        Some(&pool),
        &[
            "replay",
            "--topic",
            "orders",
            "--from",
            "1h",
            "--dry-run",
            "--json",
        ],
    );
    assert!(dry.status.success(), "{}", stderr(&dry));
    let report = json(&dry);
    assert_eq!(report["selected"], 4);
    assert_eq!(report["filter"]["topic"], "orders");
    assert_eq!(
        count(&pool, "SELECT count(*) FROM outbox_replay_run").await,
        0,
        "a dry run records nothing"
    );
}

/// `--rebuild-topic` and `--rebuild-group`: what they need, what they
/// conflict with, what a dry run counts (events waiting for the relay too),
/// and what `--help` says of them.
#[sqlx::test(migrations = false)]
async fn replay_rebuild_options_check_their_input_and_explain_themselves(pool: PgPool) {
    txoutbox_runtime::migrations::run(&pool).await.unwrap();
    OutboxRow::new("orders")
        .published(600, 500)
        .insert(&pool)
        .await;
    OutboxRow::new("orders").insert(&pool).await; // waiting for the relay
    OutboxRow::new("orders")
        .parked(5, "refused")
        .insert(&pool)
        .await; // never sent: not rebuilt

    let refused = |args: &[&str], needle: &str| {
        let output = outbox(Some(&pool), args);
        assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
        assert!(stderr(&output).contains(needle), "{}", stderr(&output));
    };
    refused(
        &[
            "replay",
            "--all",
            "--rebuild-topic",
            "orders.rebuild",
            "--dry-run",
        ],
        "--topic <TOPIC>",
    );
    refused(
        &[
            "replay",
            "--topic",
            "orders",
            "--rebuild-topic",
            "orders.rebuild",
            "--target-topic",
            "elsewhere",
        ],
        "cannot be used with",
    );
    refused(
        &[
            "replay",
            "--topic",
            "orders",
            "--rebuild-group",
            "g",
            "--dry-run",
        ],
        "--rebuild-topic <TOPIC>",
    );

    let dry = outbox(
        Some(&pool),
        &[
            "replay",
            "--topic",
            "orders",
            "--rebuild-topic",
            "orders.rebuild",
            "--dry-run",
            "--json",
        ],
    );
    assert!(dry.status.success(), "{}", stderr(&dry));
    let report = json(&dry);
    assert_eq!(
        (report["mode"].as_str(), report["selected"].as_i64()),
        (Some("rebuild"), Some(2))
    );
    let text = outbox(
        Some(&pool),
        &[
            "replay",
            "--topic",
            "orders",
            "--rebuild-topic",
            "orders.rebuild",
            "--dry-run",
        ],
    );
    assert_eq!(
        stdout(&text).trim(),
        "would replay 2 events (published or waiting for the relay) into orders.rebuild"
    );
    let republish = outbox(
        Some(&pool),
        &["replay", "--topic", "orders", "--dry-run", "--json"],
    );
    assert_eq!(json(&republish)["selected"], 1);
    assert_eq!(json(&republish)["mode"], "republish");

    let help = stdout(&outbox(None, &["replay", "--help"]));
    for needle in [
        "--rebuild-topic <TOPIC>",
        "--rebuild-group <GROUP>",
        "out of order",
        "one database snapshot",
        "outbox replay --topic orders --rebuild-topic orders.rebuild-7 --rebuild-group",
    ] {
        assert!(help.contains(needle), "--help lacks {needle:?}:\n{help}");
    }
}

#[test]
fn bad_input_and_unreachable_database_exit_2_with_one_line() {
    let duration = outbox(
        None,
        &[
            "--database-url",
            "postgres://x@127.0.0.1:1/x",
            "cleanup",
            "--older-than",
            "7x",
        ],
    );
    assert_usage_error(
        &duration,
        "invalid value '7x' for '--older-than <DURATION>'",
    );
    let unreachable = outbox(
        None,
        &[
            "--database-url",
            "postgres://me:s3cret@127.0.0.1:1/db",
            "--connect-timeout",
            "2s",
            "status",
        ],
    );
    assert_usage_error(
        &unreachable,
        "cannot connect to the database at 127.0.0.1:1/db",
    );
    assert!(
        !stderr(&unreachable).contains("s3cret"),
        "the password is never printed"
    );
    let no_url = outbox(None, &["status"]);
    assert_usage_error(&no_url, "DATABASE_URL");
    let garbage_url = outbox(None, &["--database-url", "mysql://nope:port/db", "status"]);
    assert_usage_error(&garbage_url, "invalid database URL");
    let unknown_host = outbox(None, &["--database-url", "mysql://nope", "status"]);
    assert_usage_error(
        &unknown_host,
        "cannot connect to the database at nope:3306/",
    );
    let sqlite = outbox(None, &["--database-url", "sqlite://x.db", "migrate"]);
    assert_usage_error(&sqlite, "invalid database URL");
}

/// `outbox migrate` on MariaDB (`MYSQL_URL`'s server, a database of its
/// own): creates the MySQL schema, then finds it up to date; `replay`
/// counts there, `notify` says it needs PostgreSQL (`cli_mysql.rs` runs
/// the other commands on MariaDB).
#[test]
fn migrate_on_mariadb() {
    let server = std::env::var("MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned());
    let server = server
        .rsplit_once('/')
        .map_or(server.as_str(), |(s, _)| s)
        .to_owned();
    let name = format!("outbox_cli_{}", uuid::Uuid::new_v4().simple());
    let admin = |sql: String| {
        let status = Command::new("mariadb")
            .args(["-h", "127.0.0.1", "-u", "root", "-e", &sql])
            .status()
            .expect("the mariadb client");
        assert!(status.success(), "{sql}");
    };
    admin(format!("CREATE DATABASE {name}"));
    let url = format!("{}/{name}", server.replacen("mysql://", "mariadb://", 1));
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_outbox"))
            .env_remove("DATABASE_URL")
            .arg("--database-url")
            .arg(&url)
            .args(args)
            .output()
            .unwrap()
    };
    let first = run(&["--json", "migrate"]);
    let second = run(&["migrate"]);
    let replay = run(&["replay", "--all", "--dry-run"]);
    let notify = run(&["notify", "status"]);
    admin(format!("DROP DATABASE {name}"));
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    // Every MySQL migration, in order (the list grows with the backend).
    let migrations = txoutbox_runtime::migrations::MYSQL_MIGRATIONS;
    let expected: Vec<serde_json::Value> = migrations
        .iter()
        .map(|m| serde_json::json!({"version": m.version, "description": m.description}))
        .collect();
    assert_eq!(
        &expected[..3],
        [
            serde_json::json!({"version": 1, "description": "outbox"}),
            serde_json::json!({"version": 2, "description": "relay"}),
            serde_json::json!({"version": 3, "description": "operator_tooling"}),
        ]
    );
    assert_eq!(json(&first)["applied"], serde_json::Value::from(expected));
    assert_eq!(second.status.code(), Some(0), "{}", stderr(&second));
    assert_eq!(
        stdout(&second).trim(),
        format!("schema is up to date ({} migrations)", migrations.len())
    );
    assert_eq!(replay.status.code(), Some(0), "{}", stderr(&replay));
    assert_eq!(stdout(&replay).trim(), "would replay 0 published events");
    assert_usage_error(
        &notify,
        "`outbox notify` needs PostgreSQL (MariaDB has no LISTEN/NOTIFY",
    );
}

#[test]
fn schemas_points_to_the_exporter_or_runs_it() {
    let unconfigured = outbox(None, &["schemas", "export"]);
    assert_usage_error(&unconfigured, "--exporter");
    let ran = outbox(
        None,
        &[
            "schemas",
            "check",
            "--exporter",
            "echo exporter-ran",
            "--",
            "--dir",
            "my schemas",
        ],
    );
    assert!(ran.status.success(), "{}", stderr(&ran));
    assert_eq!(stdout(&ran), "exporter-ran check --dir my schemas\n");
    let failing = outbox(
        None,
        &["schemas", "check", "--exporter", "sh -c 'exit 3' x"],
    );
    assert_eq!(
        failing.status.code(),
        Some(3),
        "the exporter's exit code is kept"
    );
}

#[sqlx::test(migrations = false)]
async fn notify_enable_status_disable(pool: PgPool) {
    let unmigrated = outbox(Some(&pool), &["notify", "enable"]);
    assert_usage_error(&unmigrated, "run `outbox migrate` first");
    assert!(outbox(Some(&pool), &["migrate"]).status.success());
    let off = outbox(Some(&pool), &["notify", "status", "--json"]);
    assert!(off.status.success(), "{}", stderr(&off));
    assert_eq!(json(&off)["enabled"], false);

    for _ in 0..2 {
        let on = outbox(Some(&pool), &["notify", "enable"]);
        assert!(on.status.success(), "{}", stderr(&on));
        assert!(stdout(&on).contains("notifications on"), "{}", stdout(&on));
    }
    // The trigger notifies the relays' channel when a row is inserted.
    let mut listener = sqlx::postgres::PgListener::connect_with(&pool)
        .await
        .unwrap();
    listener
        .listen(txoutbox_runtime::ops::notify::CHANNEL)
        .await
        .unwrap();
    OutboxRow::new("orders").insert(&pool).await;
    let got = tokio::time::timeout(std::time::Duration::from_secs(5), listener.recv())
        .await
        .expect("a notification within 5 s")
        .unwrap();
    assert_eq!(got.channel(), "outbox_event");
    let status = outbox(Some(&pool), &["notify", "status", "--json"]);
    assert_eq!(json(&status)["enabled"], true);

    for _ in 0..2 {
        let disabled = outbox(Some(&pool), &["notify", "disable"]);
        assert!(disabled.status.success(), "{}", stderr(&disabled));
        assert!(stdout(&disabled).contains("notifications off"));
    }
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM pg_proc WHERE proname = 'outbox_event_notify_relays'"
        )
        .await,
        0,
        "disable removes the function too"
    );
}

/// Every flag taking a duration or a time: a value beyond its range is a
/// usage error naming the flag and the range, never a chrono overflow panic.
#[sqlx::test(migrations = false)]
async fn out_of_range_durations_and_times_exit_2(pool: PgPool) {
    txoutbox_runtime::migrations::run(&pool).await.unwrap();
    OutboxRow::new("orders")
        .published(600, 500)
        .insert(&pool)
        .await;
    let age_range = "out of range; accepted: 0s to 1000y";
    for flag in [
        "--older-than",
        "--processed-older-than",
        "--inbox-older-than",
        "--sagas-older-than",
    ] {
        for value in ["300000y", "1001y", "300000000000y"] {
            let cleanup = outbox(Some(&pool), &["cleanup", flag, value, "--dry-run"]);
            assert_usage_error(
                &cleanup,
                &format!("invalid value '{value}' for '{flag} <DURATION>'"),
            );
            assert_usage_error(&cleanup, age_range);
        }
    }
    let oldest = outbox(
        Some(&pool),
        &["cleanup", "--older-than", "1000y", "--dry-run"],
    );
    assert!(oldest.status.success(), "{}", stderr(&oldest));
    assert!(stdout(&oldest).contains("would delete 0 published outbox rows"));

    let time_range = "out of range; accepted: a time from 0000-01-01 to 9999-12-31, or a duration ago of at most 1000y";
    for flag in ["--from", "--to"] {
        for value in ["300000y", "300000000000y", "-5000-01-01"] {
            let replay = outbox(
                Some(&pool),
                &["replay", "--all", &format!("{flag}={value}"), "--dry-run"],
            );
            assert_usage_error(
                &replay,
                &format!("invalid value '{value}' for '{flag} <TIME>'"),
            );
            assert_usage_error(&replay, time_range);
        }
    }
    let widest = outbox(
        Some(&pool),
        &[
            "replay",
            "--all",
            "--from",
            "1000y",
            "--to",
            "9999-12-31",
            "--dry-run",
            "--json",
        ],
    );
    assert!(widest.status.success(), "{}", stderr(&widest));
    assert_eq!(json(&widest)["selected"], 1);

    let pause = outbox(
        Some(&pool),
        &["cleanup", "--older-than", "1d", "--pause", "300000000000y"],
    );
    assert_usage_error(
        &pause,
        "invalid value '300000000000y' for '--pause <DURATION>'",
    );
    assert_usage_error(&pause, "out of range; accepted: 0s to 1h");
    let timeout = outbox(
        Some(&pool),
        &["--connect-timeout", "300000000000y", "status"],
    );
    assert_usage_error(
        &timeout,
        "invalid value '300000000000y' for '--connect-timeout <DURATION>'",
    );
    assert_usage_error(&timeout, "out of range; accepted: 0s to 1h");

    // Health thresholds are compared, never turned into times: any size is
    // valid (and never exceeded); only a number too large to parse is refused.
    for flag in ["--max-age", "--max-inbox-age", "--max-saga-age"] {
        let huge = outbox(Some(&pool), &["status", flag, "300000000000y"]);
        assert_eq!(huge.status.code(), Some(0), "{}", stderr(&huge));
        let unparsable = outbox(Some(&pool), &["status", flag, "99999999999999999999999y"]);
        assert_usage_error(&unparsable, &format!("'{flag} <DURATION>': out of range"));
    }
}

/// `outbox notify enable` run by a role without the right to create the
/// trigger (an application role, not the migration role) exits 2 with a
/// hint, not with PostgreSQL's bare "permission denied".
#[sqlx::test(migrations = false)]
async fn notify_without_the_right_to_create_triggers_says_which_role_to_use(pool: PgPool) {
    assert!(outbox(Some(&pool), &["migrate"]).status.success());
    let role = format!("outbox_app_{}", uuid::Uuid::new_v4().simple());
    let database: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&pool)
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE ROLE {role} LOGIN; GRANT CONNECT ON DATABASE \"{database}\" TO {role};
         GRANT USAGE ON SCHEMA public TO {role}; GRANT SELECT ON outbox_event TO {role};"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let options: &PgConnectOptions = &pool.connect_options();
    let as_app = options.clone().username(&role).to_url_lossy().to_string();
    let output = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .env_remove("DATABASE_URL")
        .args(["--database-url", &as_app, "notify", "enable"])
        .output()
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "REVOKE ALL ON outbox_event FROM {role}; REVOKE ALL ON SCHEMA public FROM {role};
         REVOKE ALL ON DATABASE \"{database}\" FROM {role}; DROP ROLE {role};"
    )))
    .execute(&pool)
    .await
    .unwrap();
    assert_usage_error(
        &output,
        "run `outbox notify` as the role that runs your migrations",
    );
    assert!(
        stderr(&output).contains("SQLSTATE 42501"),
        "{}",
        stderr(&output)
    );
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

#[sqlx::test(migrations = false)]
async fn sagas_list_show_and_stuck(pool: PgPool) {
    txoutbox_runtime::migrations::run(&pool).await.unwrap();
    let mut reserving = SagaRow::running("OrderFulfilment", "o-1", 3_600);
    reserving.compensations = vec![
        ("ReleaseStock", "inventory.commands", "o-1"),
        ("RefundPayment", "payment.commands", "o-1"),
    ];
    let (compensation_ids, last_event_id) = reserving.insert(&pool).await;
    SagaRow::running("OrderFulfilment", "o-2", 1_200)
        .insert(&pool)
        .await;
    SagaRow::running("Refund", "r-1", 30).insert(&pool).await;
    SagaRow::finished("OrderFulfilment", "o-3", "compensated", 60)
        .insert(&pool)
        .await;

    let list = outbox(Some(&pool), &["sagas", "list"]);
    assert!(list.status.success(), "{}", stderr(&list));
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
        Some(&pool),
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
    assert!(filtered.status.success(), "{}", stderr(&filtered));
    let filtered = json(&filtered);
    let sagas = filtered["sagas"].as_array().unwrap();
    assert_eq!(sagas.len(), 1);
    assert_eq!(sagas[0]["saga_id"], "o-2");
    assert_eq!(sagas[0]["status"], "running");
    let limited = outbox(Some(&pool), &["sagas", "list", "--limit", "2"]);
    assert!(
        stdout(&limited)
            .contains("2 sagas, the most recently moved first (the limit; raise --limit"),
        "{}",
        stdout(&limited)
    );
    let bad_status = outbox(Some(&pool), &["sagas", "list", "--status", "done"]);
    assert_usage_error(&bad_status, "invalid value 'done' for '--status <STATUS>'");
    let misspelt = outbox(
        Some(&pool),
        &["sagas", "list", "--type", "OrderFulfillment"],
    );
    assert_usage_error(
        &misspelt,
        "no saga has type 'OrderFulfillment' (check the spelling)",
    );

    let show = outbox(Some(&pool), &["sagas", "show", "OrderFulfilment", "o-1"]);
    assert!(show.status.success(), "{}", stderr(&show));
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
    let show_json = outbox(
        Some(&pool),
        &["sagas", "show", "OrderFulfilment", "o-1", "--json"],
    );
    let detail = json(&show_json);
    assert_eq!(detail["version"], 2);
    assert_eq!(detail["state"]["stage"], "waiting");
    assert_eq!(detail["last_event_id"], last_event_id.to_string());
    assert_eq!(detail["compensations"][0]["topic"], "inventory.commands");
    let finished = outbox(Some(&pool), &["sagas", "show", "OrderFulfilment", "o-3"]);
    let text = stdout(&finished);
    assert!(text.contains("\n  finished      20"), "{text}");
    assert!(text.contains("pending compensations: none"), "{text}");
    let missing = outbox(Some(&pool), &["sagas", "show", "OrderFulfilment", "o-9"]);
    assert_usage_error(
        &missing,
        "no OrderFulfilment saga has id 'o-9' (never started, or removed by retention",
    );
    let unknown_type = outbox(Some(&pool), &["sagas", "show", "Nope", "o-1"]);
    assert_usage_error(&unknown_type, "no saga has type 'Nope'");

    let stuck = outbox(Some(&pool), &["sagas", "stuck", "--older-than", "10m"]);
    assert_eq!(stuck.status.code(), Some(1), "{}", stderr(&stuck));
    let text = stdout(&stuck);
    assert!(text.lines().next().unwrap().contains("WAITING"), "{text}");
    let rows = table_rows(&text);
    let waiting: Vec<&str> = rows.iter().map(|r| r[1].as_str()).collect();
    assert_eq!(waiting, ["o-1", "o-2"], "oldest first: {text}");
    // The time since the last step (a second more if the clock ticked).
    assert!(
        rows[0][7].starts_with("1h") && rows[1][7].starts_with("20m"),
        "{text}"
    );
    assert_eq!(text.lines().count(), 3, "a header and the sagas: {text}");
    assert_eq!(
        stderr(&stuck),
        "unhealthy: 2 running sagas have not moved for more than 10m\n"
    );
    let one = outbox(
        Some(&pool),
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
    let shown = outbox(
        Some(&pool),
        &["sagas", "stuck", "--older-than", "10m", "--limit", "1"],
    );
    assert!(
        stdout(&shown).ends_with("\n1 of 2 shown; raise --limit to see more\n"),
        "{}",
        stdout(&shown)
    );
    let report = json(&one);
    assert_eq!(report["total"], 2, "counted beyond the limit");
    assert_eq!(report["older_than_secs"], 600.0);
    assert_eq!(report["sagas"][0]["saga_id"], "o-1");
    assert_eq!(report["sagas"].as_array().unwrap().len(), 1);
    let of_type = outbox(
        Some(&pool),
        &["sagas", "stuck", "--older-than", "1m", "--type", "Refund"],
    );
    assert_eq!(of_type.status.code(), Some(0), "{}", stderr(&of_type));
    assert_eq!(
        stdout(&of_type),
        "no running Refund saga has gone without a step for more than 1m\n"
    );
    assert_eq!(stderr(&of_type), "");
    let none = outbox(Some(&pool), &["sagas", "stuck", "--older-than", "2h"]);
    assert_eq!(none.status.code(), Some(0), "{}", stderr(&none));
    let too_old = outbox(Some(&pool), &["sagas", "stuck", "--older-than", "1001y"]);
    assert_usage_error(&too_old, "out of range; accepted: 0s to 1000y");
    let without_age = outbox(Some(&pool), &["sagas", "stuck"]);
    assert_eq!(without_age.status.code(), Some(2));
    assert!(
        stderr(&without_age).contains("--older-than"),
        "{}",
        stderr(&without_age)
    );
}

#[sqlx::test(migrations = false)]
async fn status_shows_sagas_and_checks_their_age(pool: PgPool) {
    txoutbox_runtime::migrations::run(&pool).await.unwrap();
    SagaRow::running("OrderFulfilment", "o-1", 1_800)
        .insert(&pool)
        .await;
    SagaRow::running("OrderFulfilment", "o-2", 10)
        .insert(&pool)
        .await;
    SagaRow::finished("OrderFulfilment", "o-3", "completed", 60)
        .insert(&pool)
        .await;
    SagaRow::finished("Refund", "r-1", "compensated", 60)
        .insert(&pool)
        .await;

    let healthy = outbox(Some(&pool), &["status", "--max-saga-age", "1h"]);
    assert_eq!(healthy.status.code(), Some(0), "{}", stderr(&healthy));
    let text = stdout(&healthy);
    let (_, sagas) = text.split_once("\nsagas (saga_state)\n").expect(&text);
    let lines: Vec<&str> = sagas.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].starts_with(
            "  OrderFulfilment  running 2  completed 1  compensated 0  oldest running moved 30m"
        ),
        "{text}"
    );
    assert_eq!(
        lines[1],
        "  Refund           running 0  completed 0  compensated 1"
    );

    let unhealthy = outbox(Some(&pool), &["status", "--max-saga-age", "10m", "--json"]);
    assert_eq!(unhealthy.status.code(), Some(1));
    let report = json(&unhealthy);
    assert_eq!(report["healthy"], false);
    assert_eq!(report["breaches"][0]["threshold"], "max-saga-age");
    assert_eq!(report["sagas"][0]["saga_type"], "OrderFulfilment");
    assert_eq!(report["sagas"][0]["running"], 2);
    assert_eq!(report["sagas"][1]["compensated"], 1);
    let err = stderr(&unhealthy);
    assert!(
        err.starts_with(
            "unhealthy: max-saga-age exceeded: a running OrderFulfilment saga has not moved for 18"
        ) && err.ends_with("s (limit 600s)\n"),
        "{err}"
    );
    let unparsable = outbox(Some(&pool), &["status", "--max-saga-age", "soon"]);
    assert_usage_error(
        &unparsable,
        "invalid value 'soon' for '--max-saga-age <DURATION>'",
    );

    // A database migrated before 0008: no sagas part, thresholds still work.
    sqlx::query("DROP TABLE saga_state")
        .execute(&pool)
        .await
        .unwrap();
    let old = outbox(Some(&pool), &["status", "--max-saga-age", "1s"]);
    assert_eq!(old.status.code(), Some(0), "{}", stderr(&old));
    assert!(!stdout(&old).contains("sagas"), "{}", stdout(&old));
    let list = outbox(Some(&pool), &["sagas", "list"]);
    assert_usage_error(&list, "run `outbox migrate` first");
}

#[sqlx::test(migrations = false)]
async fn cleanup_deletes_only_finished_sagas_older_than_the_age(pool: PgPool) {
    txoutbox_runtime::migrations::run(&pool).await.unwrap();
    let day = 86_400;
    SagaRow::finished("OrderFulfilment", "old-completed", "completed", 10 * day)
        .insert(&pool)
        .await;
    SagaRow::finished("OrderFulfilment", "old-compensated", "compensated", 9 * day)
        .insert(&pool)
        .await;
    SagaRow::finished("Refund", "old-refund", "completed", 8 * day)
        .insert(&pool)
        .await;
    SagaRow::finished("OrderFulfilment", "recent", "completed", day)
        .insert(&pool)
        .await;
    // Running for a month without a step: stuck, but never deleted.
    SagaRow::running("OrderFulfilment", "running", 30 * day)
        .insert(&pool)
        .await;

    let dry = outbox(
        Some(&pool),
        &["cleanup", "--sagas-older-than", "7d", "--dry-run", "--json"],
    );
    assert!(dry.status.success(), "{}", stderr(&dry));
    let report = json(&dry);
    assert_eq!(report["targets"][0]["target"], "finished_saga");
    assert_eq!(report["targets"][0]["matched"], 3);
    assert_eq!(count(&pool, "SELECT count(*) FROM saga_state").await, 5);

    let run = outbox(
        Some(&pool),
        &["cleanup", "--sagas-older-than", "7d", "--batch-size", "2"],
    );
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(
        stdout(&run).starts_with("deleted 3 finished sagas (before "),
        "{}",
        stdout(&run)
    );
    let left: Vec<String> = sqlx::query_scalar("SELECT saga_id FROM saga_state ORDER BY saga_id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(left, ["recent", "running"]);

    let everything = outbox(Some(&pool), &["cleanup", "--sagas-older-than", "0s"]);
    assert!(everything.status.success(), "{}", stderr(&everything));
    assert!(stdout(&everything).starts_with("deleted 1 finished sagas"));
    let left: Vec<String> = sqlx::query_scalar("SELECT saga_id FROM saga_state")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(left, ["running"], "a running saga is never deleted");
}
