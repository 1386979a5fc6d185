//! What the receive loop, dedup mode and the inbox processors share: the
//! pool, the dispatch table, the settings, the dead-letter producer, and the
//! steps every mode takes (opening a transaction, calling a handler, backing
//! off, counting).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::FutureExt;
use sqlx::{PgPool, Postgres, Transaction};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use txoutbox_core::{AfterCommit, Events};

use super::config::Settings;
use super::dlq::DeadLetters;
use super::handler::{Dispatch, ErasedHandler, EventMeta, HandlerError};
use super::summary::Totals;
use super::telemetry as m;
use crate::lifecycle::catch;

/// State shared by the receiving loop and the inbox processors.
pub(crate) struct Shared {
    pub(crate) pool: PgPool,
    pub(crate) dispatch: Dispatch,
    pub(crate) settings: Settings,
    pub(crate) dlq: DeadLetters,
    /// Wakes idle inbox processors when rows were stored.
    pub(crate) stored: Notify,
    pub(crate) token: CancellationToken,
    /// What the events handlers wrote and not committed yet leave to do
    /// after the commit (see [`Shared::committed`]).
    after_commit: Mutex<AfterCommit>,
    /// What the consumer did so far, for its summary (shared with its handle).
    pub(crate) totals: Arc<Totals>,
    /// How every transaction of the consumer begins (see [`Shared::begin`]).
    begin_statement: Arc<str>,
}

/// A handler call that failed: its error, and whether it was abandoned at
/// the handler timeout (such a call is not run again in the same pass).
#[derive(Debug)]
pub(crate) struct HandlerFailure {
    pub(crate) error: HandlerError,
    pub(crate) timed_out: bool,
}

impl std::fmt::Display for HandlerFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl Shared {
    pub(crate) fn new(
        pool: PgPool,
        dispatch: Dispatch,
        settings: Settings,
        dlq: DeadLetters,
    ) -> Self {
        let begin_statement = begin_statement(settings.handler_timeout).into();
        Self {
            pool,
            dispatch,
            settings,
            dlq,
            stored: Notify::new(),
            token: CancellationToken::new(),
            after_commit: Mutex::default(),
            totals: Arc::default(),
            begin_statement,
        }
    }

    pub(crate) fn group(&self) -> String {
        self.settings.group_id.clone()
    }

    /// Opens one of the consumer's transactions: `READ COMMITTED`, whatever
    /// the database's or role's default, because the inbox triggers and the
    /// dedup and saga statements need a fresh snapshot per statement (under
    /// `REPEATABLE READ` a trigger could miss a pending row committed
    /// meanwhile, and `ON CONFLICT` on a row committed after the snapshot
    /// fails with a serialization error); and with `statement_timeout` set to
    /// the handler timeout. Both in the `BEGIN` round trip.
    pub(crate) async fn begin(&self) -> sqlx::Result<Transaction<'static, Postgres>> {
        self.pool
            .begin_with(sqlx::AssertSqlSafe(Arc::clone(&self.begin_statement)))
            .await
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

    /// Counts a message skipped by the unknown-event policy.
    pub(crate) fn count_skipped(&self, topic: &str, event_type: &str) {
        metrics::counter!(m::UNKNOWN_SKIPPED, "group" => self.group(), "topic" => topic.to_owned())
            .increment(1);
        Totals::add(&self.totals.skipped, 1);
        tracing::debug!(topic, event_type, "no handler; skipped");
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
        self.pause(self.settings.backoff.delay(*retry)).await
    }

    /// After a commit of a handler's transaction: wakes the relay of this
    /// process if handlers recorded events. Best effort (processors share the
    /// pending wake-up, so one commit may take another's); the relay polls
    /// anyway.
    pub(crate) fn committed(&self) {
        let pending = std::mem::take(&mut *self.pending_after_commit());
        pending.committed();
    }

    fn pending_after_commit(&self) -> std::sync::MutexGuard<'_, AfterCommit> {
        // Nothing panics while holding the lock; a poisoned one is still a
        // number of rows.
        self.after_commit
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
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

    /// The failure of `handler`'s call when the transaction it had turned
    /// out unable to commit (`error` is [`txoutbox_core::Error::TransactionAborted`]
    /// or `TransactionEnded`): the handler returned `Ok` regardless.
    pub(crate) fn left_unusable(
        &self,
        handler: &dyn ErasedHandler,
        meta: &EventMeta,
        error: &txoutbox_core::Error,
    ) -> HandlerError {
        let error = HandlerError::new(format!(
            "handler `{}` returned Ok, but {error}",
            handler.name()
        ));
        self.count_failure(handler, meta, &error, false);
        error
    }

