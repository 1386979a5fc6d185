//! Running the saga scenario: two databases, a broker, the services as
//! processes, sagas started over the load period while processes are killed
//! and the broker is cut off, then convergence and the checker.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

use rand::Rng;
use rand::seq::IndexedRandom;
use sqlx::PgPool;
use txoutbox_testkit::broker::{create_topics, free_port, spawn_tansu, wait_listening_async};
use txoutbox_testkit::db::{connect, create_database, drop_databases, url_of};
use uuid::Uuid;

use super::checker::{self, SagaFigures, Topics};
use super::model::{
    self, Behaviour, CHARGE_LIMIT, DLQ_TOPICS, PARTICIPANT_GROUP, PARTICIPANT_TOPIC, SAGA_GROUP,
    SAGA_TOPIC,
};
use crate::faults::env;
use crate::faults::fleet::{Fleet, Role};
use crate::faults::proxy::Proxy;
use crate::faults::topic;

/// The saga scenario's shape.
#[derive(Debug, Clone)]
pub struct SagaScenario {
    /// Name (also in database names: lowercase, no spaces).
    pub name: &'static str,
    /// Saga service processes.
    pub saga_hosts: usize,
    /// Participant processes.
    pub participants: usize,
    /// Partitions of each topic.
    pub partitions: i32,
    /// How long sagas are started.
    pub load: Duration,
    /// Sagas started per second.
    pub rate: u32,
    /// `kill -9` of a random service process (saga host or participant,
    /// alternately) this often, restarted at once.
    pub kill_every: Duration,
    /// The broker outage: when into the load, how long.
    pub outage: (Duration, Duration),
    /// The first saga host and the first participant kill themselves each
    /// time their group handled this many messages since they started,
    /// their offsets never committed (0: never); see `faults-saga`.
    pub crash_after: u32,
    /// Longest wait for convergence after the load.
    pub settle_timeout: Duration,
}

impl SagaScenario {
    /// The short mode's shape (well under 90 s on a small machine).
    pub fn short(name: &'static str) -> Self {
        Self {
            name,
            saga_hosts: 2,
            participants: 2,
            partitions: 4,
            load: Duration::from_secs(20),
            rate: 20,
            kill_every: Duration::from_secs(3),
            outage: (Duration::from_secs(8), Duration::from_secs(4)),
            crash_after: 150,
            settle_timeout: Duration::from_secs(60),
        }
    }

    /// The long mode's shape.
    pub fn long(name: &'static str) -> Self {
        Self {
            load: Duration::from_secs(90),
            rate: 20,
            kill_every: Duration::from_secs(6),
            outage: (Duration::from_secs(40), Duration::from_secs(10)),
            crash_after: 300,
            settle_timeout: Duration::from_secs(180),
            ..Self::short(name)
        }
    }
}

/// The broker of the scenario: tansu (memory storage), reached only through
/// a proxy whose address it advertises. An outage drops the proxy: every
/// connection is closed and new ones are refused, as when the broker
/// process is down; bringing it back starts the proxy again on the same
/// port, with the broker's log intact, as a Kafka broker restarts with its
/// disk. (Restarting tansu itself would lose every record: memory storage.)
#[derive(Debug)]
pub struct CutBroker {
    tansu: Child,
    tansu_port: u16,
    port: u16,
    proxy: Option<Proxy>,
}

impl CutBroker {
    /// Starts the broker and creates the topics.
    pub async fn start(partitions: i32) -> Self {
        let (tansu_port, port) = (free_port(), free_port());
        let target: SocketAddr = ([127, 0, 0, 1], tansu_port).into();
        let proxy = Proxy::start_on(port, target).await;
        let tansu = spawn_tansu(tansu_port, &format!("127.0.0.1:{port}"));
        wait_listening_async(tansu_port).await;
        let broker = Self {
            tansu,
            tansu_port,
            port,
            proxy: Some(proxy),
        };
        let mut topics = vec![(SAGA_TOPIC, partitions), (PARTICIPANT_TOPIC, partitions)];
        topics.extend(DLQ_TOPICS.iter().map(|t| (*t, 1)));
        create_topics(&broker.address(), &topics).await;
        broker
    }

    /// `bootstrap.servers`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The outage begins: every connection closed, new ones refused.
    pub fn cut(&mut self) {
        self.proxy = None;
    }

    /// The broker is back.
    pub async fn restore(&mut self) {
        let target: SocketAddr = ([127, 0, 0, 1], self.tansu_port).into();
        self.proxy = Some(Proxy::start_on(self.port, target).await);
    }
}

impl Drop for CutBroker {
    fn drop(&mut self) {
        let _ = self.tansu.kill();
        let _ = self.tansu.wait();
    }
}

