//! Re-publishing already published events, e.g. to rebuild a read projection
//! (the database is the source of truth, Kafka the transport).
//!
//! A replay selects published `outbox_event` rows by a [`ReplayFilter`] and
//! sends them again, in id order, with the same key, value and headers the
//! relay used, plus a [`HEADER_REPLAY`] header naming the run. It never
//! modifies an outbox row: each run is recorded in `outbox_replay_run` (filter,
//! counts, start / end, error), so the audit trail shows what was sent twice.
//!
//! Receivers dedup on `event_id`, so a projection being rebuilt must read with
//! a consumer group of its own (dedup rows are per group) or have its dedup
//! rows removed first.
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

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use super::OpsError;

pub use txoutbox_core::wire::HEADER_REPLAY;

/// Which published events to replay. Every field that is set must match;
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

/// The selection, with parameters `$1`..`$6` from the filter and `$7` the
/// highest id the run considers (so a run ends even while events keep coming).
const SELECTED: &str = "FROM outbox_event t
    WHERE t.published_at IS NOT NULL AND t.id <= $7
      AND ($1::timestamptz IS NULL OR t.created_at >= $1)
      AND ($2::timestamptz IS NULL OR t.created_at < $2)
      AND ($3::text IS NULL OR t.topic = $3)
      AND ($4::text IS NULL OR t.event_type = $4)
      AND ($5::text IS NULL OR t.aggregate_type = $5)
      AND ($6::text IS NULL OR t.aggregate_id = $6)";

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

/// How many published events `filter` selects now.
pub async fn count(pool: &PgPool, filter: &ReplayFilter) -> Result<i64, OpsError> {
    let sql = format!("SELECT count(*) {SELECTED}");
    let (count,): (i64,) = filter.query(sql, i64::MAX).fetch_one(pool).await?;
    Ok(count)
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
}

/// A replay run's settings.
#[derive(Debug, Clone)]
pub struct Replay {
    filter: ReplayFilter,
    target_topic: Option<String>,
    batch_size: usize,
    rate: Option<f64>,
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
}

impl Replay {
    /// Default events per pipelined batch.
    pub const DEFAULT_BATCH_SIZE: usize = 500;

    /// A run over `filter`, to each event's own topic, unthrottled, in batches
    /// of [`Self::DEFAULT_BATCH_SIZE`].
    pub fn new(filter: ReplayFilter) -> Self {
        Self {
            filter,
            target_topic: None,
            batch_size: Self::DEFAULT_BATCH_SIZE,
            rate: None,
        }
    }

