//! Testing only: the consumer's decision for one record, without I/O, so the
//! decode and dispatch path can be fuzzed (see `tests/tests/faults_fuzz.rs`).

use rdkafka::message::OwnedMessage;
use uuid::Uuid;

use super::config::{Mode, UnknownEventPolicy};
use super::message::{Classified, DeadLetterReason, classify, nul_character};
use super::run::Consumer;

/// Where a record goes. Not a public API.
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// To this handler (then to the dedup check or the inbox, by `event_id`).
    Handle {
        /// The event id the dedup / inbox key is.
        event_id: Uuid,
        /// The handler's name.
        handler: &'static str,
    },
    /// Skipped: no handler and the policy is to skip.
    Skip,
    /// To the dead-letter topic, for this reason.
    DeadLetter(DeadLetterReason),
}

impl Consumer {
    /// The route of `message`, decided as the consumer loop decides it:
    /// classification, in inbox mode the check for what PostgreSQL cannot
    /// store, then the handler's decoding, then the unknown-event policy.
    /// Not a public API.
    #[doc(hidden)]
    pub fn __route(&self, message: &OwnedMessage) -> Route {
        let ctx = &self.ctx;
        match classify(message, &ctx.dispatch, ctx.settings.max_message_bytes) {
            Classified::Known(envelope)
                if ctx.settings.mode == Mode::Inbox && nul_character(&envelope).is_some() =>
            {
                Route::DeadLetter(DeadLetterReason::Unstorable)
            }
            Classified::Known(envelope) => {
                let handler = ctx
                    .dispatch
                    .handler(&envelope.meta.topic, &envelope.meta.event_type)
                    .expect("classified as known");
                match handler.decode(&envelope.payload) {
                    Ok(_) => Route::Handle {
                        event_id: envelope.meta.event_id,
                        handler: handler.name(),
                    },
                    Err(_) => Route::DeadLetter(DeadLetterReason::PayloadMismatch),
                }
            }
            Classified::Unknown(_) => match ctx.settings.unknown_events {
                UnknownEventPolicy::Skip => Route::Skip,
                UnknownEventPolicy::DeadLetter => {
                    Route::DeadLetter(DeadLetterReason::UnknownEventType)
                }
            },
            Classified::Bad(reason, _) => Route::DeadLetter(reason),
        }
    }
}
