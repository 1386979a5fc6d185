//! Latency across services: a chain of services passing one event along,
//! each hop a service's commit, its relay, the broker, the next service's
//! consumer and that service's transaction, measured beside the broker's
//! own floor in the same run.
//!
//! ```text
//! scripts/services.sh up   # PostgreSQL, and the tansu binary the bench starts
//! cargo bench -p txoutbox-runtime --features test-hooks --bench hops
//! HOPS_BENCH_CHAINS=1,3,5 HOPS_BENCH_RATES=100,1000 HOPS_BENCH_MODES=dedup,inbox,saga,bare \
//!     HOPS_BENCH_SECS=4 HOPS_BENCH_ROUNDS=3 cargo bench ...   # the defaults
//! HOPS_BENCH_KAFKA_fetch.wait.max.ms=50 cargo bench ...      # any librdkafka setting
//! HOPS_BENCH_ARRIVALS=periodic cargo bench ...               # evenly spaced sends (default: poisson)
//! HOPS_BENCH_FRESH=configuration cargo bench ...             # one broker per configuration (default: per round)
//! HOPS_BENCH_OWN_BROKER=0 KAFKA_BROKERS_TEST=kafka:9092 cargo bench ...  # a broker of yours
//! HOPS_BENCH_FLOOR_SECS=2 cargo bench ...                    # a shorter floor (default: as long as a round)
//! HOPS_BENCH_FLOOR_BROKER=shared cargo bench ...             # the floor on the round's broker (default: its own)
//! HOPS_BENCH_CONCURRENT_BATCHES=1 cargo bench ...            # consumers take one batch at a time (default: theirs, 4)
//! ```
//!
//! By default every round runs against a fresh tansu of its own (memory
//! storage, a free port; `TANSU_BIN` or where `scripts/services.sh` installs
//! it) and fresh services, because tansu slows down as records, groups and
//! topics pile up in its memory: at 1,000/s its floor doubled from one
//! round to the next. The round's floor gets a fresh broker of its own
//! too, stopped before the round's starts. `HOPS_BENCH_FRESH=configuration`
//! keeps one broker and one set of services for all rounds and rates of a
//! configuration, the floor measured on it before each round.
//!
//! Every round also reports the CPU time it cost, from `/proc`: this
//! process (the services), every PostgreSQL process, the broker, and the
//! machine as a whole, per hop and as cores busy, so a configuration the
//! machine cannot carry shows as such; and the claims the chain's relays
//! ran per hop, and how many of them found nothing (polls).
//!
//! A chain of `N` hops is `N + 1` services, each with a database of its own
//! (scratch databases, dropped at the end): service 0 commits an order-like
//! row and records `Hop1` in one transaction; service `i` consumes `Hop{i}`
//! (dedup or inbox mode), writes its effect row and records `Hop{i+1}`, and
//! its relay publishes it; service `N` only writes its effect. In `saga` mode
//! the chain has three hops and service 2 runs the step as a saga (load and
//! lock the saga row, send the next message through the saga context).
//! Every relay and consumer runs with the framework's defaults.
//!
//! `bare` mode is the baseline: the same chain written by hand with no
//! outbox, the way a service without the framework would pass an event on.
//! Each service is a plain consumer (the consumers' fetch settings, in a
//! group), commits its effect row in a transaction of its own per record,
//! records handled concurrently, and then sends the next hop's record itself
//! with a plain producer (the relay's producer settings) and awaits its
//! acknowledgement: a dual write, with neither the outbox row, the relay's
//! claim and mark, nor the dedup row: per record, the least a hop that
//! commits its effect and then passes the event on can do (it does not
//! batch, which the framework's consumers and relays do). On the same
//! machine in the same run it shows what the machine allows such a hop at
//! that rate; the summary gives each framework chain's per-hop p50 and p99
//! as ratios of bare's.
//!
//! Timestamps (wall clock, microseconds; the database server runs on this
//! host, so its clock is the same): each service takes one when its
//! transaction body ends (after the events are recorded, before the commit),
//! and the consumer's handler one when it starts. A hop is the time from
//! one service's body end to the next one's: the commit, the relay (wake-up,
//! claim, produce, acknowledgement, mark), the broker, the consumer's fetch
//! and its transaction up to the effect. The stages come from the runtime's
//! own probe points (`test-hooks` feature: `txoutbox_runtime::probe`): when
//! the relay claimed the row, sent it, got its acknowledgement and marked
//! it; when the consumer received the record, stored it (inbox) and
//! committed it.
//!
//! The broker floor, measured in every round at the same rate: a plain
//! producer with the relay's producer settings and a plain consumer with the
//! consumers' fetch settings, records sent as the chains are (same rate,
//! same arrival process, as many seconds as the round) over 100 keys, each
//! timed from `send` to its acknowledgement and to its arrival at the
//! consumer. A hop cannot be faster than send-to-arrival. The floor lasts
//! as long as the round because tansu serves a reader at the end of a
//! topic more slowly the longer the topic grows (BENCHMARKS.md, "The tail
//! grows with the topic"): the floor's topic then ends as long as each of
//! the chain's topics. Before commit `f82a007` it ran at most 2 s
//! (`HOPS_BENCH_FLOOR_SECS=2` gives that back).
//!
//! Each configuration (mode, hops) runs `HOPS_BENCH_ROUNDS` rounds at each
//! rate; the summary gives min / median / max over rounds of each
//! percentile and the per-hop targets (p50 <= 2x the floor's send-to-arrival
//! p50, p99 <= 3x its p99) per round.
#![allow(missing_docs)]

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer as _, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::{PgPool, Postgres, Transaction};
use txoutbox_core::{DomainEvent, Events};
use txoutbox_runtime::consumer::{
    Consumer, ConsumerBuilder, ConsumerHandle, HandlerError, Mode, event_handler,
};
use txoutbox_runtime::probe::{self, Stage};
use txoutbox_runtime::relay::{Relay, RelayHandle};
use txoutbox_runtime::saga::{SagaContext, saga};
use txoutbox_testkit::broker::{
    brokers, create_topics, free_port, spawn_tansu, unique_group, wait_listening_async,
};
use uuid::Uuid;

const PARTITIONS: i32 = 4;
const MAX_HOPS: usize = 5;
const FLOOR_TOPIC: &str = "bench.hops.floor";

/// Microseconds since the epoch, wall clock.
fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

/// What one service took of one chain: the event it received (the origin:
/// the event it sent), when its handler started (the origin: 0), when its
/// transaction body ended and (the origin only) when its commit returned.
#[derive(Clone, Copy)]
struct Stamp {
    event_id: Uuid,
    start_us: i64,
    end_us: i64,
    commit_us: Option<i64>,
}

/// Stamps of the running round, by (chain, hop).
static STAMPS: LazyLock<Mutex<HashMap<(Uuid, usize), Stamp>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Hops of the running configuration: service `HOPS` records nothing.
static HOPS: AtomicUsize = AtomicUsize::new(0);

