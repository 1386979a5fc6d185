//! `status` on MariaDB (feature `mysql`): the outbox's backlog, its failing,
//! parked and discarded rows, the inbox's alike (MySQL migration 0005), its
//! keys no running processor claims, the dead letters their topic refused
//! (`consumer_dead_letter`, MySQL migration 0004), the sizes of the tables,
//! the live relays with the lanes they hold, and the sagas per type
//! (`saga_state`, MySQL migration 0006). The consumer tables of a schema
//! migrated before them are named in [`Status::not_on_this_database`] and
//! their parts are left empty.
//!
//! Every statement is a plain read (no locks). A relay member is live while
//! its session holds the member lock `obx:<database>:m<connection id>`; it
//! owns the lanes whose lock `obx:<database>:l<lane>` its session holds
//! (`IS_USED_LOCK` names the holder's connection id). The inbox's counts
//! read each group's unprocessed rows only (see
//! [`inbox_groups`](crate::ops::database::inbox_groups)), however many
//! processed ones the table keeps.

use chrono::{DateTime, Utc};
use sqlx::{MySql, MySqlPool, QueryBuilder};

use super::{
    ConsumerDeadLetterRow, ConsumerDeadLetters, HeldTopic, ProblemRow, QueueStatus, RelayMember,
    Status, TableSize, TopicBacklog,
};
use crate::ops::database::{inbox_groups, push_groups, text};
use crate::ops::sagas;
use crate::ops::{OpsError, PARKED_NOT_DISCARDED};
use crate::relay::{LockNames, NO_SUCH_TABLE, error_number};

/// The framework's tables of the consumer side, in the order
/// [`Status::not_on_this_database`] names the missing ones: the inbox's
/// (MySQL migration 0005), the dedup table and the refused dead letters
/// (0004), and the sagas' (0006).
const CONSUMER_TABLES: [&str; 4] = [
    "inbox_event",
    "processed_event",
    "saga_state",
    "consumer_dead_letter",
];

/// Below this many rows (by the server's estimate) a table's rows are
/// counted exactly: such a count costs a few milliseconds, and InnoDB's
/// estimate of a small or young table can be far off.
const EXACT_BELOW: i64 = 100_000;

/// Whether a row of `outbox_relay_member` (alias `m`) belongs to a live
/// session: its member lock is held by the row's own connection.
const LIVE: &str = "IS_USED_LOCK(CONCAT(?, m.backend_pid)) = m.backend_pid";

pub(super) async fn collect(pool: &MySqlPool, sample: i64) -> Result<Status, OpsError> {
    let sample = sample.max(0);
    let present = consumer_tables(pool).await?;
    let has = |table: &str| present.iter().any(|t| t == table);
    let outbox = outbox(pool, sample).await?;
    let (inbox, inbox_unclaimed) = if has("inbox_event") {
        (
            inbox(pool, sample).await?,
            crate::consumer::inbox::mysql::inbox_unclaimed(pool, None).await?,
        )
    } else {
        (not_here(), Vec::new())
    };
    let consumer_dead_letters = if has("consumer_dead_letter") {
        consumer_dead_letters(pool, sample).await?
    } else {
        ConsumerDeadLetters::default()
    };
    let mut tables = Vec::new();
    for table in [
        "outbox_event",
        "outbox_scheduled",
        "inbox_event",
        "processed_event",
    ] {
        tables.extend(table_size(pool, table).await?);
    }
    // As on PostgreSQL: shown while it holds something to act on.
    if consumer_dead_letters.unpublished > 0 {
        tables.extend(table_size(pool, "consumer_dead_letter").await?);
    }
    let relays = relays(pool).await?;
    let sagas = if has("saga_state") {
        sagas::overview(pool).await?
    } else {
        Vec::new()
    };
    Ok(Status {
        outbox,
        inbox,
        inbox_unclaimed,
        tables,
        relays,
        sagas,
        consumer_dead_letters,
        not_on_this_database: CONSUMER_TABLES
            .into_iter()
            .filter(|table| !has(table))
            .collect(),
    })
}

