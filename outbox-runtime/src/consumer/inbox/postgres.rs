//! The inbox's PostgreSQL statements: the store's partition locks, the
//! pending-key lookup and the insert, a processor's claim and what it
//! records, and the group's bookkeeping. The `inbox_key` entries follow
//! from the triggers of migration 0005, whoever writes `inbox_event`.

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::rows::{
    InboxRow, LockedStore, PartitionLock, Settled, candidate_window, headers_object,
};
use crate::consumer::message::Envelope;

/// Advisory lock class of the inbox's store locks ("obxi").
const STORE_LOCK: i32 = 0x6f62_7869;

/// Advisory lock class serializing the adoption of legacy rows ("obxa").
const ADOPT_LOCK: i32 = 0x6f62_7861;

/// The store locks as the text PostgreSQL hashes into the lock's key
/// (`hashtext`, so every process computes the same key). A topic name has
/// no `:` and a partition is a number, so the text names one partition.
fn lock_texts(group: &str, partitions: &[PartitionLock]) -> Vec<String> {
    partitions
        .iter()
        .map(|(topic, partition)| format!("{topic}:{partition}:{group}"))
        .collect()
}

/// Takes every lock of `partitions` that is free, until the transaction
/// ends; true if it got them all (the usual case: one statement, no wait).
pub(super) async fn try_lock_partitions(
    conn: &mut PgConnection,
    group: &str,
    partitions: &[PartitionLock],
) -> sqlx::Result<bool> {
    let all: Option<bool> = sqlx::query_scalar(
        "SELECT bool_and(pg_try_advisory_xact_lock($1, hashtext(p)))
         FROM unnest($2::text[]) AS p",
    )
    .bind(STORE_LOCK)
    .bind(lock_texts(group, partitions))
    .fetch_one(conn)
    .await?;
    Ok(all.unwrap_or(true))
}

/// A row of migration 0016's function: locked, a pending key's topic and
/// key, an inserted row's id.
type StoreRow = (bool, Option<String>, Option<String>, Option<Uuid>);

/// Takes every lock of `partitions` that is free, as [`try_lock_partitions`]
/// does; if it got them all, reads which of the (topic, key) pairs have
/// pending rows, as [`pending_keys`] does, and if none has, inserts `rows`
/// already processed, as [`insert`] does: one round trip (migration 0016's
/// function, whose read and insert each take a snapshot of their own, after
/// the locks).
pub(super) async fn lock_read_and_insert(
    conn: &mut PgConnection,
    group: &str,
    partitions: &[PartitionLock],
    (topics, keys): (&[&str], &[&str]),
    rows: &[&Envelope],
) -> sqlx::Result<LockedStore> {
    let columns = InsertColumns::of(rows);
    let query = sqlx::query_as(
        "SELECT locked, pending_topic, pending_key, inserted_id
         FROM outbox_inbox_store_on_receipt($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
    )
    .bind(STORE_LOCK)
    .bind(lock_texts(group, partitions))
    .bind(group)
    .bind(topics)
    .bind(keys);
    let returned: Vec<StoreRow> = columns.bind(query).fetch_all(conn).await?;
    let (mut pending, mut inserted) = (Vec::new(), Vec::new());
    for (locked, topic, key, id) in returned {
        match (locked, topic.zip(key), id) {
            (false, ..) => return Ok(LockedStore::Blocked),
            (true, Some(pending_key), _) => pending.push(pending_key),
            (true, None, Some(id)) => inserted.push(id),
            (true, None, None) => {}
        }
    }
    // The function returns pending keys or inserted rows, never both.
    Ok(match pending.is_empty() {
        true => LockedStore::Inserted(inserted),
        false => LockedStore::Pending(pending),
    })
}

/// Whether migration 0016's function, [`lock_read_and_insert`]'s, exists.
pub(super) async fn lock_read_and_insert_available(pool: &PgPool) -> sqlx::Result<bool> {
    sqlx::query_scalar(
        "SELECT to_regprocedure(
             'outbox_inbox_store_on_receipt(integer, text[], text, text[], text[], uuid[],
                                            text[], text[], text[], text[], jsonb[])')
             IS NOT NULL",
    )
    .fetch_one(pool)
    .await
}

