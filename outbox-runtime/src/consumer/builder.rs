//! Building a consumer: its handlers, mode and tuning, checked by `build`.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use rdkafka::ClientConfig;
use sqlx::Postgres;
use txoutbox_core::Backoff;

use super::config::{Mode, PeriodicTask, Settings, UnknownEventPolicy};
use super::database::Pool;
use super::error::BuildError;
use super::handler::{ConsumerDatabase, Dispatch, EventHandler, Registration};
use super::run::{Consumer, ConsumerHandle};

impl Consumer {
    /// Starts a builder: the pool for `processed_event` / `inbox_event` and your
    /// handlers' writes, the Kafka client configuration (at least
    /// `bootstrap.servers`), and the consumer group id, which is also the dedup
    /// scope in `processed_event`; at most 1,024 bytes
    /// ([`MAX_PARTITION_KEY_BYTES`](txoutbox_core::MAX_PARTITION_KEY_BYTES)), as it is
    /// indexed with every row (`build` refuses a longer one).
    ///
    /// Of the Kafka settings the consumer sets `group.id`, its offset
    /// handling (`enable.auto.offset.store=false`, offsets stored after the
    /// database commit) and, where you set nothing, `auto.offset.reset=earliest`,
    /// `fetch.message.max.bytes` (from
    /// [`max_message_bytes`](ConsumerBuilder::max_message_bytes)) and
    /// `fetch.wait.max.ms=10`: a broker that holds an empty fetch to its end
    /// (tansu, librdkafka's mock cluster) then delays a record by at most
    /// 10 ms rather than librdkafka's 500 (docs/consumer.md, "Latency and
    /// fetch settings").
    ///
    /// The pool is a `PgPool`, or a `MySqlPool` (feature `mysql`, MariaDB
    /// 10.6 or later, schema from `migrations::run`): the builder then takes
    /// handlers of `&mut Transaction<'_, MySql>`, in dedup or inbox mode
    /// (sagas are PostgreSQL's for now).
    pub fn builder<DB: ConsumerDatabase>(
        pool: sqlx::Pool<DB>,
        kafka_config: ClientConfig,
        group_id: impl Into<String>,
    ) -> ConsumerBuilder<DB> {
        ConsumerBuilder::new(DB::consumer_pool(pool).0, kafka_config, group_id.into())
    }
}

/// Builds a [`Consumer`]. Start with [`Consumer::builder`].
///
/// ```no_run
/// # use txoutbox_runtime::consumer::{Consumer, Mode};
/// # fn f(pool: sqlx::PgPool, h: impl txoutbox_runtime::consumer::EventHandler) -> Result<(), Box<dyn std::error::Error>> {
/// let mut kafka = rdkafka::ClientConfig::new();
/// kafka.set("bootstrap.servers", "127.0.0.1:9092");
/// let consumer = Consumer::builder(pool, kafka, "payments")
///     .handler(h)
///     .mode(Mode::Inbox)
///     .build()?;
/// let running = consumer.spawn();
/// # Ok(()) }
/// ```
///
/// `DB` is the database of the pool, [`Postgres`] unless the builder was
/// started on a `MySqlPool`; every handler registered takes a transaction of
/// that database (another is a compile error).
#[must_use = "call .build() to get a consumer"]
pub struct ConsumerBuilder<DB: ConsumerDatabase = Postgres> {
    pool: Pool,
    kafka: ClientConfig,
    settings: Settings,
    handlers: Vec<Registration>,
    database: std::marker::PhantomData<fn() -> DB>,
}

/// Shows the settings, the handlers (topic and event type) and the librdkafka
/// settings with secrets replaced by `[redacted]`.
impl<DB: ConsumerDatabase> std::fmt::Debug for ConsumerBuilder<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerBuilder")
            .field("pool", &self.pool)
            .field("kafka", &crate::redact::Redacted(&self.kafka))
            .field("settings", &self.settings)
            .field(
                "handlers",
                &self
                    .handlers
                    .iter()
                    .map(|r| (r.topic, r.event_type))
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl<DB: ConsumerDatabase> ConsumerBuilder<DB> {
    pub(crate) fn new(pool: Pool, kafka: ClientConfig, group_id: String) -> Self {
        Self {
            pool,
            kafka,
            handlers: Vec::new(),
            database: std::marker::PhantomData,
            settings: Settings {
                group_id,
                mode: Mode::Dedup,
                max_attempts: 5,
                backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(10)),
                dlq_suffix: ".dlq".to_owned(),
                unknown_events: UnknownEventPolicy::Skip,
                max_message_bytes: 1024 * 1024,
                event_type_headers: Vec::new(),
                batch_size: 500,
                batch_max_bytes: 16 * 1024 * 1024,
                concurrent_batches: 4,
                handler_timeout: Duration::from_secs(30),
                shutdown_timeout: Duration::from_secs(45),
                processors: 2,
                processor_batch_size: 500,
                processor_poll_interval: Duration::from_millis(500),
                handle_on_receipt: true,
                backlog_interval: Duration::from_secs(10),
                periodic: Vec::new(),
                refetch_offset_gaps: false,
                create_missing_dlq_topics: false,
            },
        }
    }

    /// Registers a handler (an `#[event_handler]` function). Its event's topic is
    /// subscribed; two handlers for one (topic, event type) fail [`build`](Self::build).
    pub fn handler<H: EventHandler<DB>>(mut self, handler: H) -> Self {
        self.handlers.push(Registration::new::<DB, H>(handler));
        self
    }
}