/// Which of the consumer tables the schema has (none before MySQL
/// migration 0004).
async fn consumer_tables(pool: &MySqlPool) -> Result<Vec<String>, OpsError> {
    let mut query = QueryBuilder::<MySql>::new(
        "SELECT TABLE_NAME FROM information_schema.TABLES
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN (",
    );
    let mut list = query.separated(", ");
    for table in CONSUMER_TABLES {
        list.push_bind(table);
    }
    query.push(")");
    Ok(query.build_query_scalar().fetch_all(pool).await?)
}

/// The inbox's counts on a database without an inbox: nothing, as
/// [`Status::not_on_this_database`] says.
fn not_here() -> QueueStatus {
    QueueStatus {
        pending: 0,
        oldest_pending_at: None,
        oldest_pending_age_secs: None,
        topics: Vec::new(),
        failing: 0,
        failing_rows: Vec::new(),
        parked: 0,
        parked_rows: Vec::new(),
        discarded: 0,
    }
}

/// Age in seconds of `oldest` at `now` (both by the database clock).
fn age(now: DateTime<Utc>, oldest: DateTime<Utc>) -> f64 {
    (now - oldest)
        .num_microseconds()
        .map_or(f64::MAX, |us| us as f64 / 1e6)
}

/// The outbox's counts. Unpublished rows are the NULL head of
/// `ix_outbox_event_unpublished (published_at, parked_at, id)`, pending rows
/// first, then the parked ones (MySQL migration 0008), so every count reads
/// the rows it counts only, however many published ones the table keeps.
/// The index is forced: the optimizer preferred scanning the whole table
/// once the unpublished rows were a tenth of it.
async fn outbox(pool: &MySqlPool, sample: i64) -> Result<QueueStatus, OpsError> {
    let topics: Vec<TopicBacklog> = sqlx::query_as(
        "SELECT topic, COUNT(*) AS pending, MIN(created_at) AS oldest_pending_at
         FROM outbox_event FORCE INDEX (ix_outbox_event_unpublished)
         WHERE published_at IS NULL AND parked_at IS NULL
         GROUP BY topic ORDER BY topic",
    )
    .fetch_all(pool)
    .await?;
    // A discarded row is always parked.
    let (failing, parked, discarded, now): (i64, i64, i64, DateTime<Utc>) = sqlx::query_as(
        "SELECT (SELECT COUNT(*) FROM outbox_event FORCE INDEX (ix_outbox_event_unpublished)
                 WHERE published_at IS NULL AND parked_at IS NULL AND attempts > 0),
                (SELECT COUNT(*) FROM outbox_event FORCE INDEX (ix_outbox_event_unpublished)
                 WHERE published_at IS NULL AND parked_at IS NOT NULL AND discarded_at IS NULL),
                (SELECT COUNT(*) FROM outbox_event FORCE INDEX (ix_outbox_event_unpublished)
                 WHERE published_at IS NULL AND parked_at IS NOT NULL
                   AND discarded_at IS NOT NULL),
                UTC_TIMESTAMP(6)",
    )
    .fetch_one(pool)
    .await?;
    let oldest_pending_at = topics.iter().filter_map(|t| t.oldest_pending_at).min();
    // By the database clock, read with the counts.
    let oldest_pending_age_secs = oldest_pending_at.map(|oldest| age(now, oldest));
    let rows = |which: &str| {
        sqlx::AssertSqlSafe(format!(
            "SELECT id, event_id, topic, event_type, attempts, last_error,
                    created_at AS written_at, parked_at, next_attempt_at
             FROM outbox_event FORCE INDEX (ix_outbox_event_unpublished)
             WHERE published_at IS NULL AND {which}
             ORDER BY created_at, id LIMIT ?"
        ))
    };
    let failing_rows: Vec<ProblemRow> = sqlx::query_as(rows("parked_at IS NULL AND attempts > 0"))
        .bind(sample)
        .fetch_all(pool)
        .await?;
    let parked_rows: Vec<ProblemRow> = sqlx::query_as(rows(PARKED_NOT_DISCARDED))
        .bind(sample)
        .fetch_all(pool)
        .await?;
    Ok(QueueStatus {
        pending: topics.iter().map(|t| t.pending).sum(),
        oldest_pending_at,
        oldest_pending_age_secs,
        topics,
        failing,
        failing_rows,
        parked,
        parked_rows,
        discarded,
    })
}

/// `SELECT <columns> FROM inbox_event t WHERE <the groups' unprocessed
/// rows> AND <which>`, through `ix_inbox_event_group_processed` (forced:
/// InnoDB's estimates of a young table can make the optimizer prefer the
/// whole primary key).
fn unprocessed(columns: &str, groups: &[Vec<u8>], which: &str) -> QueryBuilder<MySql> {
    let mut query = QueryBuilder::new(format!(
        "SELECT {columns} FROM inbox_event t FORCE INDEX (ix_inbox_event_group_processed) WHERE "
    ));
    push_groups(&mut query, groups);
    query.push(format!(" AND t.processed = FALSE AND {which}"));
    query
}

