//! Four relays over one database keep per-key order: keys are hashed into
//! lanes, each published by one relay at a time, while relays come and go.

mod relay_support;

use std::collections::HashMap;
use std::time::Duration;

use relay_support::*;
use sqlx::PgPool;
use txoutbox_runtime::relay::{Relay, RelayHandle};

const KEYS: i64 = 1_000;
const ROUNDS: i64 = 8;

fn relay(pool: &PgPool, brokers: &str) -> RelayHandle {
    Relay::builder(pool.clone(), kafka_config(brokers))
        .batch_size(250)
        .lanes(32)
        .rebalance_interval(Duration::from_millis(100))
        .spawn()
        .unwrap()
}

#[sqlx::test(migrations = false)]
async fn four_relays_keep_per_key_order_while_lanes_move(pool: PgPool) {
    migrated(&pool).await;
    let brokers = brokers();
    let topic = unique_topic("order");
    create_topic(&brokers, &topic, 4).await;

    let mut relays = vec![relay(&pool, &brokers), relay(&pool, &brokers)];
    for round in 0..ROUNDS {
        // Every round appends one event per key, in shuffled key order, in
        // several transactions, while relays start and stop.
        let mut events: Vec<NewEvent> = (0..KEYS)
            .map(|k| NewEvent::new(&topic, format!("key-{k}"), round))
            .collect();
        events.rotate_left((round * 137 % KEYS) as usize);
        for chunk in events.chunks(200) {
            insert(&pool, chunk).await;
        }
        match round {
            1 | 2 => relays.push(relay(&pool, &brokers)),
            4 => {
                // A relay leaves gracefully; its lanes move to the others.
                let summary = relays.remove(0).shutdown().await.unwrap();
                assert!(summary.clean);
                relays.push(relay(&pool, &brokers));
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert_eq!(relays.len(), 4);
    all_published(&pool, Duration::from_secs(25)).await;
    let mut published_by_each = Vec::new();
    for relay in relays {
        let summary = relay.shutdown().await.unwrap();
        assert!(summary.clean);
        published_by_each.push(summary.published);
    }
    assert!(
        published_by_each.iter().filter(|&&n| n > 0).count() >= 3,
        "work was shared: {published_by_each:?}"
    );

    let total = (KEYS * ROUNDS) as usize;
    let mut received = read_topic(&brokers, &topic, total, Duration::from_secs(25)).await;
    received.sort_by_key(|r| (r.partition, r.offset));
    let mut per_key: HashMap<String, Vec<i64>> = HashMap::new();
    for record in &received {
        per_key
            .entry(record.key.clone())
            .or_default()
            .push(record.value["seq"].as_i64().unwrap());
    }
    assert_eq!(per_key.len(), KEYS as usize);
    for (key, seqs) in &per_key {
        let expected: Vec<i64> = (0..ROUNDS).collect();
        assert_eq!(seqs, &expected, "order of {key}");
    }
    assert_eq!(received.len(), total);
}
