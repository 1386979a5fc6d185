//! Publishing messages that cannot be handled to `<topic><suffix>`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};
use rdkafka::{ClientConfig, Message};

use super::message::DeadLetterReason;

/// Header with the [`DeadLetterReason`] code, e.g. `not_json`.
pub const HEADER_DLQ_REASON: &str = "dlq_reason";
/// Header with the human-readable error.
pub const HEADER_DLQ_ERROR: &str = "dlq_error";
/// Header with the topic the message was read from.
pub const HEADER_DLQ_TOPIC: &str = "dlq_original_topic";
/// Header with the partition the message was read from.
pub const HEADER_DLQ_PARTITION: &str = "dlq_original_partition";
/// Header with the offset the message had.
pub const HEADER_DLQ_OFFSET: &str = "dlq_original_offset";
/// Header with the consumer group that gave up on the message.
pub const HEADER_DLQ_GROUP: &str = "dlq_consumer_group";
/// Header set to `true` when the value was too large even for the dead-letter
/// topic and was left out (key and headers are kept).
pub const HEADER_DLQ_VALUE_DROPPED: &str = "dlq_value_dropped";

pub(crate) struct DeadLetters {
    producer: FutureProducer,
    /// The connection and security settings, for an admin client.
    connection: ClientConfig,
    suffix: String,
    group: String,
    /// Dead-letter topics the broker refused as a whole (missing, not
    /// writable), with when and why: for a while after such a refusal,
    /// further dead letters for the topic are parked without trying.
    refusals: Mutex<HashMap<String, (Instant, String)>>,
}

/// How long a topic-wide refusal of a dead-letter topic stands before the
/// next dead letter for it tries the broker again.
const REFUSAL_HOLD: Duration = Duration::from_secs(60);

/// What a failed dead-letter publish says about the next try.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// This record can never be published as it is (too large even
    /// without its value).
    OfTheRecord,
    /// The broker refuses the topic itself: missing, or not writable.
    OfTheTopic,
    /// Anything else (timeouts, an unreachable broker): worth another try.
    Transient,
}

impl Refusal {
    pub(crate) fn of(error: &KafkaError) -> Self {
        use RDKafkaErrorCode as C;
        match error.rdkafka_error_code() {
            Some(
                C::MessageSizeTooLarge
                | C::InvalidMessageSize
                | C::MessageBatchTooLarge
                | C::InvalidRecord
                | C::InvalidMessage,
            ) => Self::OfTheRecord,
            Some(
                C::UnknownTopicOrPartition
                | C::UnknownTopic
                | C::TopicAuthorizationFailed
                | C::ClusterAuthorizationFailed
                | C::InvalidTopic,
            ) => Self::OfTheTopic,
            _ => Self::Transient,
        }
    }
}

impl DeadLetters {
    pub(crate) fn new(
        base: &ClientConfig,
        suffix: String,
        group: String,
        max_message_bytes: usize,
    ) -> Result<Self, KafkaError> {
        let mut config = ClientConfig::new();
        // Only connection and security settings carry over; consumer tuning would
        // make librdkafka warn about properties it ignores.
        for (key, value) in base.config_map() {
            if key.starts_with("bootstrap.")
                || key.starts_with("security.")
                || key.starts_with("sasl.")
                || key.starts_with("ssl.")
                || key.starts_with("client.")
                || key == "metadata.broker.list"
            {
                config.set(key, value);
            }
        }
        let connection = config.clone();
        config
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .set("message.timeout.ms", "30000")
            .set(
                "message.max.bytes",
                (max_message_bytes + 64 * 1024).max(1_000_000).to_string(),
            );
        Ok(Self {
            producer: config.create()?,
            connection,
            suffix,
            group,
            refusals: Mutex::default(),
        })
    }

    /// Why `topic` is refused right now, if a topic-wide refusal was seen
    /// less than [`REFUSAL_HOLD`] ago.
    pub(crate) fn refused(&self, topic: &str) -> Option<String> {
        let refusals = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
        refusals
            .get(topic)
            .filter(|(at, _)| at.elapsed() < REFUSAL_HOLD)
            .map(|(_, why)| why.clone())
    }

