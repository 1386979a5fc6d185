//! The relay on MariaDB, next to the relay on PostgreSQL, in the same run
//! (issue 26):
//!
//! ```text
//! scripts/services.sh up
//! cargo bench -p txoutbox-runtime --features mysql --bench relay_mysql
//! ```
//!
//! Each of `MYSQL_BENCH_ROUNDS` [3] rounds measures, back to back on the
//! same broker: the MariaDB relay draining a backlog of `MYSQL_BENCH_EVENTS`
//! [50000] events (about 250 bytes of JSON each, 10,000 keys, 8 partitions);
//! the same drain over a table that also keeps `MYSQL_BENCH_PUBLISHED_ROWS`
//! [5000000] published rows; the seed's loop on MariaDB over
//! `MYSQL_BENCH_BASELINE_EVENTS` [2000] events (claim 100 rows `FOR UPDATE
//! SKIP LOCKED`, send and wait for each, `UPDATE` it, commit per batch; the
//! server's default isolation, a producer with `linger.ms=0`, idempotence and
//! `acks=all`, as a competent user of the seed's stack runs it); and the
//! PostgreSQL relay over the same backlog. Batches of `MYSQL_BENCH_BATCH`
//! [1000]. Also counted over each MariaDB drain: InnoDB index entries read
//! (`Handler_read_next` and `Handler_read_key`, server-wide) per published
//! event: a claim that stepped over published rows would show here.
//!
//! Dead letters (`MYSQL_BENCH_PARKED_ROWS` [200000], `0` skips it): each
//! round also drains the same backlog in a database whose oldest rows are
//! that many parked ones, on today's schema and on the schema before MySQL
//! migration 0008 (`ix_outbox_event_unpublished (published_at, id)`, whose
//! NULL head kept the parked rows in the claim's walk), each against the
//! empty-table drain run back to back with it, which goes first
//! alternating by round (target >= 0.90, as on PostgreSQL).
//!
//! Min / median / max over rounds of every rate and of the ratios taken
//! within a round. Databases: `outbox_bench_mysql`,
//! `outbox_bench_mysql_large`, `outbox_bench_mysql_parked` and
//! `outbox_bench_mysql_parked_0007` on MariaDB (`MYSQL_URL`), `outbox_bench_mysql_pg`
//! on PostgreSQL (`DATABASE_URL`); dropped and recreated, and dropped at
//! the end.
#![allow(missing_docs)]

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, MySqlPool, PgConnection, PgPool};
use txoutbox_runtime::relay::{Database, Relay};
use txoutbox_testkit::broker::new_topic;

const KEYS: i64 = 10_000;
const PARTITIONS: i32 = 8;
const FILL_CHUNK: usize = 250_000;

