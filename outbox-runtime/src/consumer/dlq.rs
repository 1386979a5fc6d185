//! Publishing messages that cannot be handled to `<topic><suffix>`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedMessage;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};
use rdkafka::{ClientConfig, Message};

use crate::topic_admin::{TopicRole, TopicSpec, TopicsError};
use crate::wire::dead_letter::{DeadLetterHeaders, DeadLetterReason, dead_letter_headers};

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
    pub(crate) async fn create(&self, names: &[String]) -> Result<(), TopicsError> {
        let specs: Vec<TopicSpec> = names
            .iter()
            .map(|name| TopicSpec {
                name: name.clone(),
                role: TopicRole::DeadLetters,
                partitions: 1,
                replication: 1,
                configs: Default::default(),
            })
            .collect();
        let specs: Vec<&TopicSpec> = specs.iter().collect();
        crate::topic_admin::create(&self.connection, &specs)
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
        let headers = dead_letter_headers(
            message,
            &DeadLetterHeaders {
                reason,
                error,
                group: &self.group,
                value_dropped: !with_value,
            },
        );
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
