//! The routing decision as the fuzz test sees it (feature `test-hooks`).

use rdkafka::message::OwnedMessage;
use uuid::Uuid;

use super::message::DeadLetterReason;
use super::route::{Routed, route};
use super::run::Consumer;

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
        match route(message, &ctx.dispatch, &ctx.settings) {
            Routed::Handle {
                envelope, handler, ..
            } => Route::Handle {
                event_id: envelope.meta.event_id,
                handler: handler.name(),
            },
            Routed::Store(envelope) => Route::Store {
                event_id: envelope.meta.event_id,
            },
            Routed::Skip(_) => Route::Skip,
            Routed::DeadLetter(reason, _) => Route::DeadLetter(reason),
        }
    }
}
