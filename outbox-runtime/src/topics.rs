//! Topic provisioning: the topics a service needs, compared with a cluster,
//! and created where missing. Never deletes, shrinks or reconfigures a topic.
//!
//! A service needs the topics of the events linked into it (the registry
//! `#[derive(DomainEvent)]` fills, the one the schema export uses) and, for
//! every topic an `#[event_handler]` consumes, its dead-letter topic
//! (`<topic>.dlq` by default). [`required`] lists them;
//! [`plan`] asks the cluster what exists; [`apply`] creates what is missing.
//! The `outbox topics plan | apply` command does the same from a service's
//! exporter binary.
//!
//! ```no_run
//! # async fn run() -> Result<(), txoutbox_runtime::topics::TopicsError> {
//! use txoutbox_runtime::topics::{self, TopicDefaults};
//!
//! let mut kafka = rdkafka::ClientConfig::new();
//! kafka.set("bootstrap.servers", "kafka:9092");
//! let wanted = topics::required(&TopicDefaults::default());
//! let plan = topics::plan(&kafka, &wanted).await?;
//! for entry in plan.missing() {
//!     println!("to create: {} ({} partitions)", entry.spec.name, entry.spec.partitions);
//! }
//! let created = topics::apply(&kafka, &plan).await?;
//! # Ok(()) }
//! ```

use std::collections::{BTreeMap, BTreeSet};

use rdkafka::ClientConfig;
use serde::{Deserialize, Serialize};

pub use crate::topic_admin::{TopicRole, TopicSpec, TopicsError};
use crate::topic_admin::{create, existing};

/// How [`required`] sizes the topics. Defaults: 3 partitions, replication 1
/// (a development cluster: raise both for production), no configs,
/// dead-letter topics of 1 partition with the suffix `.dlq` (the consumer's
/// default).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TopicDefaults {
    /// Partitions of event topics.
    pub partitions: i32,
    /// Replication factor of every topic.
    pub replication: i32,
    /// Configs of every topic.
    pub configs: BTreeMap<String, String>,
    /// Partitions of dead-letter topics.
    pub dead_letter_partitions: i32,
    /// Suffix of dead-letter topics (`ConsumerBuilder::dlq_suffix`).
    pub dead_letter_suffix: String,
}

impl TopicDefaults {
    /// Partitions of event topics.
    pub fn partitions(mut self, partitions: i32) -> Self {
        self.partitions = partitions;
        self
    }

    /// Replication factor of every topic.
    pub fn replication(mut self, replication: i32) -> Self {
        self.replication = replication;
        self
    }

    /// A config of every topic (e.g. `retention.ms`).
    pub fn config(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.configs.insert(key.into(), value.into());
        self
    }

    /// Partitions of dead-letter topics.
    pub fn dead_letter_partitions(mut self, partitions: i32) -> Self {
        self.dead_letter_partitions = partitions;
        self
    }

    /// Suffix of dead-letter topics.
    pub fn dead_letter_suffix(mut self, suffix: impl Into<String>) -> Self {
        self.dead_letter_suffix = suffix.into();
        self
    }
}

impl Default for TopicDefaults {
    fn default() -> Self {
        Self {
            partitions: 3,
            replication: 1,
            configs: BTreeMap::new(),
            dead_letter_partitions: 1,
            dead_letter_suffix: ".dlq".to_owned(),
        }
    }
}

/// The topics of this binary's registries: what `#[derive(DomainEvent)]`
/// and `#[event_handler]` registered. A service's exporter binary prints it
/// (as JSON) for `outbox topics`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registered {
    /// Topics of the registered event types.
    pub events: BTreeSet<String>,
    /// Topics an `#[event_handler]` consumes.
    pub consumed: BTreeSet<String>,
}

impl Registered {
    /// This binary's registries.
    pub fn linked() -> Self {
        Self {
            events: txoutbox_core::schema::registered_events()
                .iter()
                .map(|e| e.topic.to_owned())
                .collect(),
            consumed: crate::registry::registered_handlers()
                .iter()
                .map(|h| h.topic.to_owned())
                .collect(),
        }
    }

