//! The consumer's one routing decision: what becomes of a received record.
//!
//! Dedup mode, inbox mode and the fuzz test (through [`Consumer::__route`])
//! all call [`route`]; nothing else decides where a record goes. Routing
//! does not know the mode: the batch step passes its [`Admit`].

use std::sync::Arc;

use rdkafka::message::OwnedMessage;

use super::config::{Settings, UnknownEventPolicy};
use super::handler::{Dispatch, ErasedHandler};
use super::message::{Classified, Envelope, classify};
use crate::wire::dead_letter::DeadLetterReason;

/// Where a record goes.
pub(crate) enum Routed<T> {
    /// To the batch step of the consumer's mode, as that step admitted it
    /// (see [`Admit`]).
    Take(T),
    /// No handler for its event type here (the string), and the policy is
    /// to skip.
    Skip(String),
    /// To the dead-letter topic.
    DeadLetter(DeadLetterReason, String),
}

/// What a batch step (dedup or inbox) makes of a record routing let
/// through: the one mode-specific part of routing. Dedup decodes the event
/// for its handler; the inbox checks that PostgreSQL can store it.
pub(crate) trait Admit {
    /// What the step takes.
    type Taken;

    /// An event of a type this consumer handles, with its handler.
    fn known(&self, envelope: Envelope, handler: &Arc<dyn ErasedHandler>) -> Routed<Self::Taken>;

    /// An event of a type without a handler here, kept by
    /// [`UnknownEventPolicy::Keep`].
    fn kept(&self, envelope: Envelope) -> Routed<Self::Taken>;
}

/// Routes one record: size and envelope checks and the event type's
/// resolution ([`classify`]), then for a known type the batch step's
/// [`Admit::known`], for an unknown type the [`UnknownEventPolicy`] (whose
/// `Keep` hands it to [`Admit::kept`]).
///
/// Nothing a record holds may stop the consumer: a panic while routing it
/// (a bug, here or in an event type's `Deserialize`) sends the record to the
/// dead-letter topic with reason `panicked`.
pub(crate) fn route<A: Admit>(
    message: &OwnedMessage,
    dispatch: &Dispatch,
    settings: &Settings,
    admit: &A,
) -> Routed<A::Taken> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        route_unguarded(message, dispatch, settings, admit)
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

fn route_unguarded<A: Admit>(
    message: &OwnedMessage,
    dispatch: &Dispatch,
    settings: &Settings,
    admit: &A,
) -> Routed<A::Taken> {
    let bounded = |mut envelope: Envelope| {
        envelope.meta.max_attempts = settings.max_attempts;
        envelope
    };
    match classify(
        message,
        dispatch,
        settings.max_message_bytes,
        &settings.event_type_headers,
    ) {
        Classified::Bad(reason, error) => Routed::DeadLetter(reason, error),
        // A record that names no event type at all is `Bad` (malformed)
        // already: the policy is for types that another service handles.
        Classified::Unknown(envelope) => match settings.unknown_events {
            UnknownEventPolicy::Skip => Routed::Skip(envelope.meta.event_type),
            UnknownEventPolicy::DeadLetter => Routed::DeadLetter(
                DeadLetterReason::UnknownEventType,
                format!("no handler for event type `{}`", envelope.meta.event_type),
            ),
            UnknownEventPolicy::Keep => admit.kept(bounded(envelope)),
        },
        Classified::Known(envelope) => {
            crate::probe::mark(crate::probe::Stage::Received, envelope.meta.event_id);
            let handler = dispatch
                .handler(&envelope.meta.topic, &envelope.meta.event_type)
                .expect("classified as known");
            admit.known(bounded(envelope), handler)
        }
    }
}
