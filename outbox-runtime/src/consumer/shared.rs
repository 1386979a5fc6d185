//! What the receive loop, dedup mode and the inbox processors share: the
//! pool, the dispatch table, the settings, the dead-letter producer, and the
//! steps every mode takes (calling a handler, backing off, dead-lettering).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::FutureExt;
use rdkafka::Message;
use rdkafka::message::OwnedMessage;
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use txoutbox_core::Events;

use super::config::Settings;
use super::dlq::DeadLetters;
use super::handler::{Dispatch, ErasedHandler, EventMeta, HandlerError};
use super::message::DeadLetterReason;
use super::summary::Totals;
use super::telemetry as m;
use crate::lifecycle::panic_message;

/// State shared by the receiving loop and the inbox processors.
pub(crate) struct Shared {
    pub(crate) pool: PgPool,
    pub(crate) dispatch: Dispatch,
    pub(crate) settings: Settings,
    pub(crate) dlq: DeadLetters,
    /// Wakes idle inbox processors when rows were stored.
    pub(crate) stored: Notify,
    pub(crate) token: CancellationToken,
    /// Set when a handler recorded outbox events that are not committed yet.
    pub(crate) events_recorded: AtomicBool,
    /// What the consumer did so far, for its summary (shared with its handle).
    pub(crate) totals: Arc<Totals>,
}

/// A message that does not reach a handler.
pub(crate) enum Aside {
    /// To the dead-letter topic.
    Dead(DeadLetterReason, String),
    /// No handler for this event type (the string; empty if none was named),
    /// skipped by policy.
    Skip(String),
}

impl Shared {
    pub(crate) fn group(&self) -> String {
        self.settings.group_id.clone()
    }

    /// Counts committed handlers and duplicates (dedup mode's metrics have
    /// no event type label).
    pub(crate) fn count_handled(&self, handled: u64, duplicates: u64) {
        let group = self.group();
        metrics::counter!(m::HANDLED, "group" => group.clone()).increment(handled);
        metrics::counter!(m::DUPLICATES, "group" => group).increment(duplicates);
        Totals::add(&self.totals.handled, handled);
        Totals::add(&self.totals.duplicates, duplicates);
    }

    /// Counts rows inserted into the inbox and duplicates it absorbed.
    pub(crate) fn count_stored(&self, inserted: u64, duplicates: u64) {
        let group = self.group();
        metrics::counter!(m::INBOX_STORED, "group" => group.clone()).increment(inserted);
        metrics::counter!(m::DUPLICATES, "group" => group).increment(duplicates);
        Totals::add(&self.totals.stored, inserted);
        Totals::add(&self.totals.duplicates, duplicates);
    }

    /// Counts committed handlers per event type (inbox mode).
    pub(crate) fn count_handled_by_type(&self, handled: impl IntoIterator<Item = (String, u64)>) {
        for (event_type, count) in handled {
            metrics::counter!(m::HANDLED, "group" => self.group(), "event_type" => event_type)
                .increment(count);
            Totals::add(&self.totals.handled, count);
        }
    }

    /// Sleeps `delay`; false if the consumer is shutting down.
    pub(crate) async fn pause(&self, delay: Duration) -> bool {
        tokio::select! {
            () = self.token.cancelled() => false,
            () = tokio::time::sleep(delay) => true,
        }
    }

    /// After a database error: counts it and waits before the next try.
    /// False if the consumer is shutting down.
    pub(crate) async fn db_failed(&self, error: &sqlx::Error, retry: &mut u32) -> bool {
        *retry += 1;
        metrics::counter!(m::DB_ERRORS, "group" => self.group()).increment(1);
        tracing::warn!(error = %txoutbox_core::DbErrorDisplay(error), retry = *retry, "database unavailable; pausing before retry");
        self.pause(self.settings.backoff(*retry)).await
    }

    /// After a commit of a handler's transaction: wakes the relay of this
    /// process if handlers recorded events. Best effort (processors share the
    /// flag, so one commit may take another's wake-up); the relay polls anyway.
    pub(crate) fn committed(&self) {
        if self.events_recorded.swap(false, Ordering::Relaxed) {
            txoutbox_core::wakeup::notify_committed();
        }
    }

    /// Whether the database answers; a handler error while it does not is an
    /// outage, not the event's fault, and must not use up the event's attempts.
    pub(crate) async fn db_reachable(&self) -> bool {
        let ping = sqlx::query("SELECT 1").execute(&self.pool);
        matches!(
            tokio::time::timeout(Duration::from_secs(5), ping).await,
            Ok(Ok(_))
        )
    }