/// Takes the locks of `partitions` until the transaction ends, waiting for
/// whoever holds them, in the order of their keys, as every store does, so
/// two stores never wait for each other.
pub(super) async fn lock_partitions(
    conn: &mut PgConnection,
    group: &str,
    partitions: &[PartitionLock],
) -> sqlx::Result<()> {
    sqlx::query(
        "SELECT pg_advisory_xact_lock($1, h)
         FROM (SELECT DISTINCT hashtext(p) AS h FROM unnest($2::text[]) AS p ORDER BY 1) AS keys",
    )
    .bind(STORE_LOCK)
    .bind(lock_texts(group, partitions))
    .execute(conn)
    .await
    .map(drop)
}

/// Which of the (topic, key) pairs have pending rows in the group's inbox
/// (an `inbox_key` entry). Each pair is looked up on its own (an index probe
/// of `ux_inbox_key`), so the statement's cached plan never reads the
/// group's every key, whatever the table's size when it was planned
/// (migration 0017 does the same in the store's functions).
pub(super) async fn pending_keys(
    conn: &mut PgConnection,
    group: &str,
    topics: &[&str],
    keys: &[&str],
) -> sqlx::Result<Vec<(String, String)>> {
    sqlx::query_as(
        "SELECT w.topic, w.partition_key
         FROM (SELECT DISTINCT * FROM unnest($2::text[], $3::text[])) AS w(topic, partition_key)
         CROSS JOIN LATERAL (
             SELECT 1 FROM inbox_key k
             WHERE k.consumer_group = $1 AND k.topic = w.topic
               AND k.partition_key = w.partition_key
             LIMIT 1) AS found",
    )
    .bind(group)
    .bind(topics)
    .bind(keys)
    .fetch_all(conn)
    .await
}

/// Inserts `rows` into `group`'s inbox, already processed or pending;
/// returns the ids inserted (a row already in the inbox is left as it is).
/// The insert trigger gives new keys of pending rows their entry.
pub(super) async fn insert(
    conn: &mut PgConnection,
    group: &str,
    rows: &[&Envelope],
    processed: bool,
) -> sqlx::Result<Vec<Uuid>> {
    let columns = InsertColumns::of(rows);
    let query = sqlx::query_as(
        "INSERT INTO inbox_event
             (consumer_group, event_id, payload, payload_bytes, event_type, topic, partition_key,
              headers, processed, processed_at)
         SELECT $1, r.event_id, r.payload::jsonb, octet_length(r.payload), r.event_type, r.topic,
                r.partition_key, r.headers, $8, CASE WHEN $8 THEN now() END
         FROM UNNEST($2::uuid[], $3::text[], $4::text[], $5::text[], $6::text[], $7::jsonb[])
              AS r(event_id, payload, event_type, topic, partition_key, headers)
         ON CONFLICT (consumer_group, event_id) DO NOTHING
         RETURNING event_id",
    )
    .bind(group);
    let inserted: Vec<(Uuid,)> = columns.bind(query).bind(processed).fetch_all(conn).await?;
    Ok(inserted.into_iter().map(|(id,)| id).collect())
}

/// The columns of rows to insert into the inbox, as the arrays the insert
/// unnests.
struct InsertColumns<'a> {
    ids: Vec<Uuid>,
    payloads: Vec<&'a str>,
    types: Vec<&'a str>,
    topics: Vec<&'a str>,
    keys: Vec<Option<&'a str>>,
    headers: Vec<serde_json::Value>,
}

