//! What a claim and a settlement are, settling's rules (shared by every
//! backend through [`SettleStatements`]), and every PostgreSQL statement of
//! the relay's claim, publish and settle (parked rows are
//! `ops::dead_letters`; the scheduler's statements are in `scheduler.rs`;
//! MySQL's are in `mysql/`).

use std::future::Future;

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

/// One claimed row, as it goes to Kafka.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct ClaimedRow {
    pub id: i64,
    pub event_id: Uuid,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub event_type: String,
    /// The payload as JSON text (`jsonb::text`).
    pub payload: String,
    pub topic: String,
    pub partition_key: String,
    pub traceparent: Option<String>,
    pub attempts: i32,
    /// The user's headers as JSON text (`headers::text`), NULL for none.
    pub headers: Option<String>,
    /// When the event was recorded (CloudEvents' `time`).
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// Claims up to `limit` publishable rows of the given lanes, in id order,
/// leaving out the rows of the batch still in flight and those of the
/// `held_topics` (refused by the broker as a whole, see `held_topics`).
///
/// The statement is its own transaction: exclusivity while the batch is in
/// flight comes from lane ownership (see `lanes`), not from row locks, so
/// the relay can claim its next batch while the previous one is delivered.
/// A row is skipped while a row of its key *on its topic* waits for a retry
/// (`next_attempt_at` in the future), so one key's failure holds back that
/// key of that topic only (the key's rows of other topics are other
/// sequences, see `keys`); parked rows hold back nothing. (Only the rows
/// after the waiting one can be in that position in the relay's own
/// running; an older row of the key that an operator retried from the
/// parked ones waits for the retry to fall due too, and then goes first, in
/// id order.) `SKIP LOCKED` keeps a relay from waiting on rows another
/// transaction holds (a relay that lost a lane, an operator's retry).
///
/// **The plan must not depend on the statistics.** The statement is one
/// ordered walk of `ix_outbox_event_unpublished` that stops at `limit`: every
/// other condition is a filter on that walk, never a join (a join loses the
/// index's order, and the planner then reads and sorts the whole backlog),
/// and the keys waiting for a retry are read once per claim into a hashed
/// set. The statistics of the unpublished rows are stale whenever a backlog
/// builds faster than autovacuum analyzes the table (a broker outage, a
/// burst over a table of months of published rows): the index's
/// `reltuples` still says 0, and with the earlier form of this statement
/// (the lanes as `IN (SELECT unnest(..))`, the waiting keys as a correlated
/// `NOT EXISTS`) the planner sorted the whole backlog and, for every row of
/// it, scanned the whole index again for an earlier waiting row of its key:
/// a claim over 200,000 unpublished rows ran for more than 14 minutes. Now
/// it takes about 3 ms there (`relay_claim_index.rs` checks the plan). With
/// statistics that do know the backlog, the planner could still prefer
/// reading and sorting all of it; the relay's connection discourages sorts
/// ([`PLANNER_SETTINGS`]).
///
/// The lanes are `= ANY(..)`, searched linearly per row: a relay owns at
/// most `lanes` of them (64 by default). The rows in flight and the held
/// topics are `NOT IN (SELECT unnest(..))`, a hashed subplan filter: an
/// array parameter would be searched linearly for every row (with 1,000
/// rows in flight, 11 ms instead of 1.9 ms per claim of 1,000). The waiting
/// keys' subquery is ordered by `(partition_key, id)`, the order of
/// `ix_outbox_event_retrying`, which holds only those rows: with stale
/// statistics every partial index looks empty and the planner would as
/// soon read them from the whole unpublished index.
///
/// The lane of a key is `(hashtext(partition_key) & 2147483647) % lanes`:
/// `hashtext` is cheap and the same on every server of one PostgreSQL major
/// version; the mask keeps the modulo non-negative.
pub(crate) async fn claim(
    conn: &mut PgConnection,
    lane_count: u32,
    lanes: &[i32],
    in_flight: &[i64],
    held_topics: &[String],
    limit: usize,
) -> sqlx::Result<Vec<ClaimedRow>> {
    sqlx::query_as(CLAIM)
        .bind(lane_count as i32)
        .bind(lanes)
        .bind(limit as i64)
        .bind(in_flight)
        .bind(held_topics)
        .fetch_all(conn)
        .await
}