/// The two services' databases.
#[derive(Debug)]
pub struct ServiceDatabases {
    names: [String; 2],
    /// The saga service's database URL.
    pub saga_url: String,
    /// The participant's database URL.
    pub participant_url: String,
    /// A pool on the saga service's database.
    pub saga: PgPool,
    /// A pool on the participant's database.
    pub participant: PgPool,
}

impl ServiceDatabases {
    /// Creates `faults_<scenario>_<id>_{saga,part}` with their tables.
    pub async fn create(scenario: &str) -> Self {
        let id = &Uuid::new_v4().simple().to_string()[..8];
        let names = [
            format!("faults_{scenario}_{id}_saga"),
            format!("faults_{scenario}_{id}_part"),
        ];
        for name in &names {
            create_database(name).await;
        }
        let saga = connect(&names[0], 4).await;
        let participant = connect(&names[1], 4).await;
        model::migrate_saga_service(&saga)
            .await
            .expect("migrate the saga service's database");
        model::migrate_participant(&participant)
            .await
            .expect("migrate the participant's database");
        Self {
            saga_url: url_of(&names[0]),
            participant_url: url_of(&names[1]),
            names,
            saga,
            participant,
        }
    }

    /// Drops both (after every process using them stopped).
    pub async fn drop_all(self) {
        self.saga.close().await;
        self.participant.close().await;
        let _ = drop_databases(&self.names).await;
    }
}

/// A random saga: mostly normal (a fifth of them over the charge limit),
/// some rejected, silent or late.
fn random_saga(rng: &mut impl Rng) -> (i64, Behaviour) {
    let behaviour = match rng.random_range(0..100) {
        0..10 => Behaviour::Reject,
        10..20 => Behaviour::Silent,
        20..30 => Behaviour::Late,
        _ => Behaviour::Normal,
    };
    let amount = if rng.random_range(0..5) == 0 {
        rng.random_range(CHARGE_LIMIT + 1..=2 * CHARGE_LIMIT)
    } else {
        rng.random_range(1..=CHARGE_LIMIT)
    };
    (amount, behaviour)
}

/// Whether everything sent was handled and every saga ended: nothing
/// unpublished, nothing scheduled, no message missing from its consumer's
/// dedup table, no saga running.
async fn converged(dbs: &ServiceDatabases) -> bool {
    let open: Result<i64, _> = sqlx::query_scalar(
        "SELECT count(*) FROM saga_request r
         WHERE NOT EXISTS (SELECT 1 FROM saga_state s
                           WHERE s.saga_type = $1 AND s.saga_id = r.saga_id::text
                             AND s.finished_at IS NOT NULL)",
    )
    .bind(model::SAGA_NAME)
    .fetch_one(&dbs.saga)
    .await;
    if !matches!(open, Ok(0)) {
        return false;
    }
    for pool in [&dbs.saga, &dbs.participant] {
        let unpublished: Result<i64, _> = sqlx::query_scalar(
            "SELECT count(*) FROM outbox_event WHERE published_at IS NULL AND parked_at IS NULL",
        )
        .fetch_one(pool)
        .await;
        if !matches!(unpublished, Ok(0)) {
            return false;
        }
    }
    checker::scheduled_left(&dbs.saga).await == 0
        && checker::lost(&dbs.saga, &dbs.participant).await == 0
}

