//! The routing decision as the fuzz test sees it, the inbox's store in a
//! transaction a test holds open, and one batch's step without the broker
//! (feature `test-hooks`).

use rdkafka::message::OwnedMessage;
use sqlx::PgConnection;
use uuid::Uuid;

use super::config::Mode;
use super::dedup::ToHandler;
use super::inbox::IntoInbox;
use super::route::{Routed, route};
use super::run::Consumer;
use crate::wire::dead_letter::DeadLetterReason;

/// Where a record goes, as [`Consumer::__route`] reports it. Not a public API.
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Dedup mode: to this handler (then to the dedup check by `event_id`).
    Handle {
        /// The event id the dedup key is.
        event_id: Uuid,
        /// The handler's name.
        handler: &'static str,
    },
    /// Inbox mode: into the inbox, under this event id.
    Store {
        /// The event id the inbox key is.
        event_id: Uuid,
    },
    /// Skipped: no handler and the policy is to skip.
    Skip,
    /// To the dead-letter topic, for this reason.
    DeadLetter(DeadLetterReason),
}

impl Consumer {
    /// The route of `message`: [`route`], the consumer loop's own decision,
    /// without the I/O that follows it. For the fuzz test. Not a public API.
    #[doc(hidden)]
    pub fn __route(&self, message: &OwnedMessage) -> Route {
        let ctx = &self.ctx;
        match ctx.settings.mode {
            Mode::Dedup => report(
                route(message, &ctx.dispatch, &ctx.settings, &ToHandler),
                |(envelope, handler, _)| Route::Handle {
                    event_id: envelope.meta.event_id,
                    handler: handler.name(),
                },
            ),
            Mode::Inbox => report(
                route(message, &ctx.dispatch, &ctx.settings, &IntoInbox::POSTGRES),
                |envelope| Route::Store {
                    event_id: envelope.meta.event_id,
                },
            ),
        }
    }
}

/// `routed` as [`Route`] says it, with `take` for what the step took.
fn report<T>(routed: Routed<T>, take: impl FnOnce(T) -> Route) -> Route {
    match routed {
        Routed::Take(taken) => take(taken),
        Routed::Skip(_) => Route::Skip,
        Routed::DeadLetter(reason, _) => Route::DeadLetter(reason),
    }
}

impl Consumer {
    /// Inbox mode: stores the messages this consumer would store, pending
    /// (no handling on receipt), in the caller's transaction, by the store's
    /// own path (its locks, its insert and the triggers), and leaves the
    /// transaction open; returns how many rows it inserted. A test holds it
    /// open to stand in for an evicted owner's store still in flight. Not a
    /// public API.
    #[doc(hidden)]
    pub async fn __store_pending(
        &self,
        conn: &mut PgConnection,
        messages: &[OwnedMessage],
    ) -> sqlx::Result<u64> {
        let ctx = &self.ctx;
        let rows: Vec<_> = messages
            .iter()
            .filter_map(|message| {
                match route(message, &ctx.dispatch, &ctx.settings, &IntoInbox::POSTGRES) {
                    Routed::Take(envelope) => Some(envelope),
                    _ => None,
                }
            })
            .collect();
        super::inbox::store_pending(ctx, conn, &rows).await
    }

    /// The consumer loop's step for one batch, without the broker: dedup
    /// mode handles it, inbox mode stores it (handling on receipt what
    /// qualifies), each in its transaction, as for a batch just fetched.
    /// Returns how many messages it finished; offsets are not committed.
    /// For the store bench. Not a public API.
    #[doc(hidden)]
    pub async fn __take(&self, messages: &[OwnedMessage]) -> usize {
        let taken = match self.ctx.settings.mode {
            Mode::Dedup => super::dedup::take(&self.ctx, messages).await,
            Mode::Inbox => super::inbox::take(&self.ctx, messages).await,
        };
        taken.done.len()
    }
}
