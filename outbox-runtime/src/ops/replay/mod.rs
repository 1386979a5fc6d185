//! Re-publishing already published events, e.g. to rebuild a read projection
//! (the database is the source of truth, Kafka the transport).
//!
//! A replay selects `outbox_event` rows by a [`ReplayFilter`] and sends them
//! again, in id order, with the same key, value and headers the relay used,
//! plus a [`HEADER_REPLAY`] header naming the run. It never modifies an
//! outbox row: each run is recorded in `outbox_replay_run` (mode, filter,
//! target topic, counts, start / end, error, and for a rebuild the group and
//! the hand-over), so the audit trail shows what was sent twice.
//!
//! Receivers dedup on `event_id`, so a projection being rebuilt must read with
//! a consumer group of its own (dedup rows are per group) or have its dedup
//! rows removed first.
//!
//! # Two modes
//!
//! **Republish** ([`Replay::new`] alone): published rows, sent to each row's
//! own topic (or to [`Replay::target_topic`]), page by page. Into the live
//! topic, the replayed copies land *between* the live events the relay keeps
//! appending: a group rebuilding a projection from such a replay sees, for
//! one key, old replayed versions after newer live ones (and dedups the later
//! copies), so a "last version wins" fold ends on an old version. Use it to
//! feed a consumer that does not care about order, or that is stopped.
//!
//! **Rebuild** ([`Replay::rebuild`]): for a projection that must see each
//! key's events in order while live traffic goes on. The run
//!
//! 1. reads the live topic's end offsets `O` (per partition) and the replay
//!    topic's,
//! 2. *then* opens one `REPEATABLE READ` snapshot `S` and selects every row of
//!    the live topic that `S` sees and that is not parked or discarded,
//!    **published or still waiting for the relay**, in id order,
//! 3. sends them to a topic dedicated to the rebuild, and records `O`, the
//!    replay topic's range and `S`'s highest id as a [`Handover`]
//!    (optionally committing a new consumer group's start offsets there, see
//!    [`Replay::start_group`]).
//!
//! The rebuilding group reads the replay topic to [`Handover::replay_end`],
//! then the live topic from [`Handover::live_offsets`], with dedup on
//! `event_id`. What it sees, per key:
//!
//! * every event committed before `S` exactly once, from the replay, in id
//!   order (for a key written by transactions that lock the same aggregate
//!   row, id order is commit order; see `docs/relay.md`, "Commit order and
//!   id order");
//! * then every event committed after `S`, from the live topic, in the
//!   relay's order. The relay can only claim a committed row, so anything it
//!   appended before `O` was committed before `O` was read, hence before `S`,
//!   hence is in the replay. What it appends from `O` on is either in the
//!   replay too (rows pending at `S`, or delivered but not yet marked: the
//!   group's dedup skips them) or committed after `S` (new, later than every
//!   replayed event of its key). Rows whose id is at most
//!   [`Handover::snapshot_max_id`] but that committed after `S` (commit order
//!   is not id order) come from the live topic like any later row.
//!
//! Pending rows are included on purpose: a row delivered just before `O` but
//! marked `published_at` only after `S` would otherwise be in neither the
//! replay nor the live topic's range. One snapshot, not one per page, on
//! purpose too: with a page per snapshot, a key's row committed late (after
//! its page was read) could be missing while the key's next row, read by a
//! later page, is in the replay, and the group would see them swapped.
//!
//! The price: the snapshot is a transaction held open for the whole run, so
//! PostgreSQL's vacuum keeps dead row versions (of every table) younger than
//! it until the run ends; rate-limited runs over millions of rows hold it
//! for their whole duration. The live consumers are not affected: nothing is
//! sent to the live topic, and the relay is not held.
//!
//! # On MariaDB
//!
//! Both modes run on a `&MySqlPool` too (feature `mysql`, MySQL migration
//! 0007 for `outbox_replay_run`; SQL in the child module `mysql`), with the
//! same selection, records, hand-over and guarantees. The rebuild's
//! snapshot is an InnoDB read view: `SET TRANSACTION ISOLATION LEVEL
//! REPEATABLE READ` and `START TRANSACTION WITH CONSISTENT SNAPSHOT, READ
//! ONLY` on a connection of its own, sent after the end offsets were read
//! (the read view is created by that statement, and sees every transaction
//! committed before it, so every row the relay had claimed), held for the
//! whole run and closed with its connection. Its price on InnoDB: the purge
//! of undo history is held back for as long (the history list grows with
//! every row the relay marks and every write of the service, as PostgreSQL's
//! dead row versions do), and the run's own reads of rows changed since its
//! snapshot rebuild their old versions from that undo.
//!
//! Limits: a row pending at `S` that the relay later parks is in the rebuild
//! though live consumers never received it (until an operator retries it);
//! records in the live topic that did not come from this outbox are seen
//! only from `O` on; a `from` / `to` range rebuilds from that range only.
//!
//! ```no_run
//! # async fn run(pool: sqlx::PgPool) -> Result<(), txoutbox_runtime::ops::OpsError> {
//! use txoutbox_runtime::ops::replay::{self, Replay, ReplayFilter};
//!
//! let filter = ReplayFilter { topic: Some("orders".into()), ..Default::default() };
//! let producer: rdkafka::producer::FutureProducer = rdkafka::ClientConfig::new()
//!     .set("bootstrap.servers", "127.0.0.1:9092")
//!     .set("enable.idempotence", "true")
//!     .create()?;
//! let report = Replay::new(filter).rate(500.0).run(&pool, &producer, |_sent| {}).await?;
//! println!("run {} re-published {} events", report.run_id, report.published);
//! # Ok(()) }
//! ```
//!
//! A rebuild, and the switch to the live topic once the group has read the
//! replay:
//!
//! ```no_run
//! # async fn run(pool: sqlx::PgPool, producer: rdkafka::producer::FutureProducer)
//! #     -> Result<(), txoutbox_runtime::ops::OpsError> {
//! use txoutbox_runtime::ops::replay::{Replay, ReplayFilter};
//!
//! let mut kafka = rdkafka::ClientConfig::new();
//! kafka.set("bootstrap.servers", "127.0.0.1:9092");
//! let filter = ReplayFilter { topic: Some("orders".into()), ..Default::default() };
//! let report = Replay::new(filter)
//!     .rebuild("orders.rebuild-7")
//!     .start_group("orders-projection-v2", kafka.clone())
//!     .run(&pool, &producer, |_sent| {})
//!     .await?;
//! let handover = report.handover.expect("a rebuild records its hand-over");
//! // ... the projection's consumer (group orders-projection-v2) reads orders.rebuild-7 ...
//! while handover.remaining(&kafka, "orders-projection-v2").await? > 0 {
//!     tokio::time::sleep(std::time::Duration::from_secs(1)).await;
//! }
//! // ... stop it, and start the group's consumer of `orders`: it starts at
//! // handover.live_offsets, committed by the run.
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde::Serialize;
use sqlx::{PgPool, Postgres, Transaction};
use uuid::Uuid;