/// The claim statement (see [`claim`]).
const CLAIM: &str = "SELECT o.id, o.event_id, o.aggregate_type, o.aggregate_id, o.event_type,
        o.payload::text AS payload, o.topic, o.partition_key, o.traceparent, o.attempts,
        o.headers::text AS headers, o.created_at
 FROM outbox_event o
 WHERE o.published_at IS NULL AND o.parked_at IS NULL
   AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= now())
   AND (hashtext(o.partition_key) & 2147483647) % $1 = ANY ($2::int[])
   AND o.id NOT IN (SELECT unnest($4::bigint[]))
   AND o.topic NOT IN (SELECT unnest($5::text[]))
   AND (o.topic, o.partition_key) NOT IN (
       SELECT b.topic, b.partition_key FROM outbox_event b
       WHERE b.published_at IS NULL AND b.parked_at IS NULL
         AND b.next_attempt_at IS NOT NULL AND b.next_attempt_at > now()
       ORDER BY b.partition_key, b.id)
 ORDER BY o.id
 LIMIT $3
 FOR UPDATE OF o SKIP LOCKED";

/// Tests only (feature `test-hooks`): runs the relay's claim statement under
/// `EXPLAIN (ANALYZE, FORMAT JSON)` over every lane (nothing in flight),
/// planned as on the relay's connection (`PLANNER_SETTINGS`), and returns the
/// plan, so a test can check which index it walks and how many rows it
/// stepped over. The claim's row locks end with its transaction, rolled
/// back.
#[cfg(feature = "test-hooks")]
pub async fn explain_claim(
    conn: &mut PgConnection,
    lane_count: u32,
    limit: usize,
) -> sqlx::Result<serde_json::Value> {
    let lanes: Vec<i32> = (0..lane_count as i32).collect();
    // The relay's planner settings, for this statement only.
    let mut tx = sqlx::Connection::begin(conn).await?;
    for setting in PLANNER_SETTINGS {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("SET LOCAL {setting}")))
            .execute(&mut *tx)
            .await?;
    }
    let explain = format!("EXPLAIN (ANALYZE, FORMAT JSON) {CLAIM}");
    let plan = sqlx::query_scalar(sqlx::AssertSqlSafe(explain))
        .bind(lane_count as i32)
        .bind(&lanes)
        .bind(limit as i64)
        .bind(&[] as &[i64])
        .bind(&[] as &[String])
        .fetch_one(&mut *tx)
        .await?;
    tx.rollback().await?;
    Ok(plan)
}

/// The planner settings of the relay's connection: sorting is the last
/// resort, and there is no JIT. The claim must be one walk of `ix_outbox_event_unpublished` in id
/// order that stops at its limit; its filters (the lanes, the keys waiting
/// for a retry, rows in flight, held topics) make the planner believe few
/// backlog rows qualify, and with statistics that know a large backlog
/// (any `ANALYZE` during an outage, or autovacuum's) and a table holding
/// other rows too (dead letters, history), it judged reading the whole
/// backlog and sorting it cheaper: 50,000 rows sorted on disk for every
/// claim of 1,000 (49 ms instead of 1.3 ms, and growing with the backlog).
/// Every other statement of this connection either reads an index in the
/// order it needs or sorts a handful of rows, so discouraging sorts changes
/// no other plan. But a discouraged sort that cannot be avoided still runs,
/// priced at 10^10, far over `jit_above_cost`: the membership reads (their
/// `ORDER BY` of a few rows) were compiled by the JIT at each execution,
/// about 13 ms each, 8 % off a 50,000-event drain. The relay's statements
/// are all short, so JIT is off on this connection too.
///
/// Sequential scans are the last resort as well. The connection keeps its
/// statements prepared, and PostgreSQL settles on a generic plan after a
/// statement's first five runs, kept until the table's statistics change.
/// A relay that started on a young table (never analyzed, so planned as
/// ten pages) planned its mark, `WHERE id = ANY($1)` for an array of
/// unknown length, as a scan of those pages, and kept scanning the whole
/// table on every mark as it grew until autovacuum analyzed it (in the hops
/// bench at 1,000 events/s: 4,000 marks read 14 million rows in 10 s, and
/// the database's CPU went to the marks). Every statement of this
/// connection reads its rows by an index or touches a table of a few rows
/// (the membership), where a scan forbidden but without an alternative
/// still runs.
pub(crate) const PLANNER_SETTINGS: [&str; 3] =
    ["enable_sort = off", "enable_seqscan = off", "jit = off"];

/// Session settings of the relay's own connection (the one its lane locks,
/// claims and marks use).
///
/// The relay's statements need not wait for the WAL flush at commit: a claim
/// only takes row locks, and a mark lost in a crash right after commit makes
/// its rows publish again, which receivers dedup anyway (delivery is
/// at-least-once). That wait is most of a small statement's cost. Only this
/// connection is set; the service's transactions keep their own setting.
///
/// Its planner avoids sorting and JIT ([`PLANNER_SETTINGS`]). Its statements
/// (claims, marks, lane locks) also run at `READ COMMITTED` whatever the
/// database's default (see `crate::txn`): a claim under
/// `REPEATABLE READ` would fail on rows committed after its snapshot.
pub(crate) async fn configure_connection(conn: &mut PgConnection) -> sqlx::Result<()> {
    let planner: String = PLANNER_SETTINGS
        .iter()
        .map(|setting| format!("SET {setting}; "))
        .collect();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "SET synchronous_commit = off; {planner}{}",
        crate::txn::SESSION_DEFAULT
    )))
    .execute(conn)
    .await
    .map(|_| ())
}

