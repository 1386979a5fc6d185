//! Running one scenario: start the processes, inject its faults under load,
//! wait until the system converged, stop everything, check.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Utc};
use rand::seq::IndexedRandom;
use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};

use super::broker::{Broker, Cluster, MockBrokers};
use super::checker::{self, Expect, Figures, OutageFigures};
use super::db::{Databases, ReceiverBackend, SourceBackend};
use super::env;
use super::fleet::{Fleet, Role};
use super::freeze::{Freeze, FreezeTarget};
use super::liveness;
use super::model::{DLQ_TOPIC, TOPIC};
use super::poison::{self, POISON_HEADER};
use super::proxy::Proxy;
use super::topic;

/// The fault a scenario injects while the writers run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fault {
    /// None: processes compete, nothing crashes.
    None,
    /// `kill -9` a random relay every `every`, restarting it at once.
    KillRelays {
        /// Interval between kills.
        every: Duration,
    },
    /// Consumers kill themselves right after `crash_after_effects` effects
    /// committed (before any offset commit), and a random one is also killed
    /// from outside every `every`.
    KillConsumers {
        /// Interval between outside kills.
        every: Duration,
        /// The crash hook's threshold.
        crash_after_effects: u32,
    },
    /// `kill -9` a random writer every `every` (writers sleep inside some
    /// transactions, so kills land mid-transaction), restarting it.
    KillWriters {
        /// Interval between kills.
        every: Duration,
    },
    /// Stop the broker `after` into the load for `outage`, then restart it
    /// (empty: memory storage) and recreate the topics.
    BrokerOutage {
        /// When.
        after: Duration,
        /// How long.
        outage: Duration,
    },
    /// Take the last broker of the mock cluster (see
    /// [`Scenario::mock_brokers`]) down `after` into the load for `outage`,
    /// then bring it back: its partitions are unavailable meanwhile, the
    /// others are not, and nothing is lost.
    BrokerDown {
        /// When.
        after: Duration,
        /// How long.
        outage: Duration,
    },
    /// Restart PostgreSQL `after` into the load (affects the whole machine).
    PostgresRestart {
        /// When.
        after: Duration,
    },
    /// The handler of key `k0` fails from `from` until `until` into the load
    /// (a downstream of that key is down); writers should make `k0` hot so
    /// that its backlog grows large. Consumers must not park or dead-letter
    /// it meanwhile (give them many attempts): the point is that every other
    /// key keeps flowing.
    BlockedKey {
        /// When the failures start.
        from: Duration,
        /// When they stop.
        until: Duration,
    },
    /// Every event whose sequence number is a multiple of `every` makes the
    /// handler panic, once per consumer process: the panic must count as a
    /// failed attempt, and the consumer must go on.
    HandlerPanics {
        /// See above.
        every: i64,
    },
    /// Handlers that misbehave with their transaction, once per consumer
    /// process and event each: every `swallow_every`-th sequence number runs
    /// a failing statement, drops its error and returns `Ok` without its
    /// effect; every `hang_every`-th waits an hour (the consumers' handler
    /// timeout is `timeout`). The framework must charge those attempts, not
    /// commit or wait for them, and nothing may be lost.
    MisbehavingHandlers {
        /// See above.
        swallow_every: i64,
        /// See above.
        hang_every: i64,
        /// The consumers' handler timeout.
        timeout: Duration,
    },
    /// A rolling deploy of the inbox group that adds a handler: its consumers
    /// start without the `LedgerNote` handler (keeping what they cannot
    /// handle), `at` into the load (once they consume) as many new ones start
    /// with it, and once those consume the old ones are stopped (`kill -9`),
    /// one every `gap`.
    RollingDeploy {
        /// When the new version starts.
        at: Duration,
        /// Between two old consumers' stops.
        gap: Duration,
    },
    /// Freeze (not close) the connections of `target` `after` into the load,
    /// for `hold` (see [`super::freeze`]).
    Freeze {
        /// Whose connections.
        target: FreezeTarget,
        /// When.
        after: Duration,
        /// How long.
        hold: Duration,
    },
}

