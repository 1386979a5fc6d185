//! Fault-injection consumer: an `txoutbox_runtime::consumer::Consumer` in dedup
//! or inbox mode applying one `effect` row per `LedgerEntry` (and
//! `LedgerNote`, unless `FAULTS_HANDLES=entry`) in the receiver database:
//! PostgreSQL, or MariaDB for a `mysql://` (`mariadb://`) URL, where it runs
//! the MySQL twins of the handlers, in either mode.
//! Unknown event types are dead-lettered (or, `FAULTS_UNKNOWN=keep`, kept in
//! the inbox), so every poison message ends on the dead-letter topic. Stops
//! gracefully on SIGTERM; exits 1 if the consumer stops on its own.
//!
//! Handler faults: `FAULTS_BLOCKED_KEY` with `FAULTS_BLOCKED_FROM_MS` /
//! `FAULTS_BLOCKED_UNTIL_MS` make one key's events fail for a while;
//! `FAULTS_PANIC_EVERY=n` makes every n-th sequence number panic once;
//! `FAULTS_SWALLOW_EVERY` / `FAULTS_HANG_EVERY` make handlers swallow a
//! database error (on MariaDB a deadlock: see `model.rs`) or hang.
//!
//! Crash hook (`FAULTS_CRASH_AFTER_EFFECTS=n`): offsets are not auto-committed
//! in this process's lifetime (commit interval of an hour), and a watcher
//! kills the process with SIGKILL as soon as `n` of its effects are committed
//! in the database: a crash between the database commit and the offset
//! commit, every time. Its successor is redelivered all of those messages.

use std::time::Duration;

use outbox_tests::faults::db::is_mysql_url;
use outbox_tests::faults::env;
use outbox_tests::faults::model::{
    DEADLOCK_POOL, EFFECT_GROUP, HANDLER_FAULTS, HandlerFaults, PROCESS_TAG, apply_entry,
    apply_entry_mysql, apply_note, apply_note_mysql,
};
use sqlx::mysql::MySqlPoolOptions;
use sqlx::postgres::PgPoolOptions;
use sqlx::{MySqlPool, PgPool};
use txoutbox_runtime::consumer::{
    Consumer, ConsumerBuilder, ConsumerDatabase, Mode, UnknownEventPolicy,
};
use uuid::Uuid;

/// The receiver database: PostgreSQL, or MariaDB for a `mysql://` URL.
#[derive(Clone)]
enum Receiver {
    Postgres(PgPool),
    MariaDb(MySqlPool),
}

impl Receiver {
    fn connect_lazy(url: &str) -> Self {
        let timeout = Duration::from_secs(5);
        if is_mysql_url(url) {
            Self::MariaDb(
                MySqlPoolOptions::new()
                    .max_connections(4)
                    .acquire_timeout(timeout)
                    .connect_lazy(url)
                    .expect("valid database url"),
            )
        } else {
            Self::Postgres(
                PgPoolOptions::new()
                    .max_connections(4)
                    .acquire_timeout(timeout)
                    .connect_lazy(url)
                    .expect("valid database url"),
            )
        }
    }

    /// The effects this process (`tag`) committed.
    async fn effects_of(&self, tag: &str) -> sqlx::Result<i64> {
        match self {
            Self::Postgres(pool) => {
                sqlx::query_scalar("SELECT count(*) FROM effect WHERE process = $1")
                    .bind(tag)
                    .fetch_one(pool)
                    .await
            }
            Self::MariaDb(pool) => {
                sqlx::query_scalar("SELECT COUNT(*) FROM effect WHERE process = ?")
                    .bind(tag)
                    .fetch_one(pool)
                    .await
            }
        }
    }
}

/// The settings of the consumer, the same on both databases.
struct Settings {
    mode: Mode,
    unknown: UnknownEventPolicy,
    handler_timeout: Option<Duration>,
}