/// The relay's database work for one batch without the publishing: the same
/// claim and the same settling statement, every claimed row marked. Used by
/// the benchmark (on a connection set up by `configure_connection`) to
/// measure the database's share of the relay's cost.
#[cfg(feature = "test-hooks")]
pub async fn claim_and_mark_without_publishing(
    conn: &mut PgConnection,
    lane_count: u32,
    lanes: &[i32],
    limit: usize,
) -> sqlx::Result<usize> {
    let rows = claim(conn, lane_count, lanes, &[], &[], limit).await?;
    let ids: Vec<i64> = rows.iter().map(|row| row.id).collect();
    conn.mark_published(&ids).await?;
    Ok(ids.len())
}

/// What settling a batch recorded.
#[derive(Debug, Default)]
pub(crate) struct Settlement {
    /// Rows parked (reached `max_attempts`, or their failure could not be recorded).
    pub parked: u64,
    /// Rows whose failure could not be recorded, with the database's error:
    /// the refused ones among them were parked, the others left as they were.
    pub unrecordable: Vec<(i64, String)>,
}

/// The statements settling a batch takes, one implementation per backend
/// (on the relay's own connection); [`settle`] applies the rules.
pub(crate) trait SettleStatements: Send {
    /// Marks delivered rows as published (one statement, its own
    /// transaction); returns how many.
    fn mark_published(&mut self, ids: &[i64]) -> impl Future<Output = sqlx::Result<u64>> + Send;

