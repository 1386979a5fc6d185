//! What a saga handler can do besides changing its state.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{Postgres, Transaction};

use super::store::SagaDatabase;
use txoutbox_core::{DomainEvent, Events, OutboxRecord};
use uuid::Uuid;

use super::SagaStatus;
use crate::consumer::EventMeta;

/// The step's side of a saga handler: the transaction, the messages it
/// sends, the compensations it registers and how the saga ends.
///
/// Everything here happens in the step's transaction: messages are inserted
/// into `outbox_event` (or `outbox_scheduled`) only if the step commits,
/// together with the saga's new state and the incoming message's dedup row.
///
/// `DB` is the database the saga runs on: [`Postgres`] unless the saga's
/// handlers take `ctx: &mut SagaContext<'_, MySql>` (feature `mysql`).
pub struct SagaContext<'a, DB: SagaDatabase = Postgres> {
    pub(super) tx: &'a mut Transaction<'static, DB>,
    pub(super) events: &'a mut Events,
    pub(super) meta: &'a EventMeta,
    pub(super) saga_type: &'static str,
    pub(super) saga_id: String,
    pub(super) status: SagaStatus,
    pub(super) version: i64,
    /// Compensation messages of the steps done, in registration order.
    pub(super) compensations: Vec<OutboxRecord>,
    /// Compensations sent by this step (for the metric).
    pub(super) compensations_sent: usize,
    /// The first message that could not be recorded (fails the step).
    pub(super) failure: Option<txoutbox_core::Error>,
}

impl<DB: SagaDatabase> std::fmt::Debug for SagaContext<'_, DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SagaContext")
            .field("saga_type", &self.saga_type)
            .field("saga_id", &self.saga_id)
            .field("status", &self.status)
            .field("version", &self.version)
            .field("compensations", &self.compensations.len())
            .finish_non_exhaustive()
    }
}

impl<'a, DB: SagaDatabase> SagaContext<'a, DB> {
    /// The saga instance's id (`saga_state.saga_id`).
    pub fn saga_id(&self) -> &str {
        &self.saga_id
    }

    /// The saga type's name.
    pub fn saga_type(&self) -> &'static str {
        self.saga_type
    }

    /// The incoming message's metadata (event id, topic, headers...).
    pub fn meta(&self) -> &EventMeta {
        self.meta
    }

    /// The steps applied before this one (0 in a start handler).
    pub fn version(&self) -> i64 {
        self.version
    }

    /// The saga's status as this step leaves it so far.
    pub fn status(&self) -> SagaStatus {
        self.status
    }

    /// The step's transaction, for the service's own writes (they commit
    /// with the step, or not at all). Do not commit it.
    pub fn tx(&mut self) -> &mut Transaction<'static, DB> {
        self.tx
    }

    /// Sends a command or event through the outbox when the step commits.
    /// A message that cannot be serialized fails the step (like
    /// [`Events::record`]).
    pub fn send<M: DomainEvent>(&mut self, message: M) {
        self.events.record(message);
    }

    /// Sends a message through the outbox not before `delay` from now: a
    /// timeout of the saga (a message to itself, handled like any other) or
    /// a delayed command. Returns the message's event id, for
    /// [`cancel_scheduled`](Self::cancel_scheduled).
    pub fn send_after<M: DomainEvent>(&mut self, message: M, delay: Duration) -> Uuid {
        let id = message.event_id();
        self.events.record_after(message, delay);
        id
    }

    /// Like [`send_after`](Self::send_after), at a point in time.
    pub fn send_at<M: DomainEvent>(&mut self, message: M, at: DateTime<Utc>) -> Uuid {
        let id = message.event_id();
        self.events.record_at(message, at);
        id
    }

    /// Cancels a message scheduled by an earlier step (say, a timeout that
    /// is no longer needed). `false` if it was due already (it went to the
    /// outbox and will be delivered; the handler of a timeout should check
    /// the state anyway).
    pub async fn cancel_scheduled(&mut self, event_id: Uuid) -> Result<bool, sqlx::Error> {
        DB::cancel_scheduled(self.tx, event_id).await
    }

    /// Registers the compensation of the step just done (e.g. `ReleaseStock`
    /// once `StockReserved` arrived). It is stored with the saga and sent only
    /// if the saga is [compensated](Self::compensate), in reverse order of
    /// registration; [`complete`](Self::complete) drops it. A message that
    /// cannot be serialized fails the step.
    pub fn on_compensate<M: DomainEvent>(&mut self, message: M) {
        match OutboxRecord::from_event(&message) {
            Ok(record) => self.compensations.push(record),
            Err(error) => {
                self.failure.get_or_insert(error);
            }
        }
    }

    /// The compensations registered so far and not sent.
    pub fn pending_compensations(&self) -> usize {
        self.compensations.len()
    }

    /// Ends the saga as completed: the registered compensations are dropped;
    /// later messages of this saga are ignored.
    pub fn complete(&mut self) {
        self.compensations.clear();
        self.status = SagaStatus::Completed;
    }

    /// Ends the saga as compensated: sends every registered compensation,
    /// the last registered first, each once (with the event id it got when
    /// it was registered, so receivers deduplicate it like any message).
    /// Later messages of this saga are ignored.
    pub fn compensate(&mut self) {
        while let Some(record) = self.compensations.pop() {
            self.events.record_prepared(record);
            self.compensations_sent += 1;
        }
        self.status = SagaStatus::Compensated;
    }
}