impl<'a> InsertColumns<'a> {
    fn of(rows: &[&'a Envelope]) -> Self {
        let mut columns = Self {
            ids: Vec::with_capacity(rows.len()),
            payloads: Vec::with_capacity(rows.len()),
            types: Vec::with_capacity(rows.len()),
            topics: Vec::with_capacity(rows.len()),
            keys: Vec::with_capacity(rows.len()),
            headers: Vec::with_capacity(rows.len()),
        };
        for row in rows {
            let meta = &row.meta;
            columns.ids.push(meta.event_id);
            columns.payloads.push(row.payload.as_str());
            columns.types.push(meta.event_type.as_str());
            columns.topics.push(meta.topic.as_str());
            columns.keys.push(meta.key.as_deref());
            columns.headers.push(headers_object(&meta.headers));
        }
        columns
    }

    /// Binds the columns, in this order, as the next six parameters of
    /// `query`.
    fn bind<'q, O>(
        self,
        query: sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>
    where
        'a: 'q,
    {
        query
            .bind(self.ids)
            .bind(self.payloads)
            .bind(self.types)
            .bind(self.topics)
            .bind(self.keys)
            .bind(self.headers)
    }
}

/// The payload is read as JSON text, which the handler's type is decoded
/// from: never as a `serde_json::Value`, about 16 times the size of an array
/// of small numbers.
const COLUMNS: &str =
    "seq, event_id, payload::text AS payload, event_type, topic, partition_key, headers, attempts";

/// Whether the group has a key that is due: one waiting for no retry, or
/// whose wait is over. Every key the claim can take is one of these, so when
/// there is none the claim ([`claim_rows`], whose planning alone costs
/// about 1 ms) is skipped: a processor polling an empty inbox costs one
/// cheap statement instead of a transaction with that claim.
///
/// Planned afresh each time, as the claim is: `inbox_key` is a queue whose
/// size swings, and a cached plan made while it was nearly empty could
/// read every key later.
pub(crate) async fn any_key_due(pool: &PgPool, group: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM inbox_key
                        WHERE consumer_group = $1 AND not_before IS NULL)
             OR EXISTS (SELECT 1 FROM inbox_key
                        WHERE consumer_group = $1 AND not_before <= now())",
    )
    .bind(group)
    .persistent(false)
    .fetch_one(pool)
    .await
}

/// The claim of [`super::claim`] in one statement, with its parameters
/// spelled out: at most `batch` rows and, past the first, `max_bytes` of
/// payload.
///
/// `k.topic || ''` in the backing-off branch keeps PostgreSQL from reaching
/// those keys through `ux_inbox_key` (every key of the topic) instead of the
/// partial index of waiting keys: without statistics (a queue table that
/// just filled, before `ANALYZE`) it chose that plan, which reads every key
/// on every claim (44 ms instead of 8 ms per claim at 80,000 pending keys;
/// a drain of 100,000 pending rows slowed to under 100 rows/s).
pub(crate) async fn claim_rows(
    conn: &mut PgConnection,
    group: &str,
    topics: &[&str],
    types: &[&str],
    batch: usize,
    max_bytes: usize,
) -> Result<Vec<InboxRow>, sqlx::Error> {
    let limit = batch as i64;
    let max_bytes = i64::try_from(max_bytes).unwrap_or(i64::MAX);
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "WITH handled AS (
             SELECT * FROM unnest($2::text[], $3::text[]) AS h(topic, event_type)),
         candidates AS (
             (SELECT k.head_seq FROM inbox_key k
              WHERE k.consumer_group = $1 AND k.not_before IS NULL
                AND (k.topic, k.head_event_type) IN (SELECT topic, event_type FROM handled)
              ORDER BY k.head_seq LIMIT $5)
             UNION ALL
             (SELECT k.head_seq FROM inbox_key k
              WHERE k.consumer_group = $1 AND k.not_before IS NOT NULL AND k.not_before <= now()
                AND (k.topic || '', k.head_event_type) IN (SELECT topic, event_type FROM handled)
              ORDER BY k.not_before LIMIT $5)),
         owned AS (
             SELECT i.seq, i.topic, i.partition_key,
                    coalesce(i.payload_bytes, pg_column_size(i.payload)) AS bytes
             FROM inbox_event i
             WHERE i.seq = ANY(ARRAY(SELECT head_seq FROM candidates))
               AND NOT i.processed AND i.parked_at IS NULL
               AND (i.next_attempt_at IS NULL OR i.next_attempt_at <= now())
             ORDER BY i.seq LIMIT $4
             FOR UPDATE OF i SKIP LOCKED),
         runs AS (
             SELECT seq, 0::int8 AS rank, bytes FROM owned
             UNION ALL
             SELECT r.seq, r.rank, r.bytes FROM owned h CROSS JOIN LATERAL (
                 SELECT i.seq, row_number() OVER (ORDER BY i.seq) AS rank,
                        coalesce(i.payload_bytes, pg_column_size(i.payload)) AS bytes
                 FROM inbox_event i
                 WHERE i.consumer_group = $1 AND i.topic = h.topic
                   AND i.partition_key = h.partition_key
                   AND NOT i.processed AND i.parked_at IS NULL AND i.seq > h.seq
                 ORDER BY i.seq LIMIT (SELECT ($4 - count(*)) / count(*) FROM owned)) r
             WHERE h.partition_key IS NOT NULL),
         ranked AS (SELECT seq, rank, bytes FROM runs ORDER BY rank, seq LIMIT $4),
         -- The byte budget cuts the same order (so each key keeps a prefix
         -- of its run): a row is taken if the rows before it hold less than
         -- the budget, so the first always is.
         sized AS (
             SELECT seq, bytes, sum(bytes) OVER (ORDER BY rank, seq) AS upto FROM ranked),
         picked AS (SELECT seq FROM sized WHERE upto - bytes < $6)
         SELECT {COLUMNS} FROM inbox_event i
         WHERE i.seq = ANY(ARRAY(SELECT seq FROM picked))
           AND NOT i.processed AND i.parked_at IS NULL
         ORDER BY i.seq
         FOR UPDATE OF i"
    )))
    .bind(group)
    .bind(topics)
    .bind(types)
    .bind(limit)
    .bind(candidate_window(batch))
    .bind(max_bytes)
    // Planned afresh each time, never as a cached generic plan: a plan made
    // while the inbox was nearly empty (the first claims of a burst) chose
    // an index scan that reads the whole key index once the inbox had filled
    // (2.5 s per claim at 20,000 pending rows, 2.2 million buffer hits).
    // Planning costs about 2 ms per claim of up to a batch of rows.
    .persistent(false)
    .fetch_all(conn)
    .await
}

