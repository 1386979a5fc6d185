//! The design seed's own relay (Python: SQLAlchemy + aiokafka,
//! `seed_relay.py`) against this relay, draining the same kind of backlog in
//! the same rounds.
//!
//! ```text
//! scripts/services.sh up
//! scripts/seed-baseline.sh      # a virtualenv with SQLAlchemy, asyncpg, aiokafka
//! cargo bench -p txoutbox-runtime --bench seed_python
//! SEED_ROUNDS=5 SEED_EVENTS=1000 SEED_RELAY_EVENTS=20000 ...   # the defaults
//! ```
//!
//! Each round drains `SEED_EVENTS` rows with the seed's relay as written
//! (batches of 100, `send_and_wait` and an `UPDATE` per row, then a 0.5 s
//! sleep), the same rows with that loop's sleep set to 0 (what a user
//! draining a backlog would try first), and `SEED_RELAY_EVENTS` rows with
//! this relay (more rows, so that its start-up does not dominate); rates are
//! compared within the round. The seed asks for `enable_idempotence=True`;
//! tansu refuses aiokafka's idempotent handshake, so the Python relay runs
//! without it (this relay keeps its forced idempotent producer).
//!
//! The interpreter is `SEED_PYTHON`, else the one `scripts/seed-baseline.sh`
//! installs; if neither can import the three packages, the bench says so and
//! exits without figures.
#![allow(missing_docs)]

mod charts;
mod support;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use sqlx::PgPool;
use txoutbox_runtime::relay::Relay;
use txoutbox_testkit::broker::{brokers, client_config, new_topic};

/// The Python interpreter with the seed's packages, if there is one.
fn python() -> Option<PathBuf> {
    let candidate = std::env::var_os("SEED_PYTHON")
        .map(PathBuf::from)
        .or_else(|| {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| {
                    std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache"))
                })?;
            Some(cache.join("outbox-dev/seed-venv/bin/python"))
        })?;
    let usable = Command::new(&candidate)
        .args(["-c", "import aiokafka, asyncpg, sqlalchemy"])
        .output()
        .is_ok_and(|out| out.status.success());
    usable.then_some(candidate)
}

/// `DATABASE_URL` pointed at `database`, in SQLAlchemy's asyncpg form.
fn sqlalchemy_dsn(database: &str) -> String {
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let rest = url
        .split_once("://")
        .map_or(url.as_str(), |(_, rest)| rest)
        .to_owned();
    let (server, query) = rest.split_once('?').unwrap_or((&rest, ""));
    let server = server.split_once('/').map_or(server, |(server, _)| server);
    let query = if query.is_empty() {
        String::new()
    } else {
        format!("?{query}")
    };
    format!("postgresql+asyncpg://{server}/{database}{query}")
}

async fn topic() -> String {
    new_topic(&brokers(), "bench-seed-python", 8).await
}

/// Drains `n` rows with the seed's Python relay; events/s.
async fn python_drain(pool: &PgPool, python: &PathBuf, database: &str, n: usize, poll: f64) -> f64 {
    support::outbox_backlog(pool, &topic().await, n, 1_000).await;
    let out = Command::new(python)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/benches/seed_relay.py"
        ))
        .args(["--dsn", &sqlalchemy_dsn(database), "--brokers", &brokers()])
        .args(["--poll", &poll.to_string()])
        .output()
        .expect("run seed_relay.py");
    assert!(
        out.status.success(),
        "seed_relay.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(
        out.stdout
            .split(|b| *b == b'\n')
            .rfind(|line| !line.is_empty())
            .expect("a report line"),
    )
    .expect("JSON report");
    let published = report["published"].as_u64().unwrap() as usize;
    assert_eq!(published, n, "the seed's relay published every row");
    n as f64 / report["seconds"].as_f64().unwrap()
}

/// Drains `n` rows with this relay (default settings); events/s.
async fn relay_drain(pool: &PgPool, n: usize) -> f64 {
    support::outbox_backlog(pool, &topic().await, n, 1_000).await;
    let started = Instant::now();
    let relay = Relay::builder(pool.clone(), client_config(&brokers()))
        .spawn()
        .unwrap();
    while relay.summary().published < n as u64 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    relay.shutdown().await.unwrap();
    rate
}

fn spread(values: &[f64]) -> String {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    format!(
        "{:.0} / {:.0} / {:.0}",
        sorted[0],
        sorted[sorted.len() / 2],
        sorted[sorted.len() - 1]
    )
}

#[tokio::main]
async fn main() {
    let Some(python) = python() else {
        println!(
            "seed_python: no Python with SQLAlchemy, asyncpg and aiokafka \
             (run scripts/seed-baseline.sh, or set SEED_PYTHON): skipped"
        );
        return;
    };
    let rounds = support::env_usize("SEED_ROUNDS", 5).max(1);
    let n = support::env_usize("SEED_EVENTS", 1_000);
    let relay_n = support::env_usize("SEED_RELAY_EVENTS", 20_000);
    let (pool, database) = support::scratch_database("outbox_bench_seed_python", 8).await;
    println!(
        "seed's Python relay ({n} rows) vs this relay ({relay_n} rows), {rounds} rounds, commit {}",
        charts::commit()
    );
    let (mut seed, mut seed_no_sleep, mut ours) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=rounds {
        seed.push(python_drain(&pool, &python, &database, n, 0.5).await);
        seed_no_sleep.push(python_drain(&pool, &python, &database, n, 0.0).await);
        ours.push(relay_drain(&pool, relay_n).await);
        println!(
            "round {round}: seed as written {:.0}/s, seed without its sleep {:.0}/s, this relay {:.0}/s",
            seed[round - 1],
            seed_no_sleep[round - 1],
            ours[round - 1]
        );
        sqlx::query("DELETE FROM outbox_event")
            .execute(&pool)
            .await
            .unwrap();
    }
    pool.close().await;
    support::drop_database(&database).await;
    let ratio = |of: &[f64]| -> Vec<f64> { ours.iter().zip(of).map(|(o, s)| o / s).collect() };
    println!(
        "\n| relay | events/s min / median / max | this relay ÷ it, same round, min / median / max |"
    );
    println!("|---|---|---|");
    println!(
        "| the seed's relay as written (Python, batches of 100, 0.5 s sleep, no idempotence) | {} | {} |",
        spread(&seed),
        spread_x(&ratio(&seed))
    );
    println!(
        "| the same without its sleep | {} | {} |",
        spread(&seed_no_sleep),
        spread_x(&ratio(&seed_no_sleep))
    );
    println!("| this relay (defaults) | {} | |", spread(&ours));
}

fn spread_x(values: &[f64]) -> String {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    format!(
        "{:.1}x / {:.1}x / {:.1}x",
        sorted[0],
        sorted[sorted.len() / 2],
        sorted[sorted.len() - 1]
    )
}
