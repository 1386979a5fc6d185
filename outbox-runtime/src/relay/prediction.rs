//! Which partition a row goes to: librdkafka's partitioner over the topic's
//! partition count, from metadata fetched in the background and cached. The
//! same metadata says whether the broker refuses a topic as a whole
//! (unknown, not authorized): the relay holds such a topic (see
//! `held_topics`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::error::RDKafkaErrorCode;
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

/// What one metadata request said of a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TopicMetadata {
    /// Listed without error, with this many partitions.
    Listed(i32),
    /// Refused as a whole (see `publish::refuses_topic`), with the reason.
    Refused(String),
    /// No answer, or an error that says nothing about the topic for good
    /// (a leader election, say).
    Unknown,
}

/// Partition counts of the topics seen, and the partitioner they feed.
pub(super) struct Prediction {
    partitioner: Option<Partitioner>,
    counts: HashMap<String, Count>,
    /// Topics whose partition count is wanted.
    wanted: Vec<String>,
    fetching: Option<MetadataFetch>,
    /// Answers not taken yet (see [`take_answers`](Self::take_answers)).
    answers: Vec<(String, TopicMetadata)>,
}

impl Prediction {
    pub(super) fn new(partitioner: Option<Partitioner>) -> Self {
        Self {
            partitioner,
            counts: HashMap::new(),
            wanted: Vec::new(),
            fetching: None,
            answers: Vec::new(),
        }
    }

    /// The partition librdkafka will put `key` of `topic` in, if known.
    /// The topic's metadata is fetched when unknown or stale, whether or not
    /// the partitioner can be predicted: it also says whether the topic is
    /// refused.
    pub(super) fn predict(&mut self, topic: &str, key: &str) -> Option<i32> {
        let (partitions, stale) = match self.counts.get(topic) {
            Some(count) => (count.partitions, Instant::now() >= count.refetch_at),
            None => (None, true),
        };
        if stale {
            self.want(topic);
        }
        self.partitioner?.partition(key.as_bytes(), partitions?)
    }

    /// What metadata requests answered since the last call, per topic.
    pub(super) fn take_answers(&mut self) -> Vec<(String, TopicMetadata)> {
        std::mem::take(&mut self.answers)
    }

    pub(super) fn want(&mut self, topic: &str) {
        let fetching = self.fetching.as_ref().is_some_and(|f| f.topic == topic);
        if !fetching && !self.wanted.iter().any(|t| t == topic) {
            self.wanted.push(topic.to_owned());
        }
    }

    /// Takes the metadata request under way out, for the relay to wait for
    /// its answer beside delivery reports (it may hold a topic whose rows a
    /// batch waits for); give it back with [`restore`](Self::restore).
    pub(super) fn take_fetch(&mut self) -> Option<MetadataFetch> {
        self.fetching.take()
    }

    /// Gives back what [`take_fetch`](Self::take_fetch) took.
    pub(super) fn restore(&mut self, fetch: Option<MetadataFetch>) {
        if fetch.is_some() {
            self.fetching = fetch;
        }
    }

    /// Collects a finished metadata request and starts the next wanted one
    /// (one at a time, on a blocking thread: librdkafka's call blocks).
    pub(super) fn refresh_metadata(&mut self, producer: &FutureProducer) {
        if let Some(fetch) = &self.fetching {
            if fetch.answer.is_none() && !fetch.handle.is_finished() {
                return;
            }
            let MetadataFetch {
                topic,
                handle,
                answer,
            } = self.fetching.take().expect("checked");
            let answer = match answer {
                Some(answer) => answer,
                None => futures::FutureExt::now_or_never(handle)
                    .and_then(Result::ok)
                    .unwrap_or(TopicMetadata::Unknown),
            };
            let partitions = match answer {
                TopicMetadata::Listed(partitions) => Some(partitions),
                _ => None,
            };
            self.answers.push((topic.clone(), answer));
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
            let Ok(metadata) = producer
                .client()
                .fetch_metadata(Some(&name), METADATA_TIMEOUT)
            else {
                return TopicMetadata::Unknown;
            };
            let Some(found) = metadata.topics().iter().find(|t| t.name() == name) else {
                return TopicMetadata::Unknown;
            };
            match found.error().map(RDKafkaErrorCode::from) {
                Some(code) if super::publish::refuses_topic(code) => {
                    TopicMetadata::Refused(format!("{code:?} ({code}), in the topic's metadata"))
                }
                Some(_) => TopicMetadata::Unknown,
                None if found.partitions().is_empty() => TopicMetadata::Unknown,
                None => TopicMetadata::Listed(found.partitions().len() as i32),
            }
        });
        self.fetching = Some(MetadataFetch {
            topic,
            handle: fetch,
            answer: None,
        });
    }
}

/// One metadata request on a blocking thread.
pub(crate) struct MetadataFetch {
    topic: String,
    handle: tokio::task::JoinHandle<TopicMetadata>,
    /// Its answer, once [`answered`](Self::answered) saw it come (the
    /// handle must not be polled again).
    answer: Option<TopicMetadata>,
}

impl MetadataFetch {
    /// Whether the answer is still to come.
    pub(crate) fn pending(&self) -> bool {
        self.answer.is_none()
    }

    /// Waits for the answer and keeps it (for `refresh_metadata`); never
    /// returns once answered. Cancel-safe.
    pub(crate) async fn answered(&mut self) {
        if self.answer.is_some() {
            return std::future::pending().await;
        }
        let answer = (&mut self.handle).await.unwrap_or(TopicMetadata::Unknown);
        self.answer = Some(answer);
    }
}
