//! A relay whose database connection freezes (a partition or a hung host:
//! the socket stays open, so PostgreSQL keeps its session and its lane
//! locks) loses its lanes within the documented bound, `lease_timeout + 2 x
//! rebalance_interval` (14 s with the defaults used here), while the other
//! relay publishes its keys, in order. Without leases the lanes stay with
//! the frozen session for as long as TCP keeps it: for ever behind a proxy
//! that keeps acknowledging, about two hours for a vanished host.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use outbox_tests::faults::proxy::Proxy;
use outbox_tests::faults::topic;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use txoutbox_runtime::relay::{
    DEFAULT_LEASE_TIMEOUT, DEFAULT_REBALANCE_INTERVAL, Relay, RelayHandle,
};
use txoutbox_testkit::broker::{brokers, client_config, new_topic};
use txoutbox_testkit::{count, eventually};
use uuid::Uuid;

const LANES: u32 = 16;
const KEYS: i64 = 32;

fn relay(pool: PgPool, brokers: &str) -> RelayHandle {
    let kafka = client_config(brokers);
    // Lease, rebalance and database timeouts are the defaults.
    Relay::builder(pool, kafka)
        .lanes(LANES)
        .batch_size(50)
        .spawn()
        .unwrap()
}

/// Lanes locked by each backend of this database.
async fn lane_owners(pool: &PgPool) -> HashMap<i32, i32> {
    let rows: Vec<(i32, i32)> = sqlx::query_as(
        "SELECT objid::int, pid FROM pg_locks
         WHERE locktype = 'advisory' AND granted AND objsubid = 2
           AND classid = 1868724332::oid
           AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    rows.into_iter().collect()
}

/// Backends connected through the proxy.
async fn backends_behind(pool: &PgPool, proxy: &Proxy) -> HashSet<i32> {
    let ports: Vec<i32> = proxy
        .upstream_ports(false)
        .into_iter()
        .map(i32::from)
        .collect();
    sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity
         WHERE datname = current_database() AND client_port = ANY($1)",
    )
    .bind(&ports)
    .fetch_all(pool)
    .await
    .unwrap()
    .into_iter()
    .collect()
}

