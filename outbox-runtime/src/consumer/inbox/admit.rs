//! What the inbox admits of a routed record: everything its database can
//! store (see [`Admit`]).

use std::sync::Arc;

use txoutbox_core::MAX_PARTITION_KEY_BYTES;

use super::rows::row_bytes;
use crate::consumer::handler::ErasedHandler;
use crate::consumer::message::{Envelope, nul_character};
use crate::consumer::route::{Admit, Routed};
use crate::consumer::shared::Shared;
use crate::wire::dead_letter::DeadLetterReason;

/// Inbox mode's [`Admit`]: known and kept events alike go into the inbox;
/// processors decode and handle them later (and park one whose payload does
/// not fit its handler's type).
pub(crate) struct IntoInbox {
    /// PostgreSQL cannot store a NUL character in `text` or `jsonb`.
    refuse_nul: bool,
    /// The largest row one insert may carry (MySQL's `max_allowed_packet`
    /// bounds a statement; PostgreSQL has no such bound).
    max_row_bytes: usize,
}

impl IntoInbox {
    /// What an inbox on PostgreSQL admits.
    pub(crate) const POSTGRES: Self = Self {
        refuse_nul: true,
        max_row_bytes: usize::MAX,
    };

    /// What the consumer's inbox admits, on its database; `None` if the
    /// consumer stops while the database does not answer (MySQL's
    /// `max_allowed_packet` is read once, before the first store).
    pub(crate) async fn for_consumer(ctx: &Shared) -> Option<Self> {
        #[cfg(feature = "mysql")]
        if let Some(pool) = ctx.db.mysql() {
            let mut retry = 0;
            loop {
                let read = ctx
                    .inbox
                    .max_row_bytes
                    .get_or_try_init(|| super::mysql::max_row_bytes(pool))
                    .await;
                match read {
                    Ok(&max_row_bytes) => {
                        return Some(Self {
                            refuse_nul: false,
                            max_row_bytes,
                        });
                    }
                    Err(error) => {
                        if !ctx.db.failed(&error, &mut retry).await {
                            return None;
                        }
                    }
                }
            }
        }
        let _ = ctx;
        Some(Self::POSTGRES)
    }

    /// Into the inbox, unless its database cannot store it: on PostgreSQL a
    /// NUL character anywhere, on MySQL a row larger than one statement may
    /// be, and everywhere a key too long for the inbox's indexes. Checked
    /// here, before any insert, so that such a record is set aside on its
    /// own whichever way the inbox would store it (handled on receipt,
    /// pending, or kept by [`UnknownEventPolicy::Keep`]) instead of failing
    /// its whole batch's insert, which would be retried for ever as a
    /// database outage.
    ///
    /// [`UnknownEventPolicy::Keep`]: crate::consumer::UnknownEventPolicy::Keep
    fn storable(&self, envelope: Envelope) -> Routed<Envelope> {
        if self.refuse_nul
            && let Some(place) = nul_character(&envelope)
        {
            return Routed::DeadLetter(
                DeadLetterReason::Unstorable,
                format!(
                    "{place} contains a NUL character, which PostgreSQL cannot store in the inbox"
                ),
            );
        }
        if let Some(error) = key_too_long(&envelope) {
            return Routed::DeadLetter(DeadLetterReason::Unstorable, error);
        }
        let bytes = row_bytes(&envelope);
        if bytes > self.max_row_bytes {
            return Routed::DeadLetter(
                DeadLetterReason::Unstorable,
                format!(
                    "the record takes {bytes} bytes as an inbox row, more than the {} one \
                     statement may carry on this server (max_allowed_packet less room for the \
                     statement): raise MySQL's max_allowed_packet, or lower the consumer's \
                     max_message_bytes below it",
                    self.max_row_bytes
                ),
            );
        }
        Routed::Take(envelope)
    }
}

impl Admit for IntoInbox {
    type Taken = Envelope;

    fn known(&self, envelope: Envelope, _: &Arc<dyn ErasedHandler>) -> Routed<Envelope> {
        self.storable(envelope)
    }

    fn kept(&self, envelope: Envelope) -> Routed<Envelope> {
        self.storable(envelope)
    }
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
             can store (txoutbox_core::MAX_PARTITION_KEY_BYTES: the inbox indexes keys, and \
             neither PostgreSQL nor MySQL indexes much longer ones): have the producer use a shorter key, e.g. an id or a hash of it"
        )
    })
}
