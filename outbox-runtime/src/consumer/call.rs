//! Calling a user's handler: inside the producer's trace, at most for the
//! handler timeout, a panic caught, then the events it recorded written in
//! its transaction; and what is left to do after that transaction commits.

use std::time::Duration;

use futures::FutureExt;
use tracing::Instrument;
use txoutbox_core::__private::wakeup::{self, Scope};
use txoutbox_core::{AfterCommit, Events};

use super::counts::{Counts, FailedCall};
use super::database::TxRef;
use super::handler::{CallInput, ErasedHandler, EventMeta, HandlerError};
use crate::lifecycle::catch;

/// The handler calls of one consumer (its receive loop and its processors).
pub(crate) struct Calls {
    handler_timeout: Duration,
    /// The consumer's database, whose relays its commits wake.
    wakeup_scope: Option<Scope>,
    counts: Counts,
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

impl Calls {
    pub(crate) fn new(
        handler_timeout: Duration,
        counts: Counts,
        wakeup_scope: Option<Scope>,
    ) -> Self {
        Self {
            handler_timeout,
            wakeup_scope,
            counts,
        }
    }

    /// After the commit of a transaction whose handlers' calls returned
    /// `after` (their [`AfterCommit`]s together): wakes the relays of this
    /// process on the consumer's database if they recorded events. Each
    /// transaction signals its own commit: a relay that trusts the signals
    /// (see `docs/relay.md`, adaptive polling) must not find rows no signal
    /// announced.
    pub(crate) fn committed(&self, after: AfterCommit) {
        if after.rows() > 0 {
            wakeup::notify_committed_in(self.wakeup_scope);
        }
    }

    /// The failure of `handler`'s call when the transaction it had turned
    /// out unable to commit (`error` is [`txoutbox_core::Error::TransactionAborted`]
    /// or `TransactionEnded`; on MySQL `TransactionLost`, a deadlock rolled it
    /// back, which is transient): the handler returned `Ok` regardless.
    pub(crate) fn left_unusable(
        &self,
        handler: &dyn ErasedHandler,
        meta: &EventMeta,
        error: &txoutbox_core::Error,
    ) -> HandlerError {
        #[cfg(feature = "mysql")]
        let lost = matches!(error, txoutbox_core::Error::TransactionLost);
        #[cfg(not(feature = "mysql"))]
        let lost = false;
        let mut error = HandlerError::new(format!(
            "handler `{}` returned Ok, but {error}",
            handler.name()
        ));
        if lost {
            error = error.into_transient();
        }
        self.counts.handler_failed(&FailedCall {
            handler: handler.name(),
            event_type: &meta.event_type,
            event_id: meta.event_id,
            error: &error,
            timed_out: false,
        });
        error
    }

    /// Runs the handler inside the producer's trace (from `traceparent`), at
    /// most for the handler timeout, then writes the events it recorded in
    /// the same transaction ([`Events::write`]). Returns what is left to do
    /// once `tx` commits: callers gather it per transaction (of the calls
    /// whose work stayed in it) and pass it to [`Calls::committed`].
    ///
    /// A handler that returns `Ok` on a transaction it left aborted is found
    /// out by the framework's next statement on it: the insert of its events
    /// here, or the caller's savepoint release or commit check.
    pub(crate) async fn call(
        &self,
        handler: &dyn ErasedHandler,
        mut tx: TxRef<'_>,
        event: super::handler::Decoded,
        meta: &EventMeta,
    ) -> Result<AfterCommit, HandlerFailure> {
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
        let timeout = self.handler_timeout;
        let result = txoutbox_core::trace::with_traceparent(meta.traceparent.clone(), async {
            // A panic is this event's failure, not the consumer's: it is
            // caught, the transaction is rolled back by the caller, and the
            // attempt counts like any other failed one.
            let called = catch(handler.call(CallInput {
                tx: tx.reborrow(),
                event,
                meta,
                events: &mut events,
            }))
            .map(|ended| {
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
            match tx.write_events(&mut events).await {
                Ok(after_commit) => Ok(after_commit),
                Err(error) => Err(failed(match error {
                    unusable @ (txoutbox_core::Error::TransactionAborted
                    | txoutbox_core::Error::TransactionEnded) => HandlerError::new(format!(
                        "handler `{}` returned Ok, but {unusable}",
                        handler.name()
                    )),
                    // MySQL rolled the transaction back under the handler
                    // (a deadlock it swallowed): run it again, uncounted.
                    #[cfg(feature = "mysql")]
                    lost @ txoutbox_core::Error::TransactionLost => HandlerError::new(format!(
                        "handler `{}` returned Ok, but {lost}",
                        handler.name()
                    ))
                    .into_transient(),
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
            self.counts.handler_failed(&FailedCall {
                handler: handler.name(),
                event_type: &meta.event_type,
                event_id: meta.event_id,
                error: &failure.error,
                timed_out: failure.timed_out,
            });
        }
        result
    }
}
