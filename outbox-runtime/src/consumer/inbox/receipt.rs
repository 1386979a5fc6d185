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
//! old owner's commit (under READ COMMITTED). On PostgreSQL a store that
//! waits for no one takes its locks, reads and, when no key of its batch
//! has pending rows (the usual case), inserts the rows it handles on
//! receipt, in one round trip: migration 0016's function, whose read and
//! insert are statements of their own. Which rows those are is decided here
//! ([`plan`]) before the call, for the case that nothing is pending; if
//! something is, the function inserts nothing and the store decides again.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use txoutbox_core::AfterCommit;
use uuid::Uuid;

use super::rows::{LockedStore, OrderKey, PartitionLock};
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
    // Each row's handler and decoded event, where it has both: only these
    // can be handled on receipt.
    let mut ready: Vec<Option<Ready>> = match on_receipt {
        true => rows.iter().map(|row| ready(ctx, row)).collect(),
        false => Vec::new(),
    };
    // Read (and allocated) only when handling on receipt: without keys, no
    // pending key is read.
    let keys = if on_receipt {
        batch_keys(rows)
    } else {
        BatchKeys::default()
    };
    // The rows handled on receipt if no key of the batch has pending rows
    // (the usual case): where it can, the first statement inserts them.
    let unhindered = on_receipt.then(|| plan(rows, &ready, &[]));
    let one_call = on_receipt && one_call_available(ctx).await?;
    let mut tx = ctx.db.begin().await?;
    let locked = match (&unhindered, &mut tx) {
        (Some(unhindered), Tx::Postgres(conn)) if one_call => {
            let now: Vec<&Envelope> = picked(rows, unhindered).collect();
            let group = &ctx.settings.group_id;
            let keys = (keys.0.as_slice(), keys.1.as_slice());
            super::postgres::lock_read_and_insert(conn, group, &partitions, keys, &now).await?
        }
        _ => try_lock_and_read(ctx, &mut tx, &partitions, &keys).await?,
    };
    let (waiting_keys, inserted_now) = match locked {
        LockedStore::Pending(waiting_keys) => (waiting_keys, None),
        LockedStore::Inserted(ids) => (Vec::new(), Some(ids)),
        LockedStore::Blocked => {
            // Another transaction is storing rows of these partitions: their
            // previous owner, still finishing its last batch after a
            // rebalance. Wait for it (holding no lock meanwhile, so two such
            // waits cannot deadlock), then read `inbox_key` after its commit.
            tx.rollback().await?;
            waiting(ctx, &partitions);
            tx = ctx.db.begin().await?;
            lock_partitions(ctx, &mut tx, &partitions).await?;
            (pending_keys(ctx, &mut tx, &keys).await?, None)
        }
    };
    let mut stored = Stored::default();
    let mut later: Vec<&Envelope> = rows.iter().collect();
    let mut handled_by_type: HashMap<String, u64> = HashMap::new();
    let mut after_commit = AfterCommit::default();
    if let Some(unhindered) = unhindered {
        let plan = match inserted_now.is_some() || waiting_keys.is_empty() {
            true => unhindered,
            false => plan(rows, &ready, &waiting_keys),
        };
        let (now, rest) = split(rows, &mut ready, &plan);
        if !now.is_empty() {
            let mut fresh: HashSet<Uuid> = match inserted_now {
                Some(ids) => ids,
                None => {
                    let envelopes: Vec<&Envelope> = now.iter().map(|(row, ..)| *row).collect();
                    insert(ctx, &mut tx, &envelopes, true).await?
                }
            }
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
                match ctx.calls.call(&*handler, tx.lend(), event, &row.meta).await {
                    Ok(after) => after_commit = after_commit.and(after),
                    Err(_) => return Err(handler_failed(tx).await),
                }
                *handled_by_type
                    .entry(row.meta.event_type.clone())
                    .or_default() += 1;
            }
        }
        later = rest;
    }
    // A handler that swallowed a database error returned `Ok` on an aborted
    // transaction: whichever it was, the processors find it (its savepoint
    // release fails there) and charge it alone. Checked with the commit
    // (the usual case: nothing stored pending), else before the pending
    // rows' insert.
    let handled = !handled_by_type.is_empty();
    if later.is_empty() && handled {
        match tx.commit_checked().await {
            Ok(()) => {}
            Err(txoutbox_core::Error::Database(error)) => return Err(error.into()),
            // Rolled back already.
            Err(_) => return Err(StoreFailed::HandlerFailed),
        }
    } else {
        if handled {
            match tx.check_committable().await {
                Ok(()) => {}
                Err(txoutbox_core::Error::Database(error)) => return Err(error.into()),
                Err(_) => return Err(handler_failed(tx).await),
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
    }
    ctx.calls.committed(after_commit);
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

/// The (topic, key) pairs of a batch's rows that have a key, as two lists.
type BatchKeys<'a> = (Vec<&'a str>, Vec<&'a str>);

fn batch_keys(rows: &[Envelope]) -> BatchKeys<'_> {
    rows.iter()
        .filter_map(|row| Some((row.meta.topic.as_str(), row.meta.key.as_deref()?)))
        .unzip()
}

/// Whether a store that handles on receipt may take its locks, read its
/// pending keys and insert the rows it handles in one round trip: on
/// PostgreSQL with migration 0016 applied (checked once per consumer;
/// without it, said once, at warn level).
async fn one_call_available(ctx: &Shared) -> sqlx::Result<bool> {
    #[cfg(feature = "mysql")]
    if ctx.db.mysql().is_some() {
        return Ok(false);
    }
    ctx.inbox
        .one_call_store
        .get_or_try_init(|| async {
            let available =
                super::postgres::lock_read_and_insert_available(ctx.db.postgres()).await?;
            if !available {
                tracing::warn!(
                    group = %ctx.settings.group_id,
                    "outbox migration 0016 is not applied: the inbox's stores take their locks, \
                     read pending keys and insert the rows they handle on receipt in three \
                     statements instead of one (they work all the same); run the outbox \
                     migrations (`outbox migrate` or txoutbox_runtime::migrations::run) and \
                     restart the consumer"
                );
            }
            Ok(available)
        })
        .await
        .copied()
}

/// Takes every store lock of `partitions` that is free, until the
/// transaction ends, and if it got them all (the usual case: no wait) reads
/// which of `keys` have pending rows, after the locks are held. Inserts
/// nothing.
async fn try_lock_and_read(
    ctx: &Shared,
    tx: &mut Tx,
    partitions: &[PartitionLock],
    keys: &BatchKeys<'_>,
) -> sqlx::Result<LockedStore> {
    if !try_lock_partitions(ctx, tx, partitions).await? {
        return Ok(LockedStore::Blocked);
    }
    Ok(LockedStore::Pending(pending_keys(ctx, tx, keys).await?))
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

/// What handling a row on receipt takes: its handler and decoded event.
type Ready = (Arc<dyn ErasedHandler>, Decoded);

/// A row handled on receipt: its envelope, handler and decoded event.
type Now<'a> = (&'a Envelope, Arc<dyn ErasedHandler>, Decoded);

/// Which of the (topic, key) pairs `keys` have pending rows in the group's
/// inbox (an `inbox_key` entry); none without keys, without a statement.
async fn pending_keys(
    ctx: &Shared,
    tx: &mut Tx,
    (topics, keys): &BatchKeys<'_>,
) -> sqlx::Result<Vec<(String, String)>> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let group = &ctx.settings.group_id;
    match tx {
        Tx::Postgres(tx) => super::postgres::pending_keys(tx, group, topics, keys).await,
        #[cfg(feature = "mysql")]
        Tx::MySql(tx) => super::mysql::pending_keys(tx, group, topics, keys).await,
    }
}

