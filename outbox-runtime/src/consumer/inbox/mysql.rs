//! The inbox's MySQL / MariaDB statements (MySQL migration 0005): the
//! store's partition locks, the pending-key lookup and the insert, a
//! processor's claim and what it records, the group's bookkeeping, and the
//! upkeep of `inbox_key`.
//!
//! MySQL has no statement triggers, so what PostgreSQL's triggers do to
//! `inbox_key` is done here, in the same transactions and in the same two
//! steps: a store's upsert of its keys' entries takes each entry's lock
//! (waiting for a processor that is moving that key's head), and a
//! processor that settled rows first locks its keys' entries (waiting for a
//! store that is adding rows to them), then, in a statement of its own and
//! so with a snapshot of its own under `READ COMMITTED`, looks up each key's
//! oldest pending row: rows a store committed while it waited are seen,
//! rows it has not committed yet are added by its own upsert after ours
//! commits. Entries are locked in one order by everybody (group, topic,
//! key), so stores and processors never deadlock over them.
//!
//! MySQL has no arrays either: lists are spelled out as rows of binds, at
//! most [`CHUNK`] a statement, and inserts at most [`INSERT_BYTES`] a
//! statement (a statement must fit `max_allowed_packet`).

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use sqlx::{MySql, MySqlConnection, MySqlPool, QueryBuilder, Row};
use uuid::Uuid;

use super::rows::{InboxRow, PartitionLock, Settled, candidate_window, headers_object, row_bytes};
use super::unclaimed::UnclaimedKeys;
use crate::consumer::database::Database;
use crate::consumer::message::Envelope;
use crate::consumer::shared::InboxState as State;

/// Most list items (rows of binds) in one statement: MySQL's prepared
/// statements take at most 65,535 parameters.
const CHUNK: usize = 2_000;

/// Most bytes of rows one insert carries (a statement must fit the server's
/// `max_allowed_packet`, 16 MiB by default; a larger row goes alone, and
/// the admission refuses rows over the packet).
const INSERT_BYTES: usize = 4 * 1024 * 1024;

/// Room left in `max_allowed_packet` for the statement around a row.
const PACKET_ROOM: usize = 64 * 1024;

/// The largest row one insert may carry on this server.
pub(crate) async fn max_row_bytes(pool: &MySqlPool) -> sqlx::Result<usize> {
    let packet: u64 = sqlx::query_scalar("SELECT @@max_allowed_packet")
        .fetch_one(pool)
        .await?;
    let packet = usize::try_from(packet).unwrap_or(usize::MAX);
    Ok(packet.saturating_sub(PACKET_ROOM).max(PACKET_ROOM))
}

/// Makes sure every partition of `partitions` has its row in
/// `inbox_store_lock`, outside any transaction (an insert into a row that
/// another store holds would wait for it), once per partition and process.
pub(super) async fn ensure_store_locks(
    db: &Database,
    state: &State,
    group: &str,
    partitions: &[PartitionLock],
) -> sqlx::Result<()> {
    let missing: Vec<&PartitionLock> = {
        let known = state
            .known_store_locks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        partitions.iter().filter(|p| !known.contains(*p)).collect()
    };
    if missing.is_empty() {
        return Ok(());
    }
    let Some(pool) = db.mysql() else {
        return Ok(());
    };
    for chunk in missing.chunks(CHUNK) {
        let mut query = QueryBuilder::<MySql>::new(
            "INSERT IGNORE INTO inbox_store_lock (consumer_group, topic, `partition`) ",
        );
        query.push_values(chunk, |mut row, (topic, partition)| {
            row.push_bind(group.as_bytes())
                .push_bind(topic.as_str())
                .push_bind(*partition);
        });
        query.build().execute(pool).await?;
    }
    state
        .known_store_locks
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .extend(missing.into_iter().cloned());
    Ok(())
}

/// `SELECT .. FROM inbox_store_lock` of `partitions`, locked `how`.
fn store_lock_query(group: &str, partitions: &[PartitionLock], how: &str) -> QueryBuilder<MySql> {
    let mut query = QueryBuilder::<MySql>::new(
        "SELECT `partition` FROM inbox_store_lock WHERE consumer_group = ",
    );
    query.push_bind(group.as_bytes());
    query.push(" AND (topic, `partition`) IN (");
    let mut list = query.separated(", ");
    for (topic, partition) in partitions {
        list.push("(")
            .push_bind_unseparated(topic.as_str())
            .push_unseparated(", ")
            .push_bind_unseparated(*partition)
            .push_unseparated(")");
    }
    query.push(") ORDER BY topic, `partition` ");
    query.push(how);
    query
}