use super::{Database, OpsError};
use crate::wire::cloudevents::CloudEvents;
use crate::wire::encode::HeaderNames;

mod handover;
#[cfg(feature = "mysql")]
mod mysql;

pub use handover::{Handover, PartitionOffset};
use txoutbox_core::wire::HEADER_REPLAY;

/// Which events to replay. Every field that is set must match;
/// the time range is half-open: `from <= created_at < to`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ReplayFilter {
    /// Earliest `created_at` included.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<DateTime<Utc>>,
    /// First `created_at` excluded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<DateTime<Utc>>,
    /// Only this topic.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// Only this event type.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_type: Option<String>,
    /// Only this aggregate type.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aggregate_type: Option<String>,
    /// Only this aggregate id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aggregate_id: Option<String>,
}

/// Which rows a run considers, before the filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Published rows.
    Republish,
    /// Rows the relay has published or will publish: neither parked nor
    /// discarded (see the module documentation, "Two modes").
    Rebuild,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Republish => "republish",
            Mode::Rebuild => "rebuild",
        }
    }

    /// The rows the mode considers (alias `t`), on either database.
    fn state(self) -> &'static str {
        match self {
            Mode::Republish => "t.published_at IS NOT NULL",
            Mode::Rebuild => "t.parked_at IS NULL AND t.discarded_at IS NULL",
        }
    }

    /// The selection, with parameters `$1`..`$6` from the filter and `$7` the
    /// highest id the run considers (so a run ends even while events keep
    /// coming).
    fn selection(self) -> String {
        let state = self.state();
        format!(
            "FROM outbox_event t
             WHERE {state} AND t.id <= $7
               AND ($1::timestamptz IS NULL OR t.created_at >= $1)
               AND ($2::timestamptz IS NULL OR t.created_at < $2)
               AND ($3::text IS NULL OR t.topic = $3)
               AND ($4::text IS NULL OR t.event_type = $4)
               AND ($5::text IS NULL OR t.aggregate_type = $5)
               AND ($6::text IS NULL OR t.aggregate_id = $6)"
        )
    }
}

