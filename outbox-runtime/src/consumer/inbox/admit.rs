//! What the inbox admits of a routed record: everything PostgreSQL can store
//! (see [`Admit`]).

use std::sync::Arc;

use txoutbox_core::MAX_PARTITION_KEY_BYTES;

use crate::consumer::handler::ErasedHandler;
use crate::consumer::message::{Envelope, nul_character};
use crate::consumer::route::{Admit, Routed};
use crate::wire::dead_letter::DeadLetterReason;

/// Inbox mode's [`Admit`]: known and kept events alike go into the inbox;
/// processors decode and handle them later (and park one whose payload does
/// not fit its handler's type).
pub(crate) struct IntoInbox;

impl Admit for IntoInbox {
    type Taken = Envelope;

    fn known(&self, envelope: Envelope, _: &Arc<dyn ErasedHandler>) -> Routed<Envelope> {
        storable(envelope)
    }

    fn kept(&self, envelope: Envelope) -> Routed<Envelope> {
        storable(envelope)
    }
}

/// Into the inbox, unless PostgreSQL cannot store it: a NUL
/// character anywhere, or a key too long for the inbox's indexes. Checked
/// here, before any insert, so that such a record is set aside on its own
/// whichever way the inbox would store it (handled on receipt, pending, or
/// kept by [`UnknownEventPolicy::Keep`]) instead of failing its whole batch's
/// insert, which would be retried for ever as a database outage.
fn storable(envelope: Envelope) -> Routed<Envelope> {
    if let Some(place) = nul_character(&envelope) {
        return Routed::DeadLetter(
            DeadLetterReason::Unstorable,
            format!("{place} contains a NUL character, which PostgreSQL cannot store in the inbox"),
        );
    }
    if let Some(error) = key_too_long(&envelope) {
        return Routed::DeadLetter(DeadLetterReason::Unstorable, error);
    }
    Routed::Take(envelope)
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
