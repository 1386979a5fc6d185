use std::any::Any;
use std::fmt;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

use crate::{DomainEvent, Error, OutboxRecord};

/// An event recorded with [`Events::record_after`] or [`Events::record_at`]:
/// its outbox record and the time it is delivered not before.
///
/// The unit of work stores it in `outbox_scheduled`; the relay moves it into
/// `outbox_event` once `deliver_after` has passed (by the database's clock),
/// and publishes it from there like any other event. See `docs/relay.md`,
/// *Scheduled delivery*.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduledRecord {
    /// The event as it will be stored and published.
    pub record: OutboxRecord,
    /// Not published before this time.
    pub deliver_after: DateTime<Utc>,
}

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
///
/// # Scheduled events
///
/// [`record_after`](Events::record_after) and [`record_at`](Events::record_at)
/// record an event that is delivered **not before** a given time (a reminder,
/// a timeout, a retry of a business step). They are checked and serialized
/// exactly like [`record`](Events::record), are written in the same
/// transaction (into `outbox_scheduled`), and are listed by
/// [`scheduled`](Events::scheduled) rather than [`records`](Events::records).
///
/// ```
/// # use std::time::Duration;
/// # use txoutbox_core::{DomainEvent, Events};
/// # #[derive(serde::Serialize, schemars::JsonSchema, DomainEvent)]
/// # #[event(topic = "orders", aggregate = "Order")]
/// # struct PaymentTimedOut { event_id: uuid::Uuid, #[partition_key] order_id: u64 }
/// let mut events = Events::new();
/// events.record_after(
///     PaymentTimedOut { event_id: uuid::Uuid::new_v4(), order_id: 7 },
///     Duration::from_secs(15 * 60),
/// );
/// assert!(events.records().is_empty());
/// assert_eq!(events.scheduled().len(), 1);
/// assert!(events.scheduled()[0].deliver_after > chrono::Utc::now());
/// assert_eq!(events.len(), 1, "len counts both kinds");
/// assert_eq!(events.of_type::<PaymentTimedOut>()[0].order_id, 7);
/// ```
#[derive(Default)]
pub struct Events {
    records: Vec<OutboxRecord>,
    scheduled: Vec<ScheduledRecord>,
    // The recorded values themselves, immediate and scheduled, in recording
    // order, so tests can look them up by type without requiring
    // `Deserialize` on events.
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
        self.push(event, Vec::new(), None)
    }

    /// Gives the event recorded next headers of your own (a tenant, a
    /// correlation id, a routing hint), after its type's static ones
    /// (`#[event(headers(...))]`): call `record`, `try_record`,
    /// `record_after`, `record_at` (or their `try_` forms) on the result.
    ///
    /// They are checked when the event is recorded (see
    /// [`wire::user_headers_problem`](crate::wire::user_headers_problem):
    /// valid names that are not the framework's, at most
    /// [`MAX_USER_HEADERS`](crate::wire::MAX_USER_HEADERS) of them, values of
    /// at most [`MAX_USER_HEADER_VALUE_BYTES`](crate::wire::MAX_USER_HEADER_VALUE_BYTES));
    /// a refusal is [`Error::InvalidHeaders`], deferred by `record` like a
    /// serialization failure (the unit of work rolls back) or returned at once
    /// by `try_record`. They are stored with the row, published after the
    /// framework's headers, re-sent by `outbox replay`, and consumer handlers
    /// find them in `EventMeta::headers`.
    ///
    /// ```
    /// # use txoutbox_core::{DomainEvent, Error, Events};
    /// # #[derive(serde::Serialize, schemars::JsonSchema, DomainEvent)]
    /// # #[event(topic = "orders", aggregate = "Order")]
    /// # struct OrderCreated { event_id: uuid::Uuid, #[partition_key] order_id: u64 }
    /// let mut events = Events::new();
    /// events
    ///     .with_headers([("tenant", "acme"), ("correlation-id", "req-42")])
    ///     .record(OrderCreated { event_id: uuid::Uuid::new_v4(), order_id: 7 });
    /// assert_eq!(events.records()[0].headers[0], ("tenant".into(), "acme".into()));
    ///
    /// let refused = events
    ///     .with_headers([("event_type", "Other")])
    ///     .try_record(OrderCreated { event_id: uuid::Uuid::new_v4(), order_id: 8 });
    /// assert!(matches!(refused, Err(Error::InvalidHeaders { .. })));
    /// ```
    pub fn with_headers<I, N, V>(&mut self, headers: I) -> WithHeaders<'_>
    where
        I: IntoIterator<Item = (N, V)>,
        N: Into<String>,
        V: Into<String>,
    {
        WithHeaders {
            events: self,
            headers: headers
                .into_iter()
                .map(|(name, value)| (name.into(), value.into()))
                .collect(),
        }
    }

    /// Records `event` with `headers` (after its type's), now or not before `at`.
    fn push<E: DomainEvent>(
        &mut self,
        event: E,
        headers: Vec<(String, String)>,
        at: Option<DateTime<Utc>>,
    ) -> Result<(), Error> {
        let record = if headers.is_empty() {
            OutboxRecord::from_event(&event)?
        } else {
            OutboxRecord::from_event_with_headers(&event, headers)?
        };
        match at {
            None => self.records.push(record),
            Some(at) => self.scheduled.push(ScheduledRecord {
                record,
                deliver_after: at,
            }),
        }
        self.values.push(Box::new(event));
        Ok(())
    }

    fn defer(&mut self, result: Result<(), Error>) {
        if let Err(error) = result {
            self.failure.get_or_insert(error);
        }
    }

    /// Records `event` to be delivered not before `delay` from now (the
    /// application's clock, read at this call).
    ///
    /// The same checks as [`record`](Events::record), with the failure
    /// deferred the same way. A delay too large to represent is capped at
    /// the latest representable time (the event is then never delivered in
    /// practice; [`cancel_scheduled`](crate::cancel_scheduled) removes it).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use txoutbox_core::{DomainEvent, Events};
    /// # #[derive(serde::Serialize, schemars::JsonSchema, DomainEvent)]
    /// # #[event(topic = "carts", aggregate = "Cart")]
    /// # struct CartAbandoned { event_id: uuid::Uuid, #[partition_key] cart_id: u64 }
    /// let mut events = Events::new();
    /// let before = chrono::Utc::now();
    /// events.record_after(
    ///     CartAbandoned { event_id: uuid::Uuid::new_v4(), cart_id: 3 },
    ///     Duration::from_secs(3600),
    /// );
    /// let due = events.scheduled()[0].deliver_after;
    /// assert!(due >= before + chrono::TimeDelta::hours(1));
    /// ```
    pub fn record_after<E: DomainEvent>(&mut self, event: E, delay: Duration) {
        if let Err(error) = self.try_record_after(event, delay) {
            self.failure.get_or_insert(error);
        }
    }

    /// Records `event` to be delivered not before `at` (compared with the
    /// database's clock when the relay moves it; a time in the past means
    /// "as soon as the relay's scheduler next looks", within
    /// `schedule_poll_interval`).
    ///
    /// The same checks as [`record`](Events::record), with the failure
    /// deferred the same way.
    ///
    /// ```
    /// # use txoutbox_core::{DomainEvent, Events};
    /// # #[derive(serde::Serialize, schemars::JsonSchema, DomainEvent)]
    /// # #[event(topic = "subscriptions", aggregate = "Subscription")]
    /// # struct TrialEnded { event_id: uuid::Uuid, #[partition_key] subscription_id: u64 }
    /// let ends = chrono::Utc::now() + chrono::TimeDelta::days(14);
    /// let mut events = Events::new();
    /// events.record_at(TrialEnded { event_id: uuid::Uuid::new_v4(), subscription_id: 9 }, ends);
    /// assert_eq!(events.scheduled()[0].deliver_after, ends);
    /// ```
    pub fn record_at<E: DomainEvent>(&mut self, event: E, at: DateTime<Utc>) {
        if let Err(error) = self.try_record_at(event, at) {
            self.failure.get_or_insert(error);
        }
    }

    /// [`record_after`](Events::record_after), failing at once like
    /// [`try_record`](Events::try_record).
    pub fn try_record_after<E: DomainEvent>(
        &mut self,
        event: E,
        delay: Duration,
    ) -> Result<(), Error> {
        self.try_record_at(event, after(Utc::now(), delay))
    }

    /// [`record_at`](Events::record_at), failing at once like
    /// [`try_record`](Events::try_record).
    pub fn try_record_at<E: DomainEvent>(
        &mut self,
        event: E,
        at: DateTime<Utc>,
    ) -> Result<(), Error> {
        self.push(event, Vec::new(), Some(at))
    }

    /// The records to deliver at once, in the order they were recorded
    /// (which is also their order in `outbox_event`). Scheduled events are
    /// not among them: see [`scheduled`](Events::scheduled).
    pub fn records(&self) -> &[OutboxRecord] {
        &self.records
    }

    /// The events recorded with [`record_after`](Events::record_after) or
    /// [`record_at`](Events::record_at), in recording order.
    pub fn scheduled(&self) -> &[ScheduledRecord] {
        &self.scheduled
    }

    /// The recorded events of type `E`, immediate and scheduled, in
    /// recording order.
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

    /// Number of events recorded: immediate ([`records`](Events::records))
    /// and scheduled ([`scheduled`](Events::scheduled)) together.
    pub fn len(&self) -> usize {
        self.records.len() + self.scheduled.len()
    }

    /// Whether no event was recorded, immediate or scheduled.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty() && self.scheduled.is_empty()
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