/// Writes one event per key every 25 ms, each key's `seq` counting up from 1.
fn spawn_writer(
    pool: PgPool,
    topic: String,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<i64> {
    tokio::spawn(async move {
        let mut round = 0;
        while !stop.load(Ordering::Relaxed) {
            round += 1;
            let ids: Vec<Uuid> = (0..KEYS).map(|_| Uuid::now_v7()).collect();
            sqlx::query(
                "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type,
                                           payload, topic, partition_key)
                 SELECT e.id, 'Key', 'k' || e.n, 'Counted',
                        jsonb_build_object('key', 'k' || e.n, 'seq', $2::bigint), $3, 'k' || e.n
                 FROM unnest($1::uuid[]) WITH ORDINALITY AS e(id, n)
                 ORDER BY e.n",
            )
            .bind(&ids)
            .bind(round)
            .bind(&topic)
            .execute(&pool)
            .await
            .unwrap();
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        round
    })
}

#[sqlx::test(migrations = false)]
async fn a_frozen_relay_loses_its_lanes_within_the_lease_and_order_holds(pool: PgPool) {
    txoutbox_runtime::migrations::run(&pool).await.unwrap();
    let bound = DEFAULT_LEASE_TIMEOUT + DEFAULT_REBALANCE_INTERVAL * 2;
    let brokers = brokers();
    let topic = new_topic(&brokers, "relay-takeover", 4).await;

    let options = pool.connect_options();
    let target = format!("{}:{}", options.get_host(), options.get_port());
    let proxy = Proxy::start(target.parse().expect("DATABASE_URL with an IP host")).await;
    let through_proxy = PgPoolOptions::new()
        .max_connections(2)
        .connect_lazy_with((*options).clone().port(proxy.port()));

    // Relay A (through the proxy) takes every lane, then B arrives and gets half.
    let a = relay(through_proxy, &brokers);
    eventually("A owns every lane", Duration::from_secs(20), || async {
        lane_owners(&pool).await.len() == LANES as usize
    })
    .await;
    let b = relay(pool.clone(), &brokers);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(pool.clone(), topic.clone(), Arc::clone(&stop));
    eventually(
        "A and B share the lanes",
        Duration::from_secs(30),
        || async {
            let owners = lane_owners(&pool).await;
            let a_side = backends_behind(&pool, &proxy).await;
            let of_a = owners.values().filter(|pid| a_side.contains(pid)).count();
            owners.len() == LANES as usize && of_a > 0 && of_a < LANES as usize
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Freeze A's database connections.
    let a_side = backends_behind(&pool, &proxy).await;
    let a_lanes: Vec<i32> = lane_owners(&pool)
        .await
        .into_iter()
        .filter(|(_, pid)| a_side.contains(pid))
        .map(|(lane, _)| lane)
        .collect();
    let frozen_at: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(&pool)
        .await
        .unwrap();
    let frozen = Instant::now();
    proxy.freeze_all();
    eventually("B owns A's lanes", bound * 3, || async {
        let owners = lane_owners(&pool).await;
        a_lanes
            .iter()
            .all(|lane| owners.get(lane).is_some_and(|pid| !a_side.contains(pid)))
    })
    .await;
    let takeover = frozen.elapsed();
    println!(
        "[takeover] A's {} lanes taken over {:.2} s after the freeze (bound {:.0} s: lease {:?} + 2 x rebalance {:?})",
        a_lanes.len(),
        takeover.as_secs_f64(),
        bound.as_secs_f64(),
        DEFAULT_LEASE_TIMEOUT,
        DEFAULT_REBALANCE_INTERVAL,
    );
    assert!(
        takeover <= bound + Duration::from_secs(5),
        "takeover took {takeover:?}, bound {bound:?} (+5 s of slack for a loaded machine)"
    );

    // A comes back: it finds its session ended, reconnects and competes again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.thaw();
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    let rounds = writer.await.unwrap();
    eventually("everything published", Duration::from_secs(60), || async {
        count(
            &pool,
            "SELECT count(*) FROM outbox_event WHERE published_at IS NULL",
        )
        .await
            == 0
    })
    .await;
    assert!(a.is_running(), "the frozen relay recovered by itself");
    assert!(b.is_running());
    // Every key flows again: for each key, its first event written after the
    // freeze was published within the bound too.
    let again: f64 = sqlx::query_scalar(
        "SELECT max(first)::float8 FROM (
             SELECT partition_key, EXTRACT(EPOCH FROM min(published_at) - $1) AS first
             FROM outbox_event WHERE created_at > $1 GROUP BY partition_key) k",
    )
    .bind(frozen_at)
    .fetch_one(&pool)
    .await
    .unwrap();
    println!("[takeover] every key published again {again:.2} s after the freeze");
    assert!(again <= (bound + Duration::from_secs(5)).as_secs_f64());
    let (a, b) = (a.shutdown().await.unwrap(), b.shutdown().await.unwrap());
    println!(
        "[takeover] A published {}, B published {} ({} events written)",
        a.published,
        b.published,
        rounds * KEYS
    );

    // The topic: every event, and per key the first occurrences in order.
    let records = topic::read_all(&brokers, &topic).await;
    let mut seen = HashSet::new();
    let mut next: HashMap<String, i64> = HashMap::new();
    let mut duplicates = 0;
    for record in &records {
        let value = record.json().unwrap();
        let (key, seq) = (
            value["key"].as_str().unwrap(),
            value["seq"].as_i64().unwrap(),
        );
        if !seen.insert((key.to_owned(), seq)) {
            duplicates += 1;
            continue;
        }
        let expected = next.entry(key.to_owned()).or_insert(1);
        assert_eq!(seq, *expected, "first occurrences of {key} out of order");
        *expected += 1;
    }
    println!(
        "[takeover] {} records, {duplicates} duplicates",
        records.len()
    );
    assert_eq!(seen.len() as i64, rounds * KEYS, "every event on the topic");
}
