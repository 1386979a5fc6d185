use std::any::Any;
use std::fmt;

use crate::{DomainEvent, Error, OutboxRecord};

/// The event collector a command handler records its domain events into.
///
/// A handler receives `&mut Events` next to its transaction and calls
/// [`record`](Events::record) for every event the command produced, of any
/// [`DomainEvent`] type and as many as it likes. Nothing is sent anywhere:
/// the unit of work inserts the recorded events into `outbox_event` at the end
/// of the same transaction, after the handler's own writes, and
/// the relay publishes them after the commit.
///
/// Each event is serialized when it is recorded, so its payload is the state
/// of the value at that moment, and it carries the W3C trace context current
/// at that moment ([`crate::trace::current_traceparent`]).
///
/// # Serialization failures
///
/// [`record`](Events::record) never fails on the spot, so handlers stay free of
/// error plumbing for what is a programming error (an event whose `Serialize`
/// impl fails, or that is not a JSON object). The first such failure is kept
/// and the unit of work fails with it **before anything is inserted or
/// committed**: the whole command rolls back and the caller gets the
/// [`Error`] converted into its own error type. A partition key longer than
/// [`MAX_PARTITION_KEY_BYTES`](crate::MAX_PARTITION_KEY_BYTES) is refused the
/// same way ([`Error::PartitionKeyTooLong`]). Use
/// [`try_record`](Events::try_record) to handle the failure inside the handler.
///
/// ```
/// # use txoutbox_core::{DomainEvent, Events};
/// # #[derive(serde::Serialize, schemars::JsonSchema, DomainEvent)]
/// # #[event(topic = "orders", aggregate = "Order")]
/// # struct OrderCreated { event_id: uuid::Uuid, #[partition_key] order_id: u64 }
/// let mut events = Events::new();
/// events.record(OrderCreated { event_id: uuid::Uuid::new_v4(), order_id: 7 });
/// assert_eq!(events.len(), 1);
/// assert_eq!(events.records()[0].partition_key, "7");
/// assert_eq!(events.of_type::<OrderCreated>()[0].order_id, 7);
/// ```
#[derive(Default)]
pub struct Events {
    records: Vec<OutboxRecord>,
    // The recorded values themselves, parallel to `records`, so tests can look
    // them up by type without requiring `Deserialize` on events.
    values: Vec<Box<dyn Any + Send + Sync>>,
    failure: Option<Error>,
}

impl Events {
    /// An empty collector. The unit of work creates one per attempt; you need
    /// this only to call a handler's `*_in_tx` function by hand.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `event` to be written to the outbox when the transaction commits.
    ///
    /// A serialization failure is deferred: see the [type docs](Events#serialization-failures).
    pub fn record<E: DomainEvent>(&mut self, event: E) {
        if let Err(error) = self.try_record(event) {
            self.failure.get_or_insert(error);
        }
    }

    /// Records `event`, failing at once if it cannot be serialized or its
    /// partition key is too long.
    ///
    /// A failed event is not recorded and does not fail the unit of work by
    /// itself; propagate the error with `?` to roll back.
    pub fn try_record<E: DomainEvent>(&mut self, event: E) -> Result<(), Error> {
        let record = OutboxRecord::from_event(&event)?;
        self.records.push(record);
        self.values.push(Box::new(event));
        Ok(())
    }

    /// The records so far, in the order they were recorded (which is also
    /// their order in `outbox_event`).
    pub fn records(&self) -> &[OutboxRecord] {
        &self.records
    }

    /// The recorded events of type `E`, in recording order.
    pub fn of_type<E: DomainEvent>(&self) -> Vec<&E> {
        self.values
            .iter()
            .filter_map(|value| value.downcast_ref::<E>())
            .collect()
    }

    /// Records an already built record (say, one stored earlier, like a
    /// saga's compensation): it is written as it is, with its event id.
    /// [`of_type`](Events::of_type) does not see it.
    pub fn record_prepared(&mut self, record: OutboxRecord) {
        self.records.push(record);
        self.values.push(Box::new(()));
    }

    /// Number of events recorded.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether no event was recorded.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The deferred serialization failure of [`record`](Events::record), if any.
    pub fn failure(&self) -> Option<&Error> {
        self.failure.as_ref()
    }

    /// The deferred failure of [`record`](Events::record) that must abort the
    /// unit of work, taken out (`Ok` if every event serialized).
    pub(crate) fn take_failure(&mut self) -> Result<(), Error> {
        match self.failure.take() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
}

impl fmt::Debug for Events {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Events")
            .field("records", &self.records)
            .field("failure", &self.failure)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use serde::Serialize;
    use uuid::Uuid;

    use super::*;

    // Hand-written `DomainEvent` impls on purpose: a derived event registers
    // itself in this test binary's schema registry, whose exact contents
    // `schema::tests::registry_lists_submitted_events_sorted` asserts.