/// `row`'s handler and decoded event, if a handler here takes its event
/// type and its payload decodes.
fn ready(ctx: &Shared, row: &Envelope) -> Option<Ready> {
    let handler = ctx
        .dispatch
        .handler(&row.meta.topic, &row.meta.event_type)?;
    let event = handler.decode(&row.payload).ok()?;
    Some((handler.clone(), event))
}

/// Which of `rows` are handled on receipt (true) and which stored pending.
/// A row qualifies if nothing of its key is pending (not among
/// `waiting_keys`, the keys with an `inbox_key` entry, and no earlier row of
/// the batch stored pending) and it is `ready`. A row that does not qualify
/// holds back the rest of its key.
fn plan(rows: &[Envelope], ready: &[Option<Ready>], waiting_keys: &[OrderKey]) -> Vec<bool> {
    let mut held: HashSet<(&str, &str)> = waiting_keys
        .iter()
        .map(|(topic, key)| (topic.as_str(), key.as_str()))
        .collect();
    rows.iter()
        .zip(ready)
        .map(|(row, ready)| {
            let key = row
                .meta
                .key
                .as_deref()
                .map(|key| (row.meta.topic.as_str(), key));
            let now = ready.is_some() && !key.is_some_and(|key| held.contains(&key));
            if !now {
                held.extend(key);
            }
            now
        })
        .collect()
}

/// The rows `plan` handles on receipt.
fn picked<'a>(rows: &'a [Envelope], plan: &[bool]) -> impl Iterator<Item = &'a Envelope> {
    rows.iter()
        .zip(plan)
        .filter(|(_, now)| **now)
        .map(|(row, _)| row)
}

/// Splits `rows` as `plan` says: those handled on receipt, with what
/// handling them takes (taken out of `ready`), and those stored pending.
fn split<'a>(
    rows: &'a [Envelope],
    ready: &mut [Option<Ready>],
    plan: &[bool],
) -> (Vec<Now<'a>>, Vec<&'a Envelope>) {
    let (mut now, mut later) = (Vec::new(), Vec::new());
    for ((row, ready), handled_now) in rows.iter().zip(ready).zip(plan) {
        match (handled_now, ready.take()) {
            (true, Some((handler, event))) => now.push((row, handler, event)),
            _ => later.push(row),
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
