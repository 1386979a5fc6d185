//! The handler contract and the type-erased dispatch table built from it.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::de::DeserializeOwned;
use sqlx::{Postgres, Transaction};
use txoutbox_core::{DbErrorDisplay, DomainEvent, Events};
use uuid::Uuid;

use super::database::TxRef;

/// What a handler knows about the message it handles, besides the event.
///
/// Take it as an optional third parameter of an `#[event_handler]` function:
///
/// ```ignore
/// #[event_handler]
/// async fn on_paid(tx: &mut Transaction<'_, Postgres>, event: PaymentCompleted, meta: &EventMeta)
///     -> Result<(), sqlx::Error> { /* meta.event_id, meta.headers ... */ Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EventMeta {
    /// The event id (from the payload's `event_id`, the key receivers dedup on).
    pub event_id: Uuid,
    /// The resolved event type (header, payload field, or the topic's only handler).
    pub event_type: String,
    /// The topic the message came from.
    pub topic: String,
    /// The Kafka partition; `None` when replayed from the inbox table.
    pub partition: Option<i32>,
    /// The Kafka offset; `None` when replayed from the inbox table.
    pub offset: Option<i64>,
    /// The record key as text, if any.
    pub key: Option<String>,
    /// The message headers (UTF-8 values only), in order.
    pub headers: Vec<(String, String)>,
    /// The W3C `traceparent` header, if any; the handler runs inside this trace.
    pub traceparent: Option<String>,
    /// Which attempt at handling the event this is: 1 the first time, one
    /// more after each failed attempt (an attempt cut short by a database
    /// outage does not count, nor, in inbox mode, a failed call on receipt).
    pub attempt: u32,
    /// The consumer's [`max_attempts`](super::ConsumerBuilder::max_attempts):
    /// if the attempt numbered so fails, the event is dead-lettered (dedup
    /// mode) or parked (inbox mode). See [`is_last_attempt`](Self::is_last_attempt).
    pub max_attempts: u32,
}

impl EventMeta {
    /// Metadata with only the event's identity, for calling a handler directly
    /// (in a unit test, say) through [`EventHandler::handle`]: attempt 1 of 1.
    ///
    /// ```
    /// let meta = txoutbox_runtime::consumer::EventMeta::new(uuid::Uuid::nil(), "Paid", "payments");
    /// assert_eq!(meta.partition, None);
    /// ```
    pub fn new(event_id: Uuid, event_type: impl Into<String>, topic: impl Into<String>) -> Self {
        Self {
            event_id,
            event_type: event_type.into(),
            topic: topic.into(),
            partition: None,
            offset: None,
            key: None,
            headers: Vec::new(),
            traceparent: None,
            attempt: 1,
            max_attempts: 1,
        }
    }

    /// Whether a failure of this attempt is the last: no retry follows it.
    /// A handler that would rather wait for something (a saga's start, say)
    /// can fail its earlier attempts, to be retried with backoff, and give up
    /// gracefully on this one.
    ///
    /// ```
    /// let mut meta = txoutbox_runtime::consumer::EventMeta::new(uuid::Uuid::nil(), "Paid", "payments");
    /// assert!(meta.is_last_attempt(), "a direct call is one attempt");
    /// meta.max_attempts = 5;
    /// assert!(!meta.is_last_attempt());
    /// ```
    pub fn is_last_attempt(&self) -> bool {
        self.attempt >= self.max_attempts
    }

    /// The value of the first header named `name`.
    ///
    /// ```
    /// # use txoutbox_runtime::consumer::EventMeta;
    /// # fn f(meta: &EventMeta) -> Option<&str> {
    /// meta.header("tenant")
    /// # }
    /// ```
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The error a handler returned, as text (handlers may use any `Display` error).
///
/// This text is what the consumer logs, stores in `inbox_event.last_error` and
/// sends in the dead-letter header `dlq_error`. A [`sqlx::Error`] is written
/// with [`txoutbox_core::DbErrorDisplay`]: PostgreSQL's message, SQLSTATE,
/// detail and hint, without the server source line sqlx's `Display` adds.
///
/// ```
/// let err = txoutbox_runtime::consumer::HandlerError::new("stock service unavailable");
/// assert_eq!(err.to_string(), "stock service unavailable");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerError {
    text: String,
    /// The error is a deadlock, a lock wait timeout or a serialization
    /// failure: the attempt is run again without being counted.
    transient: bool,
}

