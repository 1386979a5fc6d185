//! What the receive loop, dedup mode and the inbox processors share: the
//! dispatch table, the settings, the dead-letter producer, and the
//! parts every mode uses: its database side ([`Database`]), its handler
//! calls ([`Calls`]) and its counters ([`Counts`]).

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::call::Calls;
use super::config::Settings;
use super::counts::Counts;
use super::database::{Database, Pool};
use super::dlq::DeadLetters;
use super::handler::Dispatch;

/// State shared by the receiving loop and the inbox processors.
pub(crate) struct Shared {
    pub(crate) dispatch: Dispatch,
    pub(crate) settings: Settings,
    pub(crate) dlq: DeadLetters,
    /// Wakes idle inbox processors when rows were stored.
    pub(crate) stored: Notify,
    pub(crate) token: CancellationToken,
    /// How the consumer begins transactions and rides out outages.
    pub(crate) db: Database,
    /// Calling handlers, and the wake-up owed after their commits.
    pub(crate) calls: Calls,
    /// Metrics and the totals of the consumer's summary (shared with its
    /// handle).
    pub(crate) counts: Counts,
    /// How long the consumer's work may go without being woken before its
    /// connection is taken for dead ([`super::stall`]); `None` when the
    /// timeouts are off.
    pub(crate) stall_limit: Option<std::time::Duration>,
    /// What inbox mode keeps in memory (on MySQL).
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) inbox: InboxState,
}

impl Shared {
    pub(crate) fn new(
        pool: Pool,
        dispatch: Dispatch,
        settings: Settings,
        dlq: DeadLetters,
    ) -> Self {
        let token = CancellationToken::new();
        let counts = Counts::new(settings.group_id.clone());
        let wakeup_scope = pool.wakeup_scope();
        let stall_limit = super::stall::stall_limit(&[
            settings.handler_timeout,
            pool.acquire_timeout(),
            settings.backoff.max(),
        ]);
        let db = Database::new(
            pool,
            settings.handler_timeout,
            stall_limit,
            settings.backoff,
            token.clone(),
            counts.clone(),
        );
        let calls = Calls::new(settings.handler_timeout, counts.clone(), wakeup_scope);
        Self {
            dispatch,
            settings,
            dlq,
            stored: Notify::new(),
            token,
            db,
            calls,
            counts,
            stall_limit,
            inbox: InboxState::default(),
        }
    }

    pub(crate) fn group(&self) -> String {
        self.settings.group_id.clone()
    }

    /// Runs `work` unless it stalls on a connection that stopped answering
    /// ([`super::stall::unless_stalled`] with the consumer's limit).
    pub(crate) async fn unless_stalled<F: std::future::Future>(
        &self,
        work: F,
    ) -> Result<F::Output, super::stall::Stalled> {
        super::stall::unless_stalled(work, self.stall_limit).await
    }

    /// [`Shared::unless_stalled`] for database work, a stall becoming its
    /// error (for the outage path: counted, logged, retried after a pause).
    pub(crate) async fn db_unless_stalled<T>(
        &self,
        work: impl std::future::Future<Output = sqlx::Result<T>>,
    ) -> sqlx::Result<T> {
        self.unless_stalled(work)
            .await
            .unwrap_or_else(|stalled| Err(stalled.into_db_error()))
    }
}

/// What the inbox keeps in memory for the consumer's life.
#[derive(Default)]
pub(crate) struct InboxState {
    /// PostgreSQL: whether migration 0016's function exists, which takes a
    /// store's locks, reads its pending keys and inserts the rows it handles
    /// on receipt in one round trip; read before the first store that
    /// handles on receipt. Without it (the migration not applied yet) stores
    /// take the statements it replaces.
    pub(crate) one_call_store: tokio::sync::OnceCell<bool>,
    /// MySQL: the partitions whose store-lock row this process knows to
    /// exist in `inbox_store_lock`.
    #[cfg(feature = "mysql")]
    pub(crate) known_store_locks: std::sync::Mutex<std::collections::HashSet<(String, i32)>>,
    /// MySQL: the largest row one insert may carry (from the server's
    /// `max_allowed_packet`), read before the first store.
    #[cfg(feature = "mysql")]
    pub(crate) max_row_bytes: tokio::sync::OnceCell<usize>,
}