impl ReplayFilter {
    fn query<O>(
        &self,
        sql: String,
        max_id: i64,
    ) -> sqlx::query::QueryAs<'_, sqlx::Postgres, O, sqlx::postgres::PgArguments>
    where
        O: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>,
    {
        sqlx::query_as(super::trusted(sql))
            .bind(self.from)
            .bind(self.to)
            .bind(self.topic.as_deref())
            .bind(self.event_type.as_deref())
            .bind(self.aggregate_type.as_deref())
            .bind(self.aggregate_id.as_deref())
            .bind(max_id)
    }
}

/// How many published events `filter` selects now (what a republish run
/// would send; [`Replay::count`] counts for either mode), on a `&PgPool` or
/// (feature `mysql`) a `&MySqlPool`.
pub async fn count<'a>(
    database: impl Into<Database<'a>>,
    filter: &ReplayFilter,
) -> Result<i64, OpsError> {
    count_of(database.into(), filter, Mode::Republish).await
}

async fn count_of(
    database: Database<'_>,
    filter: &ReplayFilter,
    mode: Mode,
) -> Result<i64, OpsError> {
    // The pool, whatever the mode: a count needs no snapshot of its own.
    let mut source = match database {
        Database::Postgres(pool) => Source::Postgres(PgSource::Pool(pool)),
        #[cfg(feature = "mysql")]
        Database::MySql(pool) => Source::MySql(mysql::Source::Pool(pool)),
    };
    source.count(filter, mode, i64::MAX).await
}

/// One outbox row as it is replayed.
#[derive(Debug, Clone, sqlx::FromRow)]
struct Row {
    id: i64,
    event_id: Uuid,
    aggregate_type: String,
    aggregate_id: String,
    event_type: String,
    /// `jsonb::text`, exactly the bytes the relay sends.
    payload: String,
    topic: String,
    partition_key: String,
    traceparent: Option<String>,
    /// The user's headers as JSON text, NULL for none.
    headers: Option<String>,
    created_at: DateTime<Utc>,
}

/// A replay run's settings.
#[derive(Clone)]
pub struct Replay {
    filter: ReplayFilter,
    target_topic: Option<String>,
    mode: Mode,
    /// A rebuild's consumer group to start, and the client settings to
    /// commit its offsets with.
    group: Option<(String, ClientConfig)>,
    batch_size: usize,
    rate: Option<f64>,
    header_names: HeaderNames,
    cloudevents: Option<CloudEvents>,
}

/// Shows the settings; the group's librdkafka settings with secrets replaced
/// by `[redacted]`.
impl std::fmt::Debug for Replay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replay")
            .field("filter", &self.filter)
            .field("target_topic", &self.target_topic)
            .field("mode", &self.mode)
            .field(
                "group",
                &self
                    .group
                    .as_ref()
                    .map(|(group, kafka)| (group, crate::redact::Redacted(kafka))),
            )
            .field("batch_size", &self.batch_size)
            .field("rate", &self.rate)
            .field("header_names", &self.header_names)
            .field("cloudevents", &self.cloudevents)
            .finish()
    }
}

/// The outcome of a finished run.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    /// Its `outbox_replay_run.id`.
    pub run_id: i64,
    /// Events the filter selected when the run started.
    pub selected: i64,
    /// Events delivered.
    pub published: u64,
    /// A rebuild's hand-over (with its `replay_end`); `None` for a
    /// republish run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handover: Option<Handover>,
}