    /// Records retries as one write: `next_attempt_at` (so later rows of the
    /// key wait), the error and, for counted attempts, `attempts + 1`,
    /// parking the rows that reached `max_attempts`. Returns how many were
    /// parked.
    fn record_retries(
        &mut self,
        retries: &[Retry],
        max_attempts: u32,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;

    /// Parks a refused row whose retry could not be recorded, with both
    /// errors (a statement that does not touch `next_attempt_at`, so it
    /// cannot fail the same way); returns 1 if it did.
    fn park_unrecordable(
        &mut self,
        retry: &Retry,
        db_error: &str,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;
}

/// Records a batch's outcome: marks the delivered rows (one statement, its
/// own transaction), then records the retries (one statement). Returns what
/// was parked.
///
/// Marking comes first and alone so that nothing about another row can keep
/// delivered rows unmarked: they would be published again and again. If the
/// retries cannot be recorded as a whole (e.g. a key PostgreSQL cannot put
/// into `ix_outbox_event_retrying`, written before the key length limit
/// existed), they are recorded row by row, and a refused row whose own
/// bookkeeping fails is parked with the reason; a row that was only held
/// back is left as it was (claimed again later). Only an error of the
/// connection itself fails the call.
///
/// Runs on the relay's own connection, which does not wait for the WAL flush
/// at commit (see [`configure_connection`]): a mark lost in a crash right
/// after commit only makes its rows publish again, and a crash between the
/// two statements leaves the retries unrecorded (those rows are retried
/// without the attempt counted).
pub(crate) async fn settle<C: SettleStatements>(
    conn: &mut C,
    delivered: &[i64],
    retries: &[Retry],
    max_attempts: u32,
) -> sqlx::Result<Settlement> {
    if !delivered.is_empty() {
        conn.mark_published(delivered).await?;
    }
    let mut settlement = Settlement::default();
    if retries.is_empty() {
        return Ok(settlement);
    }
    match conn.record_retries(retries, max_attempts).await {
        Ok(parked) => settlement.parked = parked,
        Err(sqlx::Error::Database(_)) if retries.len() > 1 => {
            for retry in retries {
                settlement.parked += record_one(conn, retry, max_attempts, &mut settlement).await?;
            }
        }
        Err(sqlx::Error::Database(error)) => {
            settlement.parked +=
                park_unrecordable(conn, &retries[0], &error.to_string(), &mut settlement).await?;
        }
        Err(error) => return Err(error),
    }
    Ok(settlement)
}

/// Records one row's retry; if the database refuses that, parks it (a
/// refusal) or leaves it (held back).
async fn record_one<C: SettleStatements>(
    conn: &mut C,
    retry: &Retry,
    max_attempts: u32,
    settlement: &mut Settlement,
) -> sqlx::Result<u64> {
    match conn
        .record_retries(std::slice::from_ref(retry), max_attempts)
        .await
    {
        Ok(parked) => Ok(parked),
        Err(sqlx::Error::Database(error)) => {
            park_unrecordable(conn, retry, &error.to_string(), settlement).await
        }
        Err(error) => Err(error),
    }
}

/// Parks a refused row whose retry could not be recorded (the statement does
/// not touch `next_attempt_at`, so it cannot fail the same way); a row only
/// held back is not parked for it (that is no fault of the record).
async fn park_unrecordable<C: SettleStatements>(
    conn: &mut C,
    retry: &Retry,
    db_error: &str,
    settlement: &mut Settlement,
) -> sqlx::Result<u64> {
    settlement
        .unrecordable
        .push((retry.id, db_error.to_owned()));
    if !retry.counts {
        return Ok(0);
    }
    conn.park_unrecordable(retry, db_error).await
}

/// A row that was not delivered this time and is tried again later.
#[derive(Debug, Clone)]
pub(crate) struct Retry {
    pub id: i64,
    pub error: String,
    pub retry_in_ms: i64,
    /// A failed attempt (the broker refused the record), counted towards
    /// `max_attempts`; `false` for a row only held back, which is never
    /// parked for it.
    pub counts: bool,
}

impl SettleStatements for PgConnection {
    async fn mark_published(&mut self, ids: &[i64]) -> sqlx::Result<u64> {
        // statement_timestamp(), not now(): now() is the start of the batch's
        // transaction, i.e. the claim; this statement runs once the broker has
        // acknowledged every row, which is when they were published.
        let done = sqlx::query(
            "UPDATE outbox_event SET published_at = statement_timestamp() WHERE id = ANY($1)",
        )
        .bind(ids)
        .execute(self)
        .await?;
        Ok(done.rows_affected())
    }

    async fn record_retries(&mut self, retries: &[Retry], max_attempts: u32) -> sqlx::Result<u64> {
        let ids: Vec<i64> = retries.iter().map(|r| r.id).collect();
        let errors: Vec<&str> = retries.iter().map(|r| r.error.as_str()).collect();
        let delays: Vec<i64> = retries.iter().map(|r| r.retry_in_ms).collect();
        let counts: Vec<bool> = retries.iter().map(|r| r.counts).collect();
        let parked: i64 = sqlx::query_scalar(
            "WITH updated AS (
                 UPDATE outbox_event o
                 SET attempts = o.attempts + f.counts::int,
                     last_error = f.error,
                     next_attempt_at = now() + f.delay_ms * interval '1 millisecond',
                     parked_at = CASE WHEN f.counts AND o.attempts + 1 >= $4 THEN now() END
                 FROM unnest($1::bigint[], $2::text[], $3::bigint[], $5::bool[])
                      AS f(id, error, delay_ms, counts)
                 WHERE o.id = f.id AND o.published_at IS NULL
                 RETURNING o.parked_at)
             SELECT count(*) FROM updated WHERE parked_at IS NOT NULL",
        )
        .bind(&ids)
        .bind(&errors)
        .bind(&delays)
        .bind(max_attempts as i32)
        .bind(&counts)
        .fetch_one(self)
        .await?;
        Ok(parked as u64)
    }

    async fn park_unrecordable(&mut self, retry: &Retry, db_error: &str) -> sqlx::Result<u64> {
        let done = sqlx::query(
            "UPDATE outbox_event
             SET attempts = attempts + 1, parked_at = now(),
                 last_error = 'the relay could not record a retry of this row (' || $2
                              || '), so it parked it; the broker had refused it: ' || $3
             WHERE id = $1 AND published_at IS NULL AND parked_at IS NULL",
        )
        .bind(retry.id)
        .bind(db_error)
        .bind(&retry.error)
        .execute(self)
        .await?;
        Ok(done.rows_affected())
    }
}

/// Lets rows held back for an unavailable partition be claimed at once (the
/// partition is back), unless something else changed them meanwhile.
pub(crate) async fn release_held(conn: &mut PgConnection, ids: &[i64]) -> sqlx::Result<u64> {
    let done = sqlx::query(
        "UPDATE outbox_event SET next_attempt_at = NULL
         WHERE id = ANY($1) AND published_at IS NULL AND parked_at IS NULL
           AND next_attempt_at > now()",
    )
    .bind(ids)
    .execute(conn)
    .await?;
    Ok(done.rows_affected())
}

/// Unpublished, unparked rows and the age of the oldest, in seconds.
pub(crate) async fn backlog(pool: &PgPool) -> sqlx::Result<(i64, f64)> {
    sqlx::query_as(
        "SELECT count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(created_at))::float8, 0)
         FROM outbox_event WHERE published_at IS NULL AND parked_at IS NULL",
    )
    .fetch_one(pool)
    .await
}
