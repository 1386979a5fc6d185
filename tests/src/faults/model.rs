//! The workload: a ledger command recording one keyed, sequenced event, and
//! the receiver's effect handler.
//!
//! Each command takes the next sequence number of its key from `key_seq`
//! (`UPDATE .. RETURNING`), whose row lock serializes the commands of one key
//! until they commit; so per key, sequence order is commit order and outbox id
//! order, and the committed sequence numbers of a key are gapless (a rolled
//! back command gives its number back). The checker relies on both.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::{MySql, MySqlPool, PgPool, Postgres, Transaction};
use txoutbox_core::{DomainEvent, Events, outbox_handler};
use txoutbox_runtime::consumer::event_handler;
use uuid::Uuid;

/// The topic of the workload. Every scenario runs its own broker, so a fixed
/// name does not collide across tests.
pub const TOPIC: &str = "faults.ledger";
/// The dead-letter topic of the consumers (default `.dlq` suffix).
pub const DLQ_TOPIC: &str = "faults.ledger.dlq";

/// The event of one ledger command.
#[derive(Debug, Clone, PartialEq, DomainEvent, Serialize, Deserialize, JsonSchema)]
#[event(
    topic = "faults.ledger",
    event_type = "LedgerEntry",
    aggregate = "Ledger"
)]
pub struct LedgerEntry {
    /// Unique id; receivers dedup on it.
    #[event_id]
    pub event_id: Uuid,
    /// One of the scenario's keys (partition key).
    #[partition_key]
    #[aggregate_id]
    pub key: String,
    /// 1, 2, 3... per key, in commit order.
    pub seq: i64,
    /// The writer process that ran the command.
    pub writer: i32,
}

/// The same command recorded as a second event type, which only some
/// consumers handle (the rolling-deploy scenario adds its handler).
#[derive(Debug, Clone, PartialEq, DomainEvent, Serialize, Deserialize, JsonSchema)]
#[event(
    topic = "faults.ledger",
    event_type = "LedgerNote",
    aggregate = "Ledger"
)]
pub struct LedgerNote {
    /// Unique id; receivers dedup on it.
    #[event_id]
    pub event_id: Uuid,
    /// One of the scenario's keys (partition key).
    #[partition_key]
    #[aggregate_id]
    pub key: String,
    /// 1, 2, 3... per key, in commit order (shared with `LedgerEntry`).
    pub seq: i64,
    /// The writer process that ran the command.
    pub writer: i32,
}

/// One command of a writer.
#[derive(Debug, Clone)]
pub struct PostEntry {
    /// The event id, chosen by the writer so a rolled-back command can be logged.
    pub event_id: Uuid,
    /// The key.
    pub key: String,
    /// The writer's number.
    pub writer: i32,
    /// Sleep this long inside the transaction, after the writes (a window for
    /// killing the writer mid-transaction). Zero for none.
    pub hold_ms: u32,
    /// Record the event, then fail: the whole command must roll back.
    pub roll_back: bool,
    /// Record a `LedgerNote` instead of a `LedgerEntry`.
    pub note: bool,
}

/// Errors of the ledger command.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The framework's write path failed.
    #[error(transparent)]
    Outbox(#[from] txoutbox_core::Error),
    /// A statement of the command failed.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// The command chose to fail after recording its event.
    #[error("deliberate rollback")]
    Deliberate,
}

/// Inserts a ledger row with the key's next sequence number and records its event.
#[outbox_handler]
pub async fn post_entry(
    tx: &mut Transaction<'_, Postgres>,
    events: &mut Events,
    cmd: PostEntry,
) -> Result<i64, LedgerError> {
    let seq: i64 =
        sqlx::query_scalar("UPDATE key_seq SET seq = seq + 1 WHERE key = $1 RETURNING seq")
            .bind(&cmd.key)
            .fetch_one(&mut **tx)
            .await?;
    sqlx::query("INSERT INTO ledger (event_id, key, seq, writer) VALUES ($1, $2, $3, $4)")
        .bind(cmd.event_id)
        .bind(&cmd.key)
        .bind(seq)
        .bind(cmd.writer)
        .execute(&mut **tx)
        .await?;
    record(events, &cmd, seq);
    if cmd.hold_ms > 0 {
        sqlx::query("SELECT pg_sleep($1)")
            .bind(f64::from(cmd.hold_ms) / 1000.0)
            .execute(&mut **tx)
            .await?;
    }
    if cmd.roll_back {
        return Err(LedgerError::Deliberate);
    }
    Ok(seq)
}

