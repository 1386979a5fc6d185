//! What a topic is and how one is created: a leaf under the topic planner
//! ([`crate::topics`], which re-exports its types) and the consumer (which
//! may create its missing dead-letter topics). Never deletes, shrinks or
//! reconfigures a topic.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;
use serde::{Deserialize, Serialize};

/// What a topic is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TopicRole {
    /// Carries events of the registered types.
    Events,
    /// The dead-letter topic of a consumed topic.
    DeadLetters,
}

/// A topic as it should exist.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicSpec {
    /// Its name.
    pub name: String,
    /// What it is for.
    pub role: TopicRole,
    /// Partitions to create it with.
    pub partitions: i32,
    /// Replication factor to create it with.
    pub replication: i32,
    /// Topic configs to create it with (e.g. `retention.ms`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub configs: BTreeMap<String, String>,
}

/// Provisioning failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TopicsError {
    /// The Kafka client could not be created, or metadata could not be read.
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// The cluster refused to create a topic.
    #[error("could not create topic `{topic}`: {reason}")]
    Create {
        /// The topic.
        topic: String,
        /// The broker's reason.
        reason: String,
    },
}

/// How long a metadata request or a topic creation may take.
const TIMEOUT: Duration = Duration::from_secs(15);

/// Partition counts of the cluster's topics.
pub(crate) async fn existing(kafka: &ClientConfig) -> Result<BTreeMap<String, i32>, TopicsError> {
    let admin: AdminClient<DefaultClientContext> = kafka.create()?;
    // Metadata is a blocking call of librdkafka's.
    tokio::task::spawn_blocking(move || {
        let metadata = admin.inner().fetch_metadata(None, TIMEOUT)?;
        Ok(metadata
            .topics()
            .iter()
            .filter(|t| t.error().is_none())
            .map(|t| (t.name().to_owned(), t.partitions().len() as i32))
            .collect())
    })
    .await
    .expect("metadata task")
}

/// Creates `missing`; returns the names of those it created. Idempotent: a
/// topic created meanwhile by someone else counts as there.
pub(crate) async fn create(
    kafka: &ClientConfig,
    missing: &[&TopicSpec],
) -> Result<Vec<String>, TopicsError> {
    if missing.is_empty() {
        return Ok(Vec::new());
    }
    let admin: AdminClient<DefaultClientContext> = kafka.create()?;
    let new: Vec<NewTopic<'_>> = missing
        .iter()
        .map(|spec| {
            spec.configs.iter().fold(
                NewTopic::new(
                    &spec.name,
                    spec.partitions,
                    TopicReplication::Fixed(spec.replication),
                ),
                |topic, (key, value)| topic.set(key, value),
            )
        })
        .collect();
    let options = AdminOptions::new().operation_timeout(Some(TIMEOUT));
    let mut created = Vec::new();
    for result in admin.create_topics(&new, &options).await? {
        match result {
            Ok(topic) => created.push(topic),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => {
                return Err(TopicsError::Create {
                    topic,
                    reason: code.to_string(),
                });
            }
        }
    }
    Ok(created)
}
