//! Storing a batch in the inbox, and handling on receipt: an event whose key
//! has nothing pending in the inbox is handled in the transaction that stores
//! it, and its row goes in already processed.
//!
//! A pending row costs three writes and two trigger runs (insert, claim,
//! mark), and a processor's transaction; a row handled on receipt costs one
//! insert that touches none of the pending-row indexes. The guarantees are
//! the inbox's: the row and the handler's writes commit together, a
//! redelivered event finds its row and is not handled again, and per-key
//! order holds because only keys with no pending row (no `inbox_key` entry)
//! qualify, and every later row of a key that does not qualify is stored
//! pending behind it. If any handler of the batch fails, the batch's handling
//! is rolled back and every row is stored pending, so failures are retried,
//! counted and parked by the processors as before.
//!
//! Every store first takes a transaction lock per partition of its batch
//! (see [`partition_locks`]). While a partition's ownership overlaps after a
//! rebalance, its evicted owner may still be storing pending rows of a key
//! that the new owner is about to find without an `inbox_key` entry (the
//! rows are not committed yet) and handle on receipt, ahead of them. The
//! lock makes the new owner's store wait for the old owner's to end, and
//! `inbox_key` is read after that, in a statement of its own (so with a
//! snapshot that sees the old owner's commit, under READ COMMITTED).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use sqlx::PgConnection;
use uuid::Uuid;

use crate::consumer::database::TxRef;
use crate::consumer::handler::{Decoded, ErasedHandler};
use crate::consumer::message::Envelope;
use crate::consumer::shared::Shared;
use crate::consumer::telemetry as m;

/// What storing a batch did.
#[derive(Debug, Default)]
pub(super) struct Stored {
    /// Rows inserted (the others were already in this group's inbox).
    pub(super) inserted: u64,
    /// Of those, rows stored pending, for the processors.
    pub(super) pending: u64,
}

/// Stores `rows` (in offset order) in the group's inbox in one transaction,
/// handling on receipt those that qualify when `on_receipt` is set.
pub(super) async fn store(
    ctx: &Shared,
    rows: &[Envelope],
    on_receipt: bool,
) -> sqlx::Result<Stored> {
    let group = ctx.settings.group_id.as_str();
    let partitions = partition_locks(ctx, rows);
    let mut tx = ctx.db.begin_postgres().await?;
    if !try_lock_partitions(&mut tx, &partitions).await? {
        // Another transaction is storing rows of these partitions: their
        // previous owner, still finishing its last batch after a rebalance.
        // Wait for it (holding no lock meanwhile, so two such waits cannot
        // deadlock), then read `inbox_key` after its commit.
        tx.rollback().await?;
        waiting(ctx, &partitions);
        tx = ctx.db.begin_postgres().await?;
        lock_partitions(&mut tx, &partitions).await?;
    }
    let mut stored = Stored::default();
    let mut later: Vec<&Envelope> = rows.iter().collect();
    let mut handled_by_type: HashMap<String, u64> = HashMap::new();
    if on_receipt {
        let (now, rest) = qualify(ctx, &mut tx, rows).await?;
        if !now.is_empty() {
            sqlx::query("SAVEPOINT outbox_inbox_receipt")
                .execute(&mut *tx)
                .await?;
            let envelopes: Vec<&Envelope> = now.iter().map(|(row, ..)| *row).collect();
            let mut fresh: HashSet<Uuid> = insert(&mut tx, group, &envelopes, true)
                .await?
                .into_iter()
                .collect();
            let inserted = fresh.len() as u64;
            let mut failed = false;
            for (row, handler, event) in now {
                // Not inserted: in the inbox already (a redelivery), or a
                // second copy within this batch.
                if !fresh.remove(&row.meta.event_id) {
                    continue;
                }
                if ctx
                    .calls
                    .call(&*handler, TxRef::Postgres(&mut tx), event, &row.meta)
                    .await
                    .is_err()
                {
                    failed = true;
                    break;
                }
                *handled_by_type
                    .entry(row.meta.event_type.clone())
                    .or_default() += 1;
            }
            // A handler that swallowed a database error returned `Ok` on an
            // aborted transaction: whichever it was, the processors find it
            // (its savepoint release fails there) and charge it alone.
            if !failed && !handled_by_type.is_empty() {
                match txoutbox_core::check_committable(&mut tx).await {
                    Ok(()) => {}
                    Err(txoutbox_core::Error::Database(error)) => return Err(error),
                    Err(_) => failed = true,
                }
            }
            if failed {
                // The processors retry it, with the attempts counted.
                sqlx::query("ROLLBACK TO SAVEPOINT outbox_inbox_receipt")
                    .execute(&mut *tx)
                    .await?;
                handled_by_type.clear();
            } else {
                stored.inserted += inserted;
                later = rest;
            }
        }
    }
    if !later.is_empty() {
        // The insert trigger gives new keys their `inbox_key` entry.
        let inserted = insert(&mut tx, group, &later, false).await?.len() as u64;
        stored.inserted += inserted;
        stored.pending = inserted;
    }
    tx.commit().await?;
    ctx.calls.committed();
    // Stored pending (for the processors), or handled on receipt.
    crate::probe::mark_each(
        crate::probe::Stage::Stored,
        later.iter().map(|row| row.meta.event_id),
    );
    // The set is built only for the probe (benchmarks), never in production.
    #[cfg(feature = "test-hooks")]
    if !handled_by_type.is_empty() {
        let pending: HashSet<Uuid> = later.iter().map(|row| row.meta.event_id).collect();
        crate::probe::mark_each(
            crate::probe::Stage::Committed,
            rows.iter()
                .map(|row| row.meta.event_id)
                .filter(|id| !pending.contains(id)),
        );
    }
    ctx.counts.handled_by_type(handled_by_type);
    Ok(stored)
}