fn stamp(chain: Uuid, hop: usize, event_id: Uuid, start_us: i64) {
    let end_us = now_us();
    STAMPS.lock().unwrap().insert(
        (chain, hop),
        Stamp {
            event_id,
            start_us,
            end_us,
            commit_us: None,
        },
    );
}

/// Sets the commit time of `(chain, hop)`'s stamp: `at_us`, taken when its
/// commit returned.
fn committed(chain: Uuid, hop: usize, at_us: i64) {
    if let Some(stamp) = STAMPS.lock().unwrap().get_mut(&(chain, hop)) {
        stamp.commit_us = Some(at_us);
    }
}

/// Bare mode's points on a record's way (sent, acknowledged, received),
/// as the runtime's probe takes them for the framework's modes.
static BARE_POINTS: Mutex<Vec<probe::Point>> = Mutex::new(Vec::new());

fn bare_point(event_id: Uuid, stage: Stage) {
    BARE_POINTS.lock().unwrap().push(probe::Point {
        event_id,
        stage,
        at_us: now_us(),
    });
}

/// The points of the round so far, the runtime's and bare mode's.
fn take_points() -> Vec<probe::Point> {
    let mut points = probe::take();
    points.append(&mut BARE_POINTS.lock().unwrap());
    points
}

trait HopEvent: DomainEvent {
    fn new(chain: Uuid) -> Self;
}

macro_rules! hops {
    ($($event:ident $topic:tt $hop:literal $handler:ident;)*) => {$(
        #[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, DomainEvent)]
        #[event(topic = $topic, aggregate = "Chain")]
        pub struct $event {
            pub event_id: Uuid,
            #[partition_key]
            pub chain: Uuid,
            pub note: String,
        }

        impl HopEvent for $event {
            fn new(chain: Uuid) -> Self {
                Self { event_id: Uuid::now_v7(), chain, note: "x".repeat(100) }
            }
        }

        #[event_handler]
        async fn $handler(
            tx: &mut Transaction<'_, Postgres>,
            event: $event,
            events: &mut Events,
        ) -> Result<(), sqlx::Error> {
            let start = now_us();
            effect(tx, event.chain, $hop).await?;
            record_next(events, event.chain, $hop);
            stamp(event.chain, $hop, event.event_id, start);
            Ok(())
        }
    )*};
}

hops! {
    Hop1 "bench.hops.1" 1 on_hop1;
    Hop2 "bench.hops.2" 2 on_hop2;
    Hop3 "bench.hops.3" 3 on_hop3;
    Hop4 "bench.hops.4" 4 on_hop4;
    Hop5 "bench.hops.5" 5 on_hop5;
}

const TOPICS: [&str; MAX_HOPS] = [
    Hop1::TOPIC,
    Hop2::TOPIC,
    Hop3::TOPIC,
    Hop4::TOPIC,
    Hop5::TOPIC,
];

async fn effect(tx: &mut sqlx::PgConnection, chain: Uuid, hop: usize) -> sqlx::Result<()> {
    sqlx::query("INSERT INTO hop_effect (chain, hop) VALUES ($1, $2)")
        .bind(chain)
        .bind(hop as i32)
        .execute(tx)
        .await
        .map(drop)
}

/// Records the event of hop `hop + 1`, unless `hop` is the chain's last.
fn record_next(events: &mut Events, chain: Uuid, hop: usize) {
    if hop >= HOPS.load(Ordering::Relaxed) {
        return;
    }
    match hop + 1 {
        1 => events.record(Hop1::new(chain)),
        2 => events.record(Hop2::new(chain)),
        3 => events.record(Hop3::new(chain)),
        4 => events.record(Hop4::new(chain)),
        5 => events.record(Hop5::new(chain)),
        _ => unreachable!("at most {MAX_HOPS} hops"),
    }
}

/// The saga hop of `saga` mode: service 2 starts (and completes) one saga
/// per chain, whose first step sends the chain's next message.
#[derive(Debug, Serialize, Deserialize)]
pub struct HopSaga {
    chain: Uuid,
}

