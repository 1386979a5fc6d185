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
        let db = Database::new(
            pool,
            settings.handler_timeout,
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
            inbox: InboxState::default(),
        }
    }

    pub(crate) fn group(&self) -> String {
        self.settings.group_id.clone()
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