/// Stores `rows` pending in `conn`'s transaction, as [`store`] does with the
/// rows it does not handle on receipt; the caller commits.
#[cfg(feature = "test-hooks")]
pub(super) async fn store_pending(
    ctx: &Shared,
    conn: &mut PgConnection,
    rows: &[Envelope],
) -> sqlx::Result<u64> {
    lock_partitions(conn, &partition_locks(ctx, rows)).await?;
    let rows: Vec<&Envelope> = rows.iter().collect();
    Ok(insert(conn, &ctx.settings.group_id, &rows, false)
        .await?
        .len() as u64)
}

/// Advisory lock class of the inbox's store locks ("obxi").
const STORE_LOCK: i32 = 0x6f62_7869;

/// The store locks of the partitions `rows` came from, one per (group,
/// topic, partition), as the text PostgreSQL hashes into the lock's key
/// (`hashtext`, so every process computes the same key). A topic name has
/// no `:` and a partition is a number, so the text names one partition.
///
/// Why per partition: two transactions store rows of one partition at once
/// only while its ownership overlaps (an evicted owner still committing its
/// last batch while the new owner stores the records it reads again from
/// the committed offset), and a key's order is a partition's order. A lock
/// per key would hold as many locks as a batch has keys (up to
/// `batch_size` per transaction, from PostgreSQL's shared lock table) for
/// no more safety.
fn partition_locks(ctx: &Shared, rows: &[Envelope]) -> Vec<String> {
    let mut locks: Vec<String> = rows
        .iter()
        .map(|row| {
            let partition = row.meta.partition.unwrap_or(-1);
            format!("{}:{partition}:{}", row.meta.topic, ctx.settings.group_id)
        })
        .collect();
    locks.sort_unstable();
    locks.dedup();
    locks
}

/// A store found `partitions` being stored by another transaction and waits
/// for it: counted and logged, as it should only happen around a rebalance.
fn waiting(ctx: &Shared, partitions: &[String]) {
    metrics::counter!(m::INBOX_STORE_WAITS, "group" => ctx.group()).increment(1);
    tracing::warn!(
        group = %ctx.settings.group_id,
        ?partitions,
        "another transaction is storing these partitions in the inbox (their previous owner \
         finishing its last batch after a rebalance?); waiting for it, so that its rows are \
         stored and handled first"
    );
}

/// Takes every lock of `partitions` that is free, until the transaction
/// ends; true if it got them all (the usual case: one statement, no wait).
async fn try_lock_partitions(conn: &mut PgConnection, partitions: &[String]) -> sqlx::Result<bool> {
    let all: Option<bool> = sqlx::query_scalar(
        "SELECT bool_and(pg_try_advisory_xact_lock($1, hashtext(p)))
         FROM unnest($2::text[]) AS p",
    )
    .bind(STORE_LOCK)
    .bind(partitions)
    .fetch_one(conn)
    .await?;
    Ok(all.unwrap_or(true))
}

