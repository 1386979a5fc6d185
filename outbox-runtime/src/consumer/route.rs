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
    /// No handler for its event type here (the string), and the policy is
    /// to skip.
    Skip(String),
    /// To the dead-letter topic.
    DeadLetter(DeadLetterReason, String),
}

/// Routes one record: size and envelope checks and the event type's
/// resolution ([`classify`]), then for a known type the mode's step
/// (dedup: decode for the handler; inbox: check that PostgreSQL can store
/// it), for an unknown type the [`UnknownEventPolicy`] (whose `Keep` stores
/// it like a known one).
///
/// Nothing a record holds may stop the consumer: a panic while routing it
/// (a bug, here or in an event type's `Deserialize`) sends the record to the
/// dead-letter topic with reason `panicked`.
pub(crate) fn route(message: &OwnedMessage, dispatch: &Dispatch, settings: &Settings) -> Routed {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        route_unguarded(message, dispatch, settings)
    }))
    .unwrap_or_else(|panic| {
        Routed::DeadLetter(
            DeadLetterReason::Panicked,
            format!(
                "routing the record panicked: {}",
                crate::lifecycle::panic_message(&*panic)
            ),
        )
    })
}

fn route_unguarded(message: &OwnedMessage, dispatch: &Dispatch, settings: &Settings) -> Routed {
    match classify(message, dispatch, settings.max_message_bytes) {
        Classified::Bad(reason, error) => Routed::DeadLetter(reason, error),
        // A record that names no event type at all is `Bad` (malformed)
        // already: the policy is for types that another service handles.
        Classified::Unknown(envelope) => match settings.unknown_events {
            UnknownEventPolicy::Skip => Routed::Skip(envelope.meta.event_type),
            UnknownEventPolicy::DeadLetter => Routed::DeadLetter(
                DeadLetterReason::UnknownEventType,
                format!("no handler for event type `{}`", envelope.meta.event_type),
            ),
            // Build refuses Keep outside inbox mode.
            UnknownEventPolicy::Keep => store(envelope),
        },
        Classified::Known(envelope) => match settings.mode {
            Mode::Inbox => store(envelope),
            Mode::Dedup => {
                let handler = dispatch
                    .handler(&envelope.meta.topic, &envelope.meta.event_type)
                    .expect("classified as known")
                    .clone();
                match handler.decode_str(&envelope.payload) {
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