    /// The topics they need, sorted by name.
    pub fn required(&self, defaults: &TopicDefaults) -> Vec<TopicSpec> {
        let events: BTreeSet<&str> = self.events.iter().map(String::as_str).collect();
        let consumed: BTreeSet<&str> = self.consumed.iter().map(String::as_str).collect();
        required_for(&events, &consumed, defaults)
    }
}

/// The topics this binary's registered events and `#[event_handler]`s need,
/// sorted by name.
pub fn required(defaults: &TopicDefaults) -> Vec<TopicSpec> {
    Registered::linked().required(defaults)
}

/// [`required`] for explicit sets of event topics and consumed topics.
fn required_for(
    events: &BTreeSet<&str>,
    consumed: &BTreeSet<&str>,
    defaults: &TopicDefaults,
) -> Vec<TopicSpec> {
    let mut specs: BTreeMap<String, TopicSpec> = BTreeMap::new();
    for topic in events.iter().chain(consumed) {
        specs
            .entry((*topic).to_owned())
            .or_insert_with(|| TopicSpec {
                name: (*topic).to_owned(),
                role: TopicRole::Events,
                partitions: defaults.partitions,
                replication: defaults.replication,
                configs: defaults.configs.clone(),
            });
    }
    for topic in consumed {
        let name = format!("{topic}{}", defaults.dead_letter_suffix);
        specs.entry(name.clone()).or_insert(TopicSpec {
            name,
            role: TopicRole::DeadLetters,
            partitions: defaults.dead_letter_partitions,
            replication: defaults.replication,
            configs: defaults.configs.clone(),
        });
    }
    specs.into_values().collect()
}

/// A topic of a [`Plan`] and what the cluster has of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlanEntry {
    /// The topic as wanted.
    pub spec: TopicSpec,
    /// Its partitions on the cluster (`None`: it does not exist).
    pub existing_partitions: Option<i32>,
}

impl PlanEntry {
    /// Whether [`apply`] creates it.
    pub fn is_missing(&self) -> bool {
        self.existing_partitions.is_none()
    }

    /// Whether it exists with fewer partitions than wanted (never changed:
    /// adding partitions moves keys to other partitions, which breaks per-key
    /// order; an operator decides).
    pub fn has_fewer_partitions(&self) -> bool {
        self.existing_partitions
            .is_some_and(|existing| existing < self.spec.partitions)
    }
}

/// The wanted topics against the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// One entry per wanted topic, sorted by name.
    pub entries: Vec<PlanEntry>,
}

impl Plan {
    /// The topics [`apply`] creates.
    pub fn missing(&self) -> impl Iterator<Item = &PlanEntry> {
        self.entries.iter().filter(|e| e.is_missing())
    }

    /// Whether the cluster has every wanted topic.
    pub fn is_complete(&self) -> bool {
        self.missing().next().is_none()
    }
}

/// Compares `wanted` with the cluster `kafka` reaches.
pub async fn plan(kafka: &ClientConfig, wanted: &[TopicSpec]) -> Result<Plan, TopicsError> {
    let existing = existing(kafka).await?;
    Ok(Plan {
        entries: wanted
            .iter()
            .map(|spec| PlanEntry {
                spec: spec.clone(),
                existing_partitions: existing.get(&spec.name).copied(),
            })
            .collect(),
    })
}

/// Creates the plan's missing topics; returns their names. Idempotent: a
/// topic created meanwhile by someone else counts as there.
pub async fn apply(kafka: &ClientConfig, plan: &Plan) -> Result<Vec<String>, TopicsError> {
    let missing: Vec<&TopicSpec> = plan.missing().map(|e| &e.spec).collect();
    create(kafka, &missing).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_topics_and_the_dead_letter_topics_of_consumed_ones() {
        let events: BTreeSet<&str> = ["order.events", "payment.events"].into();
        let consumed: BTreeSet<&str> = ["order.events"].into();
        let defaults = TopicDefaults::default().partitions(6);
        let specs = required_for(&events, &consumed, &defaults);
        let names: Vec<(&str, TopicRole, i32)> = specs
            .iter()
            .map(|s| (s.name.as_str(), s.role, s.partitions))
            .collect();
        assert_eq!(
            names,
            [
                ("order.events", TopicRole::Events, 6),
                ("order.events.dlq", TopicRole::DeadLetters, 1),
                ("payment.events", TopicRole::Events, 6),
            ]
        );
    }
}
