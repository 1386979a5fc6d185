//! Publishing messages that cannot be handled to `<topic><suffix>`.

use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, OwnedHeaders, OwnedMessage};
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
        })
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
        let mut headers = OwnedHeaders::new();
        if let Some(original) = message.headers() {
            for h in original.iter() {
                headers = headers.insert(Header {
                    key: h.key,
                    value: h.value,
                });
            }
        }
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
