//! An event on its way to its handler (dedup mode), and the same event
//! handed back to be attempted again: a leaf that the batch step
//! ([`super::dedup`]) builds and the receive loop's bookkeeping
//! ([`super::progress`]) keeps while the event backs off.

use std::sync::Arc;

use super::handler::{Decoded, ErasedHandler};
use super::message::Envelope;

/// An event on its way to its handler.
pub(crate) struct Work {
    pub(crate) index: usize,
    pub(crate) envelope: Envelope,
    pub(crate) handler: Arc<dyn ErasedHandler>,
    pub(crate) decoded: Option<Decoded>,
}

impl Work {
    pub(crate) fn event(&mut self) -> Decoded {
        match self.decoded.take() {
            Some(event) => event,
            // Decoding is deterministic and succeeded when the batch was classified.
            None => self
                .handler
                .decode(&self.envelope.payload)
                .expect("payload decoded before"),
        }
    }

    pub(crate) fn partition(&self) -> (String, i32) {
        (
            self.envelope.meta.topic.clone(),
            self.envelope.meta.partition.unwrap_or_default(),
        )
    }
}

/// An event whose handler failed, to be attempted again later.
pub(crate) struct Retry {
    pub(crate) work: Work,
    /// Failed attempts so far.
    pub(crate) attempts: u32,
    /// The last attempt's error.
    pub(crate) last_error: String,
}

impl Retry {
    /// The dead-letter error once the attempts are spent.
    pub(crate) fn give_up_error(&self) -> String {
        format!(
            "handler `{}` failed {} times; last error: {}",
            self.work.handler.name(),
            self.attempts,
            self.last_error
        )
    }
}