fn configure<DB: ConsumerDatabase>(
    builder: ConsumerBuilder<DB>,
    settings: &Settings,
) -> ConsumerBuilder<DB> {
    let mut builder = builder;
    if let Some(timeout) = settings.handler_timeout {
        builder = builder.handler_timeout(timeout);
    }
    builder
        .mode(settings.mode)
        .unknown_events(settings.unknown)
        .max_attempts(env::get(env::MAX_ATTEMPTS, 3))
        .processor_batch_size(env::get(env::PROCESSOR_BATCH, 500))
        .backoff(env::CONSUMER_BACKOFF)
        .batch_size(200)
        .processor_poll_interval(Duration::from_millis(100))
        // tansu can serve a record before an earlier one is readable
        // (RELIABILITY.md); FAULTS_REFETCH_GAPS=0 shows what happens without.
        .refetch_offset_gaps(env::get(env::REFETCH_GAPS, 1u8) == 1)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    env::init_logging();
    // One line per panic: the default hook with RUST_BACKTRACE (set by the
    // test runner) symbolizes a backtrace for every injected handler panic,
    // which costs this process more than the framework's work.
    std::panic::set_hook(Box::new(|info| eprintln!("panicked: {info}")));
    let group = env::required(env::GROUP);
    let tag = Uuid::new_v4().to_string();
    EFFECT_GROUP.set(group.clone()).expect("set once");
    PROCESS_TAG.set(tag.clone()).expect("set once");
    let mode = match env::required(env::MODE).as_str() {
        "dedup" => Mode::Dedup,
        "inbox" => Mode::Inbox,
        other => panic!("FAULTS_MODE must be dedup or inbox, not {other}"),
    };
    let crash_after: i64 = env::get(env::CRASH_AFTER_EFFECTS, 0);
    HANDLER_FAULTS
        .set(HandlerFaults {
            blocked_key: std::env::var(env::BLOCKED_KEY).ok(),
            blocked: (
                env::get(env::BLOCKED_FROM_MS, 0),
                env::get(env::BLOCKED_UNTIL_MS, 0),
            ),
            panic_every: env::get(env::PANIC_EVERY, 0),
            swallow_every: env::get(env::SWALLOW_EVERY, 0),
            hang_every: env::get(env::HANG_EVERY, 0),
        })
        .expect("set once");
    let unknown = match env::get(env::UNKNOWN, "dead_letter".to_owned()).as_str() {
        "dead_letter" => UnknownEventPolicy::DeadLetter,
        "keep" => UnknownEventPolicy::Keep,
        other => panic!("FAULTS_UNKNOWN must be dead_letter or keep, not {other}"),
    };
    let handles = env::get(env::HANDLES, "entry,note".to_owned());
    let notes = handles.split(',').any(|h| h == "note");
    let url = env::required(env::RECEIVER_URL);
    let receiver = Receiver::connect_lazy(&url);
    let mut kafka = rdkafka::ClientConfig::new();
    kafka
        .set("bootstrap.servers", env::required(env::BROKERS))
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500");
    if crash_after > 0 {
        kafka.set("auto.commit.interval.ms", "3600000");
    }
    if let Ok(debug) = std::env::var("FAULTS_KAFKA_DEBUG") {
        // librdkafka's own debug contexts (e.g. `cgrp`), logged at target
        // `librdkafka` (needs FAULTS_LOG to let it through).
        kafka.set("debug", debug);
    }
    let settings = Settings {
        mode,
        unknown,
        handler_timeout: std::env::var(env::HANDLER_TIMEOUT_MS).ok().map(|ms| {
            Duration::from_millis(ms.parse().expect("FAULTS_HANDLER_TIMEOUT_MS is a number"))
        }),
    };
    let consumer = match &receiver {
        Receiver::Postgres(pool) => {
            let mut builder = Consumer::builder(pool.clone(), kafka, group).handler(apply_entry);
            if notes {
                builder = builder.handler(apply_note);
            }
            configure(builder, &settings).build()
        }
        Receiver::MariaDb(pool) => {
            // The other side of the swallowed deadlocks (model.rs): a pool
            // of its own, so that it never waits for the consumer's.
            let deadlocks = MySqlPoolOptions::new()
                .max_connections(4)
                .acquire_timeout(Duration::from_secs(5))
                .connect_lazy(&url)
                .expect("valid database url");
            DEADLOCK_POOL.set(deadlocks).expect("set once");
            let mut builder =
                Consumer::builder(pool.clone(), kafka, group).handler(apply_entry_mysql);
            if notes {
                builder = builder.handler(apply_note_mysql);
            }
            configure(builder, &settings).build()
        }
    }
    .expect("consumer builds");
    let running = consumer.spawn();
    if crash_after > 0 {
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
                let applied = receiver.effects_of(&tag).await;
                if let Some(n) = applied.ok().filter(|&n| n >= crash_after) {
                    // Counted by the scenario (`crash hook:` lines).
                    eprintln!(
                        "crash hook: {n} effects committed by this process, killed before \
                         any offset commit"
                    );
                    let pid = std::process::id().to_string();
                    let _ = std::process::Command::new("kill")
                        .args(["-9", &pid])
                        .status();
                }
            }
        });
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    let failed = running.stopped();
    tokio::select! {
        _ = term.recv() => {}
        stopped = failed => {
            // Only a consumer that stopped on its own gets here first.
            eprintln!("consumer {stopped}");
            std::process::exit(1);
        }
    }
    if let Err(error) = running.shutdown().await {
        eprintln!("consumer stopped with an error: {error}");
        std::process::exit(1);
    }
}
