//! A consumer's database connection that freezes mid-transaction, against
//! real PostgreSQL (through a proxy that stops forwarding one connection
//! without closing it) and the real broker.
//!
//! The handler of one event records its effect, then has the proxy freeze
//! its connection, so the framework's next statement (the commit) is sent
//! into a connection that will never answer: neither TCP nor the server's
//! `statement_timeout` can notice. Before, the batch (or the inbox
//! processor) waited on it for good, and with it the partition; the
//! server, waiting for a `COMMIT` that never came, kept the transaction's
//! locks. Now the consumer abandons the work at its stall limit and runs it
//! again on another connection, PostgreSQL ends the frozen session (its
//! `idle_in_transaction_session_timeout`) and releases the locks, and every
//! event takes effect exactly once, in order, while the other partition
//! flows meanwhile.

#![allow(missing_docs)]

#[path = "../../outbox-runtime/tests/consumer_support/mod.rs"]
mod consumer_support;

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use consumer_support::*;
use outbox_tests::faults::proxy::Proxy;
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Postgres, Transaction};
use tokio::sync::oneshot;
use txoutbox_core::{Backoff, DomainEvent};
use txoutbox_runtime::consumer::{Consumer, ConsumerBuilder, Mode, event_handler};
use uuid::Uuid;

test_event!(FrozenDedup, "consumer-test.frozen-db.dedup", "FrozenDedup");
test_event!(FrozenInbox, "consumer-test.frozen-db.inbox", "FrozenInbox");
test_event!(
    FrozenProcessor,
    "consumer-test.frozen-db.processor",
    "FrozenProcessor"
);

/// The amount whose handler freezes its connection.
const CULPRIT: i64 = 13;

/// The consumers' handler timeout here, which is also their
/// `statement_timeout`.
const HANDLER_TIMEOUT: Duration = Duration::from_secs(2);

/// The proxied pool's acquire timeout.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(2);

/// The consumers' longest backoff.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// The stall limit these settings give: the longest bound of a wait
/// (handler timeout, acquire timeout, backoff) plus the runtime's 5 s grace.
const STALL_LIMIT: Duration = Duration::from_secs(7);

/// Events produced behind the culprit on its partition.
const BEHIND: i64 = 5;

/// Whether the event of `amount` goes to the frozen partition (the culprit
/// and the events behind it), whose events share one key: an aggregate's
/// events, ordered by their key in inbox mode too.
fn on_the_frozen_partition(amount: i64) -> bool {
    amount == CULPRIT || amount >= 2_000
}

/// One freeze, armed by the test and fired by the culprit's handler: the
/// handler sends its connection's port as PostgreSQL sees it (the proxy's
/// upstream port) and waits until the test has frozen that connection.
struct Freezer {
    armed: Mutex<Option<(oneshot::Sender<u16>, oneshot::Receiver<()>)>>,
}

impl Freezer {
    const fn new() -> Self {
        Self {
            armed: Mutex::new(None),
        }
    }

    /// Arms the next call of [`Freezer::fire`]; the test receives the port
    /// and answers once the connection is frozen.
    fn arm(&self) -> (oneshot::Receiver<u16>, oneshot::Sender<()>) {
        let (port_tx, port_rx) = oneshot::channel();
        let (frozen_tx, frozen_rx) = oneshot::channel();
        *self.armed.lock().unwrap() = Some((port_tx, frozen_rx));
        (port_rx, frozen_tx)
    }

    /// Once armed: has the test freeze this transaction's connection. A
    /// no-op otherwise (the work's later attempts).
    async fn fire(&self, tx: &mut Transaction<'_, Postgres>) -> Result<(), sqlx::Error> {
        let Some((port_tx, frozen_rx)) = self.armed.lock().unwrap().take() else {
            return Ok(());
        };
        let port: i32 = sqlx::query_scalar("SELECT inet_client_port()")
            .fetch_one(&mut **tx)
            .await?;
        port_tx.send(port as u16).unwrap();
        frozen_rx.await.unwrap();
        Ok(())
    }
}

static FREEZE_DEDUP: Freezer = Freezer::new();
static FREEZE_INBOX: Freezer = Freezer::new();
static FREEZE_PROCESSOR: Freezer = Freezer::new();

/// Records the effect; for the culprit, then freezes the connection (once).
async fn record_then_freeze(
    tx: &mut Transaction<'_, Postgres>,
    event_id: Uuid,
    amount: i64,
    freezer: &Freezer,
) -> Result<(), sqlx::Error> {
    record_effect(tx, event_id, amount, "").await?;
    if amount == CULPRIT {
        freezer.fire(tx).await?;
    }
    Ok(())
}

