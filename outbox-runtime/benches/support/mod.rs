//! What the runtime's benches share: a scratch database of their own (made
//! by `txoutbox-testkit`), with the outbox migrations applied, a backlog of
//! unpublished events, and settings from the environment.
#![allow(dead_code)] // each bench uses some of it

use sqlx::PgPool;
use txoutbox_testkit::db::{ScratchDatabase, drop_databases};

/// A pool of connections to a database on `DATABASE_URL`'s server (for a
/// bench that reconnects after changing the database's settings).
#[allow(unused_imports)] // not every bench reconnects
pub(crate) use txoutbox_testkit::db::connect;

/// Creates a database named `<prefix>_<random>` next to `DATABASE_URL`'s,
/// with the outbox migrations applied; returns a pool of `connections` and
/// its name (for [`drop_database`]).
pub(crate) async fn scratch_database(prefix: &str, connections: u32) -> (PgPool, String) {
    let database = ScratchDatabase::create(prefix, connections).await;
    txoutbox_runtime::migrations::run(&database.pool)
        .await
        .unwrap();
    (database.pool, database.name)
}

/// Drops a database made by [`scratch_database`] (failures ignored).
pub(crate) async fn drop_database(name: &str) {
    let _ = drop_databases(&[name]).await;
}

/// `name` from the environment as a number, else `default`.
pub(crate) fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Inserts `n` unpublished events of `topic` in one statement (about 250
/// bytes of JSON each, `OrderCreated` of order `order-{g % keys}`), then
/// vacuums and analyzes the table, as a relay's backlog.
pub(crate) async fn outbox_backlog(pool: &PgPool, topic: &str, n: usize, keys: usize) {
    sqlx::query(
        "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type, payload,
                                   topic, partition_key)
         SELECT id, 'Order', k, 'OrderCreated',
                jsonb_build_object('event_id', id, 'order_id', k, 'amount', g,
                                   'currency', 'EUR', 'note', repeat('x', 140)),
                $2, k
         FROM (SELECT gen_random_uuid() AS id, 'order-' || (g % $3) AS k, g
               FROM generate_series(1, $1) AS g) s",
    )
    .bind(n as i64)
    .bind(topic)
    .bind(keys as i64)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("VACUUM ANALYZE outbox_event")
        .execute(pool)
        .await
        .unwrap();
}

/// `(min, median, max)` of `values` (not empty), for the figures of rounds.
pub(crate) fn spread(values: &[f64]) -> (f64, f64, f64) {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    (
        sorted[0],
        sorted[sorted.len() / 2],
        sorted[sorted.len() - 1],
    )
}

/// CPU time spent so far, in seconds, by the parts of a bench's machine:
/// read from `/proc` (Linux; elsewhere every figure is zero).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CpuTimes {
    /// This process: the bench's services (relays, consumers, writers).
    pub(crate) bench: f64,
    /// Every `postgres` process, plus what the server's exited children
    /// spent (the postmaster's reaped time).
    pub(crate) postgres: f64,
    /// The broker process the bench started, if any.
    pub(crate) broker: f64,
    /// The whole machine, busy (everything but idle, I/O wait and time
    /// stolen by the hypervisor).
    pub(crate) machine_busy: f64,
    /// The whole machine, every state: `machine_busy` over it is the
    /// machine's load in the interval.
    pub(crate) machine_total: f64,
}

impl CpuTimes {
    /// Reads the counters now; `broker` is the broker's process id.
    pub(crate) fn now(broker: Option<u32>) -> Self {
        let tick = CLOCK_TICKS_PER_SECOND;
        let mut postgres = 0.0;
        if let Ok(entries) = std::fs::read_dir("/proc") {
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(pid) = name
                    .to_str()
                    .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
                else {
                    continue;
                };
                // The postmaster reaps the backends, so its children's
                // time holds the exited ones'.
                if let Some((comm, [utime, stime, cutime, cstime])) = process_times(pid)
                    && comm == "postgres"
                {
                    postgres += utime + stime + cutime + cstime;
                }
            }
        }
        let own =
            |pid: &str| process_times(pid).map_or(0.0, |(_, [utime, stime, ..])| utime + stime);
        let (machine_busy, machine_total) = machine_times();
        Self {
            bench: own("self") / tick,
            postgres: postgres / tick,
            broker: broker.map_or(0.0, |pid| own(&pid.to_string())) / tick,
            machine_busy: machine_busy / tick,
            machine_total: machine_total / tick,
        }
    }

    /// What was spent from `earlier` to `self`.
    pub(crate) fn since(&self, earlier: &Self) -> Self {
        Self {
            bench: self.bench - earlier.bench,
            postgres: self.postgres - earlier.postgres,
            broker: self.broker - earlier.broker,
            machine_busy: self.machine_busy - earlier.machine_busy,
            machine_total: self.machine_total - earlier.machine_total,
        }
    }
}

/// `USER_HZ`: the unit of `/proc`'s times, 100 on every Linux architecture
/// the project builds for.
const CLOCK_TICKS_PER_SECOND: f64 = 100.0;

/// A process's command name and `[utime, stime, cutime, cstime]` in clock
/// ticks, from `/proc/<pid>/stat`.
fn process_times(pid: &str) -> Option<(String, [f64; 4])> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat[open + 1..close].to_owned();
    // After the command name: state is field 3, utime field 14.
    let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<f64>().ok());
    Some((comm, [field(14)?, field(15)?, field(16)?, field(17)?]))
}

/// The machine's busy and total clock ticks, from `/proc/stat`'s `cpu` line.
fn machine_times() -> (f64, f64) {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
        return (0.0, 0.0);
    };
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return (0.0, 0.0);
    };
    // user nice system idle iowait irq softirq steal (guest is in user)
    let values: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: f64 = values.iter().sum();
    let not_busy: f64 = [3, 4, 7].iter().filter_map(|&i| values.get(i)).sum();
    (total - not_busy, total)
}