impl HandlerError {
    /// Wraps any displayable error; a [`sqlx::Error`] is rendered with
    /// [`txoutbox_core::DbErrorDisplay`].
    ///
    /// ```
    /// use txoutbox_runtime::consumer::HandlerError;
    ///
    /// let err = HandlerError::new(sqlx::Error::RowNotFound);
    /// assert_eq!(err.to_string(), sqlx::Error::RowNotFound.to_string());
    /// ```
    ///
    /// A NUL character in the text is written `\0`: the text is stored in
    /// PostgreSQL `text` columns (`inbox_event.last_error`), which cannot
    /// hold one, and an error that cannot be recorded must not wedge the
    /// consumer.
    pub fn new(error: impl fmt::Display + 'static) -> Self {
        let any = &error as &dyn Any;
        if let Some(handler_error) = any.downcast_ref::<HandlerError>() {
            return handler_error.clone();
        }
        if let Some(database) = any.downcast_ref::<sqlx::Error>() {
            return Self::database(database);
        }
        #[cfg(feature = "sea-orm")]
        if let Some(database) = any.downcast_ref::<::sea_orm::DbErr>() {
            return Self::text(txoutbox_core::sea_orm::DbErrDisplay(database).to_string());
        }
        Self::text(error.to_string())
    }

    fn text(text: String) -> Self {
        let text = if text.contains('\0') {
            text.replace('\0', "\\0")
        } else {
            text
        };
        Self {
            text,
            transient: false,
        }
    }

    fn database(error: &sqlx::Error) -> Self {
        let mut handler_error = Self::text(DbErrorDisplay(error).to_string());
        handler_error.transient = txoutbox_core::is_transient_error(error);
        handler_error
    }

    /// Whether the error is a failure of the moment rather than of the
    /// event: a deadlock or serialization failure (SQLSTATE 40001 / 40P01)
    /// or, on MySQL, a deadlock (1213) or lock wait timeout (1205), returned
    /// as a [`sqlx::Error`]. The consumer runs such an attempt again after a
    /// short backoff without counting it against
    /// [`max_attempts`](super::ConsumerBuilder::max_attempts).
    ///
    /// ```
    /// use txoutbox_runtime::consumer::HandlerError;
    ///
    /// assert!(!HandlerError::new("stock service unavailable").is_transient());
    /// ```
    pub fn is_transient(&self) -> bool {
        self.transient
    }

    /// This error, marked transient (the transaction was lost under the
    /// handler, as MySQL does on a deadlock).
    pub(crate) fn into_transient(mut self) -> Self {
        self.transient = true;
        self
    }
}

/// So that `?` works on SeaORM calls in a handler returning `HandlerError`
/// (feature `sea-orm`); rendered with
/// [`DbErrDisplay`](txoutbox_core::sea_orm::DbErrDisplay).
#[cfg(feature = "sea-orm")]
impl From<::sea_orm::DbErr> for HandlerError {
    fn from(error: ::sea_orm::DbErr) -> Self {
        Self::text(txoutbox_core::sea_orm::DbErrDisplay(&error).to_string())
    }
}

/// So that `?` works on sqlx calls in a handler returning `HandlerError`.
impl From<sqlx::Error> for HandlerError {
    fn from(error: sqlx::Error) -> Self {
        Self::database(&error)
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for HandlerError {}

/// A consumer-side handler of one event type.
///
/// Write it with `#[event_handler]` on an async function (see
/// `docs/consumer.md`); the attribute turns the function into a unit struct of
/// the same name implementing this trait, which you pass to
/// [`ConsumerBuilder::handler`](super::ConsumerBuilder::handler). The topic and
/// event type come from `<Self::Event as DomainEvent>`.
///
/// The handler runs inside the consumer's transaction: whatever it writes
/// through `tx` commits atomically with the dedup row (dedup mode) or with
/// marking the inbox row processed (inbox mode). It must not commit `tx`.
///
/// Events it records in `events` (a service reacting to an event with events
/// of its own, like payments answering `OrderCreated` with `PaymentCompleted`)
/// are inserted into `outbox_event` in that same transaction, after the
/// handler returns `Ok`, and the relay in this process is woken after the
/// commit: the consuming side writes atomically too.
///
/// `DB` is the database of the consumer's transaction: PostgreSQL by
/// default; `sqlx::MySql` (feature `mysql`, MariaDB) for a handler
/// taking `&mut Transaction<'_, MySql>`, which only a consumer built on a
/// `MySqlPool` takes.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an event handler on a {DB} transaction",
    label = "this handler's transaction is of another database than the consumer's pool",
    note = "a consumer built on a PgPool takes handlers of `&mut Transaction<'_, Postgres>`, one built on a MySqlPool handlers of `&mut Transaction<'_, MySql>`: change the handler's transaction type or the pool"
)]
pub trait EventHandler<DB: ConsumerDatabase = Postgres>: Send + Sync + 'static {
    /// The event this handler receives.
    type Event: DomainEvent + DeserializeOwned;
    /// The handler's name, used in logs and metrics.
    const NAME: &'static str;

    /// Handles one event inside the consumer's transaction.
    fn handle<'a>(
        &'a self,
        tx: &'a mut Transaction<'static, DB>,
        event: Self::Event,
        meta: &'a EventMeta,
        events: &'a mut Events,
    ) -> BoxFuture<'a, Result<(), HandlerError>>;
}

