//! The relay's claim walks `ix_outbox_event_unpublished` in id order, and
//! that index holds only the rows the relay may still publish: parked and
//! discarded rows are not in it, so no claim steps over them (each one cost
//! the claim a heap fetch, about 1.6 µs, for as long as it stayed parked),
//! and a parked row an operator retries is back in it. And the claim is one
//! ordered walk of that index stopping at its limit whatever the statistics
//! say: a backlog that built up since the table was last analyzed (a
//! broker outage) is not sorted whole, nor scanned again for every row.
//! Checked on the plan PostgreSQL runs (`EXPLAIN ANALYZE` of the relay's own
//! statement).

mod relay_support;

use relay_support::*;
use serde_json::Value;
use sqlx::{Connection as _, PgPool};
use txoutbox_runtime::ops::dead_letters::{self, Selection, Table};

/// Every plan node, depth first.
fn nodes(plan: &Value) -> Vec<&Value> {
    let mut out = vec![plan];
    for child in plan["Plans"].as_array().into_iter().flatten() {
        out.extend(nodes(child));
    }
    out
}

/// The scan of the claimed rows (`outbox_event o`): its node type, index and
/// the rows it read and threw away.
#[derive(Debug, PartialEq)]
struct ClaimScan {
    node: String,
    index: Option<String>,
    removed_by_filter: i64,
    rows: i64,
}

async fn claim_scan(pool: &PgPool) -> ClaimScan {
    let mut conn = pool.acquire().await.unwrap();
    let explained = txoutbox_runtime::relay::explain_claim(&mut conn, 64, 1000)
        .await
        .unwrap();
    scan_of(&explained[0]["Plan"])
}

/// The scan of the claimed rows in a claim's plan.
fn scan_of(plan: &Value) -> ClaimScan {
    let scans: Vec<&Value> = nodes(plan)
        .into_iter()
        .filter(|n| n["Relation Name"] == "outbox_event" && n["Alias"] == "o")
        .collect();
    assert_eq!(scans.len(), 1, "one scan of the claimed rows: {plan:#}");
    let scan = scans[0];
    let number = |field: &str| scan[field].as_f64().unwrap_or(0.0) as i64;
    ClaimScan {
        node: scan["Node Type"].as_str().unwrap().to_owned(),
        index: scan["Index Name"].as_str().map(str::to_owned),
        removed_by_filter: number("Rows Removed by Filter")
            + number("Rows Removed by Index Recheck"),
        rows: number("Actual Rows"),
    }
}

async fn analyze(pool: &PgPool) {
    sqlx::query("VACUUM ANALYZE outbox_event")
        .execute(pool)
        .await
        .unwrap();
}

