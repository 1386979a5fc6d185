//! Database errors as users read them: PostgreSQL's message, its SQLSTATE,
//! `detail:` and `hint:`, never the "at line N" of PostgreSQL's own C source
//! that sqlx's `Display` appends. Checked against real PostgreSQL errors and
//! end to end in a handler's error, as the inbox records it (`last_error`) and
//! as the dead-letter topic carries it (`dlq_error`).
#![allow(missing_docs)]

mod consumer_support;

use std::time::Duration;

use consumer_support::*;
use sqlx::{PgPool, Postgres, Transaction};
use txoutbox_core::Backoff;
use txoutbox_core::{DbErrorDisplay, DomainEvent};
use txoutbox_runtime::consumer::{Consumer, HandlerError, Mode, event_handler};
use txoutbox_runtime::ops::OpsError;

/// No trace of the server's source location, in any form sqlx or PostgreSQL
/// writes it.
#[track_caller]
fn assert_no_source_location(text: &str) {
    for noise in [" at line ", "line:", "routine", ".c:"] {
        assert!(!text.contains(noise), "{text:?} contains {noise:?}");
    }
}

/// The error `sql` fails with.
async fn failure(pool: &PgPool, sql: &'static str) -> sqlx::Error {
    sqlx::raw_sql(sql)
        .execute(pool)
        .await
        .expect_err("the statement fails")
}

#[sqlx::test(migrations = false)]
async fn postgres_errors_render_message_code_detail_and_hint(pool: PgPool) {
    sqlx::raw_sql("CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1)")
        .execute(&pool)
        .await
        .unwrap();

    let unique = failure(&pool, "INSERT INTO t VALUES (1)").await;
    assert!(
        unique.to_string().contains(" at line "),
        "sqlx's own text: {unique}"
    );
    assert_eq!(
        DbErrorDisplay(&unique).to_string(),
        "duplicate key value violates unique constraint \"t_pkey\" (SQLSTATE 23505); \
         detail: Key (id)=(1) already exists."
    );

    let undefined = failure(&pool, "SELECT * FROM no_such_table").await;
    assert_eq!(
        DbErrorDisplay(&undefined).to_string(),
        "relation \"no_such_table\" does not exist (SQLSTATE 42P01)"
    );

    let hinted = failure(&pool, "SELECT lower(42)").await;
    assert_eq!(
        DbErrorDisplay(&hinted).to_string(),
        "function lower(integer) does not exist (SQLSTATE 42883); \
         hint: No function matches the given name and argument types. \
         You might need to add explicit type casts."
    );

    // Not from the server: written as sqlx writes it.
    let closed = sqlx::Error::PoolClosed;
    assert_eq!(DbErrorDisplay(&closed).to_string(), closed.to_string());
}

/// Fails as `SELECT * FROM no_such_table` does.
#[event_handler]
async fn fails(tx: &mut Transaction<'_, Postgres>, _: DupDedup) -> Result<(), sqlx::Error> {
    let sql = "SELECT * FROM no_such_table";
    sqlx::raw_sql(sql).execute(&mut **tx).await.map(drop)
}

#[sqlx::test(migrations = false)]
async fn errors_shown_to_users_wrap_the_database_error_the_same_way(pool: PgPool) {
    let sql = "SELECT * FROM no_such_table";
    let rendered = "relation \"no_such_table\" does not exist (SQLSTATE 42P01)";

    // A handler's error: `#[event_handler]` code (run as the consumer runs
    // it), `HandlerError::new`, `?`.
    assert_eq!(
        txoutbox_runtime::testing::handle(&pool, fails, DupDedup::new(1))
            .await
            .unwrap_err()
            .to_string(),
        rendered
    );
    assert_eq!(
        HandlerError::new(failure(&pool, sql).await).to_string(),
        rendered
    );
    assert_eq!(
        HandlerError::from(failure(&pool, sql).await).to_string(),
        rendered
    );
    assert_eq!(
        HandlerError::new("not a database error").to_string(),
        "not a database error"
    );

    // The write path's, the operator operations' and the migrations' errors.
    assert_eq!(
        txoutbox_core::Error::Database(failure(&pool, sql).await).to_string(),
        format!("database error: {rendered}")
    );
    assert_eq!(
        OpsError::Database(failure(&pool, sql).await).to_string(),
        format!("database error: {rendered}")
    );
    let migrate = txoutbox_runtime::migrations::MigrateError {
        version: 1,
        description: "outbox_inbox_base",
        source: failure(&pool, sql).await,
    };
    assert_eq!(
        migrate.to_string(),
        format!("outbox migration 1 (outbox_inbox_base) failed: {rendered}")
    );
}

