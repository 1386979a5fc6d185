//! The hand-over of a rebuild run: where a rebuilding consumer group reads the
//! replay topic, and from where it continues on the live topic.
//!
//! A rebuild run ([`Replay::rebuild`](super::Replay::rebuild)) takes the live
//! topic's end offsets *before* it takes its database snapshot, so every
//! record the relay had appended by then belongs to a row the snapshot sees
//! (a row is committed before the relay can claim it). Whatever the relay
//! appends from those offsets on is either in the replay too (a duplicate the
//! group's dedup skips) or was committed after the snapshot (new). See the
//! module documentation of [`replay`](super) for the whole argument.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{FutureProducer, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use crate::ops::{Database, OpsError};

/// How long one metadata, watermark or offset request may take.
const KAFKA_TIMEOUT: Duration = Duration::from_secs(10);

/// An offset in one partition of a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionOffset {
    /// The partition.
    pub partition: i32,
    /// The offset (of the next record, for an end).
    pub offset: i64,
}

/// Where a rebuilding consumer group reads, recorded by a rebuild run in
/// `outbox_replay_run.handover`.
///
/// The group reads `replay_topic` from `replay_start` to `replay_end`, then
/// `live_topic` from `live_offsets`, deduplicating on `event_id` (the
/// framework's consumers do, per group), and sees each key's events once, in
/// order: every event committed before the run's snapshot from the replay,
/// in id order, then every event committed after it from the live topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handover {
    /// The topic the events were selected from (the live one).
    pub live_topic: String,
    /// Per partition of the live topic: where the group continues once it
    /// has read the replay topic to `replay_end` (its end before the
    /// snapshot was taken).
    pub live_offsets: Vec<PartitionOffset>,
    /// The topic the run sent to.
    pub replay_topic: String,
    /// Per partition of the replay topic: its end when the run started (the
    /// run's first record is at or after it).
    pub replay_start: Vec<PartitionOffset>,
    /// Per partition of the replay topic: the offset after the run's last
    /// record there (taken from the delivery reports); `None` while the run
    /// is sending or when it failed.
    pub replay_end: Option<Vec<PartitionOffset>>,
    /// The highest `outbox_event.id` the snapshot saw (rows with higher ids
    /// reach the group through the live topic; some lower ones may too, see
    /// the module documentation).
    pub snapshot_max_id: i64,
    /// The consumer group whose start offsets the run committed, if any.
    pub group: Option<String>,
}

