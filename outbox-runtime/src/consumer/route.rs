//! The consumer's one routing decision: what becomes of a received record.
//!
//! Dedup mode, inbox mode and the fuzz test (through [`Consumer::__route`])
//! all call [`route`]; nothing else decides where a record goes.

use std::sync::Arc;

use rdkafka::message::OwnedMessage;
use txoutbox_core::MAX_PARTITION_KEY_BYTES;

use super::config::{Mode, Settings, UnknownEventPolicy};
use super::handler::{Decoded, Dispatch, ErasedHandler};
use super::message::{Classified, Envelope, classify, nul_character};
use crate::wire::dead_letter::DeadLetterReason;

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
    let bounded = |mut envelope: Envelope| {
        envelope.meta.max_attempts = settings.max_attempts;
        envelope
    };
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
            UnknownEventPolicy::Keep => store(bounded(envelope)),
        },
        Classified::Known(envelope) => match (settings.mode, bounded(envelope)) {
            (Mode::Inbox, envelope) => store(envelope),
            (Mode::Dedup, envelope) => {
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

/// Inbox mode: into the inbox, unless PostgreSQL cannot store it: a NUL
/// character anywhere, or a key too long for the inbox's indexes. Checked
/// here, before any insert, so that such a record is set aside on its own
/// whichever way the inbox would store it (handled on receipt, pending, or
/// kept by [`UnknownEventPolicy::Keep`]) instead of failing its whole batch's
/// insert, which would be retried for ever as a database outage.
fn store(envelope: Envelope) -> Routed {
    if let Some(place) = nul_character(&envelope) {
        return Routed::DeadLetter(
            DeadLetterReason::Unstorable,
            format!("{place} contains a NUL character, which PostgreSQL cannot store in the inbox"),
        );
    }
    if let Some(error) = key_too_long(&envelope) {
        return Routed::DeadLetter(DeadLetterReason::Unstorable, error);
    }
    Routed::Store(envelope)
}

/// Why the record's key cannot go into the inbox, if it is too long.
///
/// The key is indexed with each pending row (`ix_inbox_event_key_pending`,
/// `inbox_key`), and a b-tree entry cannot exceed about 2,700 bytes after
/// compression: a longer key fails the insert. The bound is the relay's,
/// [`MAX_PARTITION_KEY_BYTES`], so every key an outbox producer sends fits,
/// and it applies to the key as stored (a key that is not UTF-8 is stored
/// with each invalid byte replaced by U+FFFD, three bytes), whatever the
/// group and topic names add to the entry.
fn key_too_long(envelope: &Envelope) -> Option<String> {
    let bytes = envelope.meta.key.as_ref()?.len();
    (bytes > MAX_PARTITION_KEY_BYTES).then(|| {
        format!(
            "the key is {bytes} bytes, longer than the {MAX_PARTITION_KEY_BYTES} bytes the inbox \
             can store (txoutbox_core::MAX_PARTITION_KEY_BYTES; PostgreSQL cannot index longer \
             keys): have the producer use a shorter key, e.g. an id or a hash of it"
        )
    })
}
