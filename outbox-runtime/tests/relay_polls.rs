//! What a relay's polling costs: with every writer signalling it (the
//! in-process commit signal), about one claim per batch, each at once; a
//! writer that does not signal it (another process, without `listen_notify`)
//! is noticed by a poll, and then the relay polls quickly again while it
//! writes.
//!
//! One test in this binary: a commit signal without a scope wakes every
//! relay of the process, so another test's writes would wake this relay.

mod relay_support;

use std::time::{Duration, Instant};

use relay_support::*;
use sqlx::PgPool;
use txoutbox_core::__private::wakeup::{Scope, notify_committed_in};
use txoutbox_runtime::relay::Relay;

/// Inserts one row, and signals its commit as the framework's writers do
/// when `signal` (to the relay of this database only).
async fn write(pool: &PgPool, topic: &str, key: &str, signal: bool) -> i64 {
    let id = sqlx::query_scalar(
        "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type, payload,
                                   topic, partition_key)
         VALUES (gen_random_uuid(), 'Order', $2, 'OrderCreated', '{}', $1, $2)
         RETURNING id",
    )
    .bind(topic)
    .bind(key)
    .fetch_one(pool)
    .await
    .unwrap();
    if signal {
        let database = pool.connect_options().get_database().map(str::to_owned);
        notify_committed_in(Scope::of_database(database.as_deref()));
    }
    id
}

/// Milliseconds from each published row's commit to its publication, in
/// write (id) order.
async fn delays_ms(pool: &PgPool, ids: &[i64]) -> Vec<f64> {
    sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM published_at - created_at)::float8 * 1000
         FROM outbox_event WHERE id = ANY($1) AND published_at IS NOT NULL ORDER BY id",
    )
    .bind(ids)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Writes `ROWS` rows over four keys, one every `every` (each signalled if
/// `signal`), waits until all are published and returns their delays (see
/// [`delays_ms`]).
async fn write_and_publish(pool: &PgPool, topic: &str, signal: bool, every: Duration) -> Vec<f64> {
    let mut ids = Vec::new();
    for n in 0..ROWS {
        ids.push(write(pool, topic, &format!("k{}", n % 4), signal).await);
        tokio::time::sleep(every).await;
    }
    eventually("every row published", Duration::from_secs(30), || async {
        delays_ms(pool, &ids).await.len() == ROWS
    })
    .await;
    delays_ms(pool, &ids).await
}

/// The median and the maximum of `values`.
fn median_and_max(mut values: Vec<f64>) -> (f64, f64) {
    values.sort_by(f64::total_cmp);
    (values[values.len() / 2], values[values.len() - 1])
}

const ROWS: usize = 40;
const EVERY: Duration = Duration::from_millis(50);

#[sqlx::test(migrations = false)]
async fn signalled_writes_cost_one_claim_each_and_unsignalled_ones_bring_quick_polls_back(
    pool: PgPool,
) {
    migrated(&pool).await;
    let brokers = brokers();
    let topic = unique_topic("polls");
    create_topic(&brokers, &topic, 1).await;
    // The defaults: 500 ms poll interval, 2 s rebalance interval.
    let relay = Relay::builder(pool.clone(), kafka_config(&brokers))
        .spawn()
        .unwrap();
    // Its lanes taken, its start-up claims done, its polls stretched.
    let first = write(&pool, &topic, "warm-up", true).await;
    eventually("the relay publishes", Duration::from_secs(30), || async {
        delays_ms(&pool, &[first]).await.len() == 1
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Signalled writes: a claim each, at once; few polls besides.
    let before = relay.summary();
    let started = Instant::now();
    let (p50, max) = median_and_max(write_and_publish(&pool, &topic, true, EVERY).await);
    let elapsed = started.elapsed();
    let after = relay.summary();
    let claims = after.claims - before.claims;
    let empty = after.empty_claims - before.empty_claims;
    eprintln!(
        "signalled: {ROWS} rows in {elapsed:?}: {claims} claims, {empty} empty; \
         commit to publish p50 {p50:.1} ms, max {max:.1} ms",
    );
    assert_eq!(after.published - before.published, ROWS as u64);
    assert!(
        claims - empty <= ROWS as u64,
        "at most a claim with rows per row"
    );
    // Polls every 500 ms and a claim after each 2 s rebalance: a handful in
    // ~2 s. Polling quickly after each batch, as for unsignalling writers,
    // costs two or more per row.
    assert!(
        empty <= 12,
        "{empty} empty claims for {ROWS} signalled rows"
    );
    assert!(
        p50 < 150.0,
        "signalled rows are claimed at once, not at the next poll: p50 {p50:.1} ms"
    );

    // Unsignalled writes (as another process's, without `listen_notify`):
    // the first is found by a poll, within the poll interval; then the
    // relay polls quickly again while they keep coming.
    let before = relay.summary();
    let delays = write_and_publish(&pool, &topic, false, EVERY * 2).await;
    let after = relay.summary();
    let (claims, empty) = (
        after.claims - before.claims,
        after.empty_claims - before.empty_claims,
    );
    // In write order: the first is found by a slow poll, the others by
    // quick ones.
    let first_delay = delays[0];
    let (later_p50, later_max) = median_and_max(delays[5..].to_vec());
    eprintln!(
        "unsignalled: {ROWS} rows: {claims} claims, {empty} empty; first found after \
         {first_delay:.1} ms, later ones p50 {later_p50:.1} ms, max {later_max:.1} ms",
    );
    assert!(
        first_delay < 1_000.0,
        "found by a poll within the poll interval: {first_delay:.1} ms"
    );
    // Quick polls (5 ms doubling after each batch) find a row written 100
    // ms after the last within ~50 ms; 500 ms polls would take ~250 ms.
    assert!(
        later_p50 < 150.0,
        "quick polls again: p50 {later_p50:.1} ms"
    );

    let summary = relay.shutdown().await.unwrap();
    assert!(summary.clean);
    assert_eq!(summary.published, 1 + 2 * ROWS as u64);
}
