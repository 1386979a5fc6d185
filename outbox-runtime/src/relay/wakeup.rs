//! What wakes an idle relay besides its poll timer: commits of its own
//! process and, with `listen_notify`, notifications from other processes,
//! received by a listener task on a connection of its own (`LISTEN`; the
//! trigger that sends them is installed with [`crate::ops::notify`]).
//! Notifications are only a hint: one lost while the listener reconnects is
//! made up by the next poll.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;

use sqlx::PgPool;
use sqlx::postgres::{PgListener, PgPoolOptions};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use txoutbox_core::__private::wakeup::CommitListener;
use txoutbox_core::Backoff;

use super::notify::{CHANNEL, is_enabled};

/// The relay's wake-up sources.
pub(crate) struct Wakeups {
    local: CommitListener,
    remote: Option<Arc<Notify>>,
    /// A commit signal or notification was taken by a wait since the last
    /// [`take_signalled`](Self::take_signalled).
    signalled: bool,
}

impl Wakeups {
    pub(crate) fn new(local: CommitListener, remote: Option<Arc<Notify>>) -> Self {
        Self {
            local,
            remote,
            signalled: false,
        }
    }

    /// Returns at the next commit signal or notification.
    pub(crate) async fn committed(&mut self) {
        match &self.remote {
            Some(remote) => tokio::select! {
                () = self.local.committed() => {}
                () = remote.notified() => {}
            },
            None => self.local.committed().await,
        }
        self.signalled = true;
    }

    /// Whether a commit was signalled (or notified) since the previous
    /// call: one a wait returned for, or one pending now, which is taken
    /// (the claim that follows sees its rows).
    pub(crate) fn take_signalled(&mut self) -> bool {
        let remote = self
            .remote
            .as_ref()
            .is_some_and(|remote| remote.notified().now_or_never().is_some());
        let local = self.local.take_pending();
        std::mem::take(&mut self.signalled) | local | remote
    }

    /// Whether an in-process commit signal is pending (not taken).
    pub(crate) fn local_pending(&self) -> bool {
        self.local.is_pending()
    }
}

/// Pauses between two attempts to (re)connect the listener: 100 ms up to 5 s.
const RECONNECT: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));

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
             outbox_event: run `outbox notify enable` (or `ops::notify::enable`); polling meanwhile"
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
                if started.elapsed() > RECONNECT.max() * 2 {
                    failures = 0;
                }
                failures = failures.saturating_add(1);
                tokio::time::sleep(RECONNECT.delay(failures)).await;
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