#[saga(name = "bench_hops", id = Uuid, correlate = chain, starts_with(Hop2))]
impl HopSaga {
    async fn on_hop2(event: Hop2, ctx: &mut SagaContext<'_>) -> Result<Self, HandlerError> {
        let start = now_us();
        effect(ctx.tx(), event.chain, 2).await?;
        ctx.send(Hop3::new(event.chain));
        ctx.complete();
        stamp(event.chain, 2, event.event_id, start);
        Ok(Self { chain: event.chain })
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum ChainMode {
    Dedup,
    Inbox,
    Saga,
    /// The hand-written baseline: no outbox, a dual write per hop.
    Bare,
}

impl ChainMode {
    fn parse(name: &str) -> Self {
        match name.trim() {
            "dedup" => Self::Dedup,
            "inbox" => Self::Inbox,
            "saga" => Self::Saga,
            "bare" => Self::Bare,
            other => panic!("HOPS_BENCH_MODES: dedup, inbox, saga or bare, not {other:?}"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Dedup => "dedup",
            Self::Inbox => "inbox",
            Self::Saga => "saga",
            Self::Bare => "bare",
        }
    }
}

/// The framework consumers' `concurrent_batches`, from
/// `HOPS_BENCH_CONCURRENT_BATCHES` (their default when unset).
fn concurrent_batches() -> Option<usize> {
    std::env::var("HOPS_BENCH_CONCURRENT_BATCHES")
        .ok()
        .map(|n| n.parse().expect("HOPS_BENCH_CONCURRENT_BATCHES: a number"))
}

/// Extra librdkafka settings for every client of the bench, from
/// `HOPS_BENCH_KAFKA_<key>` variables.
fn kafka(broker: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", broker);
    for (key, value) in std::env::vars() {
        if let Some(key) = key.strip_prefix("HOPS_BENCH_KAFKA_") {
            config.set(key, value);
        }
    }
    config
}

fn consumer_kafka(broker: &str) -> ClientConfig {
    let mut config = kafka(broker);
    config
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
        // A new group starts at the end: earlier runs' records stay unread.
        .set("auto.offset.reset", "latest");
    config
}

/// One service of a chain: its database, and the relay and consumer it
/// runs (bare mode: its plain producer and consumer).
struct Service {
    pool: PgPool,
    database: String,
    relay: Option<RelayHandle>,
    consumer: Option<ConsumerHandle>,
    producer: Option<FutureProducer>,
    bare: Option<BareConsumer>,
}

/// Where chains start: service 0's database, and in bare mode the producer
/// it sends `Hop1` with after its commit.
#[derive(Clone)]
struct Origin {
    pool: PgPool,
    producer: Option<FutureProducer>,
}

/// A bare-mode hop's record: the fields of the framework's `Hop` events,
/// as plain JSON.
#[derive(Serialize, Deserialize)]
struct BareEvent {
    event_id: Uuid,
    chain: Uuid,
    note: String,
}

impl BareEvent {
    fn new(chain: Uuid) -> Self {
        Self {
            event_id: Uuid::now_v7(),
            chain,
            note: "x".repeat(100),
        }
    }
}

/// A bare-mode service's consumer task, and how to stop it.
struct BareConsumer {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl BareConsumer {
    /// Service `hop` of a bare chain: reads `Hop{hop}` and hands each record
    /// to a task of its own (the pool's connections bound how many commit
    /// at once), which commits the effect and sends the next hop's record
    /// with `producer` (none for the chain's last service).
    fn spawn(pool: PgPool, broker: &str, hop: usize, producer: Option<FutureProducer>) -> Self {
        let mut config =
            txoutbox_runtime::consumer::fetch_settings_for_benchmark(&consumer_kafka(broker));
        let consumer: StreamConsumer = config
            .set("group.id", unique_group(&format!("bench-hops-bare{hop}")))
            .create()
            .unwrap();
        consumer.subscribe(&[TOPICS[hop - 1]]).unwrap();
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            loop {
                let message = tokio::select! {
                    _ = &mut stopped => break,
                    message = consumer.recv() => message,
                };
                let Ok(message) = message else { continue };
                let event: BareEvent =
                    serde_json::from_slice(message.payload().unwrap_or_default()).unwrap();
                bare_point(event.event_id, Stage::Received);
                let (pool, producer) = (pool.clone(), producer.clone());
                tokio::spawn(async move {
                    let start = now_us();
                    let mut tx = pool.begin().await.unwrap();
                    effect(&mut tx, event.chain, hop).await.unwrap();
                    stamp(event.chain, hop, event.event_id, start);
                    tx.commit().await.unwrap();
                    committed(event.chain, hop, now_us());
                    if let Some(producer) = producer {
                        send_bare(&producer, hop + 1, BareEvent::new(event.chain)).await;
                    }
                });
            }
        });
        Self { stop, task }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap();
    }
}

/// Sends bare mode's record `event` of hop `hop` and awaits its
/// acknowledgement.
async fn send_bare(producer: &FutureProducer, hop: usize, event: BareEvent) {
    let payload = serde_json::to_vec(&event).unwrap();
    let key = event.chain.to_string();
    bare_point(event.event_id, Stage::Sent);
    let delivery = producer
        .send_result(
            FutureRecord::to(TOPICS[hop - 1])
                .key(&key)
                .payload(&payload),
        )
        .map_err(|(e, _)| e)
        .unwrap();
    delivery.await.unwrap().map_err(|(e, _)| e).unwrap();
    bare_point(event.event_id, Stage::Acked);
}

/// The services of one configuration.
struct Chain {
    mode: ChainMode,
    hops: usize,
    services: Vec<Service>,
}

impl Chain {
    async fn start(mode: ChainMode, hops: usize, broker: &str) -> Self {
        HOPS.store(hops, Ordering::Relaxed);
        let mut services = Vec::new();
        for index in 0..=hops {
            let (pool, database) =
                support::scratch_database(&format!("outbox_bench_hops{index}"), 8).await;
            sqlx::raw_sql(
                "CREATE TABLE hop_effect (chain uuid NOT NULL, hop int NOT NULL,
                                          PRIMARY KEY (chain, hop))",
            )
            .execute(&pool)
            .await
            .unwrap();
            let bare = mode == ChainMode::Bare;
            let relay = (index < hops && !bare).then(|| {
                Relay::builder(pool.clone(), kafka(broker))
                    .spawn()
                    .expect("relay starts")
            });
            let producer = (index < hops && bare).then(|| {
                txoutbox_runtime::relay::producer_settings_for_benchmark(&kafka(broker))
                    .create::<FutureProducer>()
                    .unwrap()
            });
            let bare_consumer = (index > 0 && bare)
                .then(|| BareConsumer::spawn(pool.clone(), broker, index, producer.clone()));
            let consumer = (index > 0 && !bare).then(|| {
                let group = unique_group(&format!("bench-hops{index}"));
                let mut builder = Consumer::builder(pool.clone(), consumer_kafka(broker), &group)
                    .create_missing_dlq_topics(true);
                if let Some(batches) = concurrent_batches() {
                    builder = builder.concurrent_batches(batches);
                }
                let builder = match mode {
                    ChainMode::Inbox => builder.mode(Mode::Inbox),
                    _ => builder,
                };
                handler_of(builder, mode, index)
                    .build()
                    .expect("consumer builds")
                    .spawn()
            });
            services.push(Service {
                pool,
                database,
                relay,
                consumer,
                producer,
                bare: bare_consumer,
            });
        }
        let chain = Self {
            mode,
            hops,
            services,
        };
        chain.warm_up().await;
        chain
    }

    /// Sends chains until three in a row complete (every consumer joined its
    /// group and was assigned), then forgets them.
    async fn warm_up(&self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut completed = 0;
        while completed < 3 {
            assert!(
                Instant::now() < deadline,
                "{} x{}: no chain completed within 120 s",
                self.mode.name(),
                self.hops
            );
            let chain = send_chain(&self.origin()).await;
            let wait = Instant::now() + Duration::from_secs(3);
            while Instant::now() < wait && !self.completed(chain) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            completed = if self.completed(chain) {
                completed + 1
            } else {
                0
            };
        }
        STAMPS.lock().unwrap().clear();
    }

    fn origin(&self) -> Origin {
        Origin {
            pool: self.services[0].pool.clone(),
            producer: self.services[0].producer.clone(),
        }
    }

    fn completed(&self, chain: Uuid) -> bool {
        STAMPS.lock().unwrap().contains_key(&(chain, self.hops))
    }

    /// One round at `rate` chains/s for `secs`: every chain is waited for,
    /// then the stamps and the probe's points are gathered.
    async fn round(&self, rate: usize, secs: f64, broker_pid: Option<u32>) -> Round {
        STAMPS.lock().unwrap().clear();
        take_points();
        let claims_before = self.relay_claims();
        let cpu_before = support::CpuTimes::now(broker_pid);
        let total = ((rate as f64) * secs).round().max(1.0) as usize;
        // Writers take the schedule's sends in turn, each at its time (a
        // writer late by a commit starts the next send at once).
        const WRITERS: usize = 4;
        let schedule = std::sync::Arc::new(Schedule::new(arrivals(), rate, total));
        let writers: Vec<_> = (0..WRITERS)
            .map(|_| {
                let origin = self.origin();
                let schedule = std::sync::Arc::clone(&schedule);
                tokio::spawn(async move {
                    let mut chains = Vec::new();
                    while schedule.next().await.is_some() {
                        chains.push(send_chain(&origin).await);
                    }
                    chains
                })
            })
            .collect();
        let started = Instant::now();
        let mut chains = Vec::with_capacity(total);
        for writer in writers {
            chains.extend(writer.await.unwrap());
        }
        let achieved = chains.len() as f64 / started.elapsed().as_secs_f64();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let done = {
                let stamps = STAMPS.lock().unwrap();
                chains
                    .iter()
                    .filter(|c| stamps.contains_key(&(**c, self.hops)))
                    .count()
            };
            if done == chains.len() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{} x{} at {rate}/s: {done} of {} chains completed within 120 s",
                self.mode.name(),
                self.hops,
                chains.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let cpu = support::CpuTimes::now(broker_pid).since(&cpu_before);
        let wall_secs = started.elapsed().as_secs_f64();
        // The relays mark right after the acknowledgement: give the last
        // marks a moment before reading the points.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let stamps = std::mem::take(&mut *STAMPS.lock().unwrap());
        let points = take_points();
        let mut round = Round::of(self.hops, &chains, &stamps, &points, achieved);
        round.cpu = cpu;
        round.wall_secs = wall_secs;
        round.claims = (self.mode != ChainMode::Bare).then(|| {
            let (claims, empty) = self.relay_claims();
            (claims - claims_before.0, empty - claims_before.1)
        });
        round
    }

    /// Claim statements run by the chain's relays so far, and how many of
    /// them found nothing.
    fn relay_claims(&self) -> (u64, u64) {
        self.services
            .iter()
            .filter_map(|service| service.relay.as_ref())
            .map(RelayHandle::summary)
            .fold((0, 0), |(claims, empty), summary| {
                (claims + summary.claims, empty + summary.empty_claims)
            })
    }

    async fn stop(self) {
        for service in self.services {
            if let Some(consumer) = service.consumer {
                consumer.shutdown().await.unwrap();
            }
            if let Some(relay) = service.relay {
                relay.shutdown().await.unwrap();
            }
            if let Some(bare) = service.bare {
                bare.stop().await;
            }
            service.pool.close().await;
            support::drop_database(&service.database).await;
        }
    }
}

/// Service 0's transaction: an effect row and `Hop1`, committed; the stamp
/// is taken before the commit, as the consumers' are. The framework's chain
/// writes through `txoutbox_core::transaction(&pool)`, as `#[outbox_handler]`
/// does, whose commit wakes the relays of its database only. Bare mode sends
/// `Hop1` itself once the commit returned (in the background, so the
/// writer takes its next send on time).
async fn send_chain(origin: &Origin) -> Uuid {
    let chain = Uuid::new_v4();
    if let Some(producer) = &origin.producer {
        let mut tx = origin.pool.begin().await.unwrap();
        effect(&mut tx, chain, 0).await.unwrap();
        // The stamp's event id is the one the next service receives.
        let first = BareEvent::new(chain);
        stamp(chain, 0, first.event_id, 0);
        tx.commit().await.unwrap();
        committed(chain, 0, now_us());
        let producer = producer.clone();
        tokio::spawn(async move { send_bare(&producer, 1, first).await });
        return chain;
    }
    txoutbox_core::transaction(&origin.pool)
        .run(async |tx, events| {
            effect(tx, chain, 0).await?;
            let first = Hop1::new(chain);
            stamp(chain, 0, first.event_id, 0);
            events.record(first);
            Ok::<_, txoutbox_core::Error>(())
        })
        .await
        .unwrap();
    // Taken after the relay was woken (the commit returns, then it signals):
    // "writer's commit" includes the signal, a few microseconds.
    committed(chain, 0, now_us());
    chain
}

fn handler_of(builder: ConsumerBuilder, mode: ChainMode, index: usize) -> ConsumerBuilder {
    match (index, mode) {
        (2, ChainMode::Saga) => builder.saga::<HopSaga>(),
        (1, _) => builder.handler(on_hop1),
        (2, _) => builder.handler(on_hop2),
        (3, _) => builder.handler(on_hop3),
        (4, _) => builder.handler(on_hop4),
        (5, _) => builder.handler(on_hop5),
        _ => unreachable!("at most {MAX_HOPS} hops"),
    }
}

/// Where a stage of a hop ends.
#[derive(Clone, Copy)]
enum Until {
    /// The previous service's commit returned (the origin's own stamp, a
    /// consumer's `Committed` point).
    PreviousCommit,
    /// A probe point of the hop's event.
    Point(Stage),
    /// The next service's handler started.
    HandlerStart,
    /// The next service's transaction body ended.
    HandlerEnd,
}

/// The stages of a hop, in the order a record goes through them: each is
/// the time from the previous stage's end to its own.
const STAGES: [(Until, &str); 8] = [
    (
        Until::PreviousCommit,
        "writer's commit (and, consumers: the outbox insert)",
    ),
    (Until::Point(Stage::Claimed), "relay wake-up and claim"),
    (
        Until::Point(Stage::Sent),
        "claim to produce (bare: commit to produce)",
    ),
    (Until::Point(Stage::Acked), "produce to acknowledgement"),
    (
        Until::Point(Stage::Received),
        "acknowledgement to consumer receipt (fetch)",
    ),
    (
        Until::Point(Stage::Stored),
        "inbox: receipt to stored pending (not on receipt)",
    ),
    (
        Until::HandlerStart,
        "to the handler's start (dedup or inbox row, saga row; processor pickup)",
    ),
    (Until::HandlerEnd, "handler body"),
];

/// What one round measured: latencies in milliseconds, each sorted.
struct Round {
    achieved: f64,
    end_to_end: Vec<f64>,
    per_hop: Vec<f64>,
    stages: Vec<Vec<f64>>,
    /// Acknowledgement to mark committed: off the hop's path, shown apart.
    marked: Vec<f64>,
    /// CPU spent from the round's first send until its last chain completed.
    cpu: support::CpuTimes,
    /// That interval's wall time, seconds.
    wall_secs: f64,
    /// Claims the relays ran over the round, and how many found nothing
    /// (`None` in bare mode, which has no relay).
    claims: Option<(u64, u64)>,
}

impl Round {
    fn of(
        hops: usize,
        chains: &[Uuid],
        stamps: &HashMap<(Uuid, usize), Stamp>,
        points: &[probe::Point],
        achieved: f64,
    ) -> Self {
        let mut by_event: HashMap<(Uuid, Stage), i64> = HashMap::new();
        for point in points {
            by_event
                .entry((point.event_id, point.stage))
                .or_insert(point.at_us);
        }
        let ms = |from: i64, to: i64| (to - from) as f64 / 1e3;
        let mut round = Round {
            achieved,
            end_to_end: Vec::new(),
            per_hop: Vec::new(),
            stages: vec![Vec::new(); STAGES.len()],
            marked: Vec::new(),
            cpu: support::CpuTimes::default(),
            wall_secs: 0.0,
            claims: None,
        };
        for chain in chains {
            let stamp = |hop: usize| stamps[&(*chain, hop)];
            round
                .end_to_end
                .push(ms(stamp(0).end_us, stamp(hops).end_us));
            for hop in 1..=hops {
                let (from, to) = (stamp(hop - 1), stamp(hop));
                round.per_hop.push(ms(from.end_us, to.end_us));
                // The hop's event: the one the next service received.
                let point = |stage| by_event.get(&(to.event_id, stage)).copied();
                let mut previous = from.end_us;
                for (index, (end, _)) in STAGES.iter().enumerate() {
                    let at = match end {
                        Until::PreviousCommit => from
                            .commit_us
                            .or_else(|| by_event.get(&(from.event_id, Stage::Committed)).copied()),
                        Until::Point(stage) => point(*stage),
                        Until::HandlerStart => Some(to.start_us),
                        Until::HandlerEnd => Some(to.end_us),
                    };
                    if let Some(at) = at {
                        round.stages[index].push(ms(previous, at));
                        previous = at;
                    }
                }
                if let (Some(acked), Some(marked)) = (point(Stage::Acked), point(Stage::Marked)) {
                    round.marked.push(ms(acked, marked));
                }
            }
        }
        for values in std::iter::once(&mut round.end_to_end)
            .chain(std::iter::once(&mut round.per_hop))
            .chain(round.stages.iter_mut())
            .chain(std::iter::once(&mut round.marked))
        {
            values.sort_by(f64::total_cmp);
        }
        round
    }