/// Where a run reads its rows: the pool (a snapshot per page), or one
/// snapshot for the whole run.
enum Source<'p> {
    Postgres(PgSource<'p>),
    #[cfg(feature = "mysql")]
    MySql(mysql::Source<'p>),
}

/// [`Source`] on PostgreSQL.
enum PgSource<'p> {
    Pool(&'p PgPool),
    Snapshot(Transaction<'static, Postgres>),
}

impl<'p> Source<'p> {
    /// The source of a run of `mode`: for a rebuild, its one snapshot,
    /// taken now (after the end offsets were read).
    async fn open(database: Database<'p>, mode: Mode) -> Result<Self, OpsError> {
        Ok(match (database, mode) {
            (Database::Postgres(pool), Mode::Republish) => Source::Postgres(PgSource::Pool(pool)),
            (Database::Postgres(pool), Mode::Rebuild) => {
                Source::Postgres(PgSource::Snapshot(snapshot(pool).await?))
            }
            #[cfg(feature = "mysql")]
            (Database::MySql(pool), mode) => Source::MySql(mysql::Source::open(pool, mode).await?),
        })
    }

    /// The highest `outbox_event.id` the source sees (0 for none).
    async fn max_id(&mut self) -> Result<i64, OpsError> {
        match self {
            Source::Postgres(source) => {
                let max_id: Option<i64> = source
                    .fetch(sqlx::query_as::<_, (Option<i64>,)>(
                        "SELECT max(id) FROM outbox_event",
                    ))
                    .await?
                    .pop()
                    .and_then(|(id,)| id);
                Ok(max_id.unwrap_or(0))
            }
            #[cfg(feature = "mysql")]
            Source::MySql(source) => source.max_id().await,
        }
    }

    /// How many rows of `mode` up to `max_id` the filter selects.
    async fn count(
        &mut self,
        filter: &ReplayFilter,
        mode: Mode,
        max_id: i64,
    ) -> Result<i64, OpsError> {
        match self {
            Source::Postgres(source) => {
                let sql = format!("SELECT count(*) {}", mode.selection());
                Ok(source
                    .fetch::<(i64,)>(filter.query(sql, max_id))
                    .await?
                    .pop()
                    .map_or(0, |(n,)| n))
            }
            #[cfg(feature = "mysql")]
            Source::MySql(source) => source.count(filter, mode, max_id).await,
        }
    }

    /// The next `limit` selected rows after id `after`, in id order.
    async fn page(
        &mut self,
        filter: &ReplayFilter,
        mode: Mode,
        max_id: i64,
        after: i64,
        limit: usize,
    ) -> Result<Vec<Row>, OpsError> {
        match self {
            Source::Postgres(source) => {
                let sql = format!(
                    "SELECT t.id, t.event_id, t.aggregate_type, t.aggregate_id, t.event_type,
                            t.payload::text AS payload, t.topic, t.partition_key, t.traceparent,
                            t.headers::text AS headers, t.created_at
                     {} AND t.id > $8 ORDER BY t.id LIMIT $9",
                    mode.selection()
                );
                Ok(source
                    .fetch(filter.query(sql, max_id).bind(after).bind(limit as i64))
                    .await?)
            }
            #[cfg(feature = "mysql")]
            Source::MySql(source) => source.page(filter, mode, max_id, after, limit).await,
        }
    }
}

impl PgSource<'_> {
    async fn fetch<O>(
        &mut self,
        query: sqlx::query::QueryAs<'_, Postgres, O, sqlx::postgres::PgArguments>,
    ) -> Result<Vec<O>, sqlx::Error>
    where
        O: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin,
    {
        match self {
            PgSource::Pool(pool) => query.fetch_all(*pool).await,
            PgSource::Snapshot(tx) => query.fetch_all(&mut **tx).await,
        }
    }
}

/// A run's row in `outbox_replay_run`, as it starts.
struct RunStart<'a> {
    filter: serde_json::Value,
    target_topic: Option<&'a str>,
    selected: i64,
    mode: Mode,
    group: Option<&'a str>,
    handover: Option<serde_json::Value>,
}