/// The inbox's counts, as PostgreSQL's (`received_at` for the age), read
/// on every group's unprocessed rows (pending and parked).
async fn inbox(pool: &MySqlPool, sample: i64) -> Result<QueueStatus, OpsError> {
    let groups = inbox_groups(pool).await?;
    if groups.is_empty() {
        return Ok(not_here());
    }
    let topics: Vec<TopicBacklog> = unprocessed(
        "t.topic, COUNT(*) AS pending, MIN(t.received_at) AS oldest_pending_at",
        &groups,
        "t.parked_at IS NULL",
    )
    .push(" GROUP BY t.topic ORDER BY t.topic")
    .build_query_as()
    .fetch_all(pool)
    .await?;
    // One scan of the unprocessed rows; a discarded row is always parked.
    let (failing, parked, discarded, now): (i64, i64, i64, DateTime<Utc>) = unprocessed(
        &format!(
            "CAST(COALESCE(SUM(t.parked_at IS NULL AND t.attempts > 0), 0) AS SIGNED),
             CAST(COALESCE(SUM({PARKED_NOT_DISCARDED}), 0) AS SIGNED),
             CAST(COALESCE(SUM(t.parked_at IS NOT NULL AND t.discarded_at IS NOT NULL), 0)
                  AS SIGNED),
             UTC_TIMESTAMP(6)"
        ),
        &groups,
        "TRUE",
    )
    .build_query_as()
    .fetch_one(pool)
    .await?;
    let oldest_pending_at = topics.iter().filter_map(|t| t.oldest_pending_at).min();
    let oldest_pending_age_secs = oldest_pending_at.map(|oldest| age(now, oldest));
    let rows = |which: &str| {
        let mut query = unprocessed(
            "CAST(NULL AS SIGNED) AS id, t.event_id, t.topic, t.event_type, t.attempts,
             t.last_error, t.received_at AS written_at, t.parked_at, t.next_attempt_at",
            &groups,
            which,
        );
        query
            .push(" ORDER BY t.received_at, t.seq LIMIT ")
            .push_bind(sample);
        query
    };
    let failing_rows: Vec<ProblemRow> = rows("t.parked_at IS NULL AND t.attempts > 0")
        .build_query_as()
        .fetch_all(pool)
        .await?;
    let parked_rows: Vec<ProblemRow> = rows(PARKED_NOT_DISCARDED)
        .build_query_as()
        .fetch_all(pool)
        .await?;
    Ok(QueueStatus {
        pending: topics.iter().map(|t| t.pending).sum(),
        oldest_pending_at,
        oldest_pending_age_secs,
        topics,
        failing,
        failing_rows,
        parked,
        parked_rows,
        discarded,
    })
}

/// One row of `consumer_dead_letter` as MariaDB returns it (the group as
/// bytes).
type DeadLetterRow = (
    i64,
    Vec<u8>,
    String,
    i32,
    i64,
    String,
    String,
    String,
    String,
    DateTime<Utc>,
);

/// The consumers' unpublished dead letters, through
/// `ix_consumer_dead_letter_unpublished (republished_at, parked_at)`.
async fn consumer_dead_letters(
    pool: &MySqlPool,
    sample: i64,
) -> Result<ConsumerDeadLetters, OpsError> {
    let (unpublished, oldest_parked_at): (i64, Option<DateTime<Utc>>) = sqlx::query_as(
        "SELECT COUNT(*), MIN(parked_at) FROM consumer_dead_letter WHERE republished_at IS NULL",
    )
    .fetch_one(pool)
    .await?;
    let rows: Vec<DeadLetterRow> = sqlx::query_as(
        "SELECT id, consumer_group, topic, `partition`, `offset`, reason, error,
                dead_letter_topic, publish_error, parked_at
         FROM consumer_dead_letter WHERE republished_at IS NULL
         ORDER BY parked_at, id LIMIT ?",
    )
    .bind(sample)
    .fetch_all(pool)
    .await?;
    let rows = rows
        .into_iter()
        .map(
            |(
                id,
                consumer_group,
                topic,
                partition,
                offset,
                reason,
                error,
                dead_letter_topic,
                publish_error,
                parked_at,
            )| ConsumerDeadLetterRow {
                id,
                consumer_group: text(consumer_group),
                topic,
                partition,
                offset,
                reason,
                error,
                dead_letter_topic,
                publish_error,
                parked_at,
            },
        )
        .collect();
    Ok(ConsumerDeadLetters {
        unpublished,
        oldest_parked_at,
        rows,
    })
}