/// One scenario's shape.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Name (also in database names: lowercase, no spaces).
    pub name: &'static str,
    /// Writer processes.
    pub writers: usize,
    /// Command loops per writer.
    pub writer_loops: usize,
    /// Pause between commands of a loop, in milliseconds.
    pub pause_ms: u64,
    /// Keys.
    pub keys: usize,
    /// Partitions of the topic.
    pub partitions: i32,
    /// Relay processes.
    pub relays: usize,
    /// Relay batch size.
    pub batch: usize,
    /// Relay delivery timeout. Default 30 s (the relay's default); short
    /// only where an outage is the point, since under overload a timed-out
    /// delivery may still have been written, and is then published again.
    pub delivery_timeout: Duration,
    /// Relay `partition_stall_timeout`; `None`: the relay's default.
    pub stall_timeout: Option<Duration>,
    /// Run against librdkafka's mock cluster with this many brokers, created
    /// in the test process, instead of a tansu broker.
    pub mock_brokers: Option<i32>,
    /// Dedup-mode consumer processes (group `dedup`).
    pub dedup_consumers: usize,
    /// Inbox-mode consumer processes (group `inbox`).
    pub inbox_consumers: usize,
    /// How long the writers write.
    pub load: Duration,
    /// Percentage of commands rolled back after recording their event.
    pub rollback_percent: u32,
    /// Percentage of commands that sleep `hold_ms` inside their transaction.
    pub hold_percent: u32,
    /// See `hold_percent`.
    pub hold_ms: u32,
    /// The fault.
    pub fault: Fault,
    /// Poison messages produced to the topic during the load.
    pub poison_inbound: usize,
    /// Poison outbox rows inserted during the load.
    pub poison_outbox: usize,
    /// Make the first poison message carry NUL bytes (see
    /// [`poison::without_nul`]); the others never do.
    pub poison_nul: bool,
    /// Longest wait for convergence after the load.
    pub settle_timeout: Duration,
    /// Extra settings for every consumer process.
    pub consumer_env: Vec<(&'static str, String)>,
    /// Extra settings for every writer process.
    pub writer_env: Vec<(&'static str, String)>,
    /// The relays' `lease_timeout` (`None`: the relay's default, 10 s).
    pub relay_lease: Option<Duration>,
    /// The relays' `database_timeout` (`None`: the relay's default, 5 s).
    pub relay_database_timeout: Option<Duration>,
    /// The database of the source service (writers, outbox, relays).
    pub source: SourceBackend,
    /// The database of the receiving service (consumers, effects).
    pub receiver: ReceiverBackend,
}

impl Scenario {
    /// A small default shape: 2 writers, 2 relays, one consumer per mode,
    /// no fault; change what the scenario is about.
    pub fn new(name: &'static str, load: Duration) -> Self {
        Self {
            name,
            writers: 2,
            writer_loops: 2,
            pause_ms: 5,
            keys: 16,
            partitions: 4,
            relays: 2,
            batch: 50,
            // Overridable for runs by hand (the 5 s of the first long runs,
            // to chase the skipped record).
            delivery_timeout: env::millis(env::RELAY_TIMEOUT_OVERRIDE_MS, 30_000),
            stall_timeout: None,
            mock_brokers: None,
            dedup_consumers: 1,
            inbox_consumers: 1,
            load,
            rollback_percent: 5,
            hold_percent: 0,
            hold_ms: 200,
            fault: Fault::None,
            poison_inbound: 0,
            poison_outbox: 0,
            poison_nul: false,
            settle_timeout: Duration::from_secs(90),
            consumer_env: Vec::new(),
            writer_env: Vec::new(),
            relay_lease: None,
            relay_database_timeout: None,
            source: SourceBackend::Postgres,
            receiver: ReceiverBackend::Postgres,
        }
    }
}

/// Paths of the harness binaries. Cargo tells only integration tests where
/// they are (`env!("CARGO_BIN_EXE_faults-writer")`...), so tests pass them in.
#[derive(Debug, Clone, Copy)]
pub struct Binaries {
    /// `faults-writer`.
    pub writer: &'static str,
    /// `faults-relay`.
    pub relay: &'static str,
    /// `faults-consumer`.
    pub consumer: &'static str,
}

/// Whether the long mode is on (`OUTBOX_FAULTS=long`).
pub fn long_mode() -> bool {
    std::env::var("OUTBOX_FAULTS").is_ok_and(|v| v == "long")
}

/// The load of a scenario: 8 s in short mode, 60 s in the long mode.
pub fn load() -> Duration {
    if long_mode() {
        Duration::from_secs(60)
    } else {
        Duration::from_secs(8)
    }
}

/// A short-mode interval, doubled in the long mode.
pub fn scaled(short_ms: u64) -> Duration {
    Duration::from_millis(if long_mode() { short_ms * 2 } else { short_ms })
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64
}

fn log_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "outbox-faults-{name}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    ))
}