/// Records a run's start in `outbox_replay_run`; returns its id.
async fn record_start(database: Database<'_>, run: &RunStart<'_>) -> Result<i64, OpsError> {
    match database {
        Database::Postgres(pool) => record_start_postgres(pool, run).await,
        #[cfg(feature = "mysql")]
        Database::MySql(pool) => mysql::record_start(pool, run).await,
    }
}

async fn record_start_postgres(pool: &PgPool, run: &RunStart<'_>) -> Result<i64, OpsError> {
    let (run_id,): (i64,) = sqlx::query_as(
        "INSERT INTO outbox_replay_run (filter, target_topic, selected, mode, rebuild_group,
                                        handover)
         VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
    )
    .bind(&run.filter)
    .bind(run.target_topic)
    .bind(run.selected)
    .bind(run.mode.name())
    .bind(run.group)
    .bind(&run.handover)
    .fetch_one(pool)
    .await?;
    Ok(run_id)
}

/// Records how many events run `run_id` delivered so far.
async fn record_progress(
    database: Database<'_>,
    run_id: i64,
    published: u64,
) -> Result<(), OpsError> {
    match database {
        Database::Postgres(pool) => {
            sqlx::query("UPDATE outbox_replay_run SET published = $2 WHERE id = $1")
                .bind(run_id)
                .bind(published as i64)
                .execute(pool)
                .await?;
        }
        #[cfg(feature = "mysql")]
        Database::MySql(pool) => mysql::record_progress(pool, run_id, published).await?,
    }
    Ok(())
}

/// Records the end of run `run_id`: when, what it delivered, its error and
/// its hand-over.
async fn record_end(
    database: Database<'_>,
    run_id: i64,
    published: u64,
    error: Option<String>,
    handover: Option<serde_json::Value>,
) -> Result<(), OpsError> {
    match database {
        Database::Postgres(pool) => {
            sqlx::query(
                "UPDATE outbox_replay_run
                 SET finished_at = now(), published = $2, error = $3, handover = $4
                 WHERE id = $1",
            )
            .bind(run_id)
            .bind(published as i64)
            .bind(error)
            .bind(handover)
            .execute(pool)
            .await?;
        }
        #[cfg(feature = "mysql")]
        Database::MySql(pool) => {
            mysql::record_end(pool, run_id, published, error, handover).await?;
        }
    }
    Ok(())
}

/// The name of the database the run reads (the default CloudEvents source).
fn database_name(database: Database<'_>) -> Option<String> {
    match database {
        Database::Postgres(pool) => pool.connect_options().get_database().map(str::to_owned),
        #[cfg(feature = "mysql")]
        Database::MySql(pool) => pool.connect_options().get_database().map(str::to_owned),
    }
}

impl Replay {
    /// Default events per pipelined batch.
    pub const DEFAULT_BATCH_SIZE: usize = 500;

    /// A republish run over `filter`'s published events, to each event's own
    /// topic, unthrottled, in batches of [`Self::DEFAULT_BATCH_SIZE`].
    pub fn new(filter: ReplayFilter) -> Self {
        Self {
            filter,
            target_topic: None,
            mode: Mode::Republish,
            group: None,
            batch_size: Self::DEFAULT_BATCH_SIZE,
            rate: None,
            header_names: HeaderNames::default(),
            cloudevents: None,
        }
    }

    /// Sends CloudEvents' binary-mode headers too, as the relay's
    /// [`RelayBuilder::cloudevents`](crate::relay::RelayBuilder::cloudevents)
    /// does: give a replay the service relay's setting. Without a
    /// [`source`](CloudEvents::source), the source is
    /// `/txoutbox/<database name>` of the pool the run reads.
    pub fn cloudevents(mut self, cloudevents: CloudEvents) -> Self {
        self.cloudevents = Some(cloudevents);
        self
    }

    /// The names of the event's headers, as the relay's
    /// [`RelayBuilder::header_names`](crate::relay::RelayBuilder::header_names):
    /// give a replay the names the service's relay uses, so its consumers
    /// read the replayed records as they read the live ones. Default: the
    /// wire format's.
    pub fn header_names(mut self, names: HeaderNames) -> Self {
        self.header_names = names;
        self
    }