/// Runs the scenario and returns its figures (checked by the caller), the
/// databases and the log directory.
///
/// # Panics
/// If the services are missing or the harness itself fails.
pub async fn run(
    scenario: &SagaScenario,
    binary: &str,
) -> (SagaFigures, ServiceDatabases, PathBuf) {
    let started = Instant::now();
    let dbs = ServiceDatabases::create(scenario.name).await;
    let mut broker = CutBroker::start(scenario.partitions).await;
    let brokers = broker.address();
    let logs = std::env::temp_dir().join(format!(
        "outbox-faults-{}-{}",
        scenario.name,
        &Uuid::new_v4().simple().to_string()[..8]
    ));
    let mut fleet = Fleet::new(
        logs.clone(),
        vec![(env::BROKERS.to_owned(), brokers.clone())],
    );
    let services = [
        (
            Role::SagaHost,
            scenario.saga_hosts,
            "saga",
            &dbs.saga_url,
            SAGA_GROUP,
        ),
        (
            Role::Participant,
            scenario.participants,
            "participant",
            &dbs.participant_url,
            PARTICIPANT_GROUP,
        ),
    ];
    for (role, count, name, url, group) in services {
        for n in 0..count {
            let crash_after = if n == 0 { scenario.crash_after } else { 0 };
            fleet.start(
                role,
                binary,
                &[
                    (super::ROLE, name.to_owned()),
                    (env::SOURCE_URL, url.clone()),
                    (env::GROUP, group.to_owned()),
                    (env::CRASH_AFTER_EFFECTS, crash_after.to_string()),
                ],
            );
        }
    }

    let mut figures = SagaFigures {
        scenario: scenario.name.to_owned(),
        ..SagaFigures::default()
    };
    // The sagas are started by a task of their own, at a steady rate.
    let load_start = Instant::now();
    let load_end = load_start + scenario.load;
    let starter = {
        let pool = dbs.saga.clone();
        let every = Duration::from_secs(1) / scenario.rate.max(1);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            let mut count = 0usize;
            while Instant::now() < load_end {
                tick.tick().await;
                let (amount, behaviour) = random_saga(&mut rand::rng());
                model::begin(&pool, Uuid::new_v4(), amount, behaviour)
                    .await
                    .expect("start a saga");
                count += 1;
            }
            count
        })
    };

    // Faults while the sagas start: a kill every `kill_every` (saga hosts
    // and participants in turn), one broker outage.
    let (outage_at, outage_for) = scenario.outage;
    let mut outage_done = false;
    let mut next_kill = load_start + scenario.kill_every;
    let mut kill_saga_host = true;
    while Instant::now() < load_end {
        let now = Instant::now();
        if !outage_done && now >= load_start + outage_at {
            broker.cut();
            tokio::time::sleep(outage_for).await;
            broker.restore().await;
            figures.outages += 1;
            outage_done = true;
            next_kill = Instant::now() + scenario.kill_every;
        } else if now >= next_kill {
            let role = if kill_saga_host {
                Role::SagaHost
            } else {
                Role::Participant
            };
            let i = *fleet.of(role).choose(&mut rand::rng()).expect("members");
            fleet.members[i].restart();
            if kill_saga_host {
                figures.saga_host_kills += 1;
            } else {
                figures.participant_kills += 1;
            }
            kill_saga_host = !kill_saga_host;
            next_kill = now + scenario.kill_every;
        }
        fleet.revive();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let begun = starter.await.expect("saga starter");
    let finished_under_faults: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM saga_state WHERE saga_type = $1 AND finished_at IS NOT NULL",
    )
    .bind(model::SAGA_NAME)
    .fetch_one(&dbs.saga)
    .await
    .expect("count the sagas ended");
    figures.finished_under_faults = finished_under_faults as usize;
    // Faults stop: the crash hooks are switched off (one last restart each).
    fleet.revive();
    let restarts: u32 = fleet.members.iter().map(|m| m.starts() - 1).sum();
    figures.crashes = restarts - figures.saga_host_kills - figures.participant_kills;
    if scenario.crash_after > 0 {
        for role in [Role::SagaHost, Role::Participant] {
            let first = fleet.of(role)[0];
            fleet.members[first].set_env(env::CRASH_AFTER_EFFECTS, "0");
            fleet.members[first].restart();
        }
    }
    let calm = Instant::now();

    let deadline = calm + scenario.settle_timeout;
    while Instant::now() < deadline {
        fleet.revive();
        if converged(&dbs).await {
            figures.converged_after = Some(calm.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    fleet.stop_all(Duration::from_secs(10));

    let mut topics = Topics::default();
    for name in [SAGA_TOPIC, PARTICIPANT_TOPIC] {
        topics.records.extend(topic::read_all(&brokers, name).await);
    }
    for name in DLQ_TOPICS {
        topics.dead_lettered += topic::read_all(&brokers, name).await.len();
    }
    let checked = checker::check(&dbs.saga, &dbs.participant, &topics).await;
    assert_eq!(
        checked.sagas, begun,
        "every saga started is in saga_request"
    );
    figures = SagaFigures {
        scenario: figures.scenario,
        saga_host_kills: figures.saga_host_kills,
        participant_kills: figures.participant_kills,
        outages: figures.outages,
        crashes: figures.crashes,
        finished_under_faults: figures.finished_under_faults,
        converged_after: figures.converged_after,
        elapsed: started.elapsed(),
        ..checked
    };
    drop(fleet);
    (figures, dbs, logs)
}

/// Runs the scenario, prints its figures, asserts every invariant and
/// cleans up; on failure the databases and logs are left for inspection.
///
/// # Panics
/// If an invariant failed.
pub async fn run_and_check(scenario: &SagaScenario, binary: &str) -> SagaFigures {
    let (figures, dbs, logs) = run(scenario, binary).await;
    figures.print();
    let failures = figures.failures();
    if failures.is_empty() && std::env::var_os(env::KEEP).is_none() {
        dbs.drop_all().await;
        let _ = std::fs::remove_dir_all(&logs);
    } else {
        println!(
            "[faults] {}: kept the logs in {} and the databases {}, {}",
            scenario.name,
            logs.display(),
            dbs.saga_url,
            dbs.participant_url
        );
    }
    figures.assert_sound();
    figures
}