/// A decoded event waiting for its handler.
pub(crate) type Decoded = Box<dyn Any + Send>;

/// [`EventHandler`] with the event type erased, so one table holds them all.
pub(crate) trait ErasedHandler: Send + Sync {
    fn name(&self) -> &'static str;
    /// Deserializes the payload (its JSON text, never a tree in between)
    /// into the handler's event type; a panic in a `Deserialize`
    /// implementation is caught and reported as an error.
    fn decode(&self, payload: &str) -> Result<Decoded, String>;
    /// Runs the handler on an event [`decode`](Self::decode) returned.
    fn call<'a>(&'a self, input: CallInput<'a>) -> BoxFuture<'a, Result<(), HandlerError>>;
}

/// What one handler call takes: the consumer's transaction, the decoded
/// event, its metadata, and the collector of the events the handler records.
pub(crate) struct CallInput<'a> {
    pub(crate) tx: TxRef<'a>,
    pub(crate) event: Decoded,
    pub(crate) meta: &'a EventMeta,
    pub(crate) events: &'a mut Events,
}

/// A handler with its event type erased; `DB` says which transaction it
/// takes out of a [`TxRef`].
struct Erased<H, DB>(H, std::marker::PhantomData<fn() -> DB>);

impl<H: EventHandler<DB>, DB: ConsumerDatabase> ErasedHandler for Erased<H, DB> {
    fn name(&self) -> &'static str {
        H::NAME
    }

    fn decode(&self, payload: &str) -> Result<Decoded, String> {
        decoded::<H::Event>(std::panic::catch_unwind(|| {
            serde_json::from_str::<H::Event>(payload)
        }))
    }

    fn call<'a>(&'a self, input: CallInput<'a>) -> BoxFuture<'a, Result<(), HandlerError>> {
        let CallInput {
            tx,
            event,
            meta,
            events,
        } = input;
        let event = *event
            .downcast::<H::Event>()
            .expect("decoded by the same handler");
        self.0
            .handle(DB::transaction(HandlerTx(tx)), event, meta, events)
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for sqlx::Postgres {}
    #[cfg(feature = "mysql")]
    impl Sealed for sqlx::MySql {}
}

/// A database a consumer runs on: [`Postgres`], or `sqlx::MySql`
/// with the feature `mysql` (MariaDB >= 10.6; dedup mode). Sealed: the
/// framework implements it for the databases whose SQL it has.
pub trait ConsumerDatabase: sqlx::Database + sealed::Sealed {
    /// The consumer's pool, as the consumer keeps it.
    #[doc(hidden)]
    fn consumer_pool(pool: sqlx::Pool<Self>) -> ConsumerPool;
    /// The handler's transaction out of the consumer's; a consumer only
    /// takes handlers of its own database, so the other variant cannot come.
    #[doc(hidden)]
    fn transaction<'a>(tx: HandlerTx<'a>) -> &'a mut Transaction<'static, Self>;
}

/// The consumer's transaction on its way to a handler. Not a public API.
#[doc(hidden)]
#[allow(missing_debug_implementations)]
pub struct HandlerTx<'a>(pub(crate) TxRef<'a>);

/// A consumer's pool, of one of the [`ConsumerDatabase`]s. Not a public API.
#[doc(hidden)]
#[derive(Debug)]
pub struct ConsumerPool(pub(crate) super::database::Pool);

impl ConsumerDatabase for Postgres {
    fn consumer_pool(pool: sqlx::PgPool) -> ConsumerPool {
        ConsumerPool(super::database::Pool::Postgres(pool))
    }

    fn transaction<'a>(tx: HandlerTx<'a>) -> &'a mut Transaction<'static, Self> {
        match tx.0 {
            TxRef::Postgres(tx) => tx,
            #[cfg(feature = "mysql")]
            TxRef::MySql(_) => unreachable!("a PostgreSQL handler on a MySQL consumer"),
        }
    }
}