    /// Sends every event to `topic` instead of its own (no hand-over: see
    /// [`Self::rebuild`] to rebuild a projection in order).
    pub fn target_topic(mut self, topic: impl Into<String>) -> Self {
        self.target_topic = Some(topic.into());
        self
    }

    /// Makes this a rebuild run into `replay_topic`, a topic dedicated to it:
    /// one snapshot, events published or still waiting for the relay, and a
    /// recorded [`Handover`] (see the module documentation, "Two modes").
    ///
    /// The filter must name the live topic ([`ReplayFilter::topic`]), and
    /// `replay_topic` must be another topic that exists (any partition
    /// count; the key decides the partition, so each key stays in order).
    /// The run holds one connection of the pool for its snapshot and records
    /// its progress through another: the pool needs at least two. On
    /// MariaDB the snapshot's connection is closed after the run, not
    /// returned to the pool.
    pub fn rebuild(mut self, replay_topic: impl Into<String>) -> Self {
        self.target_topic = Some(replay_topic.into());
        self.mode = Mode::Rebuild;
        self
    }

    /// With [`Self::rebuild`]: commits `group`'s start offsets (the replay
    /// topic where the run starts writing, the live topic at the hand-over
    /// offsets) before the first event is sent, so the group's consumer can
    /// start on the replay topic at once. `kafka` holds the client settings
    /// (at least `bootstrap.servers`). The group must be new: see
    /// [`Handover::start_group`].
    pub fn start_group(mut self, group: impl Into<String>, kafka: ClientConfig) -> Self {
        self.group = Some((group.into(), kafka));
        self
    }

    /// Events enqueued before awaiting their deliveries (at least 1).
    pub fn batch_size(mut self, events: usize) -> Self {
        self.batch_size = events.max(1);
        self
    }

    /// Caps the average rate at `events_per_sec` (ignored unless positive).
    pub fn rate(mut self, events_per_sec: f64) -> Self {
        self.rate = (events_per_sec > 0.0).then_some(events_per_sec);
        self
    }

