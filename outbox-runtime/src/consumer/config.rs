//! The consumer's settings: the mode, the policy for unknown event types,
//! and the tuning the builder fills in.

use std::sync::Arc;
use std::time::Duration;

use super::database::Pool;
use futures::future::BoxFuture;
use txoutbox_core::Backoff;

/// How received events reach their handlers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// The default: for each message, one transaction inserts
    /// `(consumer_group, event_id)` into `processed_event` (`ON CONFLICT DO
    /// NOTHING`) and, only if that row is new, runs the handler; the offset is
    /// stored after the commit.
    #[default]
    Dedup,
    /// For critical or bursty flows: messages are written to `inbox_event`
    /// (many per statement) and the offset is stored after that insert
    /// commits; processors claim pending rows `FOR UPDATE SKIP LOCKED`, key by
    /// key in arrival order, and run the handler in the transaction that marks
    /// the row processed. An event whose key has nothing pending is handled
    /// on receipt, in the storing transaction (see
    /// [`ConsumerBuilder::handle_on_receipt`](super::ConsumerBuilder::handle_on_receipt)).
    Inbox,
}

/// What to do with a well-formed message whose event type has no handler here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnknownEventPolicy {
    /// The default: count it (`outbox_consumer_unknown_skipped_total`) and move on;
    /// topics often carry event types a given service does not care about.
    #[default]
    Skip,
    /// Publish it to the dead-letter topic with reason `unknown_event_type`.
    DeadLetter,
    /// Inbox mode only: store it like any other event, for a processor that
    /// has a handler for its type. Meant for rolling deploys that add a
    /// handler: messages of the new type received by a process still on the
    /// old version are kept instead of skipped, and the new version's
    /// processors handle them, in order with the rest of their key.
    ///
    /// Until a processor that handles the type runs, such a row waits, and
    /// so does every later row of its key: counted in
    /// `outbox_inbox_unclaimed_keys`, logged, and listed by `outbox status`.
    /// So keep [`Skip`](Self::Skip) for topics that carry event types this
    /// service never handles. A message that names no event type on a topic
    /// with several handlers is dead-lettered (nobody could ever route it).
    /// [`ConsumerBuilder::build`](super::ConsumerBuilder::build) refuses this policy in dedup mode, which has
    /// nowhere to keep a message.
    Keep,
}

/// Settings of a [`Consumer`](super::Consumer); see
/// [`ConsumerBuilder`](super::ConsumerBuilder) for each default.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) group_id: String,
    pub(crate) mode: Mode,
    pub(crate) max_attempts: u32,
    /// Retry `n` follows failed attempt `n`.
    pub(crate) backoff: Backoff,
    pub(crate) dlq_suffix: String,
    pub(crate) unknown_events: UnknownEventPolicy,
    pub(crate) max_message_bytes: usize,
    /// Headers read for the event type before `event_type`, in order.
    pub(crate) event_type_headers: Vec<String>,
    pub(crate) batch_size: usize,
    pub(crate) batch_max_bytes: usize,
    /// Batches (of different partitions) in flight at once.
    pub(crate) concurrent_batches: usize,
    pub(crate) handler_timeout: Duration,
    pub(crate) shutdown_timeout: Duration,
    pub(crate) processors: usize,
    pub(crate) processor_batch_size: usize,
    pub(crate) processor_poll_interval: Duration,
    pub(crate) handle_on_receipt: bool,
    pub(crate) backlog_interval: Duration,
    pub(crate) refetch_offset_gaps: bool,
    pub(crate) create_missing_dlq_topics: bool,
    /// Work run beside the messages every `backlog_interval`, registered by
    /// extensions of the consumer (a saga refreshes its gauges), one per name.
    pub(crate) periodic: Vec<PeriodicTask>,
}

/// A consumer's periodic work (see [`ConsumerBuilder::periodic`]): run every
/// `backlog_interval` while the consumer runs; a failure is logged and the
/// next round runs as usual.
///
/// [`ConsumerBuilder::periodic`]: super::ConsumerBuilder::periodic
#[derive(Clone)]
pub(crate) struct PeriodicTask {
    pub(crate) name: &'static str,
    pub(crate) run: Arc<dyn Fn(Pool) -> BoxFuture<'static, sqlx::Result<()>> + Send + Sync>,
}

impl std::fmt::Debug for PeriodicTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeriodicTask")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}