impl<DB: ConsumerDatabase> ConsumerBuilder<DB> {
    /// Adds work the consumer runs beside its messages every
    /// [`backlog_interval`](Self::backlog_interval) while it runs, once per
    /// `name` (a second registration under a name is ignored): the extension
    /// point through which a saga refreshes its gauges. A failed round is
    /// logged at debug level; the next one runs as usual.
    pub(crate) fn periodic<F>(mut self, name: &'static str, task: F) -> Self
    where
        F: Fn(Pool) -> BoxFuture<'static, sqlx::Result<()>> + Send + Sync + 'static,
    {
        if !self.settings.periodic.iter().any(|t| t.name == name) {
            self.settings.periodic.push(PeriodicTask {
                name,
                run: Arc::new(task),
            });
        }
        self
    }
}

impl<DB: ConsumerDatabase> ConsumerBuilder<DB> {
    /// How often the consumer refreshes what it reads from the database: the
    /// inbox backlog and parked-row gauges and the inbox processors'
    /// heartbeat (inbox mode), and its periodic work (the open-saga gauges
    /// of its sagas).
    /// Default 10 s; at least 100 ms.
    pub fn backlog_interval(mut self, interval: Duration) -> Self {
        self.settings.backlog_interval = interval.max(Duration::from_millis(100));
        self
    }

    /// Dedup (default) or inbox; see [`Mode`].
    pub fn mode(mut self, mode: Mode) -> Self {
        self.settings.mode = mode;
        self
    }

    /// Handler attempts per event before it is dead-lettered (dedup) or parked
    /// (inbox). Default 5; at least 1.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.settings.max_attempts = attempts.max(1);
        self
    }