/// [`post_entry`] on MariaDB (a scenario whose source runs on MariaDB):
/// the same writes and event; the key's row lock serializes its commands as
/// on PostgreSQL, and the transaction reads back the number it took (no
/// `UPDATE .. RETURNING` on MariaDB).
#[outbox_handler]
pub async fn post_entry_mysql(
    tx: &mut Transaction<'_, MySql>,
    events: &mut Events,
    cmd: PostEntry,
) -> Result<i64, LedgerError> {
    sqlx::query("UPDATE key_seq SET seq = seq + 1 WHERE `key` = ?")
        .bind(&cmd.key)
        .execute(&mut **tx)
        .await?;
    let seq: i64 = sqlx::query_scalar("SELECT seq FROM key_seq WHERE `key` = ?")
        .bind(&cmd.key)
        .fetch_one(&mut **tx)
        .await?;
    sqlx::query(
        "INSERT INTO ledger (event_id, `key`, seq, writer, committed_at)
         VALUES (?, ?, ?, ?, UTC_TIMESTAMP(6))",
    )
    .bind(cmd.event_id)
    .bind(&cmd.key)
    .bind(seq)
    .bind(cmd.writer)
    .execute(&mut **tx)
    .await?;
    record(events, &cmd, seq);
    if cmd.hold_ms > 0 {
        sqlx::query("DO SLEEP(?)")
            .bind(f64::from(cmd.hold_ms) / 1000.0)
            .execute(&mut **tx)
            .await?;
    }
    if cmd.roll_back {
        return Err(LedgerError::Deliberate);
    }
    Ok(seq)
}

/// Records the command's event: a `LedgerNote` or a `LedgerEntry`.
fn record(events: &mut Events, cmd: &PostEntry, seq: i64) {
    if cmd.note {
        events.record(LedgerNote {
            event_id: cmd.event_id,
            key: cmd.key.clone(),
            seq,
            writer: cmd.writer,
        });
    } else {
        events.record(LedgerEntry {
            event_id: cmd.event_id,
            key: cmd.key.clone(),
            seq,
            writer: cmd.writer,
        });
    }
}