    /// CPU milliseconds per hop of a chain (`pick` of the round's CPU
    /// seconds over the round's hops).
    fn cpu_per_hop(&self, pick: CpuPart) -> f64 {
        pick(&self.cpu) * 1e3 / self.per_hop.len().max(1) as f64
    }

    /// Cores busy on average over the round (`pick` of its CPU seconds over
    /// its wall time).
    fn cores(&self, pick: CpuPart) -> f64 {
        pick(&self.cpu) / self.wall_secs.max(1e-9)
    }
}

/// One part of the machine's CPU seconds.
type CpuPart = fn(&support::CpuTimes) -> f64;

/// The parts of the machine whose CPU the bench reports, by label.
const CPU_PARTS: [(&str, CpuPart); 4] = [
    ("the services (this process)", |c| c.bench),
    ("PostgreSQL", |c| c.postgres),
    ("the broker", |c| c.broker),
    ("the whole machine (busy)", |c| c.machine_busy),
];

/// How the sends of a round (the chains' first commits, the floor's
/// records) are spread over time: `HOPS_BENCH_ARRIVALS`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Arrivals {
    /// Independent arrivals (exponential gaps of mean `1 / rate`), as
    /// requests from many clients come: the default.
    Poisson,
    /// One every `1 / rate`, evenly spaced. At 100/s the 10 ms period
    /// equals the consumers' `fetch.wait.max.ms`, and on a broker that
    /// looks at its log a few times during a held fetch (tansu) a plain
    /// reader settles into a rhythm where each record lands just before
    /// one of the fetch's looks: the floor then reads about 1 ms faster
    /// than with independent arrivals (BENCHMARKS.md, "Latency across
    /// services").
    Periodic,
}

