//! A service's relay and consumers run as one [`Service`]: `stopped()`
//! reports the first task to end with its name, `status()` feeds a liveness
//! probe, and `shutdown()` stops everything within each task's shutdown
//! timeout, including a consumer whose handler never returns (issue 23,
//! part 3: the consumer's shutdown is bounded as the relay's is).
#![allow(missing_docs)]

mod consumer_support;

use std::time::{Duration, Instant};

use consumer_support::*;
use sqlx::{PgPool, Postgres, Transaction};
use tokio::sync::Notify;
use txoutbox_core::DomainEvent;
use txoutbox_runtime::consumer::{Consumer, Mode, event_handler};
use txoutbox_runtime::lifecycle::Stopped;
use txoutbox_runtime::relay::Relay;
use txoutbox_runtime::service::Service;

/// Tells a test that its handler was entered.
static ENTERED: [Notify; 4] = [
    Notify::const_new(),
    Notify::const_new(),
    Notify::const_new(),
    Notify::const_new(),
];

/// An event on a topic of its own per test (a consumer would otherwise hang
/// on another test's event first), and its handler that never returns.
macro_rules! stuck {
    ($event:ident, $topic:tt, $handler:ident, $index:tt) => {
        test_event!($event, $topic, "Stuck");

        #[event_handler]
        async fn $handler(
            _tx: &mut Transaction<'_, Postgres>,
            _event: $event,
        ) -> Result<(), sqlx::Error> {
            ENTERED[$index].notify_one();
            std::future::pending().await
        }
    };
}

stuck!(
    StuckService,
    "consumer-test.service-stuck",
    on_stuck_service,
    0
);
stuck!(StuckAlone, "consumer-test.service-alone", on_stuck_alone, 1);
stuck!(StuckIdle, "consumer-test.service-idle", on_stuck_idle, 2);
test_event!(StuckProcessor, "consumer-test.service-processor", "Stuck");

/// Set when the stuck processor's call is dropped (its task ended).
static PROCESSOR_CALL_DROPPED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

struct SetOnDrop;

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        PROCESSOR_CALL_DROPPED.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

#[event_handler]
async fn on_stuck_processor(
    _tx: &mut Transaction<'_, Postgres>,
    _event: StuckProcessor,
) -> Result<(), sqlx::Error> {
    let _dropped = SetOnDrop;
    ENTERED[3].notify_one();
    std::future::pending().await
}

/// Produces `event` and waits until the handler that signals `ENTERED[index]`
/// (and then never returns) has it.
async fn deliver_to_stuck_handler<E: DomainEvent>(event: &E, index: usize) {
    let entered = ENTERED[index].notified();
    produce_event(&producer(), event).await;
    tokio::time::timeout(Duration::from_secs(30), entered)
        .await
        .expect("the stuck handler is called");
}

#[sqlx::test(migrations = false)]
async fn a_consumer_whose_handler_never_returns_is_stopped_within_its_shutdown_timeout(
    pool: PgPool,
) {
    prepare_db(&pool).await;
    create_topic(StuckService::TOPIC, 1).await;
    let group = unique_group("service-stuck");
    start_group_at(&group, StuckService::TOPIC, 1, true).await;
    let consumer = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_stuck_service)
        // Nothing else bounds the call.
        .handler_timeout(Duration::MAX)
        .shutdown_timeout(Duration::from_millis(500))
        .build()
        .unwrap()
        .spawn();
    let relay = Relay::builder(pool.clone(), kafka_config())
        .poll_interval(Duration::from_millis(50))
        .spawn()
        .unwrap();
    let service = Service::new().relay(relay).consumer(consumer);
    let status = service.status();
    let names: Vec<String> = status.tasks().into_iter().map(|t| t.name).collect();
    assert_eq!(names, ["relay".to_owned(), format!("consumer {group}")]);
    assert!(status.is_live());

    deliver_to_stuck_handler(&StuckService::new(1), 0).await;

    let asked = Instant::now();
    service.shutdown().await.expect("no task had failed");
    let took = asked.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "shutdown took {took:?} although the consumer's shutdown_timeout is 500 ms"
    );
    let tasks = status.tasks();
    assert!(
        tasks
            .iter()
            .all(|task| task.stopped == Some(Stopped::Requested)),
        "{tasks:?}"
    );
    assert!(!status.is_live());
    // The abandoned event was not marked processed: it is received again.
    let processed: i64 = sqlx::query_scalar("SELECT count(*) FROM processed_event")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(processed, 0);
}

