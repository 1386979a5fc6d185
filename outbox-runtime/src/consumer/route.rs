//! The consumer's one routing decision: what becomes of a received record.
//!
//! Dedup mode, inbox mode and the fuzz test (through [`Consumer::__route`])
//! all call [`route`]; nothing else decides where a record goes.

use std::sync::Arc;

use rdkafka::message::OwnedMessage;

use super::config::{Mode, Settings, UnknownEventPolicy};
use super::handler::{Decoded, Dispatch, ErasedHandler};
use super::message::{Classified, DeadLetterReason, Envelope, classify, nul_character};

/// Where a record goes.
pub(crate) enum Routed {
    /// Dedup mode: to this handler, with the event decoded (then to the
    /// dedup check by `event_id`).
    Handle {
        envelope: Envelope,
        handler: Arc<dyn ErasedHandler>,
        event: Decoded,
    },
    /// Inbox mode: into the inbox; processors decode and handle it later
    /// (and park it if its payload does not fit the handler's type).
    Store(Envelope),
    /// No handler for its event type here (the string; empty if the record
    /// names none), and the policy is to skip.
    Skip(String),
    /// To the dead-letter topic.
    DeadLetter(DeadLetterReason, String),
}

/// Routes one record: size and envelope checks and the event type's
/// resolution ([`classify`]), then for a known type the mode's step
/// (dedup: decode for the handler; inbox: check that PostgreSQL can store
/// it), for an unknown type the [`UnknownEventPolicy`] (whose `Keep` stores
/// it like a known one).
pub(crate) fn route(message: &OwnedMessage, dispatch: &Dispatch, settings: &Settings) -> Routed {
    match classify(message, dispatch, settings.max_message_bytes) {
        Classified::Bad(reason, error) => Routed::DeadLetter(reason, error),
        Classified::Unknown(envelope) => {
            let event_type = &envelope.meta.event_type;
            let unknown = || {
                let error = if event_type.is_empty() {
                    "message names no event type and its topic has several handlers".to_owned()
                } else {
                    format!("no handler for event type `{event_type}`")
                };
                Routed::DeadLetter(DeadLetterReason::UnknownEventType, error)
            };
            match settings.unknown_events {
                UnknownEventPolicy::Skip => Routed::Skip(envelope.meta.event_type),
                UnknownEventPolicy::DeadLetter => unknown(),
                // Build refuses Keep outside inbox mode.
                UnknownEventPolicy::Keep if event_type.is_empty() => unknown(),
                UnknownEventPolicy::Keep => store(envelope),
            }
        }
        Classified::Known(envelope) => match settings.mode {
            Mode::Inbox => store(envelope),
            Mode::Dedup => {
                let handler = dispatch
                    .handler(&envelope.meta.topic, &envelope.meta.event_type)
                    .expect("classified as known")
                    .clone();
                match handler.decode(&envelope.payload) {
                    Ok(event) => Routed::Handle {
                        envelope,
                        handler,
                        event,
                    },
                    Err(error) => {
                        let error = format!(
                            "payload does not match `{}`: {error}",
                            envelope.meta.event_type
                        );
                        Routed::DeadLetter(DeadLetterReason::PayloadMismatch, error)
                    }
                }
            }
        },
    }
}

/// Inbox mode: into the inbox, unless PostgreSQL cannot store it.
fn store(envelope: Envelope) -> Routed {
    match nul_character(&envelope) {
        Some(place) => Routed::DeadLetter(
            DeadLetterReason::Unstorable,
            format!("{place} contains a NUL character, which PostgreSQL cannot store in the inbox"),
        ),
        None => Routed::Store(envelope),
    }
}

#[cfg(feature = "test-hooks")]
pub use hooks::Route;

/// The routing decision as the fuzz test sees it (feature `test-hooks`).
#[cfg(feature = "test-hooks")]
mod hooks {
    use rdkafka::message::OwnedMessage;
    use uuid::Uuid;

    use super::{DeadLetterReason, Routed, route};
    use crate::consumer::Consumer;

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
}