/// Event ids of this run: each insert takes the next range.
static NEXT_EVENT: AtomicU64 = AtomicU64::new(1);

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let events = support::env_usize("MYSQL_BENCH_EVENTS", 50_000);
    let baseline_events = support::env_usize("MYSQL_BENCH_BASELINE_EVENTS", 2_000);
    let published_rows = support::env_usize("MYSQL_BENCH_PUBLISHED_ROWS", 5_000_000);
    let rounds = support::env_usize("MYSQL_BENCH_ROUNDS", 3).max(1);
    let batch = support::env_usize("MYSQL_BENCH_BATCH", 1_000);
    let parked_rows = support::env_usize("MYSQL_BENCH_PARKED_ROWS", 200_000);
    let brokers = std::env::var("KAFKA_BROKERS_TEST").unwrap_or_else(|_| "127.0.0.1:9092".into());
    println!(
        "relay on MariaDB and PostgreSQL: {events} events per drain, {baseline_events} for the \
         seed-style loop, {published_rows} published rows in the large table, batch {batch}, \
         {rounds} rounds, commit {}",
        txoutbox_testkit::measured_commit()
    );

    let small = mariadb("outbox_bench_mysql").await;
    let large = mariadb("outbox_bench_mysql_large").await;
    let started = Instant::now();
    let history = insert_mariadb(&large, "history", published_rows, true).await;
    println!(
        "filled {published_rows} published rows in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let pg = postgres("outbox_bench_mysql_pg").await;
    // Dead letters, on today's schema and on the one before migration 0008.
    let mut parked = Vec::new();
    if parked_rows > 0 {
        for (name, migrations) in [
            ("outbox_bench_mysql_parked", None),
            ("outbox_bench_mysql_parked_0007", Some(7)),
        ] {
            let pool = mariadb_at(name, migrations).await;
            let last = fill_parked(&pool, parked_rows).await;
            parked.push((pool, last, migrations, Vec::new(), Vec::new(), Vec::new()));
        }
    }

    let (mut my, mut my_large, mut seed, mut postgres_relay) = (vec![], vec![], vec![], vec![]);
    let (mut reads, mut reads_large) = (vec![], vec![]);
    for round in 1..=rounds {
        let (rate, read) = drain_mariadb(&small, 0, &brokers, events, batch).await;
        my.push(rate);
        reads.push(read);
        let (rate, read) = drain_mariadb(&large, history, &brokers, events, batch).await;
        my_large.push(rate);
        reads_large.push(read);
        seed.push(seed_style_mariadb(&small, &brokers, baseline_events).await);
        postgres_relay.push(drain_postgres(&pg, &brokers, events, batch).await);
        println!(
            "round {round}: MariaDB relay {:.0}/s ({:.1} index reads per event), over \
             {published_rows} published rows {:.0}/s ({:.1}), MariaDB seed-style loop {:.0}/s, \
             PostgreSQL relay {:.0}/s",
            my[round - 1],
            reads[round - 1],
            my_large[round - 1],
            reads_large[round - 1],
            seed[round - 1],
            postgres_relay[round - 1]
        );
        // Each against an empty-table drain back to back with it, which
        // of the two goes first alternating by round (as on PostgreSQL).
        for (pool, last, migrations, rates, reads, ratios) in &mut parked {
            let ((rate, read), (none, _)) = if round % 2 == 1 {
                let none = drain_mariadb(&small, 0, &brokers, events, batch).await;
                (
                    drain_mariadb(pool, *last, &brokers, events, batch).await,
                    none,
                )
            } else {
                let some = drain_mariadb(pool, *last, &brokers, events, batch).await;
                (
                    some,
                    drain_mariadb(&small, 0, &brokers, events, batch).await,
                )
            };
            println!(
                "round {round}: MariaDB relay with {parked_rows} parked rows ({}): {rate:.0}/s \
                 ({read:.1} index reads per event), {:.3} of the empty table's {none:.0}/s \
                 drained next to it",
                schema(*migrations),
                rate / none
            );
            rates.push(rate);
            reads.push(read);
            ratios.push(rate / none);
        }
    }
    let show = |name: &str, values: &[f64], unit: &str| {
        let (lo, mid, hi) = support::spread(values);
        // Ratios near 1 with three decimals, the rest with one.
        let digits = if hi < 2.0 { 3 } else { 1 };
        println!(
            "{name}: {lo:.digits$} / {mid:.digits$} / {hi:.digits$}{unit} (min / median / max)"
        );
    };
    show("MariaDB relay drain", &my, " events/s");
    show(
        &format!("MariaDB relay drain over {published_rows} published rows"),
        &my_large,
        " events/s",
    );
    show("MariaDB seed-style loop", &seed, " events/s");
    show("PostgreSQL relay drain", &postgres_relay, " events/s");
    show("index entries read per event, empty table", &reads, "");
    show(
        "index entries read per event, large table",
        &reads_large,
        "",
    );
    let ratio =
        |a: &[f64], b: &[f64]| -> Vec<f64> { a.iter().zip(b).map(|(a, b)| a / b).collect() };
    let relay_vs_seed = ratio(&my, &seed);
    show(
        "ratio MariaDB relay / MariaDB seed-style loop, per round",
        &relay_vs_seed,
        "x",
    );
    println!(
        "  target >= 10x: met in {} of {rounds} rounds",
        relay_vs_seed.iter().filter(|r| **r >= 10.0).count()
    );
    let large_vs_empty = ratio(&my_large, &my);
    show(
        "ratio MariaDB large table / empty table, per round",
        &large_vs_empty,
        "",
    );
    show(
        "ratio MariaDB relay / PostgreSQL relay, per round",
        &ratio(&my, &postgres_relay),
        "",
    );
    for (_, _, migrations, rates, reads, ratios) in &parked {
        let schema = schema(*migrations);
        show(
            &format!("MariaDB relay drain with {parked_rows} parked rows ({schema})"),
            rates,
            " events/s",
        );
        show(
            &format!("index entries read per event with {parked_rows} parked rows ({schema})"),
            reads,
            "",
        );
        show(
            &format!("ratio with {parked_rows} parked rows / empty table ({schema}), per round"),
            ratios,
            "",
        );
        println!(
            "  target >= 0.90: met in {} of {rounds} rounds",
            ratios.iter().filter(|r| **r >= 0.90).count()
        );
    }
    // Nothing left behind (the large table's database holds millions of rows).
    small.close().await;
    large.close().await;
    pg.close().await;
    for (pool, ..) in &parked {
        pool.close().await;
    }
    if let Err(error) = txoutbox_testkit::mysql::drop_databases(&MARIADB_DATABASES).await {
        eprintln!("dropping the bench's MariaDB databases: {error}");
    }
    support::drop_database("outbox_bench_mysql_pg").await;
}

