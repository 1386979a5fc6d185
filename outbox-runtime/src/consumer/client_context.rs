//! The Kafka client context: consumer lag from librdkafka's statistics, and
//! rebalance logging.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use rdkafka::ClientContext;
use rdkafka::consumer::{BaseConsumer, ConsumerContext, Rebalance};
use rdkafka::statistics::Statistics;

use super::telemetry as m;

pub(crate) struct KafkaContext {
    pub(crate) group: String,
    /// Counts assignments and revocations, so the receive loop knows when the
    /// offsets it expects next are no longer its own.
    pub(crate) rebalances: AtomicU64,
    /// Partitions assigned or revoked since the receive loop last looked:
    /// what it kept of them (a retried event, messages waiting) is no longer
    /// its own, and the broker redelivers from the committed offset.
    moved: Mutex<Vec<(String, i32)>>,
}

impl KafkaContext {
    pub(crate) fn new(group: String) -> Self {
        Self {
            group,
            rebalances: AtomicU64::new(0),
            moved: Mutex::default(),
        }
    }

    pub(crate) fn rebalance_generation(&self) -> u64 {
        self.rebalances.load(Ordering::Acquire)
    }

    /// The partitions assigned or revoked since the last call.
    pub(crate) fn take_moved(&self) -> Vec<(String, i32)> {
        std::mem::take(&mut *self.moved.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl ClientContext for KafkaContext {
    /// librdkafka computes the lag of each assigned partition (end offset minus
    /// committed/consumed position) in its periodic statistics; publishing it
    /// costs no broker round trip of our own.
    fn stats(&self, statistics: Statistics) {
        for (topic, stats) in &statistics.topics {
            for (partition, p) in &stats.partitions {
                // -1 is librdkafka's internal "unassigned" partition.
                if *partition < 0 || !p.desired || p.consumer_lag < 0 {
                    continue;
                }
                metrics::gauge!(
                    m::LAG,
                    "group" => self.group.clone(),
                    "topic" => topic.clone(),
                    "partition" => partition.to_string()
                )
                .set(p.consumer_lag as f64);
            }
        }
    }
}

impl ConsumerContext for KafkaContext {
    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let describe = |tpl: &rdkafka::TopicPartitionList| {
            tpl.elements()
                .iter()
                .map(|e| format!("{}/{}", e.topic(), e.partition()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        if let Rebalance::Assign(tpl) | Rebalance::Revoke(tpl) = rebalance {
            let mut moved = self.moved.lock().unwrap_or_else(|e| e.into_inner());
            moved.extend(
                tpl.elements()
                    .iter()
                    .map(|e| (e.topic().to_owned(), e.partition())),
            );
        }
        self.rebalances.fetch_add(1, Ordering::AcqRel);
        match rebalance {
            Rebalance::Assign(tpl) => {
                tracing::info!(group = %self.group, partitions = %describe(tpl), "partitions assigned")
            }
            Rebalance::Revoke(tpl) => {
                tracing::info!(group = %self.group, partitions = %describe(tpl), "partitions revoked")
            }
            Rebalance::Error(error) => {
                tracing::warn!(group = %self.group, %error, "rebalance error")
            }
        }
    }
}