test_event!(DupInbox, "db-errors-test.inbox", "DupInbox");
test_event!(DupDedup, "db-errors-test.dedup", "DupDedup");

/// Orders charged once: the handlers below insert into it, and an order that
/// is already there makes them fail with a unique violation.
async fn prepare(pool: &PgPool) {
    prepare_db(pool).await;
    sqlx::raw_sql("CREATE TABLE charged (order_id uuid PRIMARY KEY)")
        .execute(pool)
        .await
        .unwrap();
}

async fn charge_twice_beforehand(pool: &PgPool, order_id: uuid::Uuid) {
    sqlx::query("INSERT INTO charged (order_id) VALUES ($1)")
        .bind(order_id)
        .execute(pool)
        .await
        .unwrap();
}

#[event_handler]
async fn on_dup_inbox(
    tx: &mut Transaction<'_, Postgres>,
    event: DupInbox,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO charged (order_id) VALUES ($1)")
        .bind(event.order_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[event_handler]
async fn on_dup_dedup(
    tx: &mut Transaction<'_, Postgres>,
    event: DupDedup,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO charged (order_id) VALUES ($1)")
        .bind(event.order_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// What a unique violation on `charged` reads like, for `order_id`.
#[track_caller]
fn assert_unique_violation(text: &str, order_id: uuid::Uuid) {
    assert_no_source_location(text);
    let expected = format!(
        "duplicate key value violates unique constraint \"charged_pkey\" (SQLSTATE 23505); \
         detail: Key (order_id)=({order_id}) already exists."
    );
    assert!(text.contains(&expected), "{text:?} lacks {expected:?}");
}

#[sqlx::test(migrations = false)]
async fn an_inbox_row_records_the_database_error_without_source_lines(pool: PgPool) {
    prepare(&pool).await;
    create_topic(DupInbox::TOPIC, 1).await;
    let group = unique_group("db-errors-inbox");
    start_group_at(&group, DupInbox::TOPIC, 1, true).await;
    let event = DupInbox::new(1);
    charge_twice_beforehand(&pool, event.order_id).await;
    produce_event(&producer(), &event).await;
    let running = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_dup_inbox)
        .mode(Mode::Inbox)
        .max_attempts(2)
        .backoff(Backoff::new(
            Duration::from_millis(10),
            Duration::from_millis(50),
        ))
        .processor_poll_interval(Duration::from_millis(20))
        .build()
        .unwrap()
        .spawn();
    eventually("the row parked", Duration::from_secs(25), || async {
        count(
            &pool,
            "SELECT count(*) FROM inbox_event WHERE parked_at IS NOT NULL",
        )
        .await
            == 1
    })
    .await;
    running.shutdown().await.unwrap();

    let last_error: String =
        sqlx::query_scalar("SELECT last_error FROM inbox_event WHERE event_id = $1")
            .bind(event.event_id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(
        last_error.starts_with("handler `on_dup_inbox` failed: duplicate key value"),
        "{last_error}"
    );
    assert_unique_violation(&last_error, event.order_id);
}

#[sqlx::test(migrations = false)]
async fn a_dead_letter_carries_the_database_error_without_source_lines(pool: PgPool) {
    prepare(&pool).await;
    create_topic(DupDedup::TOPIC, 1).await;
    let group = unique_group("db-errors-dedup");
    start_group_at(&group, DupDedup::TOPIC, 1, true).await;
    let dlq = format!("{}.dlq", DupDedup::TOPIC);
    let dlq_start = high_watermarks(&dlq, 1).await[0];
    let event = DupDedup::new(1);
    charge_twice_beforehand(&pool, event.order_id).await;
    produce_event(&producer(), &event).await;
    let running = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_dup_dedup)
        .max_attempts(2)
        .backoff(Backoff::new(
            Duration::from_millis(10),
            Duration::from_millis(50),
        ))
        .build()
        .unwrap()
        .spawn();
    let dead = read_until(&dlq, dlq_start, Duration::from_secs(20), |m| !m.is_empty()).await;
    running.shutdown().await.unwrap();

    let error = header(&dead[0], "dlq_error").unwrap();
    assert!(
        error.starts_with("handler `on_dup_dedup` failed 2 times; last error: duplicate key value"),
        "{error}"
    );
    assert_unique_violation(&error, event.order_id);
}