/// The bench's databases on MariaDB, dropped at its end (and, after a run
/// that did not end, again when a later run recreates them).
const MARIADB_DATABASES: [&str; 4] = [
    "outbox_bench_mysql",
    "outbox_bench_mysql_large",
    "outbox_bench_mysql_parked",
    "outbox_bench_mysql_parked_0007",
];

/// Which schema a parked-rows database has.
fn schema(migrations: Option<usize>) -> String {
    match migrations {
        None => "today's schema".to_owned(),
        Some(n) => format!("schema up to migration {n:04}"),
    }
}

/// Adds `n` parked rows (dead letters: 10 failed attempts each, topic
/// `parked`), which stay while the drains come and go; returns the highest
/// id.
async fn fill_parked(pool: &MySqlPool, n: usize) -> i64 {
    let started = Instant::now();
    let last = insert_mariadb(pool, "parked", n, false).await;
    sqlx::query(
        "UPDATE outbox_event SET parked_at = UTC_TIMESTAMP(6), attempts = 10,
             last_error = 'Broker: Message size too large'
         WHERE topic = 'parked'",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE TABLE outbox_event")
        .execute(pool)
        .await
        .unwrap();
    println!(
        "filled {n} parked rows in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    last
}

fn kafka(brokers: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", brokers);
    config
}

async fn mariadb(name: &str) -> MySqlPool {
    mariadb_at(name, None).await
}

/// A fresh MariaDB database migrated in full, or up to MySQL migration
/// `migrations` (its number) only.
async fn mariadb_at(name: &str, migrations: Option<usize>) -> MySqlPool {
    let url = txoutbox_testkit::mysql::mysql_url();
    let server: MySqlConnectOptions = url.parse().expect("MYSQL_URL");
    let mut admin = server.connect().await.expect("MariaDB at MYSQL_URL");
    // Names are constants of this file: no injection possible.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name}; CREATE DATABASE {name}"
    )))
    .execute(&mut admin)
    .await
    .unwrap();
    let pool = MySqlPoolOptions::new()
        .max_connections(8)
        .connect_with(server.database(name))
        .await
        .unwrap();
    match migrations {
        None => {
            txoutbox_runtime::migrations::run(&pool).await.unwrap();
        }
        Some(n) => {
            for migration in &txoutbox_runtime::migrations::MYSQL_MIGRATIONS[..n] {
                sqlx::raw_sql(migration.sql).execute(&pool).await.unwrap();
            }
        }
    }
    pool
}

async fn postgres(name: &str) -> PgPool {
    let url = txoutbox_testkit::db::database_url();
    let options: PgConnectOptions = url.parse().expect("DATABASE_URL");
    let mut admin = PgConnection::connect_with(&options).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .execute(&mut admin)
    .await
    .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut admin)
        .await
        .unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect_with(options.database(name))
        .await
        .unwrap();
    txoutbox_runtime::migrations::run(&pool).await.unwrap();
    pool
}

/// Inserts `n` events over [`KEYS`] keys (published ones for the history);
/// returns the highest id.
async fn insert_mariadb(pool: &MySqlPool, topic: &str, n: usize, published: bool) -> i64 {
    let mut done = 0;
    while done < n {
        let chunk = (n - done).min(FILL_CHUNK);
        let first = NEXT_EVENT.fetch_add(chunk as u64, Ordering::Relaxed);
        // `seq_1_to_<n>` is MariaDB's sequence engine; the number is ours.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type,
                                       payload, topic, partition_key, published_at)
             SELECT UNHEX(LPAD(HEX(? + seq), 32, '0')), 'Order', CONCAT('order-', seq % ?),
                    'OrderCreated',
                    JSON_OBJECT('event_id', LPAD(HEX(? + seq), 32, '0'),
                                'order_id', CONCAT('order-', seq % ?), 'amount', seq,
                                'currency', 'EUR', 'note', REPEAT('x', 140)),
                    ?, CONCAT('order-', seq % ?), IF(?, UTC_TIMESTAMP(6), NULL)
             FROM seq_1_to_{chunk}"
        )))
        .bind(first)
        .bind(KEYS)
        .bind(first)
        .bind(KEYS)
        .bind(topic)
        .bind(KEYS)
        .bind(published)
        .execute(pool)
        .await
        .unwrap();
        done += chunk;
    }
    sqlx::query("ANALYZE TABLE outbox_event")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query_scalar("SELECT COALESCE(MAX(id), 0) FROM outbox_event")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// InnoDB index entries read so far, server-wide.