#[event_handler]
async fn on_frozen_dedup(
    tx: &mut Transaction<'_, Postgres>,
    event: FrozenDedup,
) -> Result<(), sqlx::Error> {
    record_then_freeze(tx, event.event_id, event.amount, &FREEZE_DEDUP).await
}

#[event_handler]
async fn on_frozen_inbox(
    tx: &mut Transaction<'_, Postgres>,
    event: FrozenInbox,
) -> Result<(), sqlx::Error> {
    record_then_freeze(tx, event.event_id, event.amount, &FREEZE_INBOX).await
}

#[event_handler]
async fn on_frozen_processor(
    tx: &mut Transaction<'_, Postgres>,
    event: FrozenProcessor,
) -> Result<(), sqlx::Error> {
    record_then_freeze(tx, event.event_id, event.amount, &FREEZE_PROCESSOR).await
}

/// A pool on `pool`'s database whose connections go through `proxy`.
async fn through(pool: &PgPool, proxy: &Proxy) -> PgPool {
    let options = (*pool.connect_options())
        .clone()
        .host("127.0.0.1")
        .port(proxy.port());
    PgPoolOptions::new()
        .max_connections(10)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_with(options)
        .await
        .unwrap()
}

/// Sessions of the database at `port` (PostgreSQL's view of the client).
async fn sessions_at(pool: &PgPool, port: u16) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE client_port = $1")
        .bind(i32::from(port))
        .fetch_one(pool)
        .await
        .unwrap()
}

/// What [`frozen_mid_commit`] measured.
struct Seen {
    /// From the freeze until every event of the frozen partition took
    /// effect.
    recovered_after: Duration,
    /// The longest a healthy event of the other partition took from its
    /// produce to its effect, while the connection was frozen.
    worst_healthy: Duration,
}

/// The scenario (see the module docs): a two-partition topic, a consumer
/// on a pool through a proxy; the culprit's connection on partition 0
/// freezes after its handler ran, with [`BEHIND`] events behind it; healthy
/// events go to partition 1 meanwhile. Checks that every event took effect
/// exactly once, partition 0's in offset order; that the offsets reach the
/// ends of both partitions; that the frozen session is gone from the
/// server; that the consumer counted the stall and stops cleanly.
async fn frozen_mid_commit<E: DomainEvent>(
    pool: &PgPool,
    consumer: impl FnOnce(PgPool, String) -> ConsumerBuilder,
    freezer: &Freezer,
    make: impl Fn(i64) -> (E, Uuid),
) -> Seen {
    prepare_db(pool).await;
    let proxy = Proxy::start(SocketAddr::from(([127, 0, 0, 1], 5432))).await;
    let proxied = through(pool, &proxy).await;
    create_topic(E::TOPIC, 2).await;
    let group = unique_group("frozen-db");
    start_group_at(&group, E::TOPIC, 2, true).await;
    let running = consumer(proxied.clone(), group.clone())
        .handler_timeout(HANDLER_TIMEOUT)
        .backoff(Backoff::new(Duration::from_millis(100), MAX_BACKOFF))
        .build()
        .unwrap()
        .spawn();
    let producer = producer();
    // The consumer has joined and handles.
    let (warm_up, warm_up_id) = make(1);
    let mut end = [0, produce_to(&producer, &warm_up, 1).await + 1];
    eventually(
        "the warm-up event handled",
        Duration::from_secs(30),
        || async { effect_counts(pool, &[warm_up_id]).await == [1] },
    )
    .await;

    let (port_rx, frozen_tx) = freezer.arm();
    let (culprit, culprit_id) = make(CULPRIT);
    produce_to(&producer, &culprit, 0).await;
    let mut partition_0 = vec![culprit_id];
    for i in 0..BEHIND {
        let (event, id) = make(2_000 + i);
        end[0] = produce_to(&producer, &event, 0).await + 1;
        partition_0.push(id);
    }
    let port = tokio::time::timeout(Duration::from_secs(30), port_rx)
        .await
        .expect("the culprit's handler ran")
        .unwrap();
    assert!(proxy.freeze_upstream_port(port), "no connection at {port}");
    let frozen_at = Instant::now();
    frozen_tx.send(()).unwrap();

    let healthy = produce_healthy(&producer, &make, Duration::from_millis(250)).await;
    end[1] = healthy.end;
    // Two seconds of the freeze went by: the frozen partition waits.
    assert_eq!(
        effect_counts(pool, &partition_0[1..]).await,
        vec![0; partition_0.len() - 1],
        "events behind the frozen commit took effect before it"
    );
    until_each_took_effect(
        pool,
        "the frozen partition's events handled",
        &partition_0,
        Duration::from_secs(60),
    )
    .await;
    let recovered_after = frozen_at.elapsed();
    eventually("the offsets committed", Duration::from_secs(15), || async {
        committed(&group, E::TOPIC, 2).await == end
    })
    .await;
    // PostgreSQL ended the frozen session (its transaction waited idle for
    // a COMMIT that never came), releasing its locks.
    eventually(
        "the frozen session ended on the server",
        Duration::from_secs(30),
        || async { sessions_at(pool, port).await == 0 },
    )
    .await;
    assert!(running.is_running());
    let summary = running.summary();
    assert!(
        summary.database_errors >= 1,
        "the abandoned work is not counted: {summary:?}"
    );
    let summary = running.shutdown().await.unwrap();
    assert!(summary.clean, "{summary:?}");

    let mut all = vec![warm_up_id];
    all.extend(&partition_0);
    all.extend(&healthy.ids);
    assert_once_in_order(pool, &all, &partition_0).await;
    let worst_healthy = worst_delay(pool, &healthy.ids, &healthy.produced_at).await;
    proxy.thaw();
    Seen {
        recovered_after,
        worst_healthy,
    }
}

