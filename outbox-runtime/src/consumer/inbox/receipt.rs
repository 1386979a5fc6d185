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
//! `inbox_key` is read after that, with a snapshot of its own that sees the
//! old owner's commit (under READ COMMITTED): on PostgreSQL a store that
//! waits for no one takes its locks and reads in one round trip, through
//! migration 0015's function, whose read is a statement of its own.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use uuid::Uuid;

use super::rows::PartitionLock;
use crate::consumer::database::Tx;
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

/// Why a store did not commit.
pub(super) enum StoreFailed {
    /// The database failed (or is unreachable): the store runs again.
    Database(sqlx::Error),
    /// A handler called on receipt failed, or returned `Ok` on a transaction
    /// it left aborted: the store was rolled back and runs again with every
    /// row stored pending, for the processors, which count attempts, retry
    /// and park.
    HandlerFailed,
    /// A handler called on receipt lost the transaction (MySQL rolled it
    /// back under it, a deadlock it swallowed or returned) or ended it: the
    /// store runs again with every row stored pending, as after
    /// [`Self::HandlerFailed`].
    HandlingLost,
}

impl From<sqlx::Error> for StoreFailed {
    fn from(error: sqlx::Error) -> Self {
        Self::Database(error)
    }
}

/// Stores `rows` (in offset order) in the group's inbox in one transaction,
/// handling on receipt those that qualify when `on_receipt` is set.
///
/// A failed handler rolls the whole transaction back (the caller stores the
/// batch again, every row pending) rather than back to a savepoint set
/// before the handling: a savepoint would cost every store a round trip to
/// the database for the rare store whose handler fails.
pub(super) async fn store(
    ctx: &Shared,
    rows: &[Envelope],
    on_receipt: bool,
) -> Result<Stored, StoreFailed> {
    let partitions = partition_locks(rows);
    #[cfg(feature = "mysql")]
    if ctx.db.mysql().is_some() {
        // Outside the transaction: an insert into a lock row another store
        // holds would wait for it.
        let group = &ctx.settings.group_id;
        super::mysql::ensure_store_locks(&ctx.db, &ctx.inbox, group, &partitions).await?;
    }
    let keys = on_receipt
        .then(|| batch_keys(rows))
        .filter(|(_, keys)| !keys.is_empty());
    let read_with_locks = keys.is_some() && lock_and_read_available(ctx).await?;
    let mut tx = ctx.db.begin().await?;
    let locked_and_read =
        try_lock_and_read(ctx, &mut tx, &partitions, keys.as_ref(), read_with_locks).await?;
    let waiting_keys = match locked_and_read {
        Some(waiting_keys) => waiting_keys,
        None => {
            // Another transaction is storing rows of these partitions: their
            // previous owner, still finishing its last batch after a
            // rebalance. Wait for it (holding no lock meanwhile, so two such
            // waits cannot deadlock), then read `inbox_key` after its commit.
            tx.rollback().await?;
            waiting(ctx, &partitions);
            tx = ctx.db.begin().await?;
            lock_partitions(ctx, &mut tx, &partitions).await?;
            match &keys {
                Some(keys) => pending_keys(ctx, &mut tx, keys).await?,
                None => Vec::new(),
            }
        }
    };
    let mut stored = Stored::default();
    let mut later: Vec<&Envelope> = rows.iter().collect();
    let mut handled_by_type: HashMap<String, u64> = HashMap::new();
    if on_receipt {
        let (now, rest) = qualify(ctx, rows, &waiting_keys);
        if !now.is_empty() {
            let envelopes: Vec<&Envelope> = now.iter().map(|(row, ..)| *row).collect();
            let mut fresh: HashSet<Uuid> = insert(ctx, &mut tx, &envelopes, true)
                .await?
                .into_iter()
                .collect();
            stored.inserted += fresh.len() as u64;
            for (row, handler, event) in now {
                // Not inserted: in the inbox already (a redelivery), or a
                // second copy within this batch.
                if !fresh.remove(&row.meta.event_id) {
                    continue;
                }
                // On MySQL a handler that swallowed a deadlock leaves the
                // session outside any transaction, where the next
                // handler's writes would commit on their own.
                if !handled_by_type.is_empty() {
                    match tx.check_still_open().await {
                        Ok(()) => {}
                        Err(txoutbox_core::Error::Database(error)) => return Err(error.into()),
                        Err(_) => return Err(StoreFailed::HandlingLost),
                    }
                }
                if ctx
                    .calls
                    .call(&*handler, tx.lend(), event, &row.meta)
                    .await
                    .is_err()
                {
                    return Err(handler_failed(tx).await);
                }
                *handled_by_type
                    .entry(row.meta.event_type.clone())
                    .or_default() += 1;
            }
            // A handler that swallowed a database error returned `Ok` on an
            // aborted transaction: whichever it was, the processors find it
            // (its savepoint release fails there) and charge it alone.
            if !handled_by_type.is_empty() {
                match tx.check_committable().await {
                    Ok(()) => {}
                    Err(txoutbox_core::Error::Database(error)) => return Err(error.into()),
                    Err(_) => return Err(handler_failed(tx).await),
                }
            }
            later = rest;
        }
    }
    if !later.is_empty() {
        // New keys get their `inbox_key` entry (PostgreSQL's insert
        // trigger, MySQL's insert statements).
        let inserted = insert(ctx, &mut tx, &later, false).await?.len() as u64;
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

/// Rolls back a store whose handling on receipt failed. A rollback that
/// fails (the connection broke under the handler) leaves the next store
/// attempt to meet the database's failure itself, pending.
async fn handler_failed(tx: Tx) -> StoreFailed {
    if let Err(error) = tx.rollback().await {
        tracing::debug!(
            error = %txoutbox_core::DbErrorDisplay(&error),
            "rolling back a store whose handler failed on receipt"
        );
    }
    StoreFailed::HandlerFailed
}

/// Stores `rows` pending in `conn`'s transaction, as [`store`] does with the
/// rows it does not handle on receipt; the caller commits.
#[cfg(feature = "test-hooks")]
pub(super) async fn store_pending(
    ctx: &Shared,
    conn: &mut sqlx::PgConnection,
    rows: &[Envelope],
) -> sqlx::Result<u64> {
    let group = &ctx.settings.group_id;
    super::postgres::lock_partitions(conn, group, &partition_locks(rows)).await?;
    let rows: Vec<&Envelope> = rows.iter().collect();
    Ok(super::postgres::insert(conn, group, &rows, false)
        .await?
        .len() as u64)
}

/// The store locks of the partitions `rows` came from, one per (group,
/// topic, partition), in order.
///
/// Why per partition: two transactions store rows of one partition at once
/// only while its ownership overlaps (an evicted owner still committing its
/// last batch while the new owner stores the records it reads again from
/// the committed offset), and a key's order is a partition's order. A lock
/// per key would hold as many locks as a batch has keys (up to
/// `batch_size` per transaction) for no more safety.
fn partition_locks(rows: &[Envelope]) -> Vec<PartitionLock> {
    let mut locks: Vec<PartitionLock> = rows
        .iter()
        .map(|row| (row.meta.topic.clone(), row.meta.partition.unwrap_or(-1)))
        .collect();
    locks.sort_unstable();
    locks.dedup();
    locks
}

/// A store found `partitions` being stored by another transaction and waits
/// for it: counted and logged, as it should only happen around a rebalance.
fn waiting(ctx: &Shared, partitions: &[PartitionLock]) {
    metrics::counter!(m::INBOX_STORE_WAITS, "group" => ctx.group()).increment(1);
    tracing::warn!(
        group = %ctx.settings.group_id,
        ?partitions,
        "another transaction is storing these partitions in the inbox (their previous owner \
         finishing its last batch after a rebalance?); waiting for it, so that its rows are \
         stored and handled first"
    );
}

/// The (topic, key) pairs of a batch's rows that have a key, as two lists
/// (never both empty where the store passes them on).
type BatchKeys<'a> = (Vec<&'a str>, Vec<&'a str>);

fn batch_keys(rows: &[Envelope]) -> BatchKeys<'_> {
    rows.iter()
        .filter_map(|row| Some((row.meta.topic.as_str(), row.meta.key.as_deref()?)))
        .unzip()
}

/// Whether the store may take its locks and read its pending keys in one
/// round trip: on PostgreSQL with migration 0015 applied (checked once per
/// consumer; without it, said once, at warn level).
async fn lock_and_read_available(ctx: &Shared) -> sqlx::Result<bool> {
    #[cfg(feature = "mysql")]
    if ctx.db.mysql().is_some() {
        return Ok(false);
    }
    ctx.inbox
        .lock_and_read
        .get_or_try_init(|| async {
            let available = super::postgres::lock_and_read_available(ctx.db.postgres()).await?;
            if !available {
                tracing::warn!(
                    group = %ctx.settings.group_id,
                    "outbox migration 0015 is not applied: the inbox's stores take their locks \
                     and read pending keys in two statements instead of one (they work all the \
                     same); run the outbox migrations (`outbox migrate` or \
                     txoutbox_runtime::migrations::run) and restart the consumer"
                );
            }
            Ok(available)
        })
        .await
        .copied()
}

/// Takes every store lock of `partitions` that is free, until the
/// transaction ends, and if it got them all (the usual case: no wait) reads
/// which of `keys` have pending rows (none read without `keys`), after the
/// locks are held: in one round trip if `read_with_locks`. `None` if another
/// transaction holds one of the locks.
async fn try_lock_and_read(
    ctx: &Shared,
    tx: &mut Tx,
    partitions: &[PartitionLock],
    keys: Option<&BatchKeys<'_>>,
    read_with_locks: bool,
) -> sqlx::Result<Option<Vec<(String, String)>>> {
    if read_with_locks && let (Tx::Postgres(conn), Some((topics, keys))) = (&mut *tx, keys) {
        let group = &ctx.settings.group_id;
        return super::postgres::lock_and_read_pending(conn, group, partitions, topics, keys).await;
    }
    if !try_lock_partitions(ctx, tx, partitions).await? {
        return Ok(None);
    }
    Ok(Some(match keys {
        Some(keys) => pending_keys(ctx, tx, keys).await?,
        None => Vec::new(),
    }))
}

/// Takes every store lock of `partitions` that is free, until the
/// transaction ends; true if it got them all (the usual case: no wait).
async fn try_lock_partitions(
    ctx: &Shared,
    tx: &mut Tx,
    partitions: &[PartitionLock],
) -> sqlx::Result<bool> {
    let group = &ctx.settings.group_id;
    match tx {
        Tx::Postgres(tx) => super::postgres::try_lock_partitions(tx, group, partitions).await,
        #[cfg(feature = "mysql")]
        Tx::MySql(tx) => super::mysql::try_lock_partitions(tx, group, partitions).await,
    }
}

/// Takes the store locks of `partitions` until the transaction ends,
/// waiting for whoever holds them, in order, as every store does, so two
/// stores never wait for each other.
async fn lock_partitions(
    ctx: &Shared,
    tx: &mut Tx,
    partitions: &[PartitionLock],
) -> sqlx::Result<()> {
    let group = &ctx.settings.group_id;
    match tx {
        Tx::Postgres(tx) => super::postgres::lock_partitions(tx, group, partitions).await,
        #[cfg(feature = "mysql")]
        Tx::MySql(tx) => super::mysql::lock_partitions(tx, group, partitions).await,
    }
}

/// A row handled on receipt: its envelope, handler and decoded event.
type Now<'a> = (&'a Envelope, Arc<dyn ErasedHandler>, Decoded);