async fn produce_poison(brokers: &str, count: usize, nul: bool) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("message.timeout.ms", "30000")
        .create()
        .expect("poison producer");
    let mut messages: Vec<_> = (0..count)
        .map(|_| poison::without_nul(poison::poison_message(&mut rand::rng())))
        .collect();
    if nul {
        // A valid envelope of the handled type (so the inbox stores it) whose
        // key and a header value hold a NUL; its body does not fit `LedgerEntry`.
        messages[0] = poison::RawMessage {
            key: Some(b"nul\0key".to_vec()),
            value: Some(
                serde_json::json!({ "event_id": uuid::Uuid::new_v4().to_string() })
                    .to_string()
                    .into_bytes(),
            ),
            headers: vec![(b"note".to_vec(), Some(b"a\0b".to_vec()))],
        };
    }
    for (n, message) in messages.iter_mut().enumerate() {
        let tag = n.to_string().into_bytes();
        message
            .headers
            .insert(0, (POISON_HEADER.as_bytes().to_vec(), Some(tag)));
    }
    let mut pending = Vec::new();
    for message in &messages {
        let headers = message.kafka_headers();
        let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(TOPIC).headers(headers);
        if let Some(key) = &message.key {
            record = record.key(key.as_slice());
        }
        if let Some(value) = &message.value {
            record = record.payload(value.as_slice());
        }
        pending.push(producer.send(record, Duration::from_secs(30)));
    }
    for delivery in pending {
        delivery.await.expect("poison message delivered");
    }
}

/// Counts what is still to do: unpublished healthy rows, poison rows not yet
/// parked, and per group the committed events not yet applied.
async fn backlog(dbs: &Databases, groups: &[(String, bool)], poison_rows: usize) -> (i64, i64) {
    let source = dbs.source.backlog().await;
    let Ok((unpublished, parked, committed)) = source else {
        return (i64::MAX, i64::MAX);
    };
    let mut unapplied = 0;
    for (group, _) in groups {
        match dbs.receiver.applied(group).await {
            Ok(applied) => unapplied += (committed - applied).max(0),
            Err(_) => return (i64::MAX, i64::MAX),
        }
    }
    (
        unpublished + (poison_rows as i64 - parked).max(0),
        unapplied,
    )
}

async fn dlq_complete(brokers: &str, groups: &[(String, bool)], poison: usize) -> bool {
    if poison == 0 {
        return true;
    }
    let records = topic::read_all(brokers, DLQ_TOPIC).await;
    groups.iter().filter(|(_, inbox)| !inbox).all(|(group, _)| {
        records
            .iter()
            .filter(|r| r.header("dlq_consumer_group") == Some(group.as_str()))
            .filter_map(|r| r.header(POISON_HEADER))
            .collect::<std::collections::HashSet<_>>()
            .len()
            >= poison
    })
}

fn restart_postgres() {
    let versions = std::fs::read_dir("/etc/postgresql").expect("/etc/postgresql");
    let version = versions
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .max()
        .expect("a PostgreSQL version");
    let status = std::process::Command::new("pg_ctlcluster")
        .args(["--skip-systemctl-redirect", &version, "main", "restart"])
        .status()
        .expect("pg_ctlcluster");
    assert!(status.success(), "pg_ctlcluster restart failed");
}