    /// Notes a topic-wide refusal of `topic`.
    pub(crate) fn note_refusal(&self, topic: &str, why: &str) {
        let mut refusals = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
        refusals.insert(topic.to_owned(), (Instant::now(), why.to_owned()));
    }

    /// The dead-letter topics of `topics` the cluster does not have; `None`
    /// when the broker did not answer (then nobody knows, and the consumer
    /// starts anyway: an unreachable broker is an outage it waits out).
    pub(crate) async fn missing(&self, topics: &[&str]) -> Option<Vec<String>> {
        let wanted: Vec<String> = topics.iter().map(|t| self.topic_for(t)).collect();
        let producer = self.producer.clone();
        let existing = tokio::task::spawn_blocking(move || {
            let metadata = producer
                .client()
                .fetch_metadata(None, Duration::from_secs(10))
                .ok()?;
            Some(
                metadata
                    .topics()
                    .iter()
                    .filter(|t| t.error().is_none())
                    .map(|t| t.name().to_owned())
                    .collect::<Vec<_>>(),
            )
        })
        .await
        .ok()??;
        Some(
            wanted
                .into_iter()
                .filter(|topic| !existing.contains(topic))
                .collect(),
        )
    }

    /// Creates the dead-letter topics `names` (1 partition, replication 1:
    /// provision production topics with `outbox topics apply`).
    pub(crate) async fn create(&self, names: &[String]) -> Result<(), crate::topics::TopicsError> {
        let plan = crate::topics::Plan {
            entries: names
                .iter()
                .map(|name| crate::topics::PlanEntry {
                    spec: crate::topics::TopicSpec {
                        name: name.clone(),
                        role: crate::topics::TopicRole::DeadLetters,
                        partitions: 1,
                        replication: 1,
                        configs: Default::default(),
                    },
                    existing_partitions: None,
                })
                .collect(),
        };
        crate::topics::apply(&self.connection, &plan)
            .await
            .map(drop)
    }

    pub(crate) fn topic_for(&self, topic: &str) -> String {
        format!("{topic}{}", self.suffix)
    }

    /// Publishes `message` with its key, value and headers plus the error headers,
    /// and waits for the broker's acknowledgement.
    pub(crate) async fn publish(
        &self,
        message: &OwnedMessage,
        reason: DeadLetterReason,
        error: &str,
    ) -> Result<(), KafkaError> {
        let topic = self.topic_for(message.topic());
        match self.send(&topic, message, reason, error, true).await {
            Err(KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge)) => {
                self.send(&topic, message, reason, error, false).await
            }
            other => other,
        }
    }

    async fn send(
        &self,
        topic: &str,
        message: &OwnedMessage,
        reason: DeadLetterReason,
        error: &str,
        with_value: bool,
    ) -> Result<(), KafkaError> {
        // A copy of the original list, made by librdkafka: its names may be
        // any bytes, which rdkafka's `Headers::iter` would panic on.
        let mut headers = message.headers().cloned().unwrap_or_default();
        let partition = message.partition().to_string();
        let offset = message.offset().to_string();
        let extra: [(&str, &str); 6] = [
            (HEADER_DLQ_REASON, reason.as_str()),
            (HEADER_DLQ_ERROR, error),
            (HEADER_DLQ_TOPIC, message.topic()),
            (HEADER_DLQ_PARTITION, &partition),
            (HEADER_DLQ_OFFSET, &offset),
            (HEADER_DLQ_GROUP, &self.group),
        ];
        for (key, value) in extra {
            headers = headers.insert(Header {
                key,
                value: Some(value),
            });
        }
        if !with_value {
            headers = headers.insert(Header {
                key: HEADER_DLQ_VALUE_DROPPED,
                value: Some("true"),
            });
        }
        let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).headers(headers);
        if let Some(key) = message.key() {
            record = record.key(key);
        }
        if with_value && let Some(value) = message.payload() {
            record = record.payload(value);
        }
        self.producer
            .send(record, Duration::from_secs(5))
            .await
            .map(drop)
            .map_err(|(e, _)| e)
    }
}