/// The event recorded next, with headers of your own: made by
/// [`Events::with_headers`], used up by one of its `record` methods, each the
/// same as the [`Events`] method of the same name.
#[must_use = "the headers are given to the event recorded through this; call `record` on it"]
#[derive(Debug)]
pub struct WithHeaders<'a> {
    events: &'a mut Events,
    headers: Vec<(String, String)>,
}

impl WithHeaders<'_> {
    /// [`Events::record`] with these headers.
    pub fn record<E: DomainEvent>(self, event: E) {
        let result = self.events.push(event, self.headers, None);
        self.events.defer(result);
    }

    /// [`Events::try_record`] with these headers.
    pub fn try_record<E: DomainEvent>(self, event: E) -> Result<(), Error> {
        self.events.push(event, self.headers, None)
    }

    /// [`Events::record_after`] with these headers.
    pub fn record_after<E: DomainEvent>(self, event: E, delay: Duration) {
        self.record_at(event, after(Utc::now(), delay));
    }

    /// [`Events::try_record_after`] with these headers.
    pub fn try_record_after<E: DomainEvent>(self, event: E, delay: Duration) -> Result<(), Error> {
        self.try_record_at(event, after(Utc::now(), delay))
    }

    /// [`Events::record_at`] with these headers.
    pub fn record_at<E: DomainEvent>(self, event: E, at: DateTime<Utc>) {
        let result = self.events.push(event, self.headers, Some(at));
        self.events.defer(result);
    }

    /// [`Events::try_record_at`] with these headers.
    pub fn try_record_at<E: DomainEvent>(self, event: E, at: DateTime<Utc>) -> Result<(), Error> {
        self.events.push(event, self.headers, Some(at))
    }
}

