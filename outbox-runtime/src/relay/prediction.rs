//! Which partition a row goes to: librdkafka's partitioner over the topic's
//! partition count, from metadata fetched in the background and cached.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::producer::FutureProducer;

use super::partitioner::Partitioner;

/// How long a topic's partition count is trusted before it is fetched again
/// (also re-fetched at once when a delivery lands elsewhere than predicted).
const METADATA_MAX_AGE: Duration = Duration::from_secs(300);
/// When a failed metadata request is tried again.
const METADATA_RETRY: Duration = Duration::from_secs(30);
/// Bound of one metadata request (run on a blocking thread).
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug)]
struct Count {
    partitions: Option<i32>,
    refetch_at: Instant,
}

/// Partition counts of the topics seen, and the partitioner they feed.
pub(super) struct Prediction {
    partitioner: Option<Partitioner>,
    counts: HashMap<String, Count>,
    /// Topics whose partition count is wanted.
    wanted: Vec<String>,
    fetching: Option<(String, tokio::task::JoinHandle<Option<i32>>)>,
}

impl Prediction {
    pub(super) fn new(partitioner: Option<Partitioner>) -> Self {
        Self {
            partitioner,
            counts: HashMap::new(),
            wanted: Vec::new(),
            fetching: None,
        }
    }

    /// The partition librdkafka will put `key` of `topic` in, if known.
    pub(super) fn predict(&mut self, topic: &str, key: &str) -> Option<i32> {
        let partitioner = self.partitioner?;
        let (partitions, stale) = match self.counts.get(topic) {
            Some(count) => (count.partitions, Instant::now() >= count.refetch_at),
            None => (None, true),
        };
        if stale {
            self.want(topic);
        }
        partitioner.partition(key.as_bytes(), partitions?)
    }

    pub(super) fn want(&mut self, topic: &str) {
        let fetching = self.fetching.as_ref().is_some_and(|(t, _)| t == topic);
        if !fetching && !self.wanted.iter().any(|t| t == topic) {
            self.wanted.push(topic.to_owned());
        }
    }

    /// Collects a finished metadata request and starts the next wanted one
    /// (one at a time, on a blocking thread: librdkafka's call blocks).
    pub(super) fn refresh_metadata(&mut self, producer: &FutureProducer) {
        if let Some((_, fetch)) = &self.fetching {
            if !fetch.is_finished() {
                return;
            }
            let (topic, fetch) = self.fetching.take().expect("checked");
            let partitions = futures::FutureExt::now_or_never(fetch)
                .and_then(Result::ok)
                .flatten();
            let wait = if partitions.is_some() {
                METADATA_MAX_AGE
            } else {
                METADATA_RETRY
            };
            let refetch_at = Instant::now() + wait;
            self.wanted.retain(|t| *t != topic);
            self.counts.insert(
                topic,
                Count {
                    partitions,
                    refetch_at,
                },
            );
        }
        let Some(topic) = self.wanted.pop() else {
            return;
        };
        let producer = producer.clone();
        let name = topic.clone();
        let fetch = tokio::task::spawn_blocking(move || {
            use rdkafka::producer::Producer;
            let metadata = producer
                .client()
                .fetch_metadata(Some(&name), METADATA_TIMEOUT)
                .ok()?;
            let found = metadata.topics().iter().find(|t| t.name() == name)?;
            if found.error().is_some() || found.partitions().is_empty() {
                return None;
            }
            Some(found.partitions().len() as i32)
        });
        self.fetching = Some((topic, fetch));
    }
}