async fn index_reads(pool: &MySqlPool) -> f64 {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SHOW GLOBAL STATUS WHERE Variable_name IN ('Handler_read_next', 'Handler_read_key')",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    rows.iter().map(|(_, v)| v.parse::<f64>().unwrap()).sum()
}

/// Drains a fresh backlog of `n` events with the MariaDB relay (the rows
/// above `keep` are removed first); returns events/s and index entries
/// read per event.
async fn drain_mariadb(
    pool: &MySqlPool,
    keep: i64,
    brokers: &str,
    n: usize,
    batch: usize,
) -> (f64, f64) {
    sqlx::query("DELETE FROM outbox_event WHERE id > ?")
        .bind(keep)
        .execute(pool)
        .await
        .unwrap();
    let topic = new_topic(brokers, "bench-mysql-drain", PARTITIONS).await;
    insert_mariadb(pool, &topic, n, false).await;
    let reads_before = index_reads(pool).await;
    let rate = drain(Database::from(pool.clone()), brokers, n, batch).await;
    let reads = index_reads(pool).await - reads_before;
    (rate, reads / n as f64)
}

async fn drain_postgres(pool: &PgPool, brokers: &str, n: usize, batch: usize) -> f64 {
    sqlx::query("TRUNCATE outbox_event")
        .execute(pool)
        .await
        .unwrap();
    let topic = new_topic(brokers, "bench-mysql-pg-drain", PARTITIONS).await;
    sqlx::query(
        "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type,
                                   payload, topic, partition_key)
         SELECT s.id, 'Order', s.k, 'OrderCreated',
                jsonb_build_object('event_id', s.id, 'order_id', s.k, 'amount', s.g,
                                   'currency', 'EUR', 'note', repeat('x', 140)),
                $2, s.k
         FROM (SELECT gen_random_uuid() AS id, 'order-' || (g % $3) AS k, g
               FROM generate_series(1, $1) AS g) AS s",
    )
    .bind(n as i64)
    .bind(&topic)
    .bind(KEYS)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("VACUUM ANALYZE outbox_event")
        .execute(pool)
        .await
        .unwrap();
    drain(Database::from(pool.clone()), brokers, n, batch).await
}

/// Spawns a relay and times until it has published `n` events.
async fn drain(database: Database, brokers: &str, n: usize, batch: usize) -> f64 {
    let started = Instant::now();
    let relay = Relay::builder(database, kafka(brokers))
        .batch_size(batch)
        .spawn()
        .unwrap();
    let mut first = None;
    while relay.summary().published < n as u64 {
        if first.is_none() && relay.summary().published > 0 {
            first = Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = started.elapsed();
    if std::env::var_os("MYSQL_BENCH_TRACE").is_some() {
        eprintln!(
            "first publish after {:?}, all after {elapsed:?}",
            first.unwrap_or_default()
        );
    }
    relay.shutdown().await.unwrap();
    n as f64 / elapsed.as_secs_f64()
}

/// The seed's loop on MariaDB (see the module documentation).
async fn seed_style_mariadb(pool: &MySqlPool, brokers: &str, n: usize) -> f64 {
    sqlx::query("DELETE FROM outbox_event")
        .execute(pool)
        .await
        .unwrap();
    let topic = new_topic(brokers, "bench-mysql-seed", PARTITIONS).await;
    insert_mariadb(pool, &topic, n, false).await;
    let producer: FutureProducer = kafka(brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "0")
        .create()
        .unwrap();
    let started = Instant::now();
    let mut conn = pool.acquire().await.unwrap();
    loop {
        let mut tx = conn.begin().await.unwrap();
        let rows: Vec<(i64, String, String, String)> = sqlx::query_as(
            "SELECT id, topic, partition_key, payload FROM outbox_event
             WHERE published_at IS NULL ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED",
        )
        .fetch_all(&mut *tx)
        .await
        .unwrap();
        if rows.is_empty() {
            break;
        }
        for (id, topic, key, payload) in rows {
            producer
                .send(
                    FutureRecord::to(&topic).key(&key).payload(&payload),
                    Duration::from_secs(30),
                )
                .await
                .unwrap();
            sqlx::query("UPDATE outbox_event SET published_at = UTC_TIMESTAMP(6) WHERE id = ?")
                .bind(id)
                .execute(&mut *tx)
                .await
                .unwrap();
        }
        tx.commit().await.unwrap();
    }
    n as f64 / started.elapsed().as_secs_f64()
}
