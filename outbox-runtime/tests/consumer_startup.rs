//! A consumer whose dead-letter topic does not exist refuses to start,
//! naming the topic and the command that creates it; opt-in, it creates it.
#![allow(missing_docs)]

mod consumer_support;

use std::collections::BTreeSet;
use std::time::Duration;

use consumer_support::*;
use sqlx::{PgPool, Postgres, Transaction};
use txoutbox_runtime::consumer::{Consumer, ConsumerError, event_handler};
use txoutbox_runtime::lifecycle::Stopped;
use txoutbox_runtime::topics::{self, TopicDefaults};

/// An event whose dead-letter topic the test deletes first.
#[derive(
    Debug,
    Clone,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
    txoutbox_core::DomainEvent,
)]
#[event(topic = "consumer-startup-lonely", aggregate = "Lonely")]
pub struct Lonely {
    #[partition_key]
    pub event_id: uuid::Uuid,
}

#[event_handler]
async fn on_lonely(_tx: &mut Transaction<'_, Postgres>, _event: Lonely) -> Result<(), sqlx::Error> {
    Ok(())
}

fn kafka() -> rdkafka::ClientConfig {
    kafka_config()
}

/// Deletes the dead-letter topic if an earlier run left it.
async fn without_dlq() {
    let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
        kafka().create().unwrap();
    let dlq = format!("{}.dlq", <Lonely as txoutbox_core::DomainEvent>::TOPIC);
    let _ = admin
        .delete_topics(&[&dlq], &rdkafka::admin::AdminOptions::new())
        .await;
    let wanted = topics::Registered {
        events: [<Lonely as txoutbox_core::DomainEvent>::TOPIC.to_owned()].into(),
        consumed: BTreeSet::new(),
    }
    .required(&TopicDefaults::default().partitions(1));
    let plan = topics::plan(&kafka(), &wanted).await.unwrap();
    topics::apply(&kafka(), &plan).await.unwrap();
}

#[sqlx::test(migrations = false)]
async fn a_missing_dead_letter_topic_is_named_at_start_or_created_on_request(pool: PgPool) {
    prepare_db(&pool).await;
    without_dlq().await;
    let dlq = format!("{}.dlq", <Lonely as txoutbox_core::DomainEvent>::TOPIC);
    let refused = Consumer::builder(pool.clone(), kafka(), unique_group("startup"))
        .handler(on_lonely)
        .build()
        .unwrap()
        .spawn();
    let stopped = tokio::time::timeout(Duration::from_secs(20), refused.stopped())
        .await
        .expect("the consumer stops at start");
    let Stopped::Failed(reason) = stopped else {
        panic!("{stopped:?}");
    };
    assert!(
        reason.contains(&format!("`{dlq}`")) && reason.contains("outbox topics apply"),
        "{reason}"
    );
    assert!(matches!(
        refused.join().await,
        Err(ConsumerError::MissingDeadLetterTopics { .. })
    ));

    let created = Consumer::builder(pool.clone(), kafka(), unique_group("startup"))
        .handler(on_lonely)
        .create_missing_dlq_topics(true)
        .build()
        .unwrap()
        .spawn();
    let plan_has_dlq = || async {
        let wanted = topics::Registered {
            events: BTreeSet::new(),
            consumed: [<Lonely as txoutbox_core::DomainEvent>::TOPIC.to_owned()].into(),
        }
        .required(&TopicDefaults::default().partitions(1));
        topics::plan(&kafka(), &wanted).await.unwrap().is_complete()
    };
    eventually(
        "the dead-letter topic created",
        Duration::from_secs(20),
        plan_has_dlq,
    )
    .await;
    assert!(created.is_running());
    created.shutdown().await.unwrap();
}