/// What every mode must show.
fn assert_recovered(mode: &str, seen: &Seen) {
    println!(
        "[frozen-db] {mode}: the frozen partition recovered {:?} after the freeze (stall limit \
         {STALL_LIMIT:?}); worst delay of the other partition meanwhile {:?}",
        seen.recovered_after, seen.worst_healthy
    );
    assert!(
        seen.recovered_after >= STALL_LIMIT - Duration::from_millis(500),
        "recovered after {:?}, before the stall limit: the freeze did not hold",
        seen.recovered_after
    );
    assert!(
        seen.worst_healthy < Duration::from_secs(1),
        "a healthy partition waited {:?} behind another partition's frozen connection",
        seen.worst_healthy
    );
}

/// Dedup mode: the batch's commit is sent into the frozen connection.
#[sqlx::test(migrations = false)]
async fn dedup_a_connection_frozen_mid_commit_is_abandoned_and_the_batch_runs_again(pool: PgPool) {
    let key = Uuid::new_v4();
    let seen = frozen_mid_commit(
        &pool,
        |proxied, group| {
            Consumer::builder(proxied, kafka_config(), &group).handler(on_frozen_dedup)
        },
        &FREEZE_DEDUP,
        |amount| {
            let mut event = FrozenDedup::new(amount);
            if on_the_frozen_partition(amount) {
                event.order_id = key;
            }
            let id = event.event_id;
            (event, id)
        },
    )
    .await;
    assert_recovered("dedup", &seen);
}

/// Inbox mode, handled on receipt: the store's commit is sent into the
/// frozen connection.
#[sqlx::test(migrations = false)]
async fn inbox_a_store_frozen_mid_commit_is_abandoned_and_stored_again(pool: PgPool) {
    let key = Uuid::new_v4();
    let seen = frozen_mid_commit(
        &pool,
        |proxied, group| {
            Consumer::builder(proxied, kafka_config(), &group)
                .handler(on_frozen_inbox)
                .mode(Mode::Inbox)
        },
        &FREEZE_INBOX,
        |amount| {
            let mut event = FrozenInbox::new(amount);
            if on_the_frozen_partition(amount) {
                event.order_id = key;
            }
            let id = event.event_id;
            (event, id)
        },
    )
    .await;
    assert_recovered("inbox on receipt", &seen);
}

/// Inbox mode, handled by the processors: a processor's commit is sent
/// into the frozen connection; the other processor goes on meanwhile, and
/// the frozen one claims again after the stall limit.
#[sqlx::test(migrations = false)]
async fn inbox_a_processor_frozen_mid_commit_is_abandoned_and_claims_again(pool: PgPool) {
    let key = Uuid::new_v4();
    let seen = frozen_mid_commit(
        &pool,
        |proxied, group| {
            Consumer::builder(proxied, kafka_config(), &group)
                .handler(on_frozen_processor)
                .mode(Mode::Inbox)
                .handle_on_receipt(false)
                .processor_poll_interval(Duration::from_millis(100))
        },
        &FREEZE_PROCESSOR,
        |amount| {
            let mut event = FrozenProcessor::new(amount);
            if on_the_frozen_partition(amount) {
                event.order_id = key;
            }
            let id = event.event_id;
            (event, id)
        },
    )
    .await;
    assert_recovered("inbox processors", &seen);
}
