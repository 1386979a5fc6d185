//! The relay's `NOTIFY` channel and the trigger on `outbox_event` that
//! sends to it: a fact of the relay's tables, like its membership row. The
//! operator's entry point is [`crate::ops::notify`], which re-exports these.

use sqlx::PgPool;

/// The channel the trigger notifies and relays listen on.
pub const CHANNEL: &str = "outbox_event";

/// Name of the trigger [`enable`] creates on `outbox_event`.
pub const TRIGGER: &str = "outbox_event_notify_relays";

/// Installs (or replaces) the trigger that notifies relays of new and
/// un-parked outbox rows. Idempotent; needs the right to create functions and
/// triggers on `outbox_event` (run it where you run the migrations).
pub async fn enable(pool: &PgPool) -> sqlx::Result<()> {
    let mut tx = crate::txn::begin(pool).await?;
    sqlx::query(
        "CREATE OR REPLACE FUNCTION outbox_event_notify_relays() RETURNS trigger
         LANGUAGE plpgsql AS $$
         BEGIN
             PERFORM pg_notify('outbox_event', '');
             RETURN NULL;
         END $$",
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query("DROP TRIGGER IF EXISTS outbox_event_notify_relays ON outbox_event")
        .execute(&mut *tx)
        .await?;
    // Statement level: one notification per INSERT statement (the write path
    // inserts a transaction's events in one statement), and PostgreSQL folds
    // identical notifications of one transaction into one.
    sqlx::query(
        "CREATE TRIGGER outbox_event_notify_relays
         AFTER INSERT OR UPDATE OF parked_at ON outbox_event
         FOR EACH STATEMENT EXECUTE FUNCTION outbox_event_notify_relays()",
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

/// Removes the trigger and its function. Idempotent. Relays that listen keep
/// running and fall back to polling.
pub async fn disable(pool: &PgPool) -> sqlx::Result<()> {
    let mut tx = crate::txn::begin(pool).await?;
    sqlx::query("DROP TRIGGER IF EXISTS outbox_event_notify_relays ON outbox_event")
        .execute(&mut *tx)
        .await?;
    sqlx::query("DROP FUNCTION IF EXISTS outbox_event_notify_relays()")
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}

/// Whether the notification trigger is installed on `outbox_event`.
pub async fn is_enabled(pool: &PgPool) -> sqlx::Result<bool> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_trigger
                        WHERE tgrelid = to_regclass('outbox_event') AND tgname = $1)",
    )
    .bind(TRIGGER)
    .fetch_one(pool)
    .await
}