/// `now + delay`, capped at the latest time `DateTime<Utc>` can hold.
fn after(now: DateTime<Utc>, delay: Duration) -> DateTime<Utc> {
    TimeDelta::from_std(delay)
        .ok()
        .and_then(|delay| now.checked_add_signed(delay))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

impl fmt::Debug for Events {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Events")
            .field("records", &self.records)
            .field("scheduled", &self.scheduled)
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

    #[test]
    fn scheduled_events_are_kept_apart_in_order_and_found_by_type() {
        let mut events = Events::new();
        let at = Utc::now() + TimeDelta::minutes(5);
        events.record_at(
            Created {
                event_id: Uuid::new_v4(),
                id: 1,
            },
            at,
        );
        events.record(Created {
            event_id: Uuid::new_v4(),
            id: 2,
        });
        let before = Utc::now();
        events.record_after(Other { n: 3 }, Duration::from_secs(60));
        let after_call = Utc::now();

        assert_eq!(events.len(), 3, "both kinds count");
        assert!(!events.is_empty());
        assert_eq!(events.records().len(), 1);
        assert_eq!(events.records()[0].payload["id"], 2);
        let scheduled = events.scheduled();
        assert_eq!(scheduled.len(), 2);
        assert_eq!(scheduled[0].record.event_type, "Created");
        assert_eq!(scheduled[0].deliver_after, at);
        assert_eq!(scheduled[1].record.event_type, "Other");
        let due = scheduled[1].deliver_after;
        assert!(
            due >= before + TimeDelta::seconds(60) && due <= after_call + TimeDelta::seconds(60),
            "{due} not 60 s after the call"
        );
        let ids: Vec<_> = events.of_type::<Created>().iter().map(|e| e.id).collect();
        assert_eq!(ids, [1, 2], "scheduled and immediate, in recording order");
        assert_eq!(events.of_type::<Other>()[0].n, 3);
    }

    #[test]
    fn only_scheduled_events_make_a_non_empty_collector() {
        let mut events = Events::new();
        events.record_after(Other { n: 1 }, Duration::ZERO);
        assert_eq!(events.len(), 1);
        assert!(!events.is_empty());
        assert!(events.records().is_empty());
    }

    #[test]
    fn scheduled_serialization_failures_are_deferred_or_returned_like_record() {
        let mut events = Events::new();
        events.record_after(NotAnObject("a"), Duration::from_secs(1));
        events.record_at(NotAnObject("b"), Utc::now());
        assert!(events.is_empty(), "nothing recorded");
        assert!(matches!(
            events.take_failure(),
            Err(Error::PayloadNotObject {
                found: "a string",
                ..
            })
        ));
        assert!(events.take_failure().is_ok(), "the first failure only");

        let err = events
            .try_record_at(
                Keyed {
                    key: "k".repeat(crate::MAX_PARTITION_KEY_BYTES + 1),
                },
                Utc::now(),
            )
            .unwrap_err();
        assert!(matches!(err, Error::PartitionKeyTooLong { .. }), "{err:?}");
        assert!(
            events
                .try_record_after(NotAnObject("c"), Duration::from_secs(1))
                .is_err()
        );
        assert!(events.is_empty());
        assert!(events.failure().is_none(), "try_* defers nothing");
        events
            .try_record_after(Other { n: 1 }, Duration::from_secs(1))
            .unwrap();
        assert_eq!(events.scheduled().len(), 1);
    }

    #[test]
    fn a_delay_too_large_to_represent_is_capped() {
        let now = Utc::now();
        assert_eq!(after(now, Duration::MAX), DateTime::<Utc>::MAX_UTC);
        assert_eq!(
            after(now, Duration::from_secs(u64::MAX / 4)),
            DateTime::<Utc>::MAX_UTC
        );
        assert_eq!(
            after(now, Duration::from_millis(1500)),
            now + TimeDelta::milliseconds(1500)
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