    #[derive(Serialize)]
    struct Created {
        event_id: Uuid,
        id: u32,
    }

    impl DomainEvent for Created {
        const TOPIC: &'static str = "things";
        const EVENT_TYPE: &'static str = "Created";
        const AGGREGATE_TYPE: &'static str = "Thing";
        const PARTITION_KEY_FIELD: &'static str = "id";
        fn event_id(&self) -> Uuid {
            self.event_id
        }
        fn aggregate_id(&self) -> String {
            self.id.to_string()
        }
        fn partition_key(&self) -> String {
            self.id.to_string()
        }
    }

    /// Serializes to a JSON string, which the outbox refuses.
    #[derive(Serialize)]
    struct NotAnObject(&'static str);

    impl DomainEvent for NotAnObject {
        const TOPIC: &'static str = "things";
        const EVENT_TYPE: &'static str = "NotAnObject";
        const AGGREGATE_TYPE: &'static str = "Thing";
        const PARTITION_KEY_FIELD: &'static str = "";
        fn event_id(&self) -> Uuid {
            Uuid::nil()
        }
        fn aggregate_id(&self) -> String {
            String::new()
        }
        fn partition_key(&self) -> String {
            String::new()
        }
    }

    #[test]
    fn keeps_order_and_types() {
        let mut events = Events::new();
        events.record(Created {
            event_id: Uuid::new_v4(),
            id: 1,
        });
        events.record(Other { n: 2 });
        events.record(Created {
            event_id: Uuid::new_v4(),
            id: 3,
        });
        assert_eq!(events.len(), 3);
        let types: Vec<_> = events.records().iter().map(|r| &r.event_type).collect();
        assert_eq!(types, ["Created", "Other", "Created"]);
        let ids: Vec<_> = events.of_type::<Created>().iter().map(|e| e.id).collect();
        assert_eq!(ids, [1, 3]);
        assert!(events.failure().is_none());
    }

    #[test]
    fn serialization_failure_is_deferred_and_first_wins() {
        let mut events = Events::new();
        events.record(NotAnObject("a"));
        events.record(Created {
            event_id: Uuid::new_v4(),
            id: 1,
        });
        events.record(NotAnObject("b"));
        assert_eq!(events.len(), 1, "the failed events are not recorded");
        let err = events.take_failure().unwrap_err();
        assert!(matches!(
            err,
            Error::PayloadNotObject {
                event_type: "NotAnObject",
                found: "a string"
            }
        ));
        assert!(events.take_failure().is_ok());
    }

    #[test]
    fn try_record_fails_at_once() {
        let mut events = Events::new();
        assert!(events.try_record(NotAnObject("a")).is_err());
        assert!(events.is_empty());
        assert!(events.failure().is_none());
    }

    #[derive(Serialize)]
    struct Keyed {
        key: String,
    }

    impl DomainEvent for Keyed {
        const TOPIC: &'static str = "things";
        const EVENT_TYPE: &'static str = "Keyed";
        const AGGREGATE_TYPE: &'static str = "Thing";
        const PARTITION_KEY_FIELD: &'static str = "key";
        fn event_id(&self) -> Uuid {
            Uuid::new_v4()
        }
        fn aggregate_id(&self) -> String {
            self.key.clone()
        }
        fn partition_key(&self) -> String {
            self.key.clone()
        }
    }

    #[test]
    fn a_partition_key_over_the_limit_is_refused_and_fails_the_unit_of_work() {
        let max = crate::MAX_PARTITION_KEY_BYTES;
        let mut events = Events::new();
        // Multi-byte characters: the limit is in bytes, not characters.
        events.record(Keyed {
            key: "é".repeat(max / 2),
        });
        events.record(Keyed {
            key: "é".repeat(max / 2) + "x",
        });
        assert_eq!(events.len(), 1, "the over-long key is not recorded");
        let err = events.take_failure().unwrap_err();
        assert!(
            matches!(
                err,
                Error::PartitionKeyTooLong { event_type: "Keyed", len, max: m } if len == max + 1 && m == max
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("MAX_PARTITION_KEY_BYTES"), "{err}");
        assert!(
            events
                .try_record(Keyed {
                    key: "k".repeat(max + 1)
                })
                .is_err()
        );
    }

    #[derive(Serialize)]
    struct Other {
        n: u32,
    }

    impl DomainEvent for Other {
        const TOPIC: &'static str = "others";
        const EVENT_TYPE: &'static str = "Other";
        const AGGREGATE_TYPE: &'static str = "Thing";
        const PARTITION_KEY_FIELD: &'static str = "n";
        fn event_id(&self) -> Uuid {
            Uuid::new_v4()
        }
        fn aggregate_id(&self) -> String {
            self.n.to_string()
        }
        fn partition_key(&self) -> String {
            self.n.to_string()
        }
    }
}