/// Writes what a processor's pass settled: failed attempts, parked rows,
/// processed rows. The update trigger moves each touched key's head (and
/// its wait) along.
pub(super) async fn record(
    conn: &mut PgConnection,
    group: &str,
    settled: &Settled<'_>,
) -> sqlx::Result<()> {
    if !settled.failed.is_empty() {
        let (mut ids, mut errors, mut delays) = (Vec::new(), Vec::new(), Vec::new());
        for failed in &settled.failed {
            ids.push(failed.event_id);
            errors.push(failed.error);
            delays.push(failed.delay_ms);
        }
        sqlx::query(
            "UPDATE inbox_event i
             SET attempts = i.attempts + 1, last_error = f.error,
                 next_attempt_at = now() + f.delay_ms * interval '1 millisecond',
                 parked_at = CASE WHEN f.delay_ms IS NULL THEN now() END
             FROM unnest($2::uuid[], $3::text[], $4::bigint[]) AS f(event_id, error, delay_ms)
             WHERE i.consumer_group = $1 AND i.event_id = f.event_id",
        )
        .bind(group)
        .bind(&ids)
        .bind(&errors)
        .bind(&delays)
        .execute(&mut *conn)
        .await?;
    }
    if !settled.processed.is_empty() {
        sqlx::query(
            "UPDATE inbox_event SET processed = true, processed_at = now()
             WHERE consumer_group = $1 AND event_id = ANY($2)",
        )
        .bind(group)
        .bind(settled.processed)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Renews this consumer's entry in `inbox_processor` and removes the entries
/// of processors gone for long (killed, not shut down).
pub(super) async fn heartbeat(
    pool: &PgPool,
    group: &str,
    instance_id: Uuid,
    host: Option<String>,
    handled: (Vec<&str>, Vec<&str>),
    heartbeat_ms: i32,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO inbox_processor
             (consumer_group, instance_id, host, topics, event_types, heartbeat_ms)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (consumer_group, instance_id) DO UPDATE
             SET seen_at = now(), topics = excluded.topics,
                 event_types = excluded.event_types, heartbeat_ms = excluded.heartbeat_ms",
    )
    .bind(group)
    .bind(instance_id)
    .bind(host)
    .bind(handled.0)
    .bind(handled.1)
    .bind(heartbeat_ms)
    .execute(pool)
    .await?;
    sqlx::query(
        "DELETE FROM inbox_processor
         WHERE consumer_group = $1 AND seen_at < now() - interval '1 hour'",
    )
    .bind(group)
    .execute(pool)
    .await?;
    Ok(())
}

/// Removes this consumer's entry (graceful shutdown).
pub(super) async fn leave(pool: &PgPool, group: &str, instance_id: Uuid) -> sqlx::Result<()> {
    sqlx::query("DELETE FROM inbox_processor WHERE consumer_group = $1 AND instance_id = $2")
        .bind(group)
        .bind(instance_id)
        .execute(pool)
        .await
        .map(drop)
}

/// Rows stored before migration 0005 have the group `''`: one database held
/// one inbox group then, so the first inbox consumer to start takes them
/// over (rows it already holds itself are left alone). Their keys follow
/// (the update trigger files them under the new group). Returns how many
/// rows it adopted.
pub(super) async fn adopt_legacy_rows(
    pool: &PgPool,
    begin: impl std::future::Future<Output = sqlx::Result<sqlx::Transaction<'static, sqlx::Postgres>>>,
    group: &str,
) -> sqlx::Result<u64> {
    let legacy: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM inbox_event WHERE consumer_group = '')")
            .fetch_one(pool)
            .await?;
    if !legacy || group.is_empty() {
        return Ok(0);
    }
    let mut tx = begin.await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1, 0)")
        .bind(ADOPT_LOCK)
        .execute(&mut *tx)
        .await?;
    let adopted = sqlx::query(
        "UPDATE inbox_event l SET consumer_group = $1
         WHERE l.consumer_group = ''
           AND NOT EXISTS (SELECT 1 FROM inbox_event g
                           WHERE g.consumer_group = $1 AND g.event_id = l.event_id)",
    )
    .bind(group)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    sqlx::query(
        "DELETE FROM inbox_key k WHERE k.consumer_group = ''
           AND NOT EXISTS (SELECT 1 FROM inbox_event i
                           WHERE i.consumer_group = '' AND i.topic = k.topic
                             AND i.partition_key IS NOT DISTINCT FROM k.partition_key
                             AND NOT i.processed AND i.parked_at IS NULL)",
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(adopted)
}