impl Handover {
    /// The hand-over recorded by run `run_id`, or `None` if that run was not
    /// a rebuild (or does not exist); on a `&PgPool` or (feature `mysql`) a
    /// `&MySqlPool`.
    pub async fn load<'a>(
        database: impl Into<Database<'a>>,
        run_id: i64,
    ) -> Result<Option<Self>, OpsError> {
        let recorded: Option<serde_json::Value> = match database.into() {
            Database::Postgres(pool) => {
                sqlx::query_scalar("SELECT handover FROM outbox_replay_run WHERE id = $1")
                    .bind(run_id)
                    .fetch_optional(pool)
                    .await?
                    .flatten()
            }
            #[cfg(feature = "mysql")]
            Database::MySql(pool) => super::mysql::load_handover(pool, run_id)
                .await?
                .flatten()
                .map(|text| serde_json::from_str(&text))
                .transpose()
                .map_err(|source| OpsError::UnreadableHandover { run_id, source })?,
        };
        recorded
            .map(|value| {
                serde_json::from_value(value)
                    .map_err(|source| OpsError::UnreadableHandover { run_id, source })
            })
            .transpose()
    }

    /// Commits `group`'s start offsets: the replay topic at `replay_start`,
    /// the live topic at `live_offsets`. A consumer of the group then starts
    /// there (first on the replay topic, later on the live one).
    ///
    /// Refuses a group that has committed offsets on either topic: a rebuild
    /// needs a group of its own (its dedup rows in `processed_event` are per
    /// group, and an old group's would skip the replayed events). The group
    /// must have no running member (committing is done outside the group).
    pub async fn start_group(&self, kafka: &ClientConfig, group: &str) -> Result<(), OpsError> {
        let consumer = group_client(kafka, group)?;
        let handover = self.clone();
        let group = group.to_owned();
        blocking(move || {
            let mut all = TopicPartitionList::new();
            for (topic, offsets) in [
                (&handover.replay_topic, &handover.replay_start),
                (&handover.live_topic, &handover.live_offsets),
            ] {
                for p in offsets {
                    all.add_partition_offset(topic, p.partition, Offset::Offset(p.offset))?;
                }
            }
            let committed = consumer.committed_offsets(all.clone(), KAFKA_TIMEOUT)?;
            if let Some(e) = committed
                .elements()
                .into_iter()
                .find(|e| e.offset().to_raw().is_some_and(|o| o >= 0))
            {
                return Err(OpsError::GroupHasOffsets {
                    group: group.clone(),
                    topic: e.topic().to_owned(),
                    partition: e.partition(),
                    offset: e.offset(),
                });
            }
            consumer.commit(&all, CommitMode::Sync)?;
            Ok(())
        })
        .await
    }

    /// Records of the replay topic that `group` has not consumed yet (its
    /// committed offsets against `replay_end`). Zero means the group may
    /// switch to the live topic.
    ///
    /// Fails while the run has no `replay_end` (still sending, or failed).
    pub async fn remaining(&self, kafka: &ClientConfig, group: &str) -> Result<i64, OpsError> {
        let Some(end) = self.replay_end.clone() else {
            return Err(OpsError::ReplayNotFinished {
                replay_topic: self.replay_topic.clone(),
                live_topic: self.live_topic.clone(),
            });
        };
        let consumer = group_client(kafka, group)?;
        let topic = self.replay_topic.clone();
        let start: BTreeMap<i32, i64> = self
            .replay_start
            .iter()
            .map(|p| (p.partition, p.offset))
            .collect();
        blocking(move || {
            let mut tpl = TopicPartitionList::new();
            for p in &end {
                tpl.add_partition(&topic, p.partition);
            }
            let committed = consumer.committed_offsets(tpl, KAFKA_TIMEOUT)?;
            let at: BTreeMap<i32, i64> = committed
                .elements()
                .into_iter()
                .filter_map(|e| Some((e.partition(), e.offset().to_raw().filter(|o| *o >= 0)?)))
                .collect();
            Ok(end
                .iter()
                .map(|p| {
                    let from = at
                        .get(&p.partition)
                        .or(start.get(&p.partition))
                        .copied()
                        .unwrap_or(0);
                    (p.offset - from).max(0)
                })
                .sum())
        })
        .await
    }
}

/// The end offset of every partition of `topic`, through the producer's
/// client; fails if the cluster does not know the topic.
pub(super) async fn ends(
    producer: &FutureProducer,
    topic: &str,
) -> Result<Vec<PartitionOffset>, OpsError> {
    let producer = producer.clone();
    let topic = topic.to_owned();
    blocking(move || {
        let client = producer.client();
        // All topics: a producer's request for one topic would have the
        // broker create it (with auto-creation on), and a missing topic must
        // be reported instead.
        let metadata = client.fetch_metadata(None, KAFKA_TIMEOUT)?;
        let partitions: Vec<i32> = metadata
            .topics()
            .iter()
            .filter(|t| t.name() == topic && t.error().is_none())
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        if partitions.is_empty() {
            return Err(OpsError::TopicMissing { topic });
        }
        partitions
            .into_iter()
            .map(|partition| {
                let (_, high) = client.fetch_watermarks(&topic, partition, KAFKA_TIMEOUT)?;
                Ok(PartitionOffset {
                    partition,
                    offset: high,
                })
            })
            .collect()
    })
    .await
}

/// A client of `group` that commits nothing by itself.
fn group_client(kafka: &ClientConfig, group: &str) -> Result<BaseConsumer, OpsError> {
    Ok(kafka
        .clone()
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?)
}

/// Runs librdkafka's blocking calls off the async runtime.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, OpsError> + Send + 'static,
) -> Result<T, OpsError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(outcome) => outcome,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_cancelled) => Err(OpsError::Kafka(rdkafka::error::KafkaError::Canceled)),
    }
}