fn arrivals() -> Arrivals {
    match std::env::var("HOPS_BENCH_ARRIVALS").as_deref() {
        Err(_) | Ok("poisson") => Arrivals::Poisson,
        Ok("periodic") => Arrivals::Periodic,
        Ok(other) => panic!("HOPS_BENCH_ARRIVALS: poisson or periodic, not {other:?}"),
    }
}

/// The due times of a round's sends, shared by the tasks that send them.
struct Schedule {
    start: tokio::time::Instant,
    due: Vec<Duration>,
    taken: AtomicUsize,
}

impl Schedule {
    fn new(arrivals: Arrivals, rate: usize, total: usize) -> Self {
        let gap = 1.0 / rate as f64;
        // xorshift64*, seeded from the clock: no two rounds alike.
        let mut state = (now_us() as u64) | 1;
        let mut uniform = move || {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            ((state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        let mut at = 0.0;
        let due = (0..total)
            .map(|_| {
                at += match arrivals {
                    Arrivals::Poisson => -uniform().ln() * gap,
                    Arrivals::Periodic => gap,
                };
                Duration::from_secs_f64(at)
            })
            .collect();
        Self {
            start: tokio::time::Instant::now(),
            due,
            taken: AtomicUsize::new(0),
        }
    }

    /// Waits until the next send is due and returns its number; `None`
    /// once every send was taken.
    async fn next(&self) -> Option<usize> {
        let seq = self.taken.fetch_add(1, Ordering::Relaxed);
        let due = *self.due.get(seq)?;
        tokio::time::sleep_until(self.start + due).await;
        Some(seq)
    }
}

/// The broker floor of one round.
struct Floor {
    to_ack: Vec<f64>,
    to_arrival: Vec<f64>,
    /// The same records' arrival at a second plain consumer, the way an
    /// async service reads: a `StreamConsumer` in a group (subscribed, not
    /// assigned), awaited on the runtime. Printed beside the floor; the
    /// targets use the first one.
    to_arrival_async: Vec<f64>,
}

/// Records at `rate`/s for `secs` (arrivals as the chains') over 100 keys through a plain
/// producer (the relay's settings) to a plain consumer (the consumers'
/// fetch settings).
async fn broker_floor(broker: &str, rate: usize, secs: f64) -> Floor {
    let total = ((rate as f64) * secs).round().max(1.0) as usize;
    let producer: FutureProducer =
        txoutbox_runtime::relay::producer_settings_for_benchmark(&kafka(broker))
            .create()
            .unwrap();
    let (ready, is_ready) = tokio::sync::oneshot::channel();
    let (async_ready, is_async_ready) = tokio::sync::oneshot::channel();
    let config = txoutbox_runtime::consumer::fetch_settings_for_benchmark(&consumer_kafka(broker));
    let reader = {
        let config = config.clone();
        tokio::task::spawn_blocking(move || read_floor(config, total, ready))
    };
    let async_reader = tokio::spawn(read_floor_async(config, total, async_ready));
    let is_ready = async move {
        let _ = is_ready.await;
        let _ = is_async_ready.await;
    };
    // Timing starts once the reader gets records (assigned, positioned) and
    // the producer is warm.
    tokio::pin!(is_ready);
    loop {
        for partition in 0..PARTITIONS {
            producer
                .send(
                    FutureRecord::to(FLOOR_TOPIC)
                        .key("warm-up")
                        .payload("{}")
                        .partition(partition),
                    Duration::from_secs(10),
                )
                .await
                .map_err(|(e, _)| e)
                .unwrap();
        }
        tokio::select! {
            _ = &mut is_ready => break,
            () = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
    }
    let schedule = Schedule::new(arrivals(), rate, total);
    let mut acks = Vec::with_capacity(total);
    while let Some(seq) = schedule.next().await {
        let key = format!("chain-{}", seq % 100);
        let sent = now_us();
        let value = serde_json::json!({"sent_us": sent, "note": "x".repeat(100)}).to_string();
        let delivery = producer
            .send_result(FutureRecord::to(FLOOR_TOPIC).key(&key).payload(&value))
            .map_err(|(e, _)| e)
            .unwrap();
        acks.push(tokio::spawn(async move {
            delivery.await.unwrap().map_err(|(e, _)| e).unwrap();
            (now_us() - sent) as f64 / 1e3
        }));
    }
    let mut to_ack = Vec::with_capacity(total);
    for ack in acks {
        to_ack.push(ack.await.unwrap());
    }
    let mut to_arrival = reader.await.unwrap();
    assert_eq!(
        to_arrival.len(),
        total,
        "the floor's reader got every record"
    );
    let mut to_arrival_async = async_reader.await.unwrap();
    assert_eq!(
        to_arrival_async.len(),
        total,
        "the floor's async reader got every record"
    );
    to_ack.sort_by(f64::total_cmp);
    to_arrival.sort_by(f64::total_cmp);
    to_arrival_async.sort_by(f64::total_cmp);
    Floor {
        to_ack,
        to_arrival,
        to_arrival_async,
    }
}

/// A floor record read now: its time since it was sent, or, for a warm-up
/// record (no `sent_us`), the signal that the reader gets records.
fn arrived(
    message: &impl Message,
    arrivals: &mut Vec<f64>,
    ready: &mut Option<tokio::sync::oneshot::Sender<()>>,
) {
    let now = now_us();
    let value: serde_json::Value =
        serde_json::from_slice(message.payload().unwrap_or(b"{}")).unwrap();
    match value["sent_us"].as_i64() {
        Some(sent) => arrivals.push((now - sent) as f64 / 1e3),
        None => {
            if let Some(ready) = ready.take() {
                let _ = ready.send(());
            }
        }
    }
}

/// The floor's second reader: a group member on the async path, as a
/// service's consumer reads (starting at the end of each partition).
async fn read_floor_async(
    config: ClientConfig,
    total: usize,
    ready: tokio::sync::oneshot::Sender<()>,
) -> Vec<f64> {
    let mut config = config;
    let consumer: StreamConsumer = config
        .set("group.id", unique_group("bench-hops-floor-async"))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "latest")
        .create()
        .unwrap();
    consumer.subscribe(&[FLOOR_TOPIC]).unwrap();
    let mut ready = Some(ready);
    let mut arrivals = Vec::with_capacity(total);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    while arrivals.len() < total {
        let Ok(message) = tokio::time::timeout_at(deadline, consumer.recv()).await else {
            break;
        };
        arrived(&message.unwrap(), &mut arrivals, &mut ready);
    }
    arrivals
}

fn read_floor(
    config: ClientConfig,
    total: usize,
    ready: tokio::sync::oneshot::Sender<()>,
) -> Vec<f64> {
    let mut config = config;
    let consumer: BaseConsumer = config
        .set("group.id", unique_group("bench-hops-floor"))
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut assignment = rdkafka::TopicPartitionList::new();
    for partition in 0..PARTITIONS {
        assignment
            .add_partition_offset(FLOOR_TOPIC, partition, rdkafka::Offset::End)
            .unwrap();
    }
    consumer.assign(&assignment).unwrap();
    let mut ready = Some(ready);
    let mut arrivals = Vec::with_capacity(total);
    let deadline = Instant::now() + Duration::from_secs(300);
    while arrivals.len() < total && Instant::now() < deadline {
        if let Some(message) = consumer.poll(Duration::from_millis(100)) {
            arrived(&message.unwrap(), &mut arrivals, &mut ready);
        }
    }
    arrivals
}

/// The value at quantile `q` of `sorted` (nearest rank), or NaN if empty.
fn at(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1]
}

/// `min / median / max` of `values`, one decimal.
fn spread(values: &[f64]) -> String {
    let values: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
    if values.is_empty() {
        return "-".into();
    }
    let (min, median, max) = support::spread(&values);
    format!("{min:.1} / {median:.1} / {max:.1}")
}

const QUANTILES: [(&str, f64); 3] = [("p50", 0.50), ("p99", 0.99), ("p99.9", 0.999)];

fn list(name: &str, default: &str) -> Vec<String> {
    std::env::var(name)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

/// The broker of one configuration. tansu slows down as groups and topics
/// pile up in its memory, so by default every configuration gets a fresh
/// one of its own on a free port (stopped when dropped);
/// `HOPS_BENCH_OWN_BROKER=0` uses `KAFKA_BROKERS_TEST` instead (a real
/// Kafka, say).
struct Broker {
    address: String,
    own: Option<std::process::Child>,
}

impl Broker {
    async fn start() -> Self {
        let broker = if own_broker() {
            let port = free_port();
            let address = format!("127.0.0.1:{port}");
            let child = spawn_tansu(port, &address);
            wait_listening_async(port).await;
            Self {
                address,
                own: Some(child),
            }
        } else {
            Self {
                address: brokers(),
                own: None,
            }
        };
        let mut topics: Vec<(&str, i32)> = TOPICS.iter().map(|t| (*t, PARTITIONS)).collect();
        topics.push((FLOOR_TOPIC, PARTITIONS));
        create_topics(&broker.address, &topics).await;
        broker
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(child) = self.own.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[tokio::main]
async fn main() {
    let modes: Vec<ChainMode> = list("HOPS_BENCH_MODES", "dedup,inbox,saga,bare")
        .iter()
        .map(|m| ChainMode::parse(m))
        .collect();
    let lengths: Vec<usize> = list("HOPS_BENCH_CHAINS", "1,3,5")
        .iter()
        .map(|n| n.parse().expect("HOPS_BENCH_CHAINS: numbers"))
        .inspect(|n| assert!((1..=MAX_HOPS).contains(n), "1 to {MAX_HOPS} hops"))
        .collect();
    let rates: Vec<usize> = list("HOPS_BENCH_RATES", "100,1000")
        .iter()
        .map(|r| r.parse().expect("HOPS_BENCH_RATES: numbers"))
        .collect();
    let secs: f64 = std::env::var("HOPS_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4.0);
    let floor_secs: f64 = std::env::var("HOPS_BENCH_FLOOR_SECS")
        .ok()
        .map(|s| s.parse().expect("HOPS_BENCH_FLOOR_SECS: seconds"))
        .unwrap_or(secs);
    let rounds = support::env_usize("HOPS_BENCH_ROUNDS", 3).max(1);
    probe::enable();
    println!(
        "commit {}; {rounds} rounds of {secs} s per rate, each after a floor of {floor_secs} s; \
         {PARTITIONS} partitions per topic; {:?} arrivals; consumers' concurrent batches: {}",
        txoutbox_testkit::measured_commit(),
        arrivals(),
        concurrent_batches().map_or("their default".to_owned(), |n| n.to_string())
    );

    let mut configurations = Vec::new();
    for mode in &modes {
        match mode {
            ChainMode::Saga => configurations.push((ChainMode::Saga, 3)),
            _ => configurations.extend(lengths.iter().map(|n| (*mode, *n))),
        }
    }
    let fresh = fresh_broker();
    let floor_broker = floor_broker(fresh);
    let mut summary = Vec::new();
    for (mode, hops) in configurations {
        // One broker and one set of services for the configuration, or a
        // fresh pair for every round (`HOPS_BENCH_FRESH`).
        let mut kept = None;
        for &rate in &rates {
            let mut measured = Vec::new();
            for round in 0..rounds {
                // The floor first, on a fresh broker of its own when the
                // round gets one too (see `FloorBroker`).
                let floor = match floor_broker {
                    FloorBroker::Own => {
                        let broker = Broker::start().await;
                        broker_floor(&broker.address, rate, floor_secs).await
                    }
                    FloorBroker::Shared => {
                        if kept.is_none() {
                            kept = Some(start_configuration(mode, hops).await);
                        }
                        let (broker, _) = kept.as_ref().expect("started above");
                        broker_floor(&broker.address, rate, floor_secs).await
                    }
                };
                if kept.is_none() {
                    kept = Some(start_configuration(mode, hops).await);
                }
                let (broker, chain) = kept.as_ref().expect("started above");
                let hop_round = chain
                    .round(rate, secs, broker.own.as_ref().map(std::process::Child::id))
                    .await;
                println!(
                    "{} x{hops} at {rate}/s, round {}: achieved {:.0}/s; end to end p50 {:.1} p99 {:.1} ms; \
                     per hop p50 {:.1} p99 {:.1} ms; floor send-to-arrival p50 {:.1} p99 {:.1} ms, \
                     send-to-ack p50 {:.1} p99 {:.1} ms, send-to-arrival (async group reader) \
                     p50 {:.1} p99 {:.1} ms; cores busy: services {:.2}, PostgreSQL {:.2}, \
                     broker {:.2}, machine {:.2} of {:.0}",
                    mode.name(),
                    round + 1,
                    hop_round.achieved,
                    at(&hop_round.end_to_end, 0.5),
                    at(&hop_round.end_to_end, 0.99),
                    at(&hop_round.per_hop, 0.5),
                    at(&hop_round.per_hop, 0.99),
                    at(&floor.to_arrival, 0.5),
                    at(&floor.to_arrival, 0.99),
                    at(&floor.to_ack, 0.5),
                    at(&floor.to_ack, 0.99),
                    at(&floor.to_arrival_async, 0.5),
                    at(&floor.to_arrival_async, 0.99),
                    hop_round.cores(|c| c.bench),
                    hop_round.cores(|c| c.postgres),
                    hop_round.cores(|c| c.broker),
                    hop_round.cores(|c| c.machine_busy),
                    hop_round.cores(|c| c.machine_total),
                );
                measured.push((hop_round, floor));
                if fresh == Fresh::EveryRound {
                    stop(kept.take()).await;
                }
            }
            summary.push((mode, hops, rate, measured));
        }
        stop(kept.take()).await;
    }
    report(&summary, rounds);
}

/// A fresh broker and the configuration's services on it.
async fn start_configuration(mode: ChainMode, hops: usize) -> (Broker, Chain) {
    let broker = Broker::start().await;
    let chain = Chain::start(mode, hops, &broker.address).await;
    (broker, chain)
}

/// Where a round's floor is measured: `HOPS_BENCH_FLOOR_BROKER`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum FloorBroker {
    /// On a fresh broker of its own, stopped before the round's broker
    /// starts (the default, when every round gets a fresh broker): the
    /// floor's broker and the round's start equally new, neither holds the
    /// other's records, and the floor is not measured beside the idle
    /// services' held fetches.
    Own,
    /// On the round's broker, before the round (as before commit `f82a007`; always
    /// with `HOPS_BENCH_FRESH=configuration` or a broker of yours).
    Shared,
}

fn floor_broker(fresh: Fresh) -> FloorBroker {
    match std::env::var("HOPS_BENCH_FLOOR_BROKER").as_deref() {
        Err(_) | Ok("own") if own_broker() && fresh == Fresh::EveryRound => FloorBroker::Own,
        Err(_) | Ok("shared") => FloorBroker::Shared,
        Ok(other) => panic!(
            "HOPS_BENCH_FLOOR_BROKER: own or shared, not {other:?} (own needs a broker of the \
             bench's own for every round: unset HOPS_BENCH_FRESH and HOPS_BENCH_OWN_BROKER)"
        ),
    }
}

/// Whether the bench starts its brokers (tansu) itself, or uses
/// `KAFKA_BROKERS_TEST` (`HOPS_BENCH_OWN_BROKER=0`).
fn own_broker() -> bool {
    std::env::var("HOPS_BENCH_OWN_BROKER").map_or(true, |v| v != "0")
}

/// Stops a configuration's services, then its broker.
async fn stop(kept: Option<(Broker, Chain)>) {
    if let Some((broker, chain)) = kept {
        chain.stop().await;
        drop(broker);
    }
}

/// When the bench starts a fresh broker and fresh services:
/// `HOPS_BENCH_FRESH`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fresh {
    /// For every round (the default): tansu keeps every record in memory
    /// and slows as they pile up (its CPU for the same load grows round by
    /// round, and so does the floor), which a broker that writes its log to
    /// disk does not. Each round's floor and chains then meet the same
    /// broker, at the same age.
    EveryRound,
    /// For every configuration (mode, hops): its rounds at every rate run
    /// one after another on one broker, as the bench ran until commit
    /// `5e6d8a3`.
    EveryConfiguration,
}

fn fresh_broker() -> Fresh {
    match std::env::var("HOPS_BENCH_FRESH").as_deref() {
        Err(_) | Ok("round") => Fresh::EveryRound,
        Ok("configuration") => Fresh::EveryConfiguration,
        Ok(other) => panic!("HOPS_BENCH_FRESH: round or configuration, not {other:?}"),
    }
}

type Measured = (ChainMode, usize, usize, Vec<(Round, Floor)>);

/// The median over rounds of a round's per-hop quantile `q`.
fn median_per_hop(measured: &[(Round, Floor)], q: f64) -> f64 {
    let values: Vec<f64> = measured
        .iter()
        .map(|(r, _)| at(&r.per_hop, q))
        .filter(|v| !v.is_nan())
        .collect();
    if values.is_empty() {
        return f64::NAN;
    }
    support::spread(&values).1
}

/// Each framework chain's per-hop p50 and p99 as ratios of the bare chain's
/// of the same length and rate (medians over rounds), where bare ran.
fn against_bare(summary: &[Measured]) {
    let bare = |hops: usize, rate: usize| {
        summary
            .iter()
            .find(|(m, h, r, _)| *m == ChainMode::Bare && *h == hops && *r == rate)
    };
    let rows: Vec<String> = summary
        .iter()
        .filter(|(mode, ..)| *mode != ChainMode::Bare)
        .filter_map(|(mode, hops, rate, measured)| {
            let (.., baseline) = bare(*hops, *rate)?;
            let cells: Vec<String> = [0.5, 0.99]
                .into_iter()
                .flat_map(|q| {
                    let (framework, by_hand) =
                        (median_per_hop(measured, q), median_per_hop(baseline, q));
                    [
                        format!("{framework:.1}"),
                        format!("{by_hand:.1}"),
                        format!("{:.2}x", framework / by_hand),
                    ]
                })
                .collect();
            Some(format!(
                "| {} x{hops} | {rate}/s | {} |",
                mode.name(),
                cells.join(" | ")
            ))
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    println!(
        "\n## Against the hand-written hop (bare mode: no outbox, a dual write per hop; \
         per hop, ms, median over rounds)\n"
    );
    println!("| chain | rate | p50 | bare p50 | ratio | p99 | bare p99 | ratio |");
    println!("|---|---|---|---|---|---|---|---|");
    for row in rows {
        println!("{row}");
    }
}

fn report(summary: &[Measured], rounds: usize) {
    println!("\n## End to end and per hop (ms, min / median / max over {rounds} rounds)\n");
    println!(
        "| chain | rate | achieved | end to end p50 | p99 | p99.9 | per hop p50 | p99 | p99.9 | \
         floor p50 | p99 | hop p50 <= 2x floor | hop p99 <= 3x floor |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (mode, hops, rate, measured) in summary {
        let of = |pick: &dyn Fn(&(Round, Floor)) -> f64| -> Vec<f64> {
            measured.iter().map(pick).collect()
        };
        let mut cells = vec![
            format!("{} x{hops}", mode.name()),
            format!("{rate}/s"),
            spread(&of(&|(r, _)| r.achieved)),
        ];
        for (_, q) in QUANTILES {
            cells.push(spread(&of(&|(r, _)| at(&r.end_to_end, q))));
        }
        for (_, q) in QUANTILES {
            cells.push(spread(&of(&|(r, _)| at(&r.per_hop, q))));
        }
        cells.push(spread(&of(&|(_, f)| at(&f.to_arrival, 0.5))));
        cells.push(spread(&of(&|(_, f)| at(&f.to_arrival, 0.99))));
        let met = |q: f64, times: f64| {
            measured
                .iter()
                .filter(|(r, f)| at(&r.per_hop, q) <= times * at(&f.to_arrival, q))
                .count()
        };
        cells.push(format!("{} of {rounds}", met(0.5, 2.0)));
        cells.push(format!("{} of {rounds}", met(0.99, 3.0)));
        println!("| {} |", cells.join(" | "));
    }
    against_bare(summary);
    println!("\n## Where a hop's time goes (ms, p50 / p99, median over rounds)\n");
    let mut header = vec!["stage".to_owned()];
    for (mode, hops, rate, _) in summary {
        header.push(format!("{} x{hops} {rate}/s", mode.name()));
    }
    println!("| {} |", header.join(" | "));
    println!("|{}", "---|".repeat(header.len()));
    let median = |values: Vec<f64>| -> f64 {
        let values: Vec<f64> = values.into_iter().filter(|v| !v.is_nan()).collect();
        if values.is_empty() {
            f64::NAN
        } else {
            support::spread(&values).1
        }
    };
    let row = |label: &str, pick: &dyn Fn(&Round) -> &Vec<f64>| {
        let mut cells = vec![label.to_owned()];
        for (_, _, _, measured) in summary {
            let p50 = median(measured.iter().map(|(r, _)| at(pick(r), 0.5)).collect());
            let p99 = median(measured.iter().map(|(r, _)| at(pick(r), 0.99)).collect());
            cells.push(if p50.is_nan() {
                "-".into()
            } else {
                format!("{p50:.1} / {p99:.1}")
            });
        }
        println!("| {} |", cells.join(" | "));
    };
    for (index, (_, label)) in STAGES.iter().enumerate() {
        row(label, &|r| &r.stages[index]);
    }
    row("whole hop", &|r| &r.per_hop);
    row("(off the path) acknowledgement to mark committed", &|r| {
        &r.marked
    });
    let mut floor = vec!["broker floor: send to arrival".to_owned()];
    let mut ack = vec!["broker floor: send to acknowledgement".to_owned()];
    let mut arrival_async =
        vec!["(beside the floor) send to arrival, async group reader".to_owned()];
    for (_, _, _, measured) in summary {
        for (cells, pick) in [
            (
                &mut floor,
                (|f: &Floor| &f.to_arrival) as fn(&Floor) -> &Vec<f64>,
            ),
            (&mut ack, |f: &Floor| &f.to_ack),
            (&mut arrival_async, |f: &Floor| &f.to_arrival_async),
        ] {
            let p50 = median(measured.iter().map(|(_, f)| at(pick(f), 0.5)).collect());
            let p99 = median(measured.iter().map(|(_, f)| at(pick(f), 0.99)).collect());
            cells.push(format!("{p50:.1} / {p99:.1}"));
        }
    }
    println!("| {} |", floor.join(" | "));
    println!("| {} |", ack.join(" | "));
    println!("| {} |", arrival_async.join(" | "));

    println!(
        "\n## CPU per hop (ms of one core per chain-hop; in brackets, cores busy over the \
         round; median over rounds)\n"
    );
    let mut parts = header.clone();
    parts[0] = "part".to_owned();
    println!("| {} |", parts.join(" | "));
    println!("|{}", "---|".repeat(parts.len()));
    for (label, pick) in CPU_PARTS {
        let mut cells = vec![label.to_owned()];
        for (_, _, _, measured) in summary {
            let per_hop = median(measured.iter().map(|(r, _)| r.cpu_per_hop(pick)).collect());
            let cores = median(measured.iter().map(|(r, _)| r.cores(pick)).collect());
            cells.push(format!("{per_hop:.2} ({cores:.2})"));
        }
        println!("| {} |", cells.join(" | "));
    }
    let mut cells = vec!["relay claims per hop (of them empty)".to_owned()];
    for (_, _, _, measured) in summary {
        let per_hop = |pick: fn((u64, u64)) -> u64| {
            let values: Vec<f64> = measured
                .iter()
                .filter_map(|(r, _)| {
                    r.claims
                        .map(|c| pick(c) as f64 / r.per_hop.len().max(1) as f64)
                })
                .collect();
            (!values.is_empty()).then(|| median(values))
        };
        cells.push(match (per_hop(|c| c.0), per_hop(|c| c.1)) {
            (Some(claims), Some(empty)) => format!("{claims:.2} ({empty:.2})"),
            _ => "-".to_owned(),
        });
    }
    println!("| {} |", cells.join(" | "));
}