    /// Sends every event to `topic` instead of its own (e.g. a rebuild topic).
    pub fn target_topic(mut self, topic: impl Into<String>) -> Self {
        self.target_topic = Some(topic.into());
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

    /// Replays the selected events through `producer`, calling `on_progress`
    /// with the number delivered by each batch. The run is recorded in
    /// `outbox_replay_run` whether it succeeds or not.
    pub async fn run(
        &self,
        pool: &PgPool,
        producer: &FutureProducer,
        mut on_progress: impl FnMut(u64),
    ) -> Result<ReplayReport, OpsError> {
        let (max_id,): (Option<i64>,) = sqlx::query_as("SELECT max(id) FROM outbox_event")
            .fetch_one(pool)
            .await?;
        let max_id = max_id.unwrap_or(0);
        let count_sql = format!("SELECT count(*) {SELECTED}");
        let (selected,): (i64,) = self.filter.query(count_sql, max_id).fetch_one(pool).await?;
        let filter = serde_json::to_value(&self.filter).expect("a filter serializes");
        let (run_id,): (i64,) = sqlx::query_as(
            "INSERT INTO outbox_replay_run (filter, target_topic, selected)
             VALUES ($1, $2, $3) RETURNING id",
        )
        .bind(filter)
        .bind(self.target_topic.as_deref())
        .bind(selected)
        .fetch_one(pool)
        .await?;

        let mut published = 0;
        let outcome = self
            .publish(
                pool,
                producer,
                run_id,
                max_id,
                &mut published,
                &mut on_progress,
            )
            .await;
        let error = outcome.as_ref().err().map(ToString::to_string);
        let recorded = sqlx::query(
            "UPDATE outbox_replay_run SET finished_at = now(), published = $2, error = $3
             WHERE id = $1",
        )
        .bind(run_id)
        .bind(published as i64)
        .bind(error)
        .execute(pool)
        .await;
        match outcome {
            Ok(()) => {
                recorded?;
                Ok(ReplayReport {
                    run_id,
                    selected,
                    published,
                })
            }
            Err(source) => Err(OpsError::ReplayFailed {
                run_id,
                published,
                source: Box::new(source),
            }),
        }
    }

    async fn publish(
        &self,
        pool: &PgPool,
        producer: &FutureProducer,
        run_id: i64,
        max_id: i64,
        published: &mut u64,
        on_progress: &mut impl FnMut(u64),
    ) -> Result<(), OpsError> {
        // With a rate, a batch is at most one second of events, so the pauses
        // between batches stay short and the rate holds over any second.
        let page = match self.rate {
            Some(rate) => self.batch_size.min(rate.ceil() as usize).max(1),
            None => self.batch_size,
        };
        let sql = format!(
            "SELECT t.id, t.event_id, t.aggregate_type, t.aggregate_id, t.event_type,
                    t.payload::text AS payload, t.topic, t.partition_key, t.traceparent
             {SELECTED} AND t.id > $8 ORDER BY t.id LIMIT $9"
        );
        let run = run_id.to_string();
        let started = Instant::now();
        let mut after = 0_i64;
        loop {
            let rows: Vec<Row> = self
                .filter
                .query(sql.clone(), max_id)
                .bind(after)
                .bind(page as i64)
                .fetch_all(pool)
                .await?;
            let Some(last) = rows.last() else { break };
            after = last.id;
            let delivered = self.send_batch(producer, &rows, &run).await;
            *published += delivered.as_ref().map_or_else(|(n, _)| *n, |n| *n);
            let delivered = delivered.map_err(|(_, e)| e)?;
            on_progress(delivered);
            sqlx::query("UPDATE outbox_replay_run SET published = $2 WHERE id = $1")
                .bind(run_id)
                .bind(*published as i64)
                .execute(pool)
                .await?;
            if rows.len() < page {
                break;
            }
            if let Some(rate) = self.rate {
                let due = Duration::from_secs_f64(*published as f64 / rate);
                tokio::time::sleep(due.saturating_sub(started.elapsed())).await;
            }
        }
        Ok(())
    }

    /// Enqueues the whole batch, then awaits every delivery (pipelining).
    /// Returns the number delivered, or that number and the first error.
    async fn send_batch(
        &self,
        producer: &FutureProducer,
        rows: &[Row],
        run: &str,
    ) -> Result<u64, (u64, OpsError)> {
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
        let mut delivered = 0;
        let mut first_error = enqueue_error;
        for outcome in futures::future::join_all(pending).await {
            match outcome {
                Ok(Ok(_)) => delivered += 1,
                Ok(Err((e, _))) => {
                    first_error.get_or_insert(OpsError::Kafka(e));
                }
                Err(_canceled) => {
                    first_error.get_or_insert(OpsError::Kafka(KafkaError::Canceled));
                }
            }
        }
        match first_error {
            None => Ok(delivered),
            Some(e) => Err((delivered, e)),
        }
    }

    async fn enqueue(
        &self,
        producer: &FutureProducer,
        row: &Row,
        run: &str,
    ) -> Result<rdkafka::producer::DeliveryFuture, OpsError> {
        let event_id = row.event_id.to_string();
        let topic = self.target_topic.as_deref().unwrap_or(&row.topic);
        let mut record = FutureRecord::to(topic)
            .key(row.partition_key.as_bytes())
            .payload(row.payload.as_str())
            .headers(headers(row, &event_id, run));
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

/// The relay's headers (see `txoutbox_core::wire`) plus [`HEADER_REPLAY`].
fn headers(row: &Row, event_id: &str, run: &str) -> OwnedHeaders {
    crate::relay::wire_headers(&crate::relay::WireRow {
        event_id,
        event_type: &row.event_type,
        aggregate_type: &row.aggregate_type,
        aggregate_id: &row.aggregate_id,
        traceparent: row.traceparent.as_deref(),
    })
    .insert(Header {
        key: HEADER_REPLAY,
        value: Some(run),
    })
}
