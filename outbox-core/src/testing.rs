//! Test support: run a command handler against a real database without
//! leaving anything behind, and inspect the events it recorded.

use sqlx::{Postgres, Transaction};

use crate::{
    AfterCommit, DomainEvent, Error, Events, OutboxRecord, ScheduledRecord, TransactionSource,
};

/// Runs `handler` in a transaction that is always rolled back, and returns
/// what it returned together with the events it recorded.
///
/// The recorded events are also inserted (into `outbox_event`, and
/// `outbox_scheduled` for scheduled ones) before the rollback, exactly as the
/// unit of work would, so a test still fails on an
/// event that cannot be serialized or stored (the `Err` of this function).
/// The database is left unchanged either way.
///
/// With `#[outbox_handler]`, call the generated `<name>_in_tx` function, which
/// takes the transaction and collector explicitly:
///
/// ```no_run
/// # #[derive(serde::Serialize, schemars::JsonSchema, txoutbox_core::DomainEvent)]
/// # #[event(topic = "orders", aggregate = "Order")]
/// # struct OrderCreated { event_id: uuid::Uuid, #[partition_key] order_id: i64 }
/// use txoutbox_core::{Events, outbox_handler};
/// use sqlx::{Postgres, Transaction};
///
/// #[outbox_handler]
/// async fn create_order(
///     tx: &mut Transaction<'_, Postgres>,
///     events: &mut Events,
///     order_id: i64,
/// ) -> Result<i64, txoutbox_core::Error> {
///     events.record(OrderCreated { event_id: uuid::Uuid::new_v4(), order_id });
///     Ok(order_id)
/// }
///
/// # async fn t(pool: sqlx::PgPool) {
/// let run = txoutbox_core::testing::record_events(&pool, async |tx, events| {
///     create_order_in_tx(tx, events, 7).await
/// })
/// .await
/// .unwrap();
/// assert_eq!(run.output.as_ref().unwrap(), &7);
/// let created = run.assert_count::<OrderCreated>(1);
/// assert_eq!(created[0].order_id, 7);
/// # }
/// ```
pub async fn record_events<S, R, F>(mut source: S, handler: F) -> Result<Recorded<R>, Error>
where
    S: TransactionSource,
    F: AsyncFnOnce(&mut Transaction<'_, Postgres>, &mut Events) -> R,
{
    let mut tx = source.begin_transaction(None).await?;
    let mut events = Events::new();
    let output = handler(&mut tx, &mut events).await;
    // As the unit of work does: a deferred serialization failure, or a
    // handler that swallowed a database error and left the transaction
    // aborted (which would commit nothing), fails the run.
    let stored = events.write_last(&mut tx).await;
    tx.rollback().await?;
    // Rolled back: there is nothing to wake a relay for.
    let _rolled_back: AfterCommit = stored?;
    Ok(Recorded { output, events })
}

/// What [`record_events`] observed: the handler's return value and its events.
#[derive(Debug)]
pub struct Recorded<R> {
    /// What the handler returned (typically its `Result`).
    pub output: R,
    /// The events it recorded.
    pub events: Events,
}

impl<R> Recorded<R> {
    /// The outbox records to deliver at once, in recording order.
    pub fn records(&self) -> &[OutboxRecord] {
        self.events.records()
    }

    /// The scheduled events ([`Events::record_after`], [`Events::record_at`]),
    /// in recording order.
    pub fn scheduled(&self) -> &[ScheduledRecord] {
        self.events.scheduled()
    }

    /// The recorded events of type `E` (immediate and scheduled); panics if
    /// there is none.
    #[track_caller]
    pub fn assert_recorded<E: DomainEvent>(&self) -> Vec<&E> {
        let found = self.events.of_type::<E>();
        assert!(
            !found.is_empty(),
            "expected at least one `{}` event, recorded: {:?}",
            E::EVENT_TYPE,
            self.event_types()
        );
        found
    }

    /// The recorded events of type `E`; panics unless there are exactly `count`.
    #[track_caller]
    pub fn assert_count<E: DomainEvent>(&self, count: usize) -> Vec<&E> {
        let found = self.events.of_type::<E>();
        assert_eq!(
            found.len(),
            count,
            "expected {count} `{}` event(s), recorded: {:?}",
            E::EVENT_TYPE,
            self.event_types()
        );
        found
    }

    /// Panics if any event was recorded.
    #[track_caller]
    pub fn assert_none(&self) {
        assert!(
            self.events.is_empty(),
            "expected no events, recorded: {:?}",
            self.event_types()
        );
    }

    fn event_types(&self) -> Vec<&str> {
        let scheduled = self.scheduled().iter().map(|s| &s.record);
        self.records()
            .iter()
            .chain(scheduled)
            .map(|r| r.event_type.as_str())
            .collect()
    }
}