#[sqlx::test(migrations = false)]
async fn a_claim_steps_over_no_parked_or_discarded_row_and_a_retried_row_is_claimed(pool: PgPool) {
    migrated(&pool).await;
    let topic = unique_topic("claim-index");
    // Months of history (published), then 3,000 rows parked (1,000 of them
    // discarded), then the 200 rows the relay has to publish: the parked
    // rows have the lowest ids among the unpublished ones, in front of
    // every claim.
    let history: Vec<NewEvent> = (0..5000)
        .map(|i| NewEvent::new(&topic, format!("h{}", i % 50), i))
        .collect();
    insert(&pool, &history).await;
    sqlx::query("UPDATE outbox_event SET published_at = now()")
        .execute(&pool)
        .await
        .unwrap();
    let parked: Vec<NewEvent> = (0..3000)
        .map(|i| NewEvent::new(&topic, format!("p{}", i % 300), i))
        .collect();
    let parked_ids = insert(&pool, &parked).await;
    sqlx::query(
        "UPDATE outbox_event SET parked_at = now(), attempts = 10, last_error = 'refused'
         WHERE published_at IS NULL",
    )
    .execute(&pool)
    .await
    .unwrap();
    dead_letters::discard(
        &pool,
        Table::Outbox,
        &Selection::EventIds(parked_ids[..1000].to_vec()),
    )
    .await
    .unwrap();
    let pending: Vec<NewEvent> = (0..200)
        .map(|i| NewEvent::new(&topic, format!("k{}", i % 20), i))
        .collect();
    insert(&pool, &pending).await;
    analyze(&pool).await;

    let scan = claim_scan(&pool).await;
    assert_eq!(
        scan,
        ClaimScan {
            node: "Index Scan".into(),
            index: Some("ix_outbox_event_unpublished".into()),
            removed_by_filter: 0,
            rows: 200,
        },
        "the claim walks the index of publishable rows and steps over no parked or discarded row"
    );

    // An operator retries 100 parked rows: they are publishable again, so
    // they are back in the index, and the next claim takes them (first:
    // their ids are the lowest).
    let retried = dead_letters::retry(
        &pool,
        Table::Outbox,
        &Selection::EventIds(parked_ids[1000..1100].to_vec()),
    )
    .await
    .unwrap();
    assert_eq!(retried.len(), 100);
    analyze(&pool).await;
    let scan = claim_scan(&pool).await;
    assert_eq!(
        (scan.index.as_deref(), scan.removed_by_filter, scan.rows),
        (Some("ix_outbox_event_unpublished"), 0, 300),
        "{scan:?}"
    );
    let claimed_first: Vec<uuid::Uuid> = sqlx::query_scalar(
        "SELECT event_id FROM outbox_event
         WHERE published_at IS NULL AND parked_at IS NULL ORDER BY id LIMIT 100",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(claimed_first, parked_ids[1000..1100].to_vec());
}

/// Upgrading a database whose parked rows are in the old index: an index
/// built beforehand with `CREATE INDEX CONCURRENTLY` under the name the
/// migration looks for is swapped in (not built again), and the claim
/// steps over nothing.
#[sqlx::test(migrations = false)]
async fn the_upgrade_swaps_in_an_index_built_concurrently_beforehand(pool: PgPool) {
    init_tracing();
    for migration in &txoutbox_runtime::migrations::MIGRATIONS[..8] {
        sqlx::raw_sql(migration.sql).execute(&pool).await.unwrap();
    }
    let topic = unique_topic("claim-index-upgrade");
    let parked = insert(
        &pool,
        &(0..500)
            .map(|i| NewEvent::new(&topic, format!("p{i}"), i))
            .collect::<Vec<_>>(),
    )
    .await;
    sqlx::query("UPDATE outbox_event SET parked_at = now(), attempts = 3")
        .execute(&pool)
        .await
        .unwrap();
    insert(
        &pool,
        &(0..50)
            .map(|i| NewEvent::new(&topic, format!("k{i}"), i))
            .collect::<Vec<_>>(),
    )
    .await;
    sqlx::query(
        "CREATE INDEX CONCURRENTLY ix_outbox_event_unpublished_0010 ON outbox_event(id)
         WHERE published_at IS NULL AND parked_at IS NULL",
    )
    .execute(&pool)
    .await
    .unwrap();
    let built: i64 = sqlx::query_scalar(
        "SELECT oid::int8 FROM pg_class WHERE relname = 'ix_outbox_event_unpublished_0010'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();

    let applied = txoutbox_runtime::migrations::run(&pool).await.unwrap();
    assert!(applied.contains(&9), "{applied:?}");
    let (oid, predicate): (i64, String) = sqlx::query_as(
        "SELECT c.oid::int8, pg_get_expr(i.indpred, i.indrelid)
         FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid
         WHERE c.relname = 'ix_outbox_event_unpublished'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(oid, built, "the index built beforehand, renamed");
    assert_eq!(
        predicate,
        "((published_at IS NULL) AND (parked_at IS NULL))"
    );
    analyze(&pool).await;
    let scan = claim_scan(&pool).await;
    assert_eq!((scan.removed_by_filter, scan.rows), (0, 50), "{scan:?}");
    // Run again (the plain file too): nothing changes.
    sqlx::raw_sql(txoutbox_runtime::migrations::MIGRATIONS[8].sql)
        .execute(&pool)
        .await
        .unwrap();
    let again: i64 = sqlx::query_scalar(
        "SELECT oid::int8 FROM pg_class WHERE relname = 'ix_outbox_event_unpublished'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(again, built);
    drop(parked);
}

/// Every node of `plan` of type `node_type`.
fn nodes_of<'a>(plan: &'a Value, node_type: &str) -> Vec<&'a Value> {
    nodes(plan)
        .into_iter()
        .filter(|n| n["Node Type"] == node_type)
        .collect()
}

/// A backlog the statistics do not know: the table was analyzed while no
/// row was unpublished (so the partial indexes' `reltuples` say 0), then
/// 20,000 rows came in before autovacuum looked again, as during a broker
/// outage. The claim still walks the index in id order and stops at its
/// limit, with the keys waiting for a retry read once: no sort of the
/// backlog, no scan of it per row. (The earlier form of the statement
/// sorted the backlog and scanned it again for every row of it: quadratic,
/// more than 14 minutes at 200,000 rows; here the statement timeout would
/// end it.)
#[sqlx::test(migrations = false)]
async fn a_backlog_the_statistics_do_not_know_is_claimed_in_one_ordered_walk(pool: PgPool) {
    migrated(&pool).await;
    sqlx::query("ALTER TABLE outbox_event SET (autovacuum_enabled = false)")
        .execute(&pool)
        .await
        .unwrap();
    let topic = unique_topic("claim-stale-statistics");
    let history: Vec<NewEvent> = (0..5000)
        .map(|i| NewEvent::new(&topic, format!("h{}", i % 50), i))
        .collect();
    insert(&pool, &history).await;
    sqlx::query("UPDATE outbox_event SET published_at = now()")
        .execute(&pool)
        .await
        .unwrap();
    analyze(&pool).await;
    // 20,000 rows over 500 keys; the first row of key `w0` waits for a
    // retry, an hour away: every row of that key waits behind it.
    let backlog: Vec<NewEvent> = (0..20_000)
        .map(|i| NewEvent::new(&topic, format!("w{}", i % 500), i))
        .collect();
    insert(&pool, &backlog).await;
    sqlx::query(
        "UPDATE outbox_event SET attempts = 1, next_attempt_at = now() + interval '1 hour'
         WHERE id = (SELECT min(id) FROM outbox_event
                     WHERE published_at IS NULL AND partition_key = 'w0')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let believed: f32 = sqlx::query_scalar(
        "SELECT reltuples FROM pg_class WHERE relname = 'ix_outbox_event_unpublished'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        believed < 1.0,
        "the statistics do not know the backlog: {believed}"
    );

    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("SET statement_timeout = '20s'")
        .execute(&mut *conn)
        .await
        .unwrap();
    let explained = txoutbox_runtime::relay::explain_claim(&mut conn, 64, 1000)
        .await
        .expect("the claim ends well within the statement timeout");
    let plan = &explained[0]["Plan"];
    assert!(
        nodes_of(plan, "Sort").is_empty(),
        "no sort of the backlog: {plan:#}"
    );
    let claimed = plan["Actual Rows"].as_f64().unwrap() as i64;
    assert_eq!(claimed, 1000, "{plan:#}");
    // The walk read the rows up to the 1,000th claimable one and the three
    // rows of `w0` before it (sequence numbers 0, 500 and 1,000), no more.
    let scan = scan_of(plan);
    assert_eq!(
        scan,
        ClaimScan {
            node: "Index Scan".into(),
            index: Some("ix_outbox_event_unpublished".into()),
            removed_by_filter: 3,
            rows: 1000,
        },
        "one ordered walk of the index, stopped at the limit"
    );
    let millis = explained[0]["Execution Time"].as_f64().unwrap();
    assert!(millis < 2000.0, "the claim took {millis} ms");
}

/// `n` unpublished rows of `topic` over 500 keys, in one statement.
async fn fill(pool: &PgPool, topic: &str, n: i64) {
    sqlx::query(
        "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type,
                                   payload, topic, partition_key)
         SELECT gen_random_uuid(), 'Order', 'o-' || g, 'OrderCreated',
                jsonb_build_object('order_id', g, 'note', repeat('x', 180)),
                $1, 'k' || (g % 500)
         FROM generate_series(1, $2) AS g",
    )
    .bind(topic)
    .bind(n)
    .execute(pool)
    .await
    .unwrap();
}

/// A backlog the statistics know: 20,000 unpublished rows behind 100,000
/// published ones, analyzed (autovacuum's analyze during an outage does
/// this). The claim's filters make the planner believe about 800 rows
/// qualify, and on any other connection it reads the whole backlog through a
/// bitmap and sorts it on disk for every claim of 1,000. The relay's
/// connection discourages sorts, so the claim stays one ordered walk
/// stopped at its limit.
#[sqlx::test(migrations = false)]
async fn a_backlog_the_statistics_know_is_claimed_in_one_ordered_walk(pool: PgPool) {
    migrated(&pool).await;
    sqlx::query("ALTER TABLE outbox_event SET (autovacuum_enabled = false)")
        .execute(&pool)
        .await
        .unwrap();
    // History written and then marked, as the relay marks: the marks leave
    // the old versions for vacuum, and the backlog reuses their space.
    fill(&pool, "history", 100_000).await;
    sqlx::query("UPDATE outbox_event SET published_at = now()")
        .execute(&pool)
        .await
        .unwrap();
    analyze(&pool).await;
    fill(&pool, "backlog", 20_000).await;
    analyze(&pool).await;

    let mut conn = pool.acquire().await.unwrap();
    let explained = txoutbox_runtime::relay::explain_claim(&mut conn, 64, 1000)
        .await
        .unwrap();
    let plan = &explained[0]["Plan"];
    assert!(
        nodes_of(plan, "Sort").is_empty(),
        "no sort of the backlog: {plan:#}"
    );
    assert_eq!(plan["Actual Rows"].as_f64(), Some(1000.0), "{plan:#}");
    assert_eq!(
        scan_of(plan),
        ClaimScan {
            node: "Index Scan".into(),
            index: Some("ix_outbox_event_unpublished".into()),
            removed_by_filter: 0,
            rows: 1000,
        },
        "one ordered walk of the index, stopped at the limit"
    );
}

/// The relay's connection keeps its statements prepared, and PostgreSQL
/// settles on a generic plan for a statement after its first five runs,
/// kept until the table's statistics change. A relay started on an empty
/// `outbox_event` ran its marks (`WHERE id = ANY($1)`) as sequential scans
/// planned on a table never analyzed (counted as ten pages), and kept
/// scanning the whole table on every mark as it grew (in the hops bench,
/// 14 million rows read by 4,000 marks in 10 s). The relay's planner
/// settings rule sequential scans out on its connection: a mark reads the
/// rows it marks by primary key however young the table was when the plan
/// was made.
#[sqlx::test(migrations = false)]
async fn a_mark_planned_on_a_young_table_reads_by_index_once_the_table_grew(pool: PgPool) {
    migrated(&pool).await;
    // No autovacuum on this table (as before its first autoanalyze), so no
    // new statistics replace the cached plans during the test.
    sqlx::query("ALTER TABLE outbox_event SET (autovacuum_enabled = false)")
        .execute(&pool)
        .await
        .unwrap();
    let topic = unique_topic("mark-plan");
    let mut conn = sqlx::PgConnection::connect_with(&pool.connect_options())
        .await
        .unwrap();
    txoutbox_runtime::relay::configure_connection(&mut conn)
        .await
        .unwrap();
    let lanes: Vec<i32> = (0..64).collect();
    // A young table: batches of ten rows claimed and marked, more than five
    // times, so the claim and the mark have their generic plans (a table
    // never analyzed counts as ten pages at least: a mark of ten ids is
    // cheaper as a scan of those pages than as ten index probes).
    for batch in 0..8 {
        let young: Vec<NewEvent> = (0..10)
            .map(|i| NewEvent::new(&topic, format!("young{batch}-{i}"), i))
            .collect();
        insert(&pool, &young).await;
        let marked =
            txoutbox_runtime::relay::claim_and_mark_without_publishing(&mut conn, 64, &lanes, 10)
                .await
                .unwrap();
        assert_eq!(marked, 10);
    }
    // The table grows: 30,000 published rows, then ten to publish.
    sqlx::query(
        "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type,
                                   payload, topic, partition_key, published_at)
         SELECT gen_random_uuid(), 'order', g::text, 'OrderPlaced', '{}', $1, g::text, now()
         FROM generate_series(1, 30000) g",
    )
    .bind(&topic)
    .execute(&pool)
    .await
    .unwrap();
    let pending: Vec<NewEvent> = (0..10)
        .map(|i| NewEvent::new(&topic, format!("k{i}"), i))
        .collect();
    insert(&pool, &pending).await;

    // The next claim and mark, in a transaction of their own whose
    // statistics say how they read the table.
    sqlx::raw_sql("BEGIN").execute(&mut conn).await.unwrap();
    let marked =
        txoutbox_runtime::relay::claim_and_mark_without_publishing(&mut conn, 64, &lanes, 10)
            .await
            .unwrap();
    let (seq_scans, seq_rows_read, index_scans): (i64, i64, i64) = sqlx::query_as(
        "SELECT seq_scan, seq_tup_read, coalesce(idx_scan, 0)
         FROM pg_stat_xact_user_tables WHERE relname = 'outbox_event'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    sqlx::raw_sql("ROLLBACK").execute(&mut conn).await.unwrap();
    assert_eq!(marked, 10);
    assert_eq!(
        (seq_scans, seq_rows_read),
        (0, 0),
        "the claim and the mark read outbox_event by index ({index_scans} index scans), \
         not by scanning its 30,090 rows"
    );
    assert!(index_scans >= 2, "{index_scans} index scans");
}
