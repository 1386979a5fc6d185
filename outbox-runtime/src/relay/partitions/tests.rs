//! Unit tests of [`Partitions`]: prediction against librdkafka, probes and
//! holds.

use std::collections::HashMap;

use rdkafka::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::FutureRecord;

use super::*;

/// The prediction is where librdkafka really puts each key, for the
/// default partitioner and the Java-compatible one.
#[tokio::test]
async fn predictions_match_librdkafkas_partitioning() {
    let cluster = MockCluster::new(1).unwrap();
    for setting in [None, Some("murmur2_random"), Some("fnv1a")] {
        let topic = format!("predict-{}", setting.unwrap_or("default"));
        cluster.create_topic(&topic, 7, 1).unwrap();
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", cluster.bootstrap_servers());
        if let Some(setting) = setting {
            config.set("partitioner", setting);
        }
        let producer: FutureProducer = config.create().unwrap();
        let mut partitions = Partitions::new(
            Partitioner::from_setting(setting),
            Duration::from_secs(1),
            Backoff::new(Duration::from_millis(1), Duration::from_millis(1)),
        );
        assert_eq!(partitions.predict(&topic, "k"), None, "count not known yet");
        let deadline = Instant::now() + Duration::from_secs(10);
        while partitions.predict(&topic, "k").is_none() {
            assert!(Instant::now() < deadline, "metadata never arrived");
            partitions.refresh_metadata(&producer);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut actual = HashMap::new();
        for i in 0..300 {
            let key = format!("key-{i}-{}", "x".repeat(i % 7));
            let delivery = producer
                .send(
                    FutureRecord::to(&topic).key(&key).payload("{}"),
                    Duration::from_secs(5),
                )
                .await
                .unwrap();
            actual.insert(key, delivery.partition);
        }
        for (key, partition) in &actual {
            assert_eq!(
                partitions.predict(&topic, key),
                Some(*partition),
                "{setting:?} {key}"
            );
        }
    }
}

#[test]
fn one_probe_at_a_time_and_a_delivery_releases_the_held_back_rows() {
    let mut partitions = Partitions::new(
        None,
        Duration::from_secs(60),
        Backoff::new(Duration::from_millis(1), Duration::from_millis(1)),
    );
    let tp = ("t".to_owned(), 2);
    assert_eq!(partitions.route("t", 2, 1), Route::Send);
    assert!(partitions.suspect(&tp, "stalled".into()));
    assert!(!partitions.suspect(&tp, "again".into()));
    // Rows sent before the suspicion are probes enough for a while.
    assert_eq!(partitions.route("t", 2, 1), Route::HoldBack);
    partitions.down.get_mut(&tp).unwrap().next_probe = Instant::now();
    assert_eq!(partitions.route("t", 2, 1), Route::Probe);
    assert_eq!(partitions.route("t", 2, 2), Route::HoldBack);
    let (hold, reason) = partitions.held_back(&tp, 2);
    assert_eq!(hold, Duration::from_secs(60));
    assert!(reason.contains("partition 2 of topic t"), "{reason}");
    assert_eq!(
        partitions.route("t", 3, 3),
        Route::Send,
        "other partitions flow"
    );
    // The probe fails: the next one after a backoff.
    partitions.reported("t", Some(2), Some(2), 1, false);
    assert!(partitions.is_down(&tp));
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(partitions.route("t", 2, 4), Route::Probe);
    partitions.reported("t", Some(2), Some(2), 4, true);
    assert!(!partitions.is_down(&tp));
    assert_eq!(partitions.take_released(), vec![2]);
    assert_eq!(partitions.unavailable(), 0);
}

#[test]
fn holds_grow_with_the_outage_and_a_held_row_is_released_to_probe() {
    let base = Duration::from_millis(20);
    let mut partitions = Partitions::new(None, base, Backoff::new(base, base));
    let tp = ("t".to_owned(), 0);
    partitions.suspect(&tp, "down".into());
    let (first, _) = partitions.held_back(&tp, 10);
    assert_eq!(first, base, "at least delivery_timeout");
    partitions.held_back(&tp, 11);
    std::thread::sleep(base * 3);
    let (later, _) = partitions.held_back(&tp, 12);
    assert!(later >= base * 3, "as long as the outage so far: {later:?}");
    // No claimed row became the probe: the oldest row still held is
    // released to be it, once.
    partitions.request_probes();
    assert_eq!(partitions.take_released(), vec![12]);
    partitions.request_probes();
    assert!(partitions.take_released().is_empty());
    assert_eq!(partitions.route("t", 0, 12), Route::Probe);
}
