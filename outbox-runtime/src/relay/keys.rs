//! Sets of keys as per-key order sees them: a partition key *of a topic*.
//!
//! Kafka orders records per partition, and a key's records go to one
//! partition of each topic, so order is kept per (topic, partition key): a
//! key's records on another topic are another sequence, which a failure or
//! a hold on this topic must not wait for.

use std::collections::{HashMap, HashSet};

/// (topic, partition key) pairs, looked up without allocating.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct TopicKeys(HashMap<String, HashSet<String>>);

impl TopicKeys {
    pub(crate) fn insert(&mut self, topic: &str, key: &str) {
        match self.0.get_mut(topic) {
            Some(keys) => {
                if !keys.contains(key) {
                    keys.insert(key.to_owned());
                }
            }
            None => {
                self.0
                    .insert(topic.to_owned(), HashSet::from([key.to_owned()]));
            }
        }
    }

    pub(crate) fn contains(&self, topic: &str, key: &str) -> bool {
        self.0.get(topic).is_some_and(|keys| keys.contains(key))
    }

    /// Every pair, sorted (for tests).
    #[cfg(test)]
    pub(crate) fn pairs(&self) -> Vec<(String, String)> {
        let mut pairs: Vec<(String, String)> = self
            .0
            .iter()
            .flat_map(|(topic, keys)| keys.iter().map(move |key| (topic.clone(), key.clone())))
            .collect();
        pairs.sort();
        pairs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_held_per_topic() {
        let mut keys = TopicKeys::default();
        keys.insert("orders", "k1");
        keys.insert("orders", "k1");
        assert!(keys.contains("orders", "k1"));
        assert!(!keys.contains("payments", "k1"));
        assert!(!keys.contains("orders", "k2"));
    }
}