    fn count_failure(
        &self,
        handler: &dyn ErasedHandler,
        meta: &EventMeta,
        error: &HandlerError,
        timed_out: bool,
    ) {
        let event_type = meta.event_type.clone();
        metrics::counter!(m::HANDLER_ERRORS, "group" => self.group(), "event_type" => event_type.clone())
            .increment(1);
        if timed_out {
            metrics::counter!(m::HANDLER_TIMEOUTS, "group" => self.group(), "event_type" => event_type)
                .increment(1);
        }
        tracing::warn!(%error, handler = handler.name(), event_id = %meta.event_id, "handler failed");
    }

    /// Runs the handler inside the producer's trace (from `traceparent`), at
    /// most for the handler timeout, then writes the events it recorded in
    /// the same transaction ([`Events::write`]). Callers call
    /// [`Shared::committed`] after committing `tx`.
    ///
    /// A handler that returns `Ok` on a transaction it left aborted is found
    /// out by the framework's next statement on it: the insert of its events
    /// here, or the caller's savepoint release or commit check.
    pub(crate) async fn call(
        &self,
        handler: &dyn ErasedHandler,
        tx: &mut Transaction<'static, Postgres>,
        event: super::handler::Decoded,
        meta: &EventMeta,
    ) -> Result<(), HandlerFailure> {
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
        let timeout = self.settings.handler_timeout;
        let result = txoutbox_core::trace::with_traceparent(meta.traceparent.clone(), async {
            // A panic is this event's failure, not the consumer's: it is
            // caught, the transaction is rolled back by the caller, and the
            // attempt counts like any other failed one.
            let called = catch(handler.call(tx, event, meta, &mut events)).map(|ended| {
                ended.unwrap_or_else(|panic| {
                    Err(HandlerError::new(format!("the handler panicked: {panic}")))
                })
            });
            match tokio::time::timeout(timeout, called).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    return Err(HandlerFailure {
                        error,
                        timed_out: false,
                    });
                }
                Err(_) => {
                    return Err(HandlerFailure {
                        error: HandlerError::new(format!(
                            "handler `{}` did not return within {timeout:?} (the consumer's \
                             handler_timeout): the call was abandoned and its transaction rolled \
                             back; bound what the handler awaits (HTTP calls, locks) or raise the \
                             timeout",
                            handler.name()
                        )),
                        timed_out: true,
                    });
                }
            }
            let failed = |error: HandlerError| HandlerFailure {
                error,
                timed_out: false,
            };
            match events.write(tx).await {
                Ok(after_commit) => {
                    // Most handlers record nothing: no lock for them.
                    if after_commit.rows() > 0 {
                        let mut pending = self.pending_after_commit();
                        *pending = pending.and(after_commit);
                    }
                    Ok(())
                }
                Err(error) => Err(failed(match error {
                    unusable @ (txoutbox_core::Error::TransactionAborted
                    | txoutbox_core::Error::TransactionEnded) => HandlerError::new(format!(
                        "handler `{}` returned Ok, but {unusable}",
                        handler.name()
                    )),
                    txoutbox_core::Error::Database(error) => HandlerError::new(format!(
                        "storing recorded events: {}",
                        txoutbox_core::DbErrorDisplay(&error)
                    )),
                    // The deferred failure of `Events::record`.
                    failure => HandlerError::new(format!(
                        "an event the handler recorded cannot be stored: {failure}"
                    )),
                })),
            }
        })
        .instrument(span)
        .await;
        if let Err(failure) = &result {
            self.count_failure(handler, meta, &failure.error, failure.timed_out);
        }
        result
    }
}

/// The statement that opens each of a consumer's transactions: `READ
/// COMMITTED` and, unless the timeout is off, a `statement_timeout` of the
/// handler timeout (`SET LOCAL`: it ends with the transaction).
fn begin_statement(handler_timeout: Duration) -> String {
    const BEGIN: &str = crate::txn::BEGIN;
    match i32::try_from(handler_timeout.as_millis()) {
        Ok(millis) if millis > 0 => format!("{BEGIN}; SET LOCAL statement_timeout = {millis}"),
        _ => BEGIN.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transactions_state_their_isolation_and_bound_their_statements() {
        assert_eq!(
            begin_statement(Duration::from_secs(30)),
            "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL statement_timeout = 30000"
        );
        assert_eq!(
            begin_statement(Duration::MAX),
            "BEGIN ISOLATION LEVEL READ COMMITTED"
        );
    }
}
