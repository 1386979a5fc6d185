//! Optional wake-ups across processes through PostgreSQL `LISTEN`/`NOTIFY`.
//!
//! A relay in the writer's process is woken at once by the in-process commit
//! signal. A relay in another process only sees new rows at its next poll
//! (within [`RelayConfig::poll_interval`](super::RelayConfig::poll_interval)).
//! With notifications enabled, a statement-level trigger on `outbox_event`
//! sends `NOTIFY outbox_event` from every transaction that inserts rows (or
//! un-parks them), and relays started with
//! [`RelayBuilder::listen_notify`](super::RelayBuilder::listen_notify) wake up
//! when such a transaction commits, whichever process or language wrote it.
//!
//! Off by default, because of its costs (see `docs/relay.md`): PostgreSQL
//! serializes the commits of all notifying transactions of a cluster on one
//! lock, and every listening relay holds one more connection. Notifications
//! are only a hint: one lost while a listener reconnects is made up by the
//! next poll, and a relay polls whether or not notifications arrive.
//!
//! ```no_run
//! # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use txoutbox_runtime::relay::{notify, Relay};
//!
//! notify::enable(&pool).await?; // once per database, like a migration
//! let mut kafka = rdkafka::ClientConfig::new();
//! kafka.set("bootstrap.servers", "localhost:9092");
//! let relay = Relay::builder(pool, kafka).listen_notify(true).spawn()?;
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgListener, PgPoolOptions};
use sqlx::{Connection, PgPool};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::backoff::jittered_exponential;

/// The channel the trigger notifies and relays listen on.
pub const CHANNEL: &str = "outbox_event";

/// Name of the trigger [`enable`] creates on `outbox_event`.
pub const TRIGGER: &str = "outbox_event_notify_relays";

/// Installs (or replaces) the trigger that notifies relays of new and
/// un-parked outbox rows. Idempotent; needs the right to create functions and
/// triggers on `outbox_event` (run it where you run the migrations).
pub async fn enable(pool: &PgPool) -> sqlx::Result<()> {
    let mut conn = pool.acquire().await?;
    let mut tx = conn.begin().await?;
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
    let mut conn = pool.acquire().await?;
    let mut tx = conn.begin().await?;
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

/// First and longest pause between two attempts to (re)connect the listener.
const RECONNECT_FIRST: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// Starts the listener task of one relay: it holds its own connection (not
/// one of the pool's), wakes `wake` on every notification, and also after
/// every (re)connection, since notifications sent meanwhile are lost. Stops
/// with `cancel`.
pub(super) fn spawn_listener(pool: &PgPool, wake: Arc<Notify>, cancel: CancellationToken) {
    let options = (*pool.connect_options()).clone();
    // A pool of its own, so the listener never takes one of the service's
    // connections; lazy, so a database that is down does not fail the spawn.
    let own = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy_with(options);
    tokio::spawn(async move {
        tokio::select! {
            () = listen_forever(&own, &wake) => {}
            () = cancel.cancelled() => {}
        }
        own.close().await;
    });
}

async fn listen_forever(pool: &PgPool, wake: &Notify) {
    match is_enabled(pool).await {
        Ok(true) => {}
        Ok(false) => tracing::warn!(
            "outbox relay listens for notifications, but the trigger is not installed on \
             outbox_event: run `outbox notify enable` (or `relay::notify::enable`); polling meanwhile"
        ),
        Err(error) => tracing::debug!(%error, "outbox relay could not check the notify trigger"),
    }
    // Failed (re)connections in a row, for the backoff; a listener that ran
    // for a while starts again from the shortest pause.
    let mut failures = 0u32;
    loop {
        let started = std::time::Instant::now();
        match listen_until_error(pool, wake).await {
            Ok(never) => match never {},
            Err(error) => {
                tracing::warn!(%error, "outbox relay lost its LISTEN connection; polling meanwhile");
                // Whatever was notified while reconnecting is lost: look.
                wake.notify_one();
                if started.elapsed() > RECONNECT_MAX * 2 {
                    failures = 0;
                }
                let pause = jittered_exponential(RECONNECT_FIRST, RECONNECT_MAX, failures);
                failures = failures.saturating_add(1);
                tokio::time::sleep(pause).await;
            }
        }
    }
}

async fn listen_until_error(
    pool: &PgPool,
    wake: &Notify,
) -> sqlx::Result<std::convert::Infallible> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(CHANNEL).await?;
    tracing::debug!(
        channel = CHANNEL,
        "outbox relay listening for notifications"
    );
    wake.notify_one();
    loop {
        match listener.try_recv().await? {
            Some(_) => wake.notify_one(),
            // The connection dropped and was re-established (LISTEN included):
            // notifications in between are lost, so look once.
            None => wake.notify_one(),
        }
    }
}