    /// How many events this run would select now (published ones, or for a
    /// rebuild those not parked nor discarded), on a `&PgPool` or (feature
    /// `mysql`) a `&MySqlPool`.
    pub async fn count<'a>(&self, database: impl Into<Database<'a>>) -> Result<i64, OpsError> {
        count_of(database.into(), &self.filter, self.mode).await
    }

    /// Replays the selected events through `producer`, calling `on_progress`
    /// with the number delivered by each batch. The run is recorded in
    /// `outbox_replay_run` whether it succeeds or not (a rebuild refused
    /// before it starts, e.g. for a missing topic, is not). The database is
    /// a `&PgPool` or (feature `mysql`) a `&MySqlPool`, with the same
    /// selection, records and hand-over on both.
    pub async fn run<'a>(
        &self,
        database: impl Into<Database<'a>>,
        producer: &FutureProducer,
        mut on_progress: impl FnMut(u64),
    ) -> Result<ReplayReport, OpsError> {
        let database = database.into();
        if let Some(problem) = self.header_names.problem() {
            return Err(OpsError::HeaderNames(problem));
        }
        if let Some(problem) = self.cloudevents.as_ref().and_then(CloudEvents::problem) {
            return Err(OpsError::CloudEvents(problem));
        }
        // The default CloudEvents source names the database the run reads.
        let resolved = self.cloudevents.as_ref().map(|cloudevents| Replay {
            cloudevents: Some(
                cloudevents
                    .clone()
                    .resolved(database_name(database).as_deref()),
            ),
            ..self.clone()
        });
        resolved
            .as_ref()
            .unwrap_or(self)
            .run_checked(database, producer, &mut on_progress)
            .await
    }

    /// [`run`](Self::run) once the settings are checked.
    async fn run_checked(
        &self,
        database: Database<'_>,
        producer: &FutureProducer,
        on_progress: &mut impl FnMut(u64),
    ) -> Result<ReplayReport, OpsError> {
        // A rebuild reads the end offsets first, then takes its snapshot:
        // that order is what makes the hand-over exact (module docs).
        let mut handover = match self.mode {
            Mode::Republish => None,
            Mode::Rebuild => Some(self.positions(producer).await?),
        };
        let mut source = Source::open(database, self.mode).await?;
        let max_id = source.max_id().await?;
        let selected = source.count(&self.filter, self.mode, max_id).await?;
        if let Some(handover) = &mut handover {
            handover.snapshot_max_id = max_id;
        }
        let run_id = record_start(
            database,
            &RunStart {
                filter: serde_json::to_value(&self.filter).expect("a filter serializes"),
                target_topic: self.target_topic.as_deref(),
                selected,
                mode: self.mode,
                group: self.group.as_ref().map(|(group, _)| group.as_str()),
                handover: handover.as_ref().map(to_json),
            },
        )
        .await?;

        let mut sent = Sent::default();
        let outcome = async {
            if let (Some(handover), Some((group, kafka))) = (&handover, &self.group) {
                handover.start_group(kafka, group).await?;
            }
            self.publish(
                database,
                &mut source,
                producer,
                run_id,
                max_id,
                &mut sent,
                on_progress,
            )
            .await
        }
        .await;
        drop(source); // ends the snapshot (read only: nothing to commit)
        if let (Some(handover), Ok(())) = (&mut handover, &outcome) {
            handover.replay_end = Some(sent.ends(&handover.replay_start));
        }
        let error = outcome.as_ref().err().map(ToString::to_string);
        let recorded = record_end(
            database,
            run_id,
            sent.delivered,
            error,
            handover.as_ref().map(to_json),
        )
        .await;
        match outcome {
            Ok(()) => {
                recorded?;
                Ok(ReplayReport {
                    run_id,
                    selected,
                    published: sent.delivered,
                    handover,
                })
            }
            Err(source) => Err(OpsError::ReplayFailed {
                run_id,
                published: sent.delivered,
                source: Box::new(source),
            }),
        }
    }

    /// A rebuild's checks and the end offsets of both topics (live first).
    async fn positions(&self, producer: &FutureProducer) -> Result<Handover, OpsError> {
        let Some(live_topic) = self.filter.topic.clone() else {
            return Err(OpsError::RebuildWithoutTopic);
        };
        let replay_topic = self.target_topic.clone().expect("rebuild sets the topic");
        if replay_topic == live_topic {
            return Err(OpsError::RebuildIntoLiveTopic { topic: live_topic });
        }
        let live_offsets = handover::ends(producer, &live_topic).await?;
        let replay_start = handover::ends(producer, &replay_topic).await?;
        Ok(Handover {
            live_topic,
            live_offsets,
            replay_topic,
            replay_start,
            replay_end: None,
            snapshot_max_id: 0,
            group: self.group.as_ref().map(|(group, _)| group.clone()),
        })
    }

    #[allow(clippy::too_many_arguments)] // the run's state, passed down once
    async fn publish(
        &self,
        database: Database<'_>,
        source: &mut Source<'_>,
        producer: &FutureProducer,
        run_id: i64,
        max_id: i64,
        sent: &mut Sent,
        on_progress: &mut impl FnMut(u64),
    ) -> Result<(), OpsError> {
        // With a rate, a batch is at most one second of events, so the pauses
        // between batches stay short and the rate holds over any second.
        let page = match self.rate {
            Some(rate) => self.batch_size.min(rate.ceil() as usize).max(1),
            None => self.batch_size,
        };
        let run = run_id.to_string();
        let started = Instant::now();
        let mut after = 0_i64;
        loop {
            let rows = source
                .page(&self.filter, self.mode, max_id, after, page)
                .await?;
            let Some(last) = rows.last() else { break };
            after = last.id;
            let before = sent.delivered;
            let outcome = self.send_batch(producer, &rows, &run, sent).await;
            on_progress(sent.delivered - before);
            outcome?;
            record_progress(database, run_id, sent.delivered).await?;
            if rows.len() < page {
                break;
            }
            if let Some(rate) = self.rate {
                let due = Duration::from_secs_f64(sent.delivered as f64 / rate);
                tokio::time::sleep(due.saturating_sub(started.elapsed())).await;
            }
        }
        Ok(())
    }

    /// Enqueues the whole batch, then awaits every delivery (pipelining),
    /// recording each in `sent`. Returns the first error, if any.
    async fn send_batch(
        &self,
        producer: &FutureProducer,
        rows: &[Row],
        run: &str,
        sent: &mut Sent,
    ) -> Result<(), OpsError> {
        let mut pending = Vec::with_capacity(rows.len());
        let mut enqueue_error = None;
        for row in rows {
            match self.enqueue(producer, row, run).await {
                Ok(delivery) => pending.push(delivery),
                Err(e) => {
                    enqueue_error = Some(e);
                    break;
                }
            }
        }
        let mut first_error = enqueue_error;
        for outcome in futures::future::join_all(pending).await {
            match outcome {
                Ok(Ok(delivery)) => sent.record(delivery.partition, delivery.offset),
                Ok(Err((e, _))) => {
                    first_error.get_or_insert(OpsError::Kafka(e));
                }
                Err(_canceled) => {
                    first_error.get_or_insert(OpsError::Kafka(KafkaError::Canceled));
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    async fn enqueue(
        &self,
        producer: &FutureProducer,
        row: &Row,
        run: &str,
    ) -> Result<rdkafka::producer::DeliveryFuture, OpsError> {
        let event_id = row.event_id.to_string();
        let topic = self.target_topic.as_deref().unwrap_or(&row.topic);
        let value = crate::wire::encode::value_naming_type(&row.payload, &row.event_type);
        let mut record = FutureRecord::to(topic)
            .key(row.partition_key.as_bytes())
            .payload(value.as_ref())
            .headers(headers(
                row,
                &event_id,
                run,
                &self.header_names,
                self.cloudevents.as_ref(),
            ));
        loop {
            match producer.send_result(record) {
                Ok(delivery) => return Ok(delivery),
                // The local queue is full: let deliveries drain, then retry.
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err((e, _)) => return Err(OpsError::Kafka(e)),
            }
        }
    }
}

/// The run's one snapshot: a read-only `REPEATABLE READ` transaction (its
/// snapshot is taken by its first query, after the end offsets were read).
/// It stays open between pages while deliveries are awaited, so the
/// server's idle-in-transaction timeout must not end it.
async fn snapshot(pool: &PgPool) -> Result<Transaction<'static, Postgres>, OpsError> {
    let mut tx = pool
        .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .await?;
    sqlx::query("SET LOCAL idle_in_transaction_session_timeout = 0")
        .execute(&mut *tx)
        .await?;
    Ok(tx)
}

fn to_json(handover: &Handover) -> serde_json::Value {
    serde_json::to_value(handover).expect("a hand-over serializes")
}

/// What a run delivered: the count, and per partition the offset after the
/// last record (a rebuild's `replay_end`).
#[derive(Debug, Default)]
struct Sent {
    delivered: u64,
    ends: BTreeMap<i32, i64>,
}

impl Sent {
    fn record(&mut self, partition: i32, offset: i64) {
        self.delivered += 1;
        let end = self.ends.entry(partition).or_insert(offset + 1);
        *end = (*end).max(offset + 1);
    }

    /// Every partition of `start`, at the end of what was delivered there
    /// (or where it started, if nothing was).
    fn ends(&self, start: &[PartitionOffset]) -> Vec<PartitionOffset> {
        start
            .iter()
            .map(|p| PartitionOffset {
                partition: p.partition,
                offset: self.ends.get(&p.partition).copied().unwrap_or(p.offset),
            })
            .collect()
    }
}

/// The relay's headers (see `txoutbox_core::wire`) plus [`HEADER_REPLAY`].
fn headers(
    row: &Row,
    event_id: &str,
    run: &str,
    names: &HeaderNames,
    cloudevents: Option<&CloudEvents>,
) -> OwnedHeaders {
    crate::wire::encode::record_headers(
        &crate::wire::encode::WireRow {
            event_id,
            event_type: &row.event_type,
            aggregate_type: &row.aggregate_type,
            aggregate_id: &row.aggregate_id,
            traceparent: row.traceparent.as_deref(),
            user_headers: row.headers.as_deref(),
            topic: &row.topic,
            partition_key: &row.partition_key,
            created_at: Some(row.created_at),
        },
        names,
        cloudevents,
    )
    .insert(Header {
        key: HEADER_REPLAY,
        value: Some(run),
    })
}