    /// Runs the handler inside the producer's trace (from `traceparent`), then
    /// inserts the events it recorded into `outbox_event` in the same
    /// transaction. Callers call [`Shared::committed`] after committing `tx`.
    pub(crate) async fn call(
        &self,
        handler: &dyn ErasedHandler,
        tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
        event: super::handler::Decoded,
        meta: &EventMeta,
    ) -> Result<(), HandlerError> {
        // A traced event is handled inside its trace: an info span that is
        // the child of the publish span (feature `opentelemetry`); the others
        // get a debug span, as a trace is not started per message.
        let span = match meta.traceparent.as_deref() {
            Some(_) => tracing::info_span!(
                "outbox.handle",
                otel.kind = "consumer",
                handler = handler.name(),
                event_id = %meta.event_id,
                event_type = %meta.event_type,
            ),
            None => tracing::debug_span!(
                "outbox.handle",
                handler = handler.name(),
                event_id = %meta.event_id,
                event_type = %meta.event_type,
            ),
        };
        txoutbox_core::trace::follow_traceparent(&span, meta.traceparent.as_deref());
        let mut events = Events::new();
        let result = txoutbox_core::trace::with_traceparent(meta.traceparent.clone(), async {
            // A panic is this event's failure, not the consumer's: it is
            // caught, the transaction is rolled back by the caller, and the
            // attempt counts like any other failed one.
            AssertUnwindSafe(handler.call(tx, event, meta, &mut events))
                .catch_unwind()
                .await
                .unwrap_or_else(|panic| {
                    Err(HandlerError::new(format!(
                        "the handler panicked: {}",
                        panic_message(&*panic)
                    )))
                })?;
            if let Some(failure) = events.failure() {
                return Err(HandlerError::new(format!(
                    "an event the handler recorded cannot be stored: {failure}"
                )));
            }
            if !events.is_empty() {
                txoutbox_core::insert_events(tx, &events)
                    .await
                    .map_err(|e| {
                        HandlerError::new(format!(
                            "storing recorded events: {}",
                            txoutbox_core::DbErrorDisplay(&e)
                        ))
                    })?;
                self.events_recorded.store(true, Ordering::Relaxed);
            }
            Ok(())
        })
        .instrument(span)
        .await;
        if let Err(error) = &result {
            metrics::counter!(m::HANDLER_ERRORS, "group" => self.group(), "event_type" => meta.event_type.clone())
                .increment(1);
            tracing::warn!(%error, handler = handler.name(), event_id = %meta.event_id, "handler failed");
        }
        result
    }

    /// Publishes to the dead-letter topic, retrying until the broker takes it.
    /// False if the consumer is shutting down first.
    pub(crate) async fn dead_letter(
        &self,
        message: &OwnedMessage,
        reason: DeadLetterReason,
        error: &str,
    ) -> bool {
        let mut retry = 0;
        loop {
            match self.dlq.publish(message, reason, error).await {
                Ok(()) => {
                    metrics::counter!(m::DEAD_LETTERED, "group" => self.group(), "topic" => message.topic().to_owned(), "reason" => reason.as_str())
                        .increment(1);
                    Totals::add(&self.totals.dead_lettered, 1);
                    tracing::warn!(
                        topic = message.topic(),
                        partition = message.partition(),
                        offset = message.offset(),
                        %reason,
                        error,
                        "message dead-lettered"
                    );
                    return true;
                }
                Err(kafka) => {
                    retry += 1;
                    tracing::warn!(error = %kafka, dlq = %self.dlq.topic_for(message.topic()), "dead-letter publish failed; retrying");
                    if !self.pause(self.settings.backoff(retry)).await {
                        return false;
                    }
                }
            }
        }
    }

    /// Dead-letters or skips the messages set aside, in offset order, marking
    /// each finished; stops at the first one interrupted by shutdown.
    pub(crate) async fn set_aside(
        &self,
        batch: &[OwnedMessage],
        mut aside: Vec<(usize, Aside)>,
        done: &mut [bool],
    ) {
        aside.sort_by_key(|(index, _)| *index);
        for (index, what) in aside {
            let finished = match what {
                Aside::Dead(reason, error) => self.dead_letter(&batch[index], reason, &error).await,
                Aside::Skip(event_type) => {
                    metrics::counter!(m::UNKNOWN_SKIPPED, "group" => self.group(), "topic" => batch[index].topic().to_owned())
                        .increment(1);
                    Totals::add(&self.totals.skipped, 1);
                    tracing::debug!(
                        topic = batch[index].topic(),
                        event_type,
                        "no handler; skipped"
                    );
                    true
                }
            };
            if !finished {
                return;
            }
            done[index] = true;
        }
    }
}