/// The group's pending and parked rows, for the gauges.
pub(super) async fn backlog(pool: &PgPool, group: &str) -> sqlx::Result<(i64, i64)> {
    sqlx::query_as(
        "SELECT count(*) FILTER (WHERE parked_at IS NULL), count(*) FILTER (WHERE parked_at IS NOT NULL)
         FROM inbox_event WHERE consumer_group = $1 AND NOT processed",
    )
    .bind(group)
    .fetch_one(pool)
    .await
}

#[cfg(test)]
mod tests {
    use sqlx::PgPool;

    use super::any_key_due;

    /// Adds an `inbox_key` entry: `wait` is `NULL` (due), or an interval
    /// from now that the key waits for its retry.
    async fn key(pool: &PgPool, group: &str, key: &str, head_seq: i64, wait: Option<&str>) {
        sqlx::query(
            "INSERT INTO inbox_key (consumer_group, topic, partition_key, head_seq,
                                    head_event_type, not_before)
             VALUES ($1, 'orders', $2, $3, 'OrderPlaced', now() + $4::interval)",
        )
        .bind(group)
        .bind(key)
        .bind(head_seq)
        .bind(wait)
        .execute(pool)
        .await
        .unwrap();
    }

    /// The probe a processor runs before its claim says "nothing due" only
    /// when the claim could take nothing: no key of the group, or every key
    /// waiting for a retry that is not due yet. Other groups' keys do not
    /// count.
    #[sqlx::test(migrations = false)]
    async fn a_key_is_due_unless_its_retry_waits_and_only_in_its_own_group(pool: PgPool) {
        crate::migrations::run(&pool).await.unwrap();
        assert!(!any_key_due(&pool, "g").await.unwrap(), "an empty inbox");

        key(&pool, "other", "a", 1, None).await;
        assert!(
            !any_key_due(&pool, "g").await.unwrap(),
            "another group's due key"
        );

        key(&pool, "g", "b", 2, Some("1 hour")).await;
        assert!(
            !any_key_due(&pool, "g").await.unwrap(),
            "a key whose retry waits another hour"
        );
        assert!(any_key_due(&pool, "other").await.unwrap());

        key(&pool, "g", "c", 3, Some("-1 second")).await;
        assert!(
            any_key_due(&pool, "g").await.unwrap(),
            "a key whose wait is over"
        );

        sqlx::query("DELETE FROM inbox_key WHERE partition_key = 'c'")
            .execute(&pool)
            .await
            .unwrap();
        key(&pool, "g", "d", 4, None).await;
        assert!(
            any_key_due(&pool, "g").await.unwrap(),
            "a key waiting for no retry"
        );
    }
}