/// The consumer group the effects of this process are recorded under (set
/// once by the consumer binary).
pub static EFFECT_GROUP: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// A tag unique to this consumer process (set once by the consumer binary),
/// so its crash hook can count the effects it committed.
pub static PROCESS_TAG: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Faults a consumer process injects into its own handler (set once by the
/// consumer binary; none by default).
#[derive(Debug, Clone, Default)]
pub struct HandlerFaults {
    /// Events of this key fail while the clock is in `blocked`.
    pub blocked_key: Option<String>,
    /// Unix milliseconds: from, until.
    pub blocked: (u64, u64),
    /// Events whose `seq` is a multiple of this panic, once per process each.
    pub panic_every: i64,
    /// Events whose `seq` is a multiple of this swallow a database error and
    /// return `Ok` without their effect, once per process each.
    pub swallow_every: i64,
    /// Events whose `seq` is a multiple of this wait an hour, once per
    /// process each.
    pub hang_every: i64,
}

/// Whether this process meets `event_id` for the first time with fault
/// `kind` (each injected fault hits an event once per process, so that its
/// retry succeeds).
fn first_time(kind: &'static str, event_id: Uuid) -> bool {
    static MET: std::sync::Mutex<Vec<(&'static str, Uuid)>> = std::sync::Mutex::new(Vec::new());
    let mut met = MET.lock().expect("not poisoned");
    let first = !met.contains(&(kind, event_id));
    if first {
        met.push((kind, event_id));
    }
    first
}

/// The faults that need time, shared by both databases' handlers: a call
/// that never returns by itself (the first time this process meets an event
/// whose `seq` is a multiple of `hang_every`).
async fn hang(event_id: Uuid, key: &str, seq: i64) {
    let Some(faults) = HANDLER_FAULTS.get() else {
        return;
    };
    if faults.hang_every > 0 && seq % faults.hang_every == 0 && first_time("hang", event_id) {
        tracing::warn!(key, seq, "fault injection: a handler that never returns");
        tokio::time::sleep(std::time::Duration::from_secs(3_600)).await;
    }
}

/// Whether the handler is to swallow a database error for this event (the
/// first time this process meets an event whose `seq` is a multiple of
/// `swallow_every`).
fn swallow_now(event_id: Uuid, seq: i64) -> bool {
    HANDLER_FAULTS.get().is_some_and(|faults| {
        faults.swallow_every > 0
            && seq % faults.swallow_every == 0
            && first_time("swallow", event_id)
    })
}

fn log_swallowed(key: &str, seq: i64) {
    tracing::warn!(
        key,
        seq,
        "fault injection: a handler swallowed a database error"
    );
}

/// The faults that need the transaction or time: a swallowed database error
/// (`true`: return `Ok` at once, without the effect) and a call that never
/// returns by itself.
async fn misbehave(
    tx: &mut Transaction<'_, Postgres>,
    event_id: Uuid,
    key: &str,
    seq: i64,
) -> bool {
    hang(event_id, key, seq).await;
    if swallow_now(event_id, seq) {
        // PostgreSQL aborts the transaction: every later statement fails.
        let failed = sqlx::query("SELECT 1 / 0").execute(&mut **tx).await;
        assert!(failed.is_err());
        log_swallowed(key, seq);
        return true;
    }
    false
}

/// A second pool on the receiver database (set once by the consumer binary
/// on MariaDB): the other transaction of `misbehave_mysql`'s deadlocks.
pub static DEADLOCK_POOL: std::sync::OnceLock<MySqlPool> = std::sync::OnceLock::new();

/// Rows the other transaction of a deadlock inserts before taking its lock,
/// so that it is the heavier side: InnoDB rolls back the transaction with
/// the fewest rows changed and locks, and a consumer's transaction holds at
/// most a batch's dedup rows and effects (200 each in the harness).
const DEADLOCK_BALLAST: u32 = 5_000;

/// [`misbehave`] on MariaDB. A failed statement there undoes itself, not the
/// transaction, so swallowing an ordinary error is harmless (the handler
/// could go on and write its effect); the error that does what PostgreSQL's
/// abort does is a deadlock (1213), which rolls the whole transaction back
/// and leaves the session in autocommit. So the swallowed error is a real
/// deadlock, against a transaction of [`DEADLOCK_POOL`] made the heavier
/// side: the handler's transaction is rolled back under it, it drops the
/// error and returns `Ok` without its effect (`true`). The framework must
/// find the transaction gone and run the event again, not commit or count
/// the attempt. Should InnoDB choose the other side after all, the handler's
/// transaction is intact and the handler goes on (`false`), as any handler
/// whose statement succeeded.
async fn misbehave_mysql(
    tx: &mut Transaction<'_, MySql>,
    event_id: Uuid,
    key: &str,
    seq: i64,
) -> Result<bool, sqlx::Error> {
    hang(event_id, key, seq).await;
    if !swallow_now(event_id, seq) {
        return Ok(false);
    }
    let pool = DEADLOCK_POOL
        .get()
        .expect("the consumer binary sets DEADLOCK_POOL on MariaDB");
    sqlx::query("INSERT IGNORE INTO deadlock_row (event_id, side) VALUES (?, 1), (?, 2)")
        .bind(event_id)
        .bind(event_id)
        .execute(pool)
        .await?;
    let mut other = pool.begin().await?;
    sqlx::query("INSERT INTO deadlock_ballast (n) SELECT seq FROM seq_1_to_1000000 LIMIT ?")
        .bind(DEADLOCK_BALLAST)
        .execute(&mut *other)
        .await?;
    let lock = move |side: i32| {
        sqlx::query("UPDATE deadlock_row SET n = n + 1 WHERE event_id = ? AND side = ?")
            .bind(event_id)
            .bind(side)
    };
    lock(1).execute(&mut *other).await?;
    lock(2).execute(&mut **tx).await?;
    // The other transaction waits for side 2, the handler's for side 1.
    let waiting = tokio::spawn(async move {
        let locked = lock(2).execute(&mut *other).await;
        let _ = other.rollback().await;
        locked.map(drop)
    });
    let handler = lock(1).execute(&mut **tx).await;
    let other = waiting.await.expect("the other transaction's task");
    match handler {
        Err(error) if is_deadlock(&error) => {
            log_swallowed(key, seq);
            Ok(true)
        }
        Err(error) => Err(error),
        Ok(_) => {
            tracing::warn!(
                key,
                seq,
                ?other,
                "fault injection: InnoDB rolled back the other side of the deadlock, \
                 not the handler's; the handler goes on"
            );
            Ok(false)
        }
    }
}

fn is_deadlock(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|db| db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
        .is_some_and(|db| db.number() == 1213)
}

/// This process's handler faults.
pub static HANDLER_FAULTS: std::sync::OnceLock<HandlerFaults> = std::sync::OnceLock::new();

fn inject_faults(event_id: Uuid, key: &str, seq: i64) -> Result<(), sqlx::Error> {
    static PANICKED: std::sync::Mutex<Vec<Uuid>> = std::sync::Mutex::new(Vec::new());
    let Some(faults) = HANDLER_FAULTS.get() else {
        return Ok(());
    };
    if faults.blocked_key.as_deref() == Some(key) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis() as u64;
        if (faults.blocked.0..faults.blocked.1).contains(&now) {
            return Err(sqlx::Error::Protocol(format!(
                "fault injection: the downstream of key {key} is down"
            )));
        }
    }
    if faults.panic_every > 0 && seq % faults.panic_every == 0 {
        let first = {
            let mut panicked = PANICKED.lock().expect("not poisoned");
            let first = !panicked.contains(&event_id);
            if first {
                panicked.push(event_id);
            }
            first
        };
        assert!(!first, "fault injection: a handler bug hit by {key}/{seq}");
    }
    Ok(())
}

async fn record_effect(
    tx: &mut Transaction<'_, Postgres>,
    event_id: Uuid,
    key: &str,
    seq: i64,
) -> Result<(), sqlx::Error> {
    inject_faults(event_id, key, seq)?;
    if misbehave(tx, event_id, key, seq).await {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO effect (consumer_group, process, event_id, key, seq)
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(EFFECT_GROUP.get().map_or("", String::as_str))
    .bind(PROCESS_TAG.get().map_or("", String::as_str))
    .bind(event_id)
    .bind(key)
    .bind(seq)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// [`record_effect`] on MariaDB: the same faults and the same row.
async fn record_effect_mysql(
    tx: &mut Transaction<'_, MySql>,
    event_id: Uuid,
    key: &str,
    seq: i64,
) -> Result<(), sqlx::Error> {
    inject_faults(event_id, key, seq)?;
    if misbehave_mysql(tx, event_id, key, seq).await? {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO effect (consumer_group, process, event_id, `key`, seq)
         VALUES (?, ?, ?, ?, ?)",
    )
    .bind(EFFECT_GROUP.get().map_or("", String::as_str))
    .bind(PROCESS_TAG.get().map_or("", String::as_str))
    .bind(event_id)
    .bind(key)
    .bind(seq)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Applies an event on the receiver: one `effect` row, in the consumer's
/// transaction. No unique constraint on purpose: a second application would
/// show as a second row instead of failing.
#[event_handler]
pub async fn apply_entry(
    tx: &mut Transaction<'_, Postgres>,
    event: LedgerEntry,
) -> Result<(), sqlx::Error> {
    record_effect(tx, event.event_id, &event.key, event.seq).await
}

/// Applies a `LedgerNote` like [`apply_entry`] applies a `LedgerEntry`.
#[event_handler]
pub async fn apply_note(
    tx: &mut Transaction<'_, Postgres>,
    event: LedgerNote,
) -> Result<(), sqlx::Error> {
    record_effect(tx, event.event_id, &event.key, event.seq).await
}

/// [`apply_entry`] on a MariaDB receiver.
#[event_handler]
pub async fn apply_entry_mysql(
    tx: &mut Transaction<'_, MySql>,
    event: LedgerEntry,
) -> Result<(), sqlx::Error> {
    record_effect_mysql(tx, event.event_id, &event.key, event.seq).await
}

/// [`apply_note`] on a MariaDB receiver.
#[event_handler]
pub async fn apply_note_mysql(
    tx: &mut Transaction<'_, MySql>,
    event: LedgerNote,
) -> Result<(), sqlx::Error> {
    record_effect_mysql(tx, event.event_id, &event.key, event.seq).await
}

/// Creates the source database's tables: the framework's and the workload's.
pub async fn migrate_source(pool: &PgPool, keys: usize) -> sqlx::Result<()> {
    txoutbox_runtime::migrations::run(pool)
        .await
        .map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS key_seq (key text PRIMARY KEY, seq bigint NOT NULL DEFAULT 0);
         CREATE TABLE IF NOT EXISTS ledger (
             event_id uuid PRIMARY KEY, key text NOT NULL, seq bigint NOT NULL,
             writer int NOT NULL, committed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
             UNIQUE (key, seq));
         CREATE TABLE IF NOT EXISTS intended_rollback (event_id uuid PRIMARY KEY);",
    )
    .execute(pool)
    .await?;
    sqlx::query(
        "INSERT INTO key_seq (key) SELECT 'k' || n FROM generate_series(0, $1 - 1) AS n
         ON CONFLICT DO NOTHING",
    )
    .bind(keys as i64)
    .execute(pool)
    .await?;
    Ok(())
}

/// Creates the source database's tables on MariaDB: the framework's and
/// the workload's (`key` is a reserved word there, hence the quotes).
pub async fn migrate_source_mysql(pool: &MySqlPool, keys: usize) -> sqlx::Result<()> {
    txoutbox_runtime::migrations::run(pool)
        .await
        .map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS key_seq (
             `key` VARCHAR(64) NOT NULL PRIMARY KEY, seq BIGINT NOT NULL DEFAULT 0
         ) ENGINE = InnoDB;
         CREATE TABLE IF NOT EXISTS ledger (
             event_id BINARY(16) NOT NULL PRIMARY KEY, `key` VARCHAR(64) NOT NULL,
             seq BIGINT NOT NULL, writer INT NOT NULL, committed_at DATETIME(6) NOT NULL,
             UNIQUE KEY (`key`, seq)
         ) ENGINE = InnoDB;
         CREATE TABLE IF NOT EXISTS intended_rollback (
             event_id BINARY(16) NOT NULL PRIMARY KEY
         ) ENGINE = InnoDB;",
    )
    .execute(pool)
    .await?;
    for n in 0..keys {
        sqlx::query("INSERT IGNORE INTO key_seq (`key`) VALUES (?)")
            .bind(key_name(n))
            .execute(pool)
            .await?;
    }
    Ok(())
}

/// Creates the receiver database's tables.
pub async fn migrate_receiver(pool: &PgPool) -> sqlx::Result<()> {
    txoutbox_runtime::migrations::run(pool)
        .await
        .map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS effect (
             id bigserial PRIMARY KEY, consumer_group text NOT NULL, process text NOT NULL,
             event_id uuid NOT NULL, key text NOT NULL, seq bigint NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT clock_timestamp());
         CREATE INDEX IF NOT EXISTS effect_event ON effect (event_id);
         CREATE INDEX IF NOT EXISTS effect_process ON effect (process);",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Creates the receiver database's tables on MariaDB: the framework's
/// (dedup mode's `processed_event` and `consumer_dead_letter`) and the
/// same `effect` table in MySQL types, plus the rows and the ballast of the
/// swallowed-deadlock fault (`misbehave_mysql`).
pub async fn migrate_receiver_mysql(pool: &MySqlPool) -> sqlx::Result<()> {
    txoutbox_runtime::migrations::run(pool)
        .await
        .map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS effect (
             id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
             consumer_group VARCHAR(255) NOT NULL, process VARCHAR(64) NOT NULL,
             event_id BINARY(16) NOT NULL, `key` VARCHAR(64) NOT NULL, seq BIGINT NOT NULL,
             applied_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
             KEY effect_event (event_id),
             KEY effect_process (process)
         ) ENGINE = InnoDB;
         CREATE TABLE IF NOT EXISTS deadlock_row (
             event_id BINARY(16) NOT NULL, side INT NOT NULL, n BIGINT NOT NULL DEFAULT 0,
             PRIMARY KEY (event_id, side)
         ) ENGINE = InnoDB;
         CREATE TABLE IF NOT EXISTS deadlock_ballast (n INT NOT NULL) ENGINE = InnoDB;",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// The key name of key number `n`.
pub fn key_name(n: usize) -> String {
    format!("k{n}")
}
