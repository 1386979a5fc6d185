//! Topic provisioning against the real broker: the plan names what is
//! missing, apply creates it (never touching what exists), and both are
//! idempotent.
#![allow(missing_docs)]

use std::collections::BTreeSet;

use txoutbox_runtime::topics::{self, TopicDefaults, TopicRole};
use txoutbox_testkit::broker::{brokers, client_config};

fn kafka() -> rdkafka::ClientConfig {
    client_config(&brokers())
}

#[tokio::test]
async fn plan_names_the_missing_topics_and_apply_creates_only_those() {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let orders = format!("topics-test-{run}.orders");
    let payments = format!("topics-test-{run}.payments");
    let events: BTreeSet<&str> = [orders.as_str(), payments.as_str()].into();
    let consumed: BTreeSet<&str> = [orders.as_str()].into();
    let defaults = TopicDefaults::default().partitions(2);
    let wanted = required_for(&events, &consumed, &defaults);
    assert_eq!(wanted.len(), 3);

    // One exists already, with more partitions than wanted: left alone.
    let existing = required_for(
        &[payments.as_str()].into(),
        &BTreeSet::new(),
        &TopicDefaults::default().partitions(4),
    );
    let first = topics::plan(&kafka(), &existing).await.unwrap();
    assert_eq!(
        topics::apply(&kafka(), &first).await.unwrap(),
        [payments.as_str()]
    );

    let plan = topics::plan(&kafka(), &wanted).await.unwrap();
    let missing: Vec<&str> = plan.missing().map(|e| e.spec.name.as_str()).collect();
    assert_eq!(missing, [orders.as_str(), &format!("{orders}.dlq")]);
    let kept = plan
        .entries
        .iter()
        .find(|e| e.spec.name == payments)
        .unwrap();
    assert_eq!(kept.existing_partitions, Some(4));

    let created = topics::apply(&kafka(), &plan).await.unwrap();
    assert_eq!(created, [orders.clone(), format!("{orders}.dlq")]);
    // The cluster may take a moment to show new topics in its metadata.
    let mut after = topics::plan(&kafka(), &wanted).await.unwrap();
    for _ in 0..50 {
        if after.is_complete() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        after = topics::plan(&kafka(), &wanted).await.unwrap();
    }
    assert!(after.is_complete(), "{after:?}");
    let dlq = after
        .entries
        .iter()
        .find(|e| e.spec.role == TopicRole::DeadLetters)
        .unwrap();
    assert_eq!(dlq.existing_partitions, Some(1));
    // Idempotent: nothing left to create.
    assert!(topics::apply(&kafka(), &after).await.unwrap().is_empty());
}

/// The topics `events` and `consumed` need (as a service whose registries
/// hold them would).
fn required_for(
    events: &BTreeSet<&str>,
    consumed: &BTreeSet<&str>,
    defaults: &TopicDefaults,
) -> Vec<txoutbox_runtime::topics::TopicSpec> {
    let owned = |set: &BTreeSet<&str>| set.iter().map(|topic| (*topic).to_owned()).collect();
    txoutbox_runtime::topics::Registered {
        events: owned(events),
        consumed: owned(consumed),
    }
    .required(defaults)
}