/// A table's rows and bytes (data and indexes, from
/// `information_schema.TABLES`); `None` for a table the schema lacks.
async fn table_size(pool: &MySqlPool, table: &'static str) -> Result<Option<TableSize>, OpsError> {
    let found: Option<(i64, i64)> = sqlx::query_as(
        "SELECT CAST(COALESCE(TABLE_ROWS, 0) AS SIGNED),
                CAST(COALESCE(DATA_LENGTH, 0) + COALESCE(INDEX_LENGTH, 0) AS SIGNED)
         FROM information_schema.TABLES
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
    )
    .bind(table)
    .fetch_optional(pool)
    .await?;
    let Some((estimate, total_bytes)) = found else {
        return Ok(None);
    };
    let (rows, estimated) = if estimate < EXACT_BELOW {
        let exact: i64 =
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}")))
                .fetch_one(pool)
                .await?;
        (exact, false)
    } else {
        (estimate, true)
    };
    Ok(Some(TableSize {
        table: table.to_owned(),
        rows,
        estimated,
        total_bytes,
    }))
}

/// One live member's row.
#[derive(sqlx::FromRow)]
struct MemberRow {
    host: String,
    process_id: i64,
    backend_pid: i64,
    lanes: i32,
    lease_ms: i64,
    renewed_us: i64,
    broker_failing_since: Option<DateTime<Utc>>,
    held_topics: String,
}

/// The live relays, oldest member first, with the lanes each holds; empty
/// when the membership table does not exist (a schema before MySQL
/// migration 0002).
async fn relays(pool: &MySqlPool) -> Result<Vec<RelayMember>, OpsError> {
    let names = LockNames::new(pool.connect_options().get_database().unwrap_or_default());
    let members: Vec<MemberRow> = match sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT m.host, CAST(m.process_id AS SIGNED) AS process_id,
                CAST(m.backend_pid AS SIGNED) AS backend_pid, m.lanes,
                CAST(m.lease_ms AS SIGNED) AS lease_ms,
                TIMESTAMPDIFF(MICROSECOND, m.heartbeat_at, UTC_TIMESTAMP(6)) AS renewed_us,
                m.broker_failing_since, m.held_topics
         FROM outbox_relay_member m
         WHERE {LIVE}
         ORDER BY m.joined_at, m.backend_pid"
    )))
    .bind(names.member_prefix())
    .fetch_all(pool)
    .await
    {
        Ok(members) => members,
        Err(error) if error_number(&error) == Some(NO_SUCH_TABLE) => return Ok(Vec::new()),
        Err(error) => return Err(error.into()),
    };
    let owners = lane_holders(pool, &names, &members).await?;
    members
        .into_iter()
        .map(|m| {
            let held_topics: Vec<HeldTopic> = serde_json::from_str(&m.held_topics)
                .map_err(|e| OpsError::Database(sqlx::Error::Decode(Box::new(e))))?;
            let lanes_owned = owners
                .iter()
                .filter(|(holder, _)| *holder == m.backend_pid)
                .map(|(_, lanes)| lanes)
                .sum();
            Ok(RelayMember {
                host: m.host,
                process_id: m.process_id,
                backend_pid: m.backend_pid,
                lanes: m.lanes,
                lanes_owned,
                renewed_secs_ago: m.renewed_us as f64 / 1e6,
                lease_secs: m.lease_ms as f64 / 1e3,
                lease_expired: m.renewed_us > m.lease_ms.saturating_mul(1_000),
                broker_failing_since: m.broker_failing_since,
                held_topics,
            })
        })
        .collect()
}

/// Who holds each lane of the members' lane count (one statement for all
/// members: every lane lock asked once): `(connection id, lanes held)`.
async fn lane_holders(
    pool: &MySqlPool,
    names: &LockNames,
    members: &[MemberRow],
) -> Result<Vec<(i64, i64)>, OpsError> {
    let lanes = members.iter().map(|m| m.lanes.max(0)).max().unwrap_or(0);
    if lanes == 0 {
        return Ok(Vec::new());
    }
    let all: Vec<i32> = (0..lanes).collect();
    let holders: Vec<(Option<i64>, i64)> = sqlx::query_as(
        "SELECT h.holder, COUNT(*)
         FROM (SELECT CAST(IS_USED_LOCK(CONCAT(?, l.n)) AS SIGNED) AS holder
               FROM JSON_TABLE(?, '$[*]' COLUMNS (n INT PATH '$')) l) h
         WHERE h.holder IS NOT NULL
         GROUP BY h.holder",
    )
    .bind(names.lane_prefix())
    .bind(serde_json::to_string(&all).expect("integers serialize"))
    .fetch_all(pool)
    .await?;
    Ok(holders
        .into_iter()
        .filter_map(|(holder, lanes)| Some((holder?, lanes)))
        .collect())
}