/// Which of the (topic, key) pairs `keys` have pending rows in the group's
/// inbox (an `inbox_key` entry).
async fn pending_keys(
    ctx: &Shared,
    tx: &mut Tx,
    (topics, keys): &BatchKeys<'_>,
) -> sqlx::Result<Vec<(String, String)>> {
    let group = &ctx.settings.group_id;
    match tx {
        Tx::Postgres(tx) => super::postgres::pending_keys(tx, group, topics, keys).await,
        #[cfg(feature = "mysql")]
        Tx::MySql(tx) => super::mysql::pending_keys(tx, group, topics, keys).await,
    }
}

/// Splits `rows` into those handled on receipt and those stored pending.
/// A row qualifies if nothing of its key is pending (not among
/// `waiting_keys`, the keys with an `inbox_key` entry, and no earlier row of
/// the batch stored pending), a handler here takes its event type and its
/// payload decodes. A row that does not qualify holds back the rest of its
/// key.
fn qualify<'a>(
    ctx: &Shared,
    rows: &'a [Envelope],
    waiting_keys: &'a [(String, String)],
) -> (Vec<Now<'a>>, Vec<&'a Envelope>) {
    let mut held: HashSet<(&str, &str)> = waiting_keys
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
    (now, later)
}

/// Inserts `rows` into the group's inbox, already processed or pending;
/// returns the ids inserted (a row already in the inbox is left as it is).
async fn insert(
    ctx: &Shared,
    tx: &mut Tx,
    rows: &[&Envelope],
    processed: bool,
) -> sqlx::Result<Vec<Uuid>> {
    let group = &ctx.settings.group_id;
    match tx {
        Tx::Postgres(tx) => super::postgres::insert(tx, group, rows, processed).await,
        #[cfg(feature = "mysql")]
        Tx::MySql(tx) => super::mysql::insert(tx, group, rows, processed).await,
    }
}