#[cfg(feature = "mysql")]
impl ConsumerDatabase for sqlx::MySql {
    fn consumer_pool(pool: sqlx::MySqlPool) -> ConsumerPool {
        ConsumerPool(super::database::Pool::MySql(pool))
    }

    fn transaction<'a>(tx: HandlerTx<'a>) -> &'a mut Transaction<'static, Self> {
        match tx.0 {
            TxRef::MySql(tx) => tx,
            TxRef::Postgres(_) => unreachable!("a MySQL handler on a PostgreSQL consumer"),
        }
    }
}

/// A deserialization's outcome as [`ErasedHandler::decode`] reports it.
fn decoded<T: Send + 'static>(
    outcome: std::thread::Result<Result<T, serde_json::Error>>,
) -> Result<Decoded, String> {
    match outcome {
        Ok(Ok(event)) => Ok(Box::new(event) as Decoded),
        Ok(Err(error)) => Err(error.to_string()),
        Err(panic) => Err(format!(
            "deserializing panicked: {}",
            crate::lifecycle::panic_message(&*panic)
        )),
    }
}

/// One registered handler with its routing key.
pub(crate) struct Registration {
    pub(crate) topic: &'static str,
    pub(crate) event_type: &'static str,
    pub(crate) handler: Arc<dyn ErasedHandler>,
}

impl Registration {
    pub(crate) fn new<DB: ConsumerDatabase, H: EventHandler<DB>>(handler: H) -> Self {
        Self {
            topic: <H::Event as DomainEvent>::TOPIC,
            event_type: <H::Event as DomainEvent>::EVENT_TYPE,
            handler: Arc::new(Erased::<H, DB>(handler, std::marker::PhantomData)),
        }
    }
}

/// Routes (topic, event type) to a handler.
pub(crate) struct Dispatch {
    by_type: HashMap<&'static str, HashMap<&'static str, Arc<dyn ErasedHandler>>>,
    by_topic: HashMap<&'static str, Vec<&'static str>>,
}

/// Two handlers registered for one (topic, event type).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Duplicate {
    pub(crate) topic: &'static str,
    pub(crate) event_type: &'static str,
    pub(crate) first: &'static str,
    pub(crate) second: &'static str,
}

impl Dispatch {
    pub(crate) fn new(registrations: Vec<Registration>) -> Result<Self, Vec<Duplicate>> {
        let mut by_type: HashMap<_, HashMap<_, Arc<dyn ErasedHandler>>> = HashMap::new();
        let mut by_topic: HashMap<_, Vec<_>> = HashMap::new();
        let mut duplicates = Vec::new();
        for r in registrations {
            let of_topic = by_type.entry(r.topic).or_default();
            if let Some(first) = of_topic.get(r.event_type) {
                duplicates.push(Duplicate {
                    topic: r.topic,
                    event_type: r.event_type,
                    first: first.name(),
                    second: r.handler.name(),
                });
                continue;
            }
            by_topic.entry(r.topic).or_default().push(r.event_type);
            of_topic.insert(r.event_type, r.handler);
        }
        if duplicates.is_empty() {
            Ok(Self { by_type, by_topic })
        } else {
            Err(duplicates)
        }
    }

    /// Topics with at least one handler, sorted.
    pub(crate) fn topics(&self) -> Vec<&'static str> {
        let mut topics: Vec<_> = self.by_topic.keys().copied().collect();
        topics.sort_unstable();
        topics
    }

    pub(crate) fn handler(&self, topic: &str, event_type: &str) -> Option<&Arc<dyn ErasedHandler>> {
        self.by_type.get(topic)?.get(event_type)
    }

    /// Every (topic, event type) with a handler, as two parallel arrays (the
    /// shape SQL's `unnest` takes).
    pub(crate) fn routes(&self) -> (Vec<&'static str>, Vec<&'static str>) {
        let mut routes: Vec<(&'static str, &'static str)> = self
            .by_type
            .iter()
            .flat_map(|(topic, types)| types.keys().map(move |t| (*topic, *t)))
            .collect();
        routes.sort_unstable();
        routes.into_iter().unzip()
    }

    /// The event type of the topic's only handler, for messages that name no type.
    pub(crate) fn sole_event_type(&self, topic: &str) -> Option<&'static str> {
        match self.by_topic.get(topic).map(Vec::as_slice) {
            Some([only]) => Some(only),
            _ => None,
        }
    }
}
