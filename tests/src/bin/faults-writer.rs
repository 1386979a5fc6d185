//! Fault-injection writer: runs the `post_entry` `#[outbox_handler]` command
//! in a loop until `FAULTS_UNTIL_MS`, on random keys; some commands roll back
//! after recording their event, some sleep inside their transaction so that a
//! `kill -9` can land mid-transaction. Database errors (e.g. during a
//! PostgreSQL restart) are survived: the outcome of such a command is unknown
//! to the writer, and the checker takes the `ledger` table as the truth.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use outbox_tests::faults::db::is_mysql_url;
use outbox_tests::faults::env;
use outbox_tests::faults::model::{LedgerError, PostEntry, key_name, post_entry, post_entry_mysql};
use rand::Rng;
use sqlx::mysql::MySqlPoolOptions;
use sqlx::postgres::PgPoolOptions;
use sqlx::{MySqlPool, PgPool};
use uuid::Uuid;

/// The source database: PostgreSQL, or MariaDB for a `mysql://` URL.
#[derive(Clone)]
enum Source {
    Postgres(PgPool),
    MariaDb(MySqlPool),
}

impl Source {
    fn connect_lazy(url: &str, connections: u32) -> Self {
        let timeout = Duration::from_secs(5);
        if is_mysql_url(url) {
            Self::MariaDb(
                MySqlPoolOptions::new()
                    .max_connections(connections)
                    .acquire_timeout(timeout)
                    .connect_lazy(url)
                    .expect("valid database url"),
            )
        } else {
            Self::Postgres(
                PgPoolOptions::new()
                    .max_connections(connections)
                    .acquire_timeout(timeout)
                    .connect_lazy(url)
                    .expect("valid database url"),
            )
        }
    }

    /// Logs a command that will roll back, in its own transaction.
    async fn log_rollback(&self, event_id: Uuid) -> sqlx::Result<()> {
        match self {
            Self::Postgres(pool) => {
                sqlx::query("INSERT INTO intended_rollback (event_id) VALUES ($1)")
                    .bind(event_id)
                    .execute(pool)
                    .await
                    .map(drop)
            }
            Self::MariaDb(pool) => {
                sqlx::query("INSERT INTO intended_rollback (event_id) VALUES (?)")
                    .bind(event_id)
                    .execute(pool)
                    .await
                    .map(drop)
            }
        }
    }

    async fn post(&self, cmd: PostEntry) -> Result<i64, LedgerError> {
        match self {
            Self::Postgres(pool) => post_entry(pool, cmd).await,
            Self::MariaDb(pool) => post_entry_mysql(pool, cmd).await,
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    env::init_logging();
    let writer: i32 = env::get(env::WRITER, 0);
    let keys: usize = env::get(env::KEYS, 8);
    let until: u64 = env::get(env::UNTIL_MS, now_ms() + 5_000);
    let loops: usize = env::get(env::CONCURRENCY, 2);
    let pause = env::millis(env::PAUSE_MS, 2);
    let rollback_percent: u32 = env::get(env::ROLLBACK_PERCENT, 5);
    let hold_percent: u32 = env::get(env::HOLD_PERCENT, 0);
    let hold_ms: u32 = env::get(env::HOLD_MS, 200);
    let note_percent: u32 = env::get(env::NOTE_PERCENT, 0);
    let hot_key_percent: u32 = env::get(env::HOT_KEY_PERCENT, 0);
    let pool = Source::connect_lazy(&env::required(env::SOURCE_URL), loops as u32 + 1);

    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..loops {
        let pool = pool.clone();
        tasks.spawn(async move {
            let (mut committed, mut rolled_back, mut failed) = (0u64, 0u64, 0u64);
            while now_ms() < until {
                let (key, roll_back, hold, note) = {
                    let mut rng = rand::rng();
                    let key = if rng.random_range(0..100) < hot_key_percent {
                        0
                    } else {
                        rng.random_range(0..keys)
                    };
                    (
                        key_name(key),
                        rng.random_range(0..100) < rollback_percent,
                        rng.random_range(0..100) < hold_percent,
                        rng.random_range(0..100) < note_percent,
                    )
                };
                let cmd = PostEntry {
                    event_id: Uuid::now_v7(),
                    key,
                    writer,
                    hold_ms: if hold { hold_ms } else { 0 },
                    roll_back,
                    note,
                };
                if roll_back {
                    // Logged first, in its own transaction, so the checker knows
                    // which event ids must never appear anywhere.
                    let logged = pool.log_rollback(cmd.event_id).await;
                    if logged.is_err() {
                        failed += 1;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                }
                match pool.post(cmd).await {
                    Ok(_) => committed += 1,
                    Err(LedgerError::Deliberate) => rolled_back += 1,
                    Err(error) => {
                        failed += 1;
                        tracing::warn!(%error, "command failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
                tokio::time::sleep(pause).await;
            }
            (committed, rolled_back, failed)
        });
    }
    let (mut committed, mut rolled_back, mut failed) = (0, 0, 0);
    while let Some(joined) = tasks.join_next().await {
        let (c, r, f) = joined.expect("writer loop");
        committed += c;
        rolled_back += r;
        failed += f;
    }
    println!("writer {writer}: committed={committed} rolled_back={rolled_back} failed={failed}");
}