    /// Backoff between handler attempts and while the database is unreachable:
    /// the retry after failed attempt `n` waits [`Backoff::delay`]`(n)`,
    /// doubling from the initial delay up to the maximum, with jitter.
    /// Default `100 ms` to `10 s`.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.settings.backoff = backoff;
        self
    }

    /// Suffix of the dead-letter topic (`<topic><suffix>`). Default `.dlq`.
    /// The topic must exist: a consumer whose dead-letter topic is missing
    /// does not start (see [`create_missing_dlq_topics`](Self::create_missing_dlq_topics)
    /// and `outbox topics apply`).
    pub fn dlq_suffix(mut self, suffix: impl Into<String>) -> Self {
        self.settings.dlq_suffix = suffix.into();
        self
    }

    /// What to do with event types that have no handler. Default [`UnknownEventPolicy::Skip`].
    pub fn unknown_events(mut self, policy: UnknownEventPolicy) -> Self {
        self.settings.unknown_events = policy;
        self
    }

    /// Also reads the event type from the header `name`, before the
    /// framework's own `event_type` header and the payload's `event_type`
    /// field; call it again for more names (read in the order given).
    /// Default: none.
    ///
    /// For records from another producer that names the type its own way:
    /// Debezium's outbox event router puts it in a header of the name its
    /// `table.fields.additional.placement` gives (commonly `eventType`). Its
    /// other defaults need no setting: the event id comes from the `id`
    /// header when the payload has none, and a value that is a JSON string
    /// holding the payload object is read as that object (see
    /// `docs/wire-format.md`, "Records from Debezium's outbox event router").
    /// An empty name is ignored.
    ///
    /// ```
    /// # fn f(pool: sqlx::PgPool, kafka: rdkafka::ClientConfig) {
    /// let consumer = txoutbox_runtime::consumer::Consumer::builder(pool, kafka, "billing")
    ///     .event_type_header("eventType");
    /// # }
    /// ```
    pub fn event_type_header(mut self, name: impl Into<String>) -> Self {
        let name = name.into();
        if !name.is_empty() && !self.settings.event_type_headers.contains(&name) {
            self.settings.event_type_headers.push(name);
        }
        self
    }

    /// Messages larger than this (key + value) are dead-lettered unread. Default 1 MiB.
    pub fn max_message_bytes(mut self, bytes: usize) -> Self {
        self.settings.max_message_bytes = bytes;
        self
    }

    /// Most messages handled in one database transaction (dedup mode) or
    /// inserted by one statement (inbox mode); a batch is what has already been
    /// fetched, never a wait for more. Default 500; at least 1.
    pub fn batch_size(mut self, size: usize) -> Self {
        self.settings.batch_size = size.max(1);
        self
    }

    /// Batches handled (dedup mode) or stored (inbox mode) at once, each in
    /// its own transaction on its own connection of the pool. Default 4; 1
    /// takes one batch at a time, as a loop over `recv` would.
    ///
    /// Batches in flight never share a partition: a partition's next batch
    /// starts when its previous one has committed, so its messages are
    /// handled in offset order, and per-key order holds for the keys a
    /// producer partitions by. What changes is that a slow batch (a slow
    /// handler, a lock wait) holds only its own partitions: the others'
    /// batches start as soon as their messages arrive and a slot is free.
    /// When more partitions are ready than slots are free, they are spread
    /// evenly over the free slots. On a busy consumer this also takes the
    /// wait for the batch in progress out of a message's latency
    /// (BENCHMARKS.md, "Latency across services").
    ///
    /// Handlers of different partitions may so run at the same time in one
    /// process, as they always could in a group of several processes. Size
    /// the pool for these connections plus, in inbox mode, one per
    /// [`processor`](Self::processors).
    pub fn concurrent_batches(mut self, batches: usize) -> Self {
        self.settings.concurrent_batches = batches.max(1);
        self
    }

    /// Inbox processors running in parallel (inbox mode). Default 2. Zero runs
    /// none: rows are only stored, for processors in another process.
    pub fn processors(mut self, count: usize) -> Self {
        self.settings.processors = count;
        self
    }

    /// Rows one inbox processor claims per transaction. Default 500; at least 1.
    pub fn processor_batch_size(mut self, size: usize) -> Self {
        self.settings.processor_batch_size = size.max(1);
        self
    }

    /// Inbox mode: whether the receiving loop handles an event itself, in the
    /// transaction that stores it, when nothing of its key is pending in the
    /// inbox (its row then goes in already processed). Default `true`.
    ///
    /// The guarantees do not change: the row and the handler's writes commit
    /// together, per-key order holds (an event whose key has a pending row is
    /// stored pending behind it), and if a handler fails the batch's handling
    /// is rolled back and its rows are stored pending for the processors,
    /// which retry, count attempts and park as usual. What changes is the
    /// cost: a row handled on receipt is one insert, where a pending row is
    /// an insert, a claim and an update (see BENCHMARKS.md). Turn it off when
    /// handlers are slow and consuming must never wait for them; with
    /// [`processors(0)`](Self::processors) rows are always only stored.
    pub fn handle_on_receipt(mut self, on: bool) -> Self {
        self.settings.handle_on_receipt = on;
        self
    }

    /// How long one handler call may take. Default 30 s.
    ///
    /// A call that has not returned by then (an awaited HTTP request without
    /// a timeout, a lock wait) is abandoned: its transaction is rolled back
    /// and the call counts as a failed attempt of its event, which is
    /// retried, then dead-lettered (dedup) or parked (inbox) like any
    /// failure; the error says `did not return within …`. Every statement of
    /// the consumer's transactions also runs under a PostgreSQL
    /// `statement_timeout` of the same length, so a statement still running
    /// on the server when the call is abandoned ends too.
    ///
    /// It also sets the *stall limit*: the longest of this timeout, the
    /// pool's `acquire_timeout` and the [`backoff`](Self::backoff)'s longest
    /// delay, plus 5 s (35 s with the defaults). Every wait of the
    /// consumer's own work is shorter, so work that goes that long without
    /// being woken is stuck on a connection that stopped answering (frozen
    /// by a partition or a hung proxy): it is abandoned, counted as a
    /// database error, and run again on another connection, and PostgreSQL
    /// ends the frozen session at the same limit
    /// (`idle_in_transaction_session_timeout`), releasing its locks.
    /// `Duration::MAX` turns all of these off.
    ///
    /// The timeout cannot interrupt a handler that blocks its thread
    /// (`std::thread::sleep`, blocking I/O): run such work with
    /// `tokio::task::spawn_blocking`.
    pub fn handler_timeout(mut self, timeout: Duration) -> Self {
        self.settings.handler_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Bound of [`ConsumerHandle::shutdown`](super::ConsumerHandle::shutdown):
    /// after it, the consumer's task and its processors are aborted (what
    /// they had not committed is received again after the restart, and
    /// deduplicated) and the summary's `clean` is `false`. Default 45 s,
    /// as the relay's: the handler timeout (30 s) plus a commit.
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.settings.shutdown_timeout = timeout;
        self
    }

    /// Most bytes (keys and values) in one batch: a batch ends at
    /// `batch_size` messages or at this many bytes, whichever comes first
    /// (a batch always takes at least one message). Default 16 MiB.
    ///
    /// With [`max_message_bytes`](Self::max_message_bytes), it bounds what a
    /// batch holds in memory: values are never parsed into a JSON tree, so
    /// a batch costs about its bytes plus the decoded events (BENCHMARKS.md,
    /// "Consumer memory"). What librdkafka prefetches is bounded by its own
    /// settings: `queued.max.messages.kbytes` (64 MiB by default) and one
    /// fetch response, `fetch.max.bytes` (50 MiB by default).
    pub fn batch_max_bytes(mut self, bytes: usize) -> Self {
        self.settings.batch_max_bytes = bytes.max(1);
        self
    }

    /// How often an idle inbox processor looks for due rows (it is also woken at
    /// once when this consumer stores rows). Default 500 ms.
    pub fn processor_poll_interval(mut self, interval: Duration) -> Self {
        self.settings.processor_poll_interval = interval;
        self
    }

    /// Create missing dead-letter topics at start (1 partition, replication
    /// factor 1) instead of refusing to start. Default `false`: production
    /// topics are provisioned (`outbox topics apply`, with the partitions,
    /// replication and configs the cluster needs), and a consumer whose
    /// dead-letter topic is missing stops at start naming it. Meant for
    /// development and tests.
    pub fn create_missing_dlq_topics(mut self, create: bool) -> Self {
        self.settings.create_missing_dlq_topics = create;
        self
    }

    /// When a partition's next message skips offsets, read the partition again
    /// from the first missing offset, once, before accepting the gap. Default
    /// `false`.
    ///
    /// A defence against brokers that serve a record before an earlier one is
    /// readable: tansu 0.6 does so under concurrent producers (see
    /// `RELIABILITY.md`), and without this the consumer moves past the late
    /// records for good. Kafka itself never does, but leaves real gaps
    /// (transaction markers, compaction), each of which then costs one
    /// re-fetch; leave it off for transactional or compacted topics on Kafka.
    /// Gaps are counted in `outbox_consumer_offset_gaps_total` either way.
    pub fn refetch_offset_gaps(mut self, enabled: bool) -> Self {
        self.settings.refetch_offset_gaps = enabled;
        self
    }

    /// `build()?.spawn()`: checks the handlers and settings, creates the
    /// Kafka consumer and starts it on a new tokio task.
    pub fn spawn(self) -> Result<ConsumerHandle, BuildError> {
        Ok(self.build()?.spawn())
    }

    /// Checks the registrations and creates the Kafka clients.
    ///
    /// The Kafka configuration you passed is used as given except for these
    /// keys, which the consumer owns: `group.id`, `enable.auto.offset.store=false`
    /// (offsets are stored only after the database commit), `enable.auto.commit=true`
    /// (stored offsets are committed in the background, on rebalance and on
    /// shutdown); `auto.offset.reset` defaults to `earliest` and
    /// `statistics.interval.ms` to 10 s (it feeds the lag gauge).
    pub fn build(self) -> Result<Consumer, BuildError> {
        if self.handlers.is_empty() {
            return Err(BuildError::NoHandlers);
        }
        if self.settings.group_id.len() > txoutbox_core::MAX_PARTITION_KEY_BYTES {
            // Indexed with every dedup and inbox row: a group id PostgreSQL
            // cannot index would fail every insert, retried for ever.
            return Err(BuildError::InvalidConfig(
                "the consumer group id is longer than 1024 bytes (txoutbox_core::MAX_PARTITION_KEY_BYTES): \
                 it is indexed with every processed_event and inbox_event row, and PostgreSQL refuses \
                 longer index entries; use a shorter group id",
            ));
        }
        if self.settings.unknown_events == UnknownEventPolicy::Keep
            && self.settings.mode != Mode::Inbox
        {
            return Err(BuildError::InvalidConfig(
                "UnknownEventPolicy::Keep needs Mode::Inbox: a dedup-mode consumer has nowhere to keep a message it cannot handle",
            ));
        }
        let dispatch =
            Dispatch::new(self.handlers).map_err(|dups| BuildError::DuplicateHandlers {
                duplicates: dups
                    .into_iter()
                    .map(|d| {
                        format!(
                            "`{}` and `{}` both handle `{}` on topic `{}`",
                            d.first, d.second, d.event_type, d.topic
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("; "),
            })?;
        Consumer::new(self.pool, self.kafka, self.settings, dispatch)
    }
}