/// Takes the locks of `partitions` until the transaction ends, waiting for
/// whoever holds them, in the order of their keys, as every store does, so
/// two stores never wait for each other.
async fn lock_partitions(conn: &mut PgConnection, partitions: &[String]) -> sqlx::Result<()> {
    sqlx::query(
        "SELECT pg_advisory_xact_lock($1, h)
         FROM (SELECT DISTINCT hashtext(p) AS h FROM unnest($2::text[]) AS p ORDER BY 1) AS keys",
    )
    .bind(STORE_LOCK)
    .bind(partitions)
    .execute(conn)
    .await
    .map(drop)
}

/// A row handled on receipt: its envelope, handler and decoded event.
type Now<'a> = (&'a Envelope, Arc<dyn ErasedHandler>, Decoded);

/// Splits `rows` into those handled on receipt and those stored pending.
/// A row qualifies if nothing of its key is pending (no `inbox_key` entry,
/// and no earlier row of the batch stored pending), a handler here takes its
/// event type and its payload decodes. A row that does not qualify holds
/// back the rest of its key.
async fn qualify<'a>(
    ctx: &Shared,
    conn: &mut PgConnection,
    rows: &'a [Envelope],
) -> sqlx::Result<(Vec<Now<'a>>, Vec<&'a Envelope>)> {
    let (topics, keys): (Vec<&str>, Vec<&str>) = rows
        .iter()
        .filter_map(|row| Some((row.meta.topic.as_str(), row.meta.key.as_deref()?)))
        .unzip();
    let waiting: Vec<(String, String)> = if keys.is_empty() {
        Vec::new()
    } else {
        sqlx::query_as(
            "SELECT k.topic, k.partition_key FROM inbox_key k
             WHERE k.consumer_group = $1
               AND (k.topic, k.partition_key) IN (SELECT * FROM unnest($2::text[], $3::text[]))",
        )
        .bind(&ctx.settings.group_id)
        .bind(&topics)
        .bind(&keys)
        .fetch_all(&mut *conn)
        .await?
    };
    let mut held: HashSet<(&str, &str)> = waiting
        .iter()
        .map(|(topic, key)| (topic.as_str(), key.as_str()))
        .collect();
    let (mut now, mut later) = (Vec::new(), Vec::new());
    for row in rows {
        let key = row
            .meta
            .key
            .as_deref()
            .map(|key| (row.meta.topic.as_str(), key));
        if key.is_some_and(|key| held.contains(&key)) {
            later.push(row);
            continue;
        }
        let ready = ctx
            .dispatch
            .handler(&row.meta.topic, &row.meta.event_type)
            .and_then(|handler| Some((handler.clone(), handler.decode(&row.payload).ok()?)));
        match ready {
            Some((handler, event)) => now.push((row, handler, event)),
            None => {
                later.push(row);
                held.extend(key);
            }
        }
    }
    Ok((now, later))
}

/// Inserts `rows` into `group`'s inbox, already processed or pending;
/// returns the ids inserted (a row already in the inbox is left as it is).
async fn insert(
    conn: &mut PgConnection,
    group: &str,
    rows: &[&Envelope],
    processed: bool,
) -> sqlx::Result<Vec<Uuid>> {
    let mut ids = Vec::with_capacity(rows.len());
    let mut payloads = Vec::with_capacity(rows.len());
    let mut types = Vec::with_capacity(rows.len());
    let mut topics = Vec::with_capacity(rows.len());
    let mut keys = Vec::with_capacity(rows.len());
    let mut headers = Vec::with_capacity(rows.len());
    for row in rows {
        let meta = &row.meta;
        ids.push(meta.event_id);
        payloads.push(row.payload.as_str());
        types.push(meta.event_type.as_str());
        topics.push(meta.topic.as_str());
        keys.push(meta.key.as_deref());
        let map: serde_json::Map<_, _> = meta
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect();
        headers.push(serde_json::Value::Object(map));
    }
    sqlx::query_scalar(
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
    .bind(group)
    .bind(&ids)
    .bind(&payloads)
    .bind(&types)
    .bind(&topics)
    .bind(&keys)
    .bind(&headers)
    .bind(processed)
    .fetch_all(conn)
    .await
}