#[sqlx::test(migrations = false)]
async fn an_aborted_consumer_says_its_shutdown_was_not_clean(pool: PgPool) {
    prepare_db(&pool).await;
    create_topic(StuckAlone::TOPIC, 1).await;
    let group = unique_group("service-unclean");
    start_group_at(&group, StuckAlone::TOPIC, 1, true).await;
    let consumer = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_stuck_alone)
        .handler_timeout(Duration::MAX)
        .shutdown_timeout(Duration::from_millis(300))
        .build()
        .unwrap()
        .spawn();
    deliver_to_stuck_handler(&StuckAlone::new(2), 1).await;
    let summary = consumer.shutdown().await.unwrap();
    assert!(!summary.clean, "{summary:?}");
    assert_eq!(summary.handled, 0);

    // A consumer with nothing in hand stops cleanly.
    let idle_group = unique_group("idle");
    start_group_at(&idle_group, StuckAlone::TOPIC, 1, true).await;
    let idle = Consumer::builder(pool.clone(), kafka_config(), &idle_group)
        .handler(on_stuck_alone)
        .build()
        .unwrap()
        .spawn();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(idle.shutdown().await.unwrap().clean);
}

#[sqlx::test(migrations = false)]
async fn the_first_task_to_end_is_the_services_stop(pool: PgPool) {
    prepare_db(&pool).await;
    create_topic(StuckIdle::TOPIC, 1).await;
    let group = unique_group("first-end");
    start_group_at(&group, StuckIdle::TOPIC, 1, true).await;
    let consumer = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_stuck_idle)
        .build()
        .unwrap()
        .spawn();
    let stop_consumer = consumer.cancellation_token();
    let relay = Relay::builder(pool.clone(), kafka_config())
        .poll_interval(Duration::from_millis(50))
        .spawn()
        .unwrap();
    let service = Service::new().relay(relay).consumer(consumer);
    let stopped = service.stopped();
    stop_consumer.cancel();
    let stopped = tokio::time::timeout(Duration::from_secs(30), stopped)
        .await
        .expect("the service sees its consumer end");
    assert_eq!(stopped, Stopped::Requested);
    let tasks = service.status().tasks();
    assert_eq!(tasks[0].stopped, None, "the relay still runs: {tasks:?}");
    assert_eq!(tasks[1].stopped, Some(Stopped::Requested), "{tasks:?}");
    service.shutdown().await.unwrap();
    assert!(!service_is_empty_stops_never().await);
}

/// An empty service's `stopped()` never resolves.
async fn service_is_empty_stops_never() -> bool {
    tokio::time::timeout(Duration::from_millis(100), Service::new().stopped())
        .await
        .is_ok()
}

/// An inbox processor stuck in a handler that never returns does not
/// outlive its consumer's aborted shutdown: its call (and transaction) is
/// dropped with it.
#[sqlx::test(migrations = false)]
async fn an_aborted_consumer_takes_its_stuck_processors_with_it(pool: PgPool) {
    prepare_db(&pool).await;
    create_topic(StuckProcessor::TOPIC, 1).await;
    let group = unique_group("service-processor");
    start_group_at(&group, StuckProcessor::TOPIC, 1, true).await;
    let consumer = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_stuck_processor)
        .mode(Mode::Inbox)
        // The processor, not the receive loop, takes the event.
        .handle_on_receipt(false)
        .processor_poll_interval(Duration::from_millis(20))
        .handler_timeout(Duration::MAX)
        .shutdown_timeout(Duration::from_millis(300))
        .build()
        .unwrap()
        .spawn();
    deliver_to_stuck_handler(&StuckProcessor::new(3), 3).await;
    assert!(!PROCESSOR_CALL_DROPPED.load(std::sync::atomic::Ordering::SeqCst));
    let summary = consumer.shutdown().await.unwrap();
    assert!(!summary.clean, "{summary:?}");
    eventually(
        "the stuck processor's call ends with its consumer",
        Duration::from_secs(10),
        || async { PROCESSOR_CALL_DROPPED.load(std::sync::atomic::Ordering::SeqCst) },
    )
    .await;
}
