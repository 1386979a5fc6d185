//! Failure paths against real PostgreSQL and real brokers: poison rows are
//! parked without stalling others, a crash between delivery and marking
//! republishes, a broker outage loses nothing.

mod relay_support;

use std::collections::HashSet;
use std::time::Duration;

use relay_support::*;
use sqlx::PgPool;
use txoutbox_core::Backoff;
use txoutbox_runtime::ops::dead_letters::{self, Selection, Table};
use txoutbox_runtime::relay::Relay;

#[sqlx::test(migrations = false)]
async fn a_poison_row_is_parked_without_stalling_others_and_can_be_retried(pool: PgPool) {
    migrated(&pool).await;
    let brokers = brokers();
    let topic = unique_topic("poison");
    create_topic(&brokers, &topic, 2).await;

    let mut events = vec![NewEvent {
        filler: 30_000,
        ..NewEvent::new(&topic, "poison", 0)
    }];
    events.push(NewEvent::new(&topic, "poison", 1)); // same key: must wait for the first
    events.extend((0..300).map(|i| NewEvent::new(&topic, format!("ok-{}", i % 30), i)));
    let ids = insert(&pool, &events).await;

    // This producer refuses messages over 20 kB: the first row is poison.
    let mut kafka = kafka_config(&brokers);
    kafka.set("message.max.bytes", "20000");
    let relay = Relay::builder(pool.clone(), kafka)
        .max_attempts(3)
        .retry_backoff(Backoff::new(
            Duration::from_millis(300),
            Duration::from_secs(300),
        ))
        .spawn()
        .unwrap();
    // Other keys are not held up by the poison row's retries.
    eventually("other keys published", Duration::from_secs(10), || async {
        unpublished(&pool).await == 2
    })
    .await;
    let attempts: i32 = sqlx::query_scalar("SELECT attempts FROM outbox_event WHERE event_id = $1")
        .bind(ids[0])
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(attempts < 3, "still retrying, not parked yet ({attempts})");

    eventually(
        "poison parked, its successor published",
        Duration::from_secs(15),
        || async { unpublished(&pool).await == 1 },
    )
    .await;
    let summary = relay.shutdown().await.unwrap();
    assert_eq!(summary.parked, 1);
    let parked_rows = dead_letters::list(&pool, Table::Outbox, &Selection::All, 10)
        .await
        .unwrap();
    assert_eq!(parked_rows.len(), 1);
    let row = &parked_rows[0];
    assert_eq!((row.event_id, row.attempts), (ids[0], 3));
    let error = row.last_error.as_deref().unwrap_or_default();
    assert!(error.to_lowercase().contains("too large"), "{error}");
    // The successor of the same key went out only after its predecessor was parked.
    let successor_after_parking: bool = sqlx::query_scalar(
        "SELECT s.published_at >= p.parked_at FROM outbox_event s, outbox_event p
         WHERE s.event_id = $1 AND p.event_id = $2",
    )
    .bind(ids[1])
    .bind(ids[0])
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(successor_after_parking);

    // Cause fixed (a producer with the default 1 MB limit): retry it.
    assert_eq!(
        dead_letters::retry(&pool, Table::Outbox, &Selection::EventIds(vec![ids[0]]))
            .await
            .unwrap(),
        vec![ids[0]]
    );
    assert!(
        dead_letters::list(&pool, Table::Outbox, &Selection::All, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let relay = Relay::builder(pool.clone(), kafka_config(&brokers))
        .spawn()
        .unwrap();
    all_published(&pool, Duration::from_secs(10)).await;
    relay.shutdown().await.unwrap();
    let received = read_topic(&brokers, &topic, events.len(), Duration::from_secs(15)).await;
    let got: HashSet<_> = received.iter().map(Received::event_id).collect();
    assert_eq!(got, ids.iter().copied().collect::<HashSet<_>>());
}

#[sqlx::test(migrations = false)]
async fn a_crash_between_delivery_and_marking_republishes_everything(pool: PgPool) {
    migrated(&pool).await;
    let brokers = brokers();
    let topic = unique_topic("crash");
    create_topic(&brokers, &topic, 2).await;
    let events: Vec<NewEvent> = (0..500)
        .map(|i| NewEvent::new(&topic, format!("k{}", i % 10), i))
        .collect();
    let ids = insert(&pool, &events).await;

    // This relay "dies" after each delivery, before its mark commits.
    let crashing = Relay::builder(pool.clone(), kafka_config(&brokers))
        .crash_before_mark(true)
        .spawn()
        .unwrap();
    let delivered = read_topic(&brokers, &topic, events.len(), Duration::from_secs(15)).await;
    crashing.shutdown().await.unwrap();
    assert!(delivered.len() >= events.len());
    assert_eq!(
        unpublished(&pool).await,
        500,
        "nothing marked without a committed mark"
    );

    let relay = Relay::builder(pool.clone(), kafka_config(&brokers))
        .spawn()
        .unwrap();
    all_published(&pool, Duration::from_secs(15)).await;
    let summary = relay.shutdown().await.unwrap();
    assert_eq!(
        summary.published, 500,
        "the next relay republished every event"
    );
    let received = read_topic(
        &brokers,
        &topic,
        delivered.len() + 500,
        Duration::from_secs(15),
    )
    .await;
    let first_copies = received.len() - delivered.len();
    assert!(first_copies >= 500);
    let got: HashSet<_> = received.iter().map(Received::event_id).collect();
    assert_eq!(got, ids.iter().copied().collect::<HashSet<_>>());
}

#[sqlx::test(migrations = false)]
async fn a_broker_outage_loses_nothing(pool: PgPool) {
    migrated(&pool).await;
    let mut broker = OwnBroker::start();
    let address = broker.address();
    let topic = unique_topic("outage");
    create_topic(&address, &topic, 1).await;

    let relay = Relay::builder(pool.clone(), kafka_config(&address))
        .delivery_timeout(Duration::from_secs(2))
        .error_backoff(Backoff::new(
            Duration::from_millis(100),
            Duration::from_millis(500),
        ))
        .spawn()
        .unwrap();
    let before = insert(
        &pool,
        &(0..100)
            .map(|i| NewEvent::new(&topic, "k", i))
            .collect::<Vec<_>>(),
    )
    .await;
    all_published(&pool, Duration::from_secs(10)).await;

    broker.stop();
    let during: Vec<NewEvent> = (100..600)
        .map(|i| NewEvent::new(&topic, format!("k{}", i % 20), i))
        .collect();
    let during_ids = insert(&pool, &during).await;
    tokio::time::sleep(Duration::from_secs(4)).await; // at least one delivery timeout
    assert_eq!(
        unpublished(&pool).await,
        500,
        "kept in the outbox while the broker is down"
    );
    let counted: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_event WHERE attempts > 0 OR parked_at IS NOT NULL",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(counted, 0, "an outage is not the messages' fault");

    // Memory storage: the restarted broker has lost the topic; recreate it.
    broker.restart();
    create_topic(&address, &topic, 1).await;
    all_published(&pool, Duration::from_secs(20)).await;
    let summary = relay.shutdown().await.unwrap();
    assert!(summary.errors > 0);
    assert!(summary.clean);
    let received = read_topic(&address, &topic, during.len(), Duration::from_secs(15)).await;
    let got: HashSet<_> = received.iter().map(Received::event_id).collect();
    for id in &during_ids {
        assert!(
            got.contains(id),
            "event {id} written during the outage is missing"
        );
    }
    drop(before);
}

#[sqlx::test(migrations = false)]
async fn an_operator_retry_wakes_the_relays_of_this_process(pool: PgPool) {
    migrated(&pool).await;
    let brokers = brokers();
    let topic = unique_topic("retry-wakes");
    create_topic(&brokers, &topic, 1).await;
    let ids = insert(&pool, &[NewEvent::new(&topic, "k", 0)]).await;
    sqlx::query(
        "UPDATE outbox_event SET parked_at = now(), attempts = 3, last_error = 'refused'
         WHERE event_id = $1",
    )
    .bind(ids[0])
    .execute(&pool)
    .await
    .unwrap();
    // An idle relay that would claim again only after half a minute.
    let relay = Relay::builder(pool.clone(), kafka_config(&brokers))
        .poll_interval(Duration::from_secs(30))
        .rebalance_interval(Duration::from_secs(30))
        .lease_timeout(Duration::from_secs(120))
        .spawn()
        .unwrap();
    // Its empty polls back off (doubling from milliseconds): after 12 s the
    // current wait runs to about 20 s, so the next poll is seconds away.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(unpublished(&pool).await, 1, "a parked row is not published");

    let retried = dead_letters::retry(&pool, Table::Outbox, &Selection::All)
        .await
        .unwrap();
    assert_eq!(retried, ids);
    // Published long before the next poll: the retry woke the relay.
    all_published(&pool, Duration::from_secs(3)).await;
    let summary = relay.shutdown().await.unwrap();
    assert_eq!(summary.published, 1);
}