/// Runs `scenario`, prints its figures and returns them with what it
/// expected and what it left behind.
///
/// # Panics
/// If the services are missing or the harness itself fails; invariants are
/// checked by the caller with [`Figures::assert_sound`].
pub async fn run(scenario: &Scenario, bins: &Binaries) -> (Figures, Expect, Leftovers) {
    let dbs = Databases::create(
        scenario.name,
        scenario.keys,
        scenario.source,
        scenario.receiver,
    )
    .await;
    let freeze_target = match scenario.fault {
        Fault::Freeze { target, .. } => Some(target),
        _ => None,
    };
    let mut cluster = match (scenario.mock_brokers, freeze_target) {
        (Some(count), _) => Cluster::Mock(MockBrokers::start(
            count,
            scenario.partitions,
            &["dedup", "inbox"],
        )),
        (None, Some(FreezeTarget::RelayBroker | FreezeTarget::ConsumersBroker)) => {
            Cluster::Tansu(Broker::start_behind_proxy(scenario.partitions).await)
        }
        (None, _) => Cluster::Tansu(Broker::start(scenario.partitions).await),
    };
    // Relay 0 reaches the database through a proxy of its own.
    let db_proxy = match freeze_target {
        Some(FreezeTarget::RelayDatabase) => {
            Some(Proxy::start(database_address(&dbs.source_url)).await)
        }
        _ => None,
    };
    let brokers = cluster.address();
    let load_end = Instant::now() + scenario.load;
    let until = unix_ms() + scenario.load.as_millis() as u64;
    let common = vec![
        (env::SOURCE_URL.to_owned(), dbs.source_url.clone()),
        (env::RECEIVER_URL.to_owned(), dbs.receiver_url.clone()),
        (env::BROKERS.to_owned(), brokers.clone()),
        (env::KEYS.to_owned(), scenario.keys.to_string()),
        (env::UNTIL_MS.to_owned(), until.to_string()),
        (
            env::CONCURRENCY.to_owned(),
            scenario.writer_loops.to_string(),
        ),
        (env::PAUSE_MS.to_owned(), scenario.pause_ms.to_string()),
        (
            env::ROLLBACK_PERCENT.to_owned(),
            scenario.rollback_percent.to_string(),
        ),
        (
            env::HOLD_PERCENT.to_owned(),
            scenario.hold_percent.to_string(),
        ),
        (env::HOLD_MS.to_owned(), scenario.hold_ms.to_string()),
        (env::BATCH.to_owned(), scenario.batch.to_string()),
        (
            env::DELIVERY_TIMEOUT_MS.to_owned(),
            scenario.delivery_timeout.as_millis().to_string(),
        ),
    ];
    let mut common = common;
    if let Some(stall) = scenario.stall_timeout {
        common.push((
            env::STALL_TIMEOUT_MS.to_owned(),
            stall.as_millis().to_string(),
        ));
    }
    for (name, value) in [
        (env::RELAY_LEASE_MS, scenario.relay_lease),
        (
            env::RELAY_DATABASE_TIMEOUT_MS,
            scenario.relay_database_timeout,
        ),
    ] {
        if let Some(value) = value {
            common.push((name.to_owned(), value.as_millis().to_string()));
        }
    }
    let logs = log_dir(scenario.name);
    let mut fleet = Fleet::new(logs.clone(), common);
    let crash_hook = match scenario.fault {
        Fault::KillConsumers {
            crash_after_effects,
            ..
        } => crash_after_effects,
        _ => 0,
    };
    let started_ms = unix_ms();
    let mut consumer_env: Vec<(&str, String)> = scenario.consumer_env.clone();
    consumer_env.push((env::CRASH_AFTER_EFFECTS, crash_hook.to_string()));
    match scenario.fault {
        Fault::BlockedKey { from, until } => consumer_env.extend([
            (env::BLOCKED_KEY, super::model::key_name(0)),
            (
                env::BLOCKED_FROM_MS,
                (started_ms + from.as_millis() as u64).to_string(),
            ),
            (
                env::BLOCKED_UNTIL_MS,
                (started_ms + until.as_millis() as u64).to_string(),
            ),
        ]),
        Fault::HandlerPanics { every } => consumer_env.push((env::PANIC_EVERY, every.to_string())),
        Fault::MisbehavingHandlers {
            swallow_every,
            hang_every,
            timeout,
        } => consumer_env.extend([
            (env::SWALLOW_EVERY, swallow_every.to_string()),
            (env::HANG_EVERY, hang_every.to_string()),
            (env::HANDLER_TIMEOUT_MS, timeout.as_millis().to_string()),
        ]),
        _ => {}
    }
    let mut groups = Vec::new();
    for (mode, count) in [
        ("dedup", scenario.dedup_consumers),
        ("inbox", scenario.inbox_consumers),
    ] {
        for _ in 0..count {
            let mut extra = consumer_env.clone();
            extra.extend([(env::GROUP, mode.to_owned()), (env::MODE, mode.to_owned())]);
            if mode == "inbox" && matches!(scenario.fault, Fault::RollingDeploy { .. }) {
                extra.extend([
                    (env::HANDLES, "entry".to_owned()),
                    (env::UNKNOWN, "keep".to_owned()),
                ]);
            }
            fleet.start(Role::Consumer, bins.consumer, &extra);
        }
        if count > 0 {
            groups.push((mode.to_owned(), mode == "inbox"));
        }
    }
    for n in 0..scenario.relays {
        let through_proxy = db_proxy
            .as_ref()
            .filter(|_| n == 0)
            .map(|proxy| (env::SOURCE_URL, with_port(&dbs.source_url, proxy.port())));
        fleet.start(Role::Relay, bins.relay, through_proxy.as_slice());
    }
    for _ in 0..scenario.writers {
        fleet.start(Role::Writer, bins.writer, &scenario.writer_env);
    }

    // The load, with its faults.
    let started = Instant::now();
    let mut faults = 0u32;
    let mut relay_crashes = 0u32;
    let mut last_fault = started;
    let mut next_fault = started
        + match scenario.fault {
            Fault::KillRelays { every }
            | Fault::KillConsumers { every, .. }
            | Fault::KillWriters { every } => every,
            Fault::BrokerOutage { after, .. }
            | Fault::BrokerDown { after, .. }
            | Fault::PostgresRestart { after }
            | Fault::Freeze { after, .. } => after,
            Fault::RollingDeploy { at, .. } => at,
            Fault::None
            | Fault::BlockedKey { .. }
            | Fault::HandlerPanics { .. }
            | Fault::MisbehavingHandlers { .. } => scenario.load * 2,
        };
    let mut deployed_at: Option<DateTime<Utc>> = None;
    let mut freeze: Option<Freeze> = None;
    let mut broker_lost_before: Option<DateTime<Utc>> = None;
    let mut broker_down: Option<BrokerDown> = None;
    let mut poison_done = scenario.poison_inbound == 0 && scenario.poison_outbox == 0;
    while Instant::now() < load_end {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = Instant::now();
        if !poison_done && now >= started + scenario.load / 3 {
            poison_done = true;
            poison::insert_poison_rows(&dbs.source, scenario.poison_outbox, 0).await;
            produce_poison(&brokers, scenario.poison_inbound, scenario.poison_nul).await;
        }
        let revived = fleet.revive() as u32;
        faults += revived;
        if revived > 0 {
            last_fault = now;
        }
        if let Some(freeze) = freeze.as_mut() {
            freeze.observe(dbs.source.postgres()).await;
        }
        if now < next_fault {
            continue;
        }
        match scenario.fault {
            Fault::None
            | Fault::BlockedKey { .. }
            | Fault::HandlerPanics { .. }
            | Fault::MisbehavingHandlers { .. } => {}
            Fault::RollingDeploy { gap, .. } => {
                let consumers = fleet.of(Role::Consumer);
                let (old, new): (Vec<usize>, Vec<usize>) = consumers
                    .into_iter()
                    .filter(|&i| fleet.members[i].has_env(env::GROUP, "inbox"))
                    .partition(|&i| fleet.members[i].has_env(env::HANDLES, "entry"));
                if deployed_at.is_none()
                    && !old
                        .iter()
                        .all(|&i| fleet.members[i].log_contains("partitions assigned"))
                {
                    // The old version is not running yet: deploy once it is.
                    next_fault = now + Duration::from_millis(100);
                } else if deployed_at.is_none() {
                    // The new version starts beside the old one.
                    deployed_at = Some(Utc::now());
                    for _ in 0..old.len() {
                        let mut extra = consumer_env.clone();
                        extra.extend([
                            (env::GROUP, "inbox".to_owned()),
                            (env::MODE, "inbox".to_owned()),
                            (env::HANDLES, "entry,note".to_owned()),
                            (env::UNKNOWN, "keep".to_owned()),
                        ]);
                        fleet.start(Role::Consumer, bins.consumer, &extra);
                    }
                    next_fault = now + gap;
                } else if !new
                    .iter()
                    .all(|&i| fleet.members[i].log_contains("partitions assigned"))
                {
                    // As an orchestrator waits for readiness: the new
                    // version takes part before the old one goes.
                    next_fault = now + Duration::from_millis(100);
                } else if let Some(&i) = old.iter().find(|&&i| fleet.members[i].alive()) {
                    // SIGKILL, not SIGTERM: tansu 0.6 leaves a group stuck
                    // for good when its leader leaves it gracefully during a
                    // rebalance (it keeps naming the departed member as the
                    // leader; RELIABILITY.md). A kill is the harder case for
                    // the framework anyway: the old version's work in flight
                    // is abandoned.
                    fleet.members[i].retire(None);
                    faults += 1;
                    last_fault = Instant::now();
                    next_fault = last_fault + gap;
                } else {
                    next_fault = load_end + scenario.load * 2;
                }
            }
            Fault::KillRelays { every } => {
                let i = *fleet
                    .of(Role::Relay)
                    .choose(&mut rand::rng())
                    .expect("relays");
                fleet.members[i].restart();
                (faults, relay_crashes, last_fault, next_fault) =
                    (faults + 1, relay_crashes + 1, now, now + every);
            }
            Fault::KillConsumers { every, .. } => {
                let i = *fleet
                    .of(Role::Consumer)
                    .choose(&mut rand::rng())
                    .expect("consumers");
                fleet.members[i].restart();
                (faults, last_fault, next_fault) = (faults + 1, now, now + every);
            }
            Fault::KillWriters { every } => {
                let i = *fleet
                    .of(Role::Writer)
                    .choose(&mut rand::rng())
                    .expect("writers");
                if fleet.members[i].alive() {
                    fleet.members[i].restart();
                    faults += 1;
                }
                (last_fault, next_fault) = (now, now + every);
            }
            Fault::BrokerOutage { outage, .. } => {
                let Cluster::Tansu(broker) = &mut cluster else {
                    panic!("a broker restart needs the tansu broker");
                };
                broker.stop();
                tokio::time::sleep(outage).await;
                // Rows marked published from here on were acknowledged by
                // the restarted broker. Not from the stop: a row the old
                // broker acknowledged just before it is marked a moment
                // later (its batch settled without its late rows after
                // `partition_stall_timeout`, 2 s, shorter than the outage).
                broker_lost_before = Some(Utc::now());
                broker.restart().await;
                (faults, last_fault) = (faults + 1, Instant::now());
                next_fault = load_end + scenario.load * 2;
            }
            Fault::BrokerDown { outage, .. } => {
                let Cluster::Mock(mock) = &cluster else {
                    panic!("taking one broker down needs the mock cluster (mock_brokers)");
                };
                let id = mock.brokers();
                let (down_at, down_at_instant) = (Utc::now(), Instant::now());
                mock.down(id);
                tokio::time::sleep(outage).await;
                mock.up(id);
                broker_down = Some(BrokerDown {
                    broker: id,
                    partitions: mock.led_by(id, scenario.partitions),
                    down_at,
                    up_at: Utc::now(),
                    before_down: down_at_instant.saturating_duration_since(started),
                });
                (faults, last_fault) = (faults + 1, Instant::now());
                next_fault = load_end + scenario.load * 2;
            }
            Fault::PostgresRestart { .. } => {
                tokio::task::spawn_blocking(restart_postgres)
                    .await
                    .expect("restart");
                (faults, last_fault) = (faults + 1, Instant::now());
                next_fault = load_end + scenario.load * 2;
            }
            Fault::Freeze { target, hold, .. } => match freeze.as_mut() {
                None => {
                    let Some(pids) = freeze_pids(&fleet, target, &logs) else {
                        // No consumer of some group has partitions yet.
                        next_fault = now + Duration::from_millis(200);
                        continue;
                    };
                    freeze = Some(
                        Freeze::begin(
                            target,
                            dbs.source.postgres(),
                            db_proxy.as_ref(),
                            cluster.proxy(),
                            &pids,
                        )
                        .await,
                    );
                    faults += 1;
                    if target != FreezeTarget::ConsumersBroker {
                        // The frozen relay's batches in flight may be
                        // published again by the lanes' next owner.
                        relay_crashes += 2;
                    }
                    next_fault = now + hold;
                }
                Some(freeze) => {
                    freeze.thaw(db_proxy.as_ref(), cluster.proxy());
                    (last_fault, next_fault) = (now, load_end + scenario.load * 2);
                }
            },
        }
    }
    if let Some(freeze) = freeze.as_mut().filter(|f| !f.thawed()) {
        freeze.thaw(db_proxy.as_ref(), cluster.proxy());
        last_fault = Instant::now();
    }

    // Faults stop; the crash hook is switched off (one last restart each).
    if crash_hook > 0 {
        for i in fleet.of(Role::Consumer) {
            fleet.members[i].set_env(env::CRASH_AFTER_EFFECTS, "0");
            fleet.members[i].restart();
            faults += 1;
        }
        last_fault = Instant::now();
    }
    for i in fleet.of(Role::Writer) {
        let member = &mut fleet.members[i];
        let name = member.name.clone();
        assert!(
            member.wait(Duration::from_secs(30)),
            "writer {name} did not stop"
        );
    }
    faults += fleet.revive() as u32;
    let calm = last_fault.max(load_end);

    // Convergence.
    let deadline = Instant::now() + scenario.settle_timeout;
    let mut stable_since: Option<(Instant, i64)> = None;
    let converged_at = loop {
        let now = Instant::now();
        if now > deadline {
            break None;
        }
        faults += fleet.revive() as u32;
        if let Some(freeze) = freeze.as_mut() {
            freeze.observe(dbs.source.postgres()).await;
        }
        let (unpublished, unapplied) = backlog(&dbs, &groups, scenario.poison_outbox).await;
        let done = if broker_lost_before.is_some() {
            // Some events died with the broker's memory: wait until nothing
            // moves any more instead of for a count.
            match stable_since {
                Some((since, seen)) if seen == unapplied && unpublished == 0 => {
                    now - since > Duration::from_secs(3)
                }
                _ => {
                    stable_since = Some((now, unapplied));
                    false
                }
            }
        } else {
            unpublished == 0 && unapplied == 0
        };
        if done && dlq_complete(&brokers, &groups, scenario.poison_inbound).await {
            break Some(match stable_since {
                Some((since, _)) if broker_lost_before.is_some() => since,
                _ => now,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    fleet.stop_all(Duration::from_secs(10));

    let records = topic::read_all(&brokers, TOPIC).await;
    let dlq = topic::read_all(&brokers, DLQ_TOPIC).await;
    let expect = Expect {
        groups,
        poison_inbound: scenario.poison_inbound,
        poison_outbox: scenario.poison_outbox,
        broker_lost_before,
    };
    let mut figures = checker::check(&dbs.source, &dbs.receiver, &records, &dlq, &expect).await;
    let fleet = fleet;
    figures.scenario = scenario.name.to_owned();
    figures.faults = faults;
    figures.recovery = converged_at.map_or(scenario.settle_timeout, |at| {
        at.saturating_duration_since(calm)
    });
    // A broker taken down may have written a batch whose acknowledgement
    // it never sent: that batch may be published again.
    figures.crashes = relay_crashes
        + u32::from(broker_lost_before.is_some())
        + u32::from(broker_down.is_some())
        + u32::from(matches!(scenario.fault, Fault::PostgresRestart { .. }));
    figures.converged = converged_at.is_some();
    figures.consumer_offset_gaps = count_log_lines(&logs, "consumer", "offset gap");
    figures.consumer_gaps_recovered =
        count_log_lines(&logs, "consumer", "the re-read found the offsets");
    figures.consumer_rebalances = count_log_lines(&logs, "consumer", "partitions assigned");
    figures.consumer_restarts = fleet
        .of(Role::Consumer)
        .iter()
        .map(|&i| fleet.members[i].starts().saturating_sub(1))
        .sum();
    match scenario.fault {
        Fault::BlockedKey { from, until } => {
            let window = (
                started_ms + from.as_millis() as u64,
                started_ms + until.as_millis() as u64,
            );
            for (group, inbox) in &expect.groups {
                liveness::blocked_key(
                    &dbs,
                    group,
                    *inbox,
                    started_ms,
                    window,
                    &records,
                    &mut figures,
                )
                .await;
            }
        }
        Fault::HandlerPanics { .. } => {
            figures.handler_panics =
                count_log_lines(&logs, "consumer", "fault injection: a handler bug");
            figures.notes.push(format!(
                "handler panics caught: {}; consumer processes restarted: {}",
                figures.handler_panics, figures.consumer_restarts
            ));
        }
        Fault::MisbehavingHandlers { .. } => {
            figures.swallowed_errors =
                count_log_lines(&logs, "consumer", "fault injection: a handler swallowed");
            figures.hung_calls = count_log_lines(
                &logs,
                "consumer",
                "fault injection: a handler that never returns",
            );
            figures.notes.push(format!(
                "swallowed database errors: {} (charged: {}); calls that never returned: {} \
                 (abandoned: {}); consumer processes restarted: {}",
                figures.swallowed_errors,
                count_log_lines(&logs, "consumer", "returned Ok, but"),
                figures.hung_calls,
                count_log_lines(&logs, "consumer", "did not return within"),
                figures.consumer_restarts
            ));
        }
        Fault::KillConsumers {
            crash_after_effects,
            ..
        } if crash_after_effects > 0 => {
            figures.consumer_crash_hook_kills = count_log_lines(&logs, "consumer", "crash hook:");
            figures.notes.push(format!(
                "consumers killed by the crash hook (after {crash_after_effects} effects \
                 committed, before any offset commit): {}; consumer processes started again: {}",
                figures.consumer_crash_hook_kills, figures.consumer_restarts
            ));
        }
        Fault::RollingDeploy { .. } => {
            if let Some(at) = deployed_at {
                liveness::rolling_deploy(&dbs, at, &mut figures).await;
            }
        }
        _ => {}
    }
    if let Some(down) = &broker_down {
        figures.outage = Some(down.figures(dbs.source.postgres(), &records).await);
    }
    if let Some(freeze) = &freeze {
        figures.liveness = freeze
            .figures(
                dbs.source.postgres(),
                dbs.receiver.postgres(),
                &expect.groups,
            )
            .await;
    }
    println!(
        "{figures}[faults] {}: logs in {}",
        scenario.name,
        logs.display()
    );
    drop(cluster);
    (figures, expect, Leftovers { dbs, logs })
}

/// When one broker of the mock cluster was down, and what it leads.
struct BrokerDown {
    broker: i32,
    partitions: Vec<i32>,
    down_at: DateTime<Utc>,
    up_at: DateTime<Utc>,
    /// How long the load had run when the broker went down.
    before_down: Duration,
}

impl BrokerDown {
    /// What was published while the broker was down, from the source
    /// database and the partitions the topic shows each event in.
    async fn figures(&self, source: &sqlx::PgPool, records: &[topic::Record]) -> OutageFigures {
        let partition_of: std::collections::HashMap<uuid::Uuid, i32> = records
            .iter()
            .filter_map(|r| Some((r.event_id()?, r.partition)))
            .collect();
        let rows: Vec<(uuid::Uuid, DateTime<Utc>, Option<DateTime<Utc>>)> =
            sqlx::query_as("SELECT event_id, created_at, published_at FROM outbox_event")
                .fetch_all(source)
                .await
                .expect("read outbox");
        let down_for = (self.up_at - self.down_at).to_std().unwrap_or_default();
        // The same length of time before, as far as the load goes back.
        let before_len = down_for.min(self.before_down);
        let before_from = self.down_at - chrono::Duration::from_std(before_len).unwrap_or_default();
        let on_down = |id: &uuid::Uuid| {
            partition_of
                .get(id)
                .is_some_and(|p| self.partitions.contains(p))
        };
        let healthy = || rows.iter().filter(|(id, ..)| !on_down(id));
        let published_in = |from, to| {
            healthy()
                .filter(|(_, _, at)| at.is_some_and(|at| at >= from && at < to))
                .count()
        };
        let median_latency_ms = |from, to| {
            let mut latencies: Vec<f64> = healthy()
                .filter(|(_, created, _)| *created >= from && *created < to)
                .filter_map(|(_, created, at)| Some(((*at)? - *created).as_seconds_f64() * 1000.0))
                .collect();
            latencies.sort_by(f64::total_cmp);
            latencies
                .get(latencies.len() / 2)
                .copied()
                .unwrap_or(f64::NAN)
        };
        let healthy_published = published_in(self.down_at, self.up_at);
        OutageFigures {
            broker: self.broker,
            partitions: self.partitions.clone(),
            down_for,
            healthy_published,
            healthy_rate: healthy_published as f64 / down_for.as_secs_f64().max(0.001),
            healthy_rate_before: published_in(before_from, self.down_at) as f64
                / before_len.as_secs_f64().max(0.001),
            healthy_latency_ms: (
                median_latency_ms(self.down_at, self.up_at),
                median_latency_ms(before_from, self.down_at),
            ),
            // From its first second on: a delivery acknowledged just before
            // the broker went down is marked a moment later.
            down_published: rows
                .iter()
                .filter(|(id, _, at)| {
                    let from = self.down_at + chrono::Duration::seconds(1);
                    on_down(id) && at.is_some_and(|at| at >= from && at < self.up_at)
                })
                .count(),
        }
    }
}

/// The processes a freeze targets: relay 0, or in each group the first
/// consumer that was assigned partitions (`None` while a group has none).
fn freeze_pids(fleet: &Fleet, target: FreezeTarget, logs: &std::path::Path) -> Option<Vec<u32>> {
    let chosen: Vec<usize> = match target {
        FreezeTarget::RelayDatabase | FreezeTarget::RelayBroker => {
            fleet.of(Role::Relay).into_iter().take(1).collect()
        }
        FreezeTarget::ConsumersBroker => {
            let consumers = fleet.of(Role::Consumer);
            let groups: std::collections::BTreeSet<Option<&str>> = consumers
                .iter()
                .map(|&i| fleet.members[i].group())
                .collect();
            let mut chosen = Vec::new();
            for group in groups {
                let first = consumers.iter().copied().find(|&i| {
                    fleet.members[i].group() == group
                        && count_log_lines(
                            logs,
                            &format!("{}.", fleet.members[i].name),
                            "partitions assigned",
                        ) > 0
                })?;
                chosen.push(first);
            }
            chosen
        }
    };
    Some(
        chosen
            .into_iter()
            .filter_map(|i| fleet.members[i].pid())
            .collect(),
    )
}

/// `host:port` of a database URL (`postgres://user@host:port/db`).
fn database_address(url: &str) -> std::net::SocketAddr {
    use std::net::ToSocketAddrs;
    let authority = authority(url);
    let host_port = authority.rsplit('@').next().unwrap_or(authority);
    let host_port = if host_port.contains(':') {
        host_port.to_owned()
    } else {
        format!("{host_port}:5432")
    };
    host_port
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.find(std::net::SocketAddr::is_ipv4))
        .expect("a database URL with a TCP host")
}

fn authority(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.split('/').next().unwrap_or(rest)
}

/// The URL with its host and port replaced by 127.0.0.1:`port`.
fn with_port(url: &str, port: u16) -> String {
    let authority = authority(url);
    let replaced = match authority.rsplit_once('@') {
        Some((user, _)) => format!("{user}@127.0.0.1:{port}"),
        None => format!("127.0.0.1:{port}"),
    };
    url.replacen(authority, &replaced, 1)
}

/// Lines containing `needle` in the logs of the processes whose name starts
/// with `process` (e.g. every consumer's `offset gap` lines).
fn count_log_lines(logs: &std::path::Path, process: &str, needle: &str) -> usize {
    let Ok(entries) = std::fs::read_dir(logs) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with(process))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .map(|text| text.lines().filter(|l| l.contains(needle)).count())
        .sum()
}

/// The databases and process logs of a finished scenario: kept for a look
/// when it failed, removed by [`Leftovers::remove`] when it passed.
#[derive(Debug)]
pub struct Leftovers {
    dbs: Databases,
    logs: PathBuf,
}

impl Leftovers {
    /// Drops the databases and deletes the logs.
    pub async fn remove(self) {
        self.dbs.drop_all().await;
        let _ = std::fs::remove_dir_all(&self.logs);
    }
}

/// Runs `scenario`, asserts every invariant ([`Figures::assert_sound`]) and
/// cleans up; on failure the databases and logs are left for inspection.
pub async fn run_and_check(scenario: &Scenario, bins: &Binaries) -> Figures {
    run_and_check_with(scenario, bins, |_| {}).await
}

/// Like [`run_and_check`], with the scenario's own checks (e.g. liveness
/// bounds) run before the clean-up, so that a failure keeps the logs.
pub async fn run_and_check_with(
    scenario: &Scenario,
    bins: &Binaries,
    checks: impl FnOnce(&Figures),
) -> Figures {
    let (figures, expect, leftovers) = run(scenario, bins).await;
    figures.assert_sound(&expect, scenario.batch);
    checks(&figures);
    if std::env::var_os(env::KEEP).is_none() {
        leftovers.remove().await;
    }
    figures
}