/// Locks every free row of `partitions` until the transaction ends; true if
/// it got them all.
pub(super) async fn try_lock_partitions(
    conn: &mut MySqlConnection,
    group: &str,
    partitions: &[PartitionLock],
) -> sqlx::Result<bool> {
    let mut got = 0;
    for chunk in partitions.chunks(CHUNK) {
        got += store_lock_query(group, chunk, "FOR UPDATE SKIP LOCKED")
            .build()
            .fetch_all(&mut *conn)
            .await?
            .len();
    }
    Ok(got == partitions.len())
}

/// Locks the rows of `partitions` until the transaction ends, waiting for
/// whoever holds them, in primary-key order, as every store does.
pub(super) async fn lock_partitions(
    conn: &mut MySqlConnection,
    group: &str,
    partitions: &[PartitionLock],
) -> sqlx::Result<()> {
    for chunk in partitions.chunks(CHUNK) {
        store_lock_query(group, chunk, "FOR UPDATE")
            .build()
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// Pushes `(topic, partition_key) IN ((?, ?), ..)` of `pairs`.
fn push_key_list(query: &mut QueryBuilder<MySql>, pairs: &[(&str, &[u8])]) {
    query.push("(topic, partition_key) IN (");
    let mut list = query.separated(", ");
    for (topic, key) in pairs {
        list.push("(")
            .push_bind_unseparated(*topic)
            .push_unseparated(", ")
            .push_bind_unseparated(*key)
            .push_unseparated(")");
    }
    query.push(")");
}

/// Which of the (topic, key) pairs have pending rows in the group's inbox
/// (an `inbox_key` entry).
pub(super) async fn pending_keys(
    conn: &mut MySqlConnection,
    group: &str,
    topics: &[&str],
    keys: &[&str],
) -> sqlx::Result<Vec<(String, String)>> {
    let pairs: Vec<(&str, &[u8])> = topics
        .iter()
        .zip(keys)
        .map(|(topic, key)| (*topic, key.as_bytes()))
        .collect();
    let mut found = Vec::new();
    for chunk in pairs.chunks(CHUNK) {
        let mut query = QueryBuilder::<MySql>::new(
            "SELECT topic, partition_key FROM inbox_key WHERE consumer_group = ",
        );
        query.push_bind(group.as_bytes()).push(" AND ");
        push_key_list(&mut query, chunk);
        let rows: Vec<(String, Vec<u8>)> = query.build_query_as().fetch_all(&mut *conn).await?;
        found.extend(rows.into_iter().map(|(topic, key)| (topic, text(key))));
    }
    Ok(found)
}

/// A key or group stored as bytes, read back (it was UTF-8 when stored).
fn text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// Inserts `rows` into `group`'s inbox, already processed or pending;
/// returns the ids inserted (a row already in the inbox is left as it is).
/// Pending rows' keys get their `inbox_key` entries, or earlier heads, in
/// the same transaction.
pub(super) async fn insert(
    conn: &mut MySqlConnection,
    group: &str,
    rows: &[&Envelope],
    processed: bool,
) -> sqlx::Result<Vec<Uuid>> {
    let mut inserted: Vec<(Uuid, i64)> = Vec::with_capacity(rows.len());
    let mut start = 0;
    while start < rows.len() {
        // Rows up to the byte and bind bounds; at least one.
        let mut end = start + 1;
        let mut bytes = row_bytes(rows[start]);
        while end < rows.len() && end - start < CHUNK / 2 {
            bytes += row_bytes(rows[end]);
            if bytes > INSERT_BYTES {
                break;
            }
            end += 1;
        }
        inserted.extend(insert_rows(conn, group, &rows[start..end], processed).await?);
        start = end;
    }
    if !processed && !inserted.is_empty() {
        add_keys(conn, group, rows, &inserted).await?;
    }
    Ok(inserted.into_iter().map(|(id, _)| id).collect())
}

async fn insert_rows(
    conn: &mut MySqlConnection,
    group: &str,
    rows: &[&Envelope],
    processed: bool,
) -> sqlx::Result<Vec<(Uuid, i64)>> {
    let headers: Vec<String> = rows
        .iter()
        .map(|row| headers_object(&row.meta.headers).to_string())
        .collect();
    let mut query = QueryBuilder::<MySql>::new(
        "INSERT IGNORE INTO inbox_event
             (consumer_group, event_id, payload, payload_bytes, event_type, topic, partition_key,
              headers, processed, processed_at) ",
    );
    query.push_values(rows.iter().zip(&headers), |mut values, (row, headers)| {
        let meta = &row.meta;
        values
            .push_bind(group.as_bytes())
            .push_bind(meta.event_id)
            .push_bind(row.payload.as_str())
            .push_bind(i32::try_from(row.payload.len()).unwrap_or(i32::MAX))
            .push_bind(meta.event_type.as_str())
            .push_bind(meta.topic.as_str())
            .push_bind(meta.key.as_deref().map(str::as_bytes))
            .push_bind(headers.as_str());
        if processed {
            values.push("TRUE").push("NOW(6)");
        } else {
            values.push("FALSE").push("NULL");
        }
    });
    // `IGNORE` skips the rows already in the group's inbox (and a second
    // copy within the batch); it would also turn a value too long into a
    // warning, which the admission rules out (keys and sizes are checked).
    query.push(" RETURNING event_id, seq");
    query.build_query_as().fetch_all(conn).await
}

/// The `inbox_key` entries of newly inserted pending rows: a key's entry,
/// or an earlier head for it (the upsert takes the entry's lock even when it
/// changes nothing, so it waits for a processor moving that key's head);
/// a row without a key gets an entry of its own.
async fn add_keys(
    conn: &mut MySqlConnection,
    group: &str,
    rows: &[&Envelope],
    inserted: &[(Uuid, i64)],
) -> sqlx::Result<()> {
    let seq_of: HashMap<Uuid, i64> = inserted.iter().copied().collect();
    // The first row of each key (rows are in arrival order), in the order
    // everybody locks entries in; rows without a key apart.
    let mut heads: BTreeMap<(&str, &[u8]), (i64, &str)> = BTreeMap::new();
    let mut keyless: Vec<(&str, i64, &str)> = Vec::new();
    let mut seen: HashMap<Uuid, ()> = HashMap::new();
    for row in rows {
        let meta = &row.meta;
        let Some(&seq) = seq_of.get(&meta.event_id) else {
            continue;
        };
        if seen.insert(meta.event_id, ()).is_some() {
            continue; // a second copy within the batch, not inserted
        }
        match &meta.key {
            Some(key) => {
                heads
                    .entry((meta.topic.as_str(), key.as_bytes()))
                    .or_insert((seq, meta.event_type.as_str()));
            }
            None => keyless.push((meta.topic.as_str(), seq, meta.event_type.as_str())),
        }
    }
    let heads: Vec<_> = heads.into_iter().collect();
    for chunk in heads.chunks(CHUNK) {
        let mut query = QueryBuilder::<MySql>::new(
            "INSERT INTO inbox_key
                 (consumer_group, topic, partition_key, head_seq, head_event_type, not_before) ",
        );
        query.push_values(chunk, |mut values, ((topic, key), (seq, event_type))| {
            values
                .push_bind(group.as_bytes())
                .push_bind(*topic)
                .push_bind(*key)
                .push_bind(*seq)
                .push_bind(*event_type)
                .push("NULL");
        });
        // MySQL assigns left to right, each seeing the ones before: the
        // head's type and wait first, compared with the old head.
        query.push(
            " ON DUPLICATE KEY UPDATE
                 head_event_type = IF(VALUES(head_seq) < head_seq, VALUES(head_event_type), head_event_type),
                 not_before = IF(VALUES(head_seq) < head_seq, VALUES(not_before), not_before),
                 head_seq = LEAST(head_seq, VALUES(head_seq))",
        );
        query.build().execute(&mut *conn).await?;
    }
    for chunk in keyless.chunks(CHUNK) {
        let mut query = QueryBuilder::<MySql>::new(
            "INSERT INTO inbox_key
                 (consumer_group, topic, partition_key, head_seq, head_event_type, not_before) ",
        );
        query.push_values(chunk, |mut values, (topic, seq, event_type)| {
            values
                .push_bind(group.as_bytes())
                .push_bind(*topic)
                .push("NULL")
                .push_bind(*seq)
                .push_bind(*event_type)
                .push("NULL");
        });
        query.build().execute(&mut *conn).await?;
    }
    Ok(())
}

/// A locked head: its sequence, key and payload size.
struct Head {
    seq: i64,
    topic: Option<String>,
    key: Option<Vec<u8>>,
    bytes: i64,
}

/// The claim of [`super::claim`] in up to four statements of one
/// transaction: the due keys' heads read without locks; those heads locked
/// `FOR UPDATE SKIP LOCKED` and checked again (a head another processor
/// holds is skipped, one it settled meanwhile is no longer pending); the
/// runs behind the locked heads read without locks (nobody else can claim
/// them: claiming a key starts with its head); and every row picked, by
/// rank and byte budget as on PostgreSQL, read and locked.
pub(crate) async fn claim_rows(
    conn: &mut MySqlConnection,
    group: &str,
    topics: &[&str],
    types: &[&str],
    batch: usize,
    max_bytes: usize,
) -> Result<Vec<InboxRow>, sqlx::Error> {
    if topics.is_empty() {
        return Ok(Vec::new());
    }
    let window = candidate_window(batch);
    let mut query = QueryBuilder::<MySql>::new("");
    for (index, due) in [
        "not_before IS NULL",
        "not_before IS NOT NULL AND not_before <= NOW(6)",
    ]
    .into_iter()
    .enumerate()
    {
        if index > 0 {
            query.push(" UNION ALL ");
        }
        query.push("(SELECT head_seq FROM inbox_key WHERE consumer_group = ");
        query.push_bind(group.as_bytes());
        query.push(" AND ").push(due);
        query.push(" AND (topic, head_event_type) IN (");
        let mut list = query.separated(", ");
        for (topic, event_type) in topics.iter().zip(types) {
            list.push("(")
                .push_bind_unseparated(*topic)
                .push_unseparated(", ")
                .push_bind_unseparated(*event_type)
                .push_unseparated(")");
        }
        query.push(")");
        query.push(if index == 0 {
            " ORDER BY head_seq LIMIT "
        } else {
            " ORDER BY not_before LIMIT "
        });
        query.push_bind(window).push(")");
    }
    let candidates: Vec<i64> = query.build_query_scalar().fetch_all(&mut *conn).await?;
    if candidates.is_empty() {
        return Ok(Vec::new());
    }
    let mut heads: Vec<Head> = Vec::new();
    for chunk in candidates.chunks(CHUNK) {
        let want = batch.saturating_sub(heads.len());
        if want == 0 {
            break;
        }
        let mut query = QueryBuilder::<MySql>::new(
            "SELECT seq, topic, partition_key, COALESCE(payload_bytes, LENGTH(payload)) AS bytes
             FROM inbox_event WHERE seq IN (",
        );
        let mut list = query.separated(", ");
        for seq in chunk {
            list.push_bind(*seq);
        }
        query.push(
            ") AND processed = FALSE AND parked_at IS NULL
               AND (next_attempt_at IS NULL OR next_attempt_at <= NOW(6))
             ORDER BY seq LIMIT ",
        );
        query.push_bind(i64::try_from(want).unwrap_or(i64::MAX));
        query.push(" FOR UPDATE SKIP LOCKED");
        let rows = query.build().fetch_all(&mut *conn).await?;
        for row in rows {
            heads.push(Head {
                seq: row.try_get("seq")?,
                topic: row.try_get("topic")?,
                key: row.try_get("partition_key")?,
                bytes: row.try_get::<Option<i64>, _>("bytes")?.unwrap_or(0),
            });
        }
    }
    if heads.is_empty() {
        return Ok(Vec::new());
    }
    heads.sort_by_key(|head| head.seq);
    // (rank, seq, bytes): heads rank 0, a run's rows 1, 2, .. behind them.
    let mut ranked: Vec<(i64, i64, i64)> = heads.iter().map(|h| (0, h.seq, h.bytes)).collect();
    let per_run = (batch.saturating_sub(heads.len())) / heads.len();
    if per_run > 0 {
        let keyed: Vec<&Head> = heads
            .iter()
            .filter(|h| h.key.is_some() && h.topic.is_some())
            .collect();
        for chunk in keyed.chunks(CHUNK / 4) {
            let mut query = QueryBuilder::<MySql>::new("");
            for (index, head) in chunk.iter().enumerate() {
                if index > 0 {
                    query.push(" UNION ALL ");
                }
                query.push("(SELECT ");
                query.push_bind(i64::try_from(index).unwrap_or(i64::MAX));
                query.push(
                    " AS h, seq, COALESCE(payload_bytes, LENGTH(payload)) AS bytes
                      FROM inbox_event WHERE consumer_group = ",
                );
                query.push_bind(group.as_bytes());
                query.push(" AND topic = ").push_bind(head.topic.as_deref());
                query
                    .push(" AND partition_key = ")
                    .push_bind(head.key.as_deref());
                query.push(" AND processed = FALSE AND seq > ");
                query.push_bind(head.seq);
                query.push(" AND parked_at IS NULL ORDER BY seq LIMIT ");
                query.push_bind(i64::try_from(per_run).unwrap_or(i64::MAX));
                query.push(")");
            }
            let rows: Vec<(i64, i64, Option<i64>)> =
                query.build_query_as().fetch_all(&mut *conn).await?;
            // A run's rank is its row's place behind its head (`h` names
            // the arm, and so the head).
            let mut ranks: HashMap<i64, i64> = HashMap::new();
            let mut rows = rows;
            rows.sort_unstable_by_key(|(arm, seq, _)| (*arm, *seq));
            for (arm, seq, bytes) in rows {
                let rank = ranks.entry(arm).or_default();
                *rank += 1;
                ranked.push((*rank, seq, bytes.unwrap_or(0)));
            }
        }
    }
    ranked.sort_unstable();
    ranked.truncate(batch);
    // The byte budget cuts the same order (so each key keeps a prefix of
    // its run): a row is taken if the rows before it hold less than the
    // budget, so the first always is.
    let max_bytes = i64::try_from(max_bytes).unwrap_or(i64::MAX);
    let mut upto = 0i64;
    let mut picked: Vec<i64> = Vec::with_capacity(ranked.len());
    for (_, seq, bytes) in ranked {
        if upto >= max_bytes {
            break;
        }
        upto = upto.saturating_add(bytes);
        picked.push(seq);
    }
    picked.sort_unstable();
    let mut claimed = Vec::with_capacity(picked.len());
    for chunk in picked.chunks(CHUNK) {
        let mut query = QueryBuilder::<MySql>::new(
            "SELECT seq, event_id, payload, event_type, topic, partition_key, headers, attempts
             FROM inbox_event WHERE seq IN (",
        );
        let mut list = query.separated(", ");
        for seq in chunk {
            list.push_bind(*seq);
        }
        query.push(") AND processed = FALSE AND parked_at IS NULL ORDER BY seq FOR UPDATE");
        for row in query.build().fetch_all(&mut *conn).await? {
            let headers: Option<String> = row.try_get("headers")?;
            let key: Option<Vec<u8>> = row.try_get("partition_key")?;
            claimed.push(InboxRow {
                seq: row.try_get("seq")?,
                event_id: row.try_get("event_id")?,
                payload: row.try_get("payload")?,
                event_type: row.try_get("event_type")?,
                topic: row.try_get("topic")?,
                partition_key: key.map(text),
                headers: headers.and_then(|h| serde_json::from_str(&h).ok()),
                attempts: row.try_get("attempts")?,
            });
        }
    }
    Ok(claimed)
}

/// Writes what a processor's pass settled (failed attempts, parked rows,
/// processed rows), then moves the touched keys' heads along.
pub(super) async fn record(
    conn: &mut MySqlConnection,
    group: &str,
    settled: &Settled<'_>,
) -> sqlx::Result<()> {
    // Failures are the exception: a statement each.
    for failed in &settled.failed {
        sqlx::query(
            "UPDATE inbox_event
             SET attempts = attempts + 1, last_error = ?,
                 next_attempt_at = IF(? IS NULL, NULL, NOW(6) + INTERVAL ? * 1000 MICROSECOND),
                 parked_at = IF(? IS NULL, NOW(6), NULL)
             WHERE consumer_group = ? AND event_id = ?",
        )
        .bind(failed.error)
        .bind(failed.delay_ms)
        .bind(failed.delay_ms)
        .bind(failed.delay_ms)
        .bind(group.as_bytes())
        .bind(failed.event_id)
        .execute(&mut *conn)
        .await?;
    }
    for chunk in settled.processed.chunks(CHUNK) {
        let mut query = QueryBuilder::<MySql>::new(
            "UPDATE inbox_event SET processed = TRUE, processed_at = NOW(6) WHERE consumer_group = ",
        );
        query.push_bind(group.as_bytes()).push(" AND event_id IN (");
        let mut list = query.separated(", ");
        for id in chunk {
            list.push_bind(*id);
        }
        query.push(")");
        query.build().execute(&mut *conn).await?;
    }
    // The keys of the rows that changed, each from its first such row (a
    // key's rows before it are settled: its head was claimed first).
    let changed: std::collections::HashSet<Uuid> = settled
        .processed
        .iter()
        .copied()
        .chain(settled.failed.iter().map(|f| f.event_id))
        .collect();
    let mut keys: BTreeMap<(String, Vec<u8>), i64> = BTreeMap::new();
    let mut keyless: Vec<i64> = Vec::new();
    for claim in settled.claims {
        if !changed.contains(&claim.event_id) {
            continue;
        }
        match &claim.key {
            Some((topic, key)) => {
                let from = keys
                    .entry((topic.clone(), key.clone().into_bytes()))
                    .or_insert(claim.seq);
                *from = (*from).min(claim.seq);
            }
            None => keyless.push(claim.seq),
        }
    }
    let keys: Vec<KeyFrom> = keys
        .into_iter()
        .map(|((topic, key), from_seq)| KeyFrom {
            topic,
            key,
            from_seq,
        })
        .collect();
    move_heads(conn, group, &keys).await?;
    settle_keyless(conn, group, &keyless).await
}

/// A key whose head may have moved, and the sequence its new head is at or
/// after.
pub(crate) struct KeyFrom {
    pub(crate) topic: String,
    pub(crate) key: Vec<u8>,
    pub(crate) from_seq: i64,
}

/// A key's new head: its sequence, event type and wait.
type NewHead = (i64, Option<String>, NotBefore);

/// Until when a key's head backs off.
type NotBefore = Option<DateTime<Utc>>;

/// Moves the heads of `keys` (sorted by topic and key) to their oldest
/// pending row at or after `from_seq` (or after the entry's head, if that
/// is earlier: a row retried meanwhile), or removes the entries of keys
/// with none left (see the module's notes on the two steps).
pub(crate) async fn move_heads(
    conn: &mut MySqlConnection,
    group: &str,
    keys: &[KeyFrom],
) -> sqlx::Result<()> {
    for chunk in keys.chunks(CHUNK / 4) {
        let pairs: Vec<(&str, &[u8])> = chunk
            .iter()
            .map(|k| (k.topic.as_str(), k.key.as_slice()))
            .collect();
        let mut lock = QueryBuilder::<MySql>::new(
            "SELECT topic, partition_key, head_seq FROM inbox_key WHERE consumer_group = ",
        );
        lock.push_bind(group.as_bytes()).push(" AND ");
        push_key_list(&mut lock, &pairs);
        lock.push(" ORDER BY topic, partition_key FOR UPDATE");
        let locked: Vec<(String, Vec<u8>, i64)> =
            lock.build_query_as().fetch_all(&mut *conn).await?;
        // An entry may point before `from_seq`: an operator retried an
        // older parked row of the key meanwhile (and moved the head back to
        // it). The new head is then at or after that.
        let heads_now: HashMap<(&str, &[u8]), i64> = locked
            .iter()
            .map(|(topic, key, head)| ((topic.as_str(), key.as_slice()), *head))
            .collect();
        let from = |index: usize| {
            let key = &chunk[index];
            heads_now
                .get(&(key.topic.as_str(), key.key.as_slice()))
                .map_or(key.from_seq, |head| key.from_seq.min(*head))
        };

        let mut heads = QueryBuilder::<MySql>::new("");
        for (index, key) in chunk.iter().enumerate() {
            if index > 0 {
                heads.push(" UNION ALL ");
            }
            heads.push("(SELECT ");
            heads.push_bind(i64::try_from(index).unwrap_or(i64::MAX));
            heads.push(
                " AS k, seq, event_type, next_attempt_at FROM inbox_event
                  WHERE consumer_group = ",
            );
            heads.push_bind(group.as_bytes());
            heads.push(" AND topic = ").push_bind(key.topic.as_str());
            heads
                .push(" AND partition_key = ")
                .push_bind(key.key.as_slice());
            heads.push(" AND processed = FALSE AND seq >= ");
            heads.push_bind(from(index));
            heads.push(" AND parked_at IS NULL ORDER BY seq LIMIT 1)");
        }
        let found: Vec<(i64, i64, Option<String>, NotBefore)> =
            heads.build_query_as().fetch_all(&mut *conn).await?;
        let found: HashMap<usize, NewHead> = found
            .into_iter()
            .map(|(k, seq, event_type, not_before)| {
                (
                    usize::try_from(k).unwrap_or(usize::MAX),
                    (seq, event_type, not_before),
                )
            })
            .collect();
        let emptied: Vec<(&str, &[u8])> = (0..chunk.len())
            .filter(|index| !found.contains_key(index))
            .map(|index| pairs[index])
            .collect();
        if !emptied.is_empty() {
            let mut delete =
                QueryBuilder::<MySql>::new("DELETE FROM inbox_key WHERE consumer_group = ");
            delete.push_bind(group.as_bytes()).push(" AND ");
            push_key_list(&mut delete, &emptied);
            delete.build().execute(&mut *conn).await?;
        }
        let moved: Vec<(usize, &NewHead)> = (0..chunk.len())
            .filter_map(|index| Some((index, found.get(&index)?)))
            .collect();
        if !moved.is_empty() {
            let mut upsert = QueryBuilder::<MySql>::new(
                "INSERT INTO inbox_key
                     (consumer_group, topic, partition_key, head_seq, head_event_type, not_before) ",
            );
            upsert.push_values(
                &moved,
                |mut values, (index, (seq, event_type, not_before))| {
                    values
                        .push_bind(group.as_bytes())
                        .push_bind(pairs[*index].0)
                        .push_bind(pairs[*index].1)
                        .push_bind(*seq)
                        .push_bind(event_type.as_deref())
                        .push_bind(*not_before);
                },
            );
            upsert.push(
                " ON DUPLICATE KEY UPDATE head_seq = VALUES(head_seq),
                     head_event_type = VALUES(head_event_type), not_before = VALUES(not_before)",
            );
            upsert.build().execute(&mut *conn).await?;
        }
    }
    Ok(())
}

/// The entries of rows without a key, each its row's own: gone with a row
/// that is settled, waiting as long as a row that backs off.
pub(crate) async fn settle_keyless(
    conn: &mut MySqlConnection,
    group: &str,
    seqs: &[i64],
) -> sqlx::Result<()> {
    for chunk in seqs.chunks(CHUNK) {
        let mut delete = QueryBuilder::<MySql>::new(
            "DELETE k FROM inbox_key k JOIN inbox_event i ON i.seq = k.head_seq
             WHERE k.consumer_group = ",
        );
        delete.push_bind(group.as_bytes());
        delete.push(
            " AND k.partition_key IS NULL AND (i.processed OR i.parked_at IS NOT NULL)
               AND k.head_seq IN (",
        );
        let mut list = delete.separated(", ");
        for seq in chunk {
            list.push_bind(*seq);
        }
        delete.push(")");
        delete.build().execute(&mut *conn).await?;
        let mut wait = QueryBuilder::<MySql>::new(
            "UPDATE inbox_key k JOIN inbox_event i ON i.seq = k.head_seq
             SET k.not_before = i.next_attempt_at WHERE k.consumer_group = ",
        );
        wait.push_bind(group.as_bytes());
        wait.push(" AND k.partition_key IS NULL AND k.head_seq IN (");
        let mut list = wait.separated(", ");
        for seq in chunk {
            list.push_bind(*seq);
        }
        wait.push(")");
        wait.build().execute(&mut *conn).await?;
    }
    Ok(())
}

/// Renews this consumer's entry in `inbox_processor` and removes the entries
/// of processors gone for long (killed, not shut down).
pub(super) async fn heartbeat(
    pool: &MySqlPool,
    group: &str,
    instance_id: Uuid,
    host: Option<String>,
    handled: (Vec<&str>, Vec<&str>),
    heartbeat_ms: i32,
) -> sqlx::Result<()> {
    let pairs: Vec<[&str; 2]> = handled
        .0
        .iter()
        .zip(&handled.1)
        .map(|(topic, event_type)| [*topic, *event_type])
        .collect();
    let handled = serde_json::to_string(&pairs).unwrap_or_else(|_| "[]".to_owned());
    sqlx::query(
        "INSERT INTO inbox_processor (consumer_group, instance_id, host, handled, heartbeat_ms)
         VALUES (?, ?, ?, ?, ?)
         ON DUPLICATE KEY UPDATE seen_at = NOW(6), handled = VALUES(handled),
             heartbeat_ms = VALUES(heartbeat_ms)",
    )
    .bind(group.as_bytes())
    .bind(instance_id)
    .bind(host)
    .bind(handled)
    .bind(heartbeat_ms)
    .execute(pool)
    .await?;
    sqlx::query(
        "DELETE FROM inbox_processor
         WHERE consumer_group = ? AND seen_at < NOW(6) - INTERVAL 1 HOUR",
    )
    .bind(group.as_bytes())
    .execute(pool)
    .await?;
    Ok(())
}

/// Removes this consumer's entry (graceful shutdown).
pub(super) async fn leave(pool: &MySqlPool, group: &str, instance_id: Uuid) -> sqlx::Result<()> {
    sqlx::query("DELETE FROM inbox_processor WHERE consumer_group = ? AND instance_id = ?")
        .bind(group.as_bytes())
        .bind(instance_id)
        .execute(pool)
        .await
        .map(drop)
}

/// The group's pending and parked rows, for the gauges.
pub(super) async fn backlog(pool: &MySqlPool, group: &str) -> sqlx::Result<(i64, i64)> {
    sqlx::query_as(
        "SELECT CAST(COALESCE(SUM(parked_at IS NULL), 0) AS SIGNED),
                CAST(COALESCE(SUM(parked_at IS NOT NULL), 0) AS SIGNED)
         FROM inbox_event WHERE consumer_group = ? AND processed = FALSE",
    )
    .bind(group.as_bytes())
    .fetch_one(pool)
    .await
}

/// [`super::unclaimed::inbox_unclaimed`] on MySQL: keys whose head event
/// type no processor of their group handles that beat within three
/// heartbeat intervals, by group, topic and event type.
pub(crate) async fn inbox_unclaimed(
    pool: &MySqlPool,
    group: Option<&str>,
) -> sqlx::Result<Vec<UnclaimedKeys>> {
    type Unclaimed = (
        Vec<u8>,
        String,
        Option<String>,
        i64,
        Option<i64>,
        Option<DateTime<Utc>>,
    );
    let rows: Vec<Unclaimed> = sqlx::query_as(
        "SELECT w.consumer_group, w.topic, w.event_type, CAST(COUNT(*) AS SIGNED),
                CAST(SUM(w.pending) AS SIGNED), MIN(w.oldest)
         FROM (
             SELECT k.consumer_group, k.topic, k.head_event_type AS event_type,
                    IF(k.partition_key IS NULL, 1,
                       (SELECT COUNT(*) FROM inbox_event i
                        WHERE i.consumer_group = k.consumer_group AND i.topic = k.topic
                          AND i.partition_key = k.partition_key AND i.processed = FALSE
                          AND i.seq >= k.head_seq AND i.parked_at IS NULL)) AS pending,
                    IF(k.partition_key IS NULL,
                       (SELECT i.received_at FROM inbox_event i WHERE i.seq = k.head_seq),
                       (SELECT MIN(i.received_at) FROM inbox_event i
                        WHERE i.consumer_group = k.consumer_group AND i.topic = k.topic
                          AND i.partition_key = k.partition_key AND i.processed = FALSE
                          AND i.seq >= k.head_seq AND i.parked_at IS NULL)) AS oldest
             FROM inbox_key k
             WHERE (? IS NULL OR k.consumer_group = ?)
               AND NOT EXISTS (
                   SELECT 1 FROM inbox_processor p,
                        JSON_TABLE(p.handled, '$[*]' COLUMNS (
                            topic VARCHAR(249) CHARACTER SET utf8mb4 PATH '$[0]',
                            event_type LONGTEXT CHARACTER SET utf8mb4 PATH '$[1]')) h
                   WHERE p.consumer_group = k.consumer_group
                     AND p.seen_at > NOW(6) - INTERVAL (3 * p.heartbeat_ms * 1000) MICROSECOND
                     AND h.topic COLLATE utf8mb4_bin = k.topic
                     AND h.event_type COLLATE utf8mb4_bin = k.head_event_type)
         ) w
         GROUP BY w.consumer_group, w.topic, w.event_type
         ORDER BY w.consumer_group, w.topic, w.event_type",
    )
    .bind(group.map(str::as_bytes))
    .bind(group.map(str::as_bytes))
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(consumer_group, topic, event_type, keys, rows, oldest)| UnclaimedKeys {
                consumer_group: text(consumer_group),
                topic,
                event_type,
                keys,
                rows: rows.unwrap_or(0),
                oldest_received_at: oldest,
            },
        )
        .collect())
}
