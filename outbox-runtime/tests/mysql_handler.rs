//! MySQL / MariaDB (feature `mysql`), the command side, against the real
//! MariaDB of the machine (`MYSQL_URL`, default
//! `mysql://root@127.0.0.1:3306/test`; each test creates and drops its own
//! database): `migrations::run` creates the schema once; `#[outbox_handler]`
//! on `&mut Transaction<'_, MySql>` commits the domain writes and the
//! recorded events together or not at all, and where MySQL differs from
//! PostgreSQL (a failed statement keeps the transaction; a deadlock ends it)
//! the framework neither loses a committed write nor commits events of
//! writes that were rolled back.
#![allow(missing_docs)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use sqlx::{Connection, MySql, MySqlConnection, MySqlPool, Transaction};
use txoutbox_core::{DomainEvent, Error, Events, outbox_handler};
use txoutbox_testkit::mysql::MySqlScratch;
use uuid::Uuid;

/// A scratch database on the MySQL server with the outbox and this test's
/// tables, dropped by [`Scratch::drop`].
struct Scratch {
    inner: MySqlScratch,
    pool: MySqlPool,
}

impl Scratch {
    async fn create() -> Self {
        let inner = MySqlScratch::create(4).await;
        let pool = inner.pool.clone();
        txoutbox_runtime::migrations::run(&pool).await.unwrap();
        sqlx::raw_sql(
            "CREATE TABLE orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, amount BIGINT NOT NULL,
                                  note VARCHAR(64) NULL, UNIQUE KEY (note)) ENGINE = InnoDB;
             CREATE TABLE counters (id INT PRIMARY KEY, v BIGINT NOT NULL) ENGINE = InnoDB;
             INSERT INTO counters (id, v) VALUES (1, 0), (2, 0);",
        )
        .execute(&pool)
        .await
        .unwrap();
        Self { inner, pool }
    }

    async fn connection(&self) -> MySqlConnection {
        self.inner.connection().await
    }

    async fn count(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    async fn drop(self) {
        self.inner.drop().await;
    }
}

#[derive(Debug, Clone, serde::Serialize, schemars::JsonSchema, DomainEvent)]
#[event(topic = "mysql-test.orders", aggregate = "Order")]
struct OrderPlaced {
    event_id: Uuid,
    #[partition_key]
    order_id: u64,
    amount: i64,
}

const FAIL_AFTER_RECORDING: i64 = -1;
const PANIC: i64 = -2;
const SWALLOW_DUPLICATE_KEY: i64 = -3;

#[outbox_handler]
async fn place(
    tx: &mut Transaction<'_, MySql>,
    events: &mut Events,
    amount: i64,
) -> Result<(u64, Uuid), Error> {
    let order_id = sqlx::query("INSERT INTO orders (amount) VALUES (?)")
        .bind(amount)
        .execute(&mut **tx)
        .await?
        .last_insert_id();
    let event = OrderPlaced {
        event_id: Uuid::now_v7(),
        order_id,
        amount,
    };
    events.record(event.clone());
    match amount {
        FAIL_AFTER_RECORDING => {
            return Err(Error::Database(sqlx::Error::Protocol(
                "refused after recording".into(),
            )));
        }
        PANIC => panic!("the handler panics after its writes"),
        SWALLOW_DUPLICATE_KEY => {
            // MySQL rolls back the failed statement only: the transaction
            // and the order inserted above stay, and commit.
            for _ in 0..2 {
                let _ = sqlx::query("INSERT INTO orders (amount, note) VALUES (0, 'dup')")
                    .execute(&mut **tx)
                    .await;
            }
        }
        _ => {}
    }
    Ok((order_id, event.event_id))
}

/// On a connection: `&mut MySqlConnection` is accepted too.
#[outbox_handler]
async fn place_on_connection(
    conn: &mut MySqlConnection,
    events: &mut Events,
    amount: i64,
) -> Result<Uuid, Error> {
    let order_id = sqlx::query("INSERT INTO orders (amount) VALUES (?)")
        .bind(amount)
        .execute(&mut *conn)
        .await?
        .last_insert_id();
    let event = OrderPlaced {
        event_id: Uuid::now_v7(),
        order_id,
        amount,
    };
    events
        .with_headers([("tenant", "acme")])
        .record(event.clone());
    events.record_after(
        OrderPlaced {
            event_id: Uuid::now_v7(),
            order_id,
            amount: amount + 1,
        },
        Duration::from_secs(60),
    );
    Ok(event.event_id)
}

type Json = sqlx::types::Json<serde_json::Value>;

/// aggregate type and id, event type, payload, topic, partition key,
/// traceparent, headers, whether `created_at` is the server's UTC now.
type OutboxRow = (
    String,
    String,
    String,
    Json,
    String,
    String,
    Option<String>,
    Option<Json>,
    i64,
);

async fn outbox_rows(pool: &MySqlPool, event_id: Uuid) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox_event WHERE event_id = ?")
        .bind(event_id)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn migrations_create_the_schema_once() {
    let db = Scratch::create().await;
    assert_eq!(
        txoutbox_runtime::migrations::run(&db.pool).await.unwrap(),
        Vec::<i64>::new(),
        "already applied by Scratch::create"
    );
    let versions: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM outbox_schema_migrations ORDER BY version")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    let shipped: Vec<i64> = txoutbox_runtime::migrations::MYSQL_MIGRATIONS
        .iter()
        .map(|m| m.version)
        .collect();
    assert_eq!(versions, shipped);
    assert_eq!(shipped, (1..=shipped.len() as i64).collect::<Vec<_>>());
    // Concurrent runners serialize on the named lock and apply nothing twice.
    let runs = futures::future::join_all(
        (0..3).map(|_| async { txoutbox_runtime::migrations::run(&db.pool).await }),
    )
    .await;
    assert!(runs.iter().all(|r| r.as_ref().is_ok_and(Vec::is_empty)));
    db.drop().await;
}

#[tokio::test]
async fn outbox_handler_commits_writes_and_events_together() {
    let db = Scratch::create().await;
    let pool = &db.pool;

    let mut wakeup = txoutbox_core::__private::wakeup::listener();
    let (order_id, event_id) = place(pool, 42).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), wakeup.committed())
        .await
        .expect("the commit wakes an in-process relay");
    assert_eq!(outbox_rows(pool, event_id).await, 1);
    let row: OutboxRow = sqlx::query_as(
        "SELECT aggregate_type, aggregate_id, event_type, payload, topic, partition_key,
                traceparent, headers,
                created_at BETWEEN UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE AND UTC_TIMESTAMP(6)
         FROM outbox_event WHERE event_id = ?",
    )
    .bind(event_id)
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(row.0, "Order");
    assert_eq!(row.1, order_id.to_string());
    assert_eq!(row.2, "OrderPlaced");
    assert_eq!(row.3.0["amount"], 42);
    assert_eq!(row.3.0["event_id"], event_id.to_string());
    assert_eq!(row.3.0["event_type"], "OrderPlaced");
    assert_eq!(
        (row.4.as_str(), row.5.as_str()),
        ("mysql-test.orders", &*order_id.to_string())
    );
    assert_eq!((row.6, row.7.map(|h| h.0)), (None, None));
    assert_eq!(row.8, 1, "created_at is the database's UTC clock");

    // Every failure writes nothing; the pool stays usable.
    let err = place(pool, FAIL_AFTER_RECORDING).await.unwrap_err();
    assert!(err.to_string().contains("refused after recording"), "{err}");
    let panicked = tokio::spawn({
        let pool = pool.clone();
        async move { place(&pool, PANIC).await }
    })
    .await;
    assert!(panicked.unwrap_err().is_panic());
    assert_eq!(db.count("SELECT count(*) FROM orders").await, 1);
    assert_eq!(db.count("SELECT count(*) FROM outbox_event").await, 1);
    for _ in 0..5 {
        place(pool, 7)
            .await
            .expect("the pool's connections are clean");
    }
    assert_eq!(db.count("SELECT count(*) FROM outbox_event").await, 6);

    // A swallowed duplicate key: on MySQL the transaction goes on, and the
    // order and its event commit (the first 'dup' note commits too).
    let (order_id, event_id) = place(pool, SWALLOW_DUPLICATE_KEY).await.unwrap();
    assert_eq!(outbox_rows(pool, event_id).await, 1);
    assert_eq!(
        db.count(&format!(
            "SELECT count(*) FROM orders WHERE id = {order_id}"
        ))
        .await,
        1
    );
    assert_eq!(
        db.count("SELECT count(*) FROM orders WHERE note = 'dup'")
            .await,
        1
    );

    // On a connection, with a header of the user's own and a scheduled event.
    let mut conn = pool.acquire().await.unwrap();
    let event_id = place_on_connection(&mut *conn, 5).await.unwrap();
    drop(conn);
    let headers: sqlx::types::Json<serde_json::Value> =
        sqlx::query_scalar("SELECT headers FROM outbox_event WHERE event_id = ?")
            .bind(event_id)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(headers.0, serde_json::json!({"tenant": "acme"}));
    let due_in: i64 = sqlx::query_scalar(
        "SELECT TIMESTAMPDIFF(SECOND, UTC_TIMESTAMP(6), deliver_after) FROM outbox_scheduled",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert!((55..=60).contains(&due_in), "due in {due_in} s");

    // Inside a caller's transaction: a savepoint, following the outer outcome.
    let mut outer = pool.begin().await.unwrap();
    let (_, nested) = place(&mut *outer, 9).await.unwrap();
    outer.rollback().await.unwrap();
    assert_eq!(outbox_rows(pool, nested).await, 0);
    db.drop().await;
}

static ATTEMPTS: AtomicU32 = AtomicU32::new(0);

/// Fails its first attempt with the error `number` (SIGNAL), then commits.
#[outbox_handler(retries = 3)]
async fn place_retried(
    tx: &mut Transaction<'_, MySql>,
    events: &mut Events,
    number: u16,
) -> Result<Uuid, Error> {
    let attempt = ATTEMPTS.fetch_add(1, Ordering::SeqCst);
    let order_id = sqlx::query("INSERT INTO orders (amount) VALUES (1)")
        .execute(&mut **tx)
        .await?
        .last_insert_id();
    let event = OrderPlaced {
        event_id: Uuid::now_v7(),
        order_id,
        amount: 1,
    };
    events.record(event.clone());
    if attempt == 0 {
        let sqlstate = if number == 1213 { "40001" } else { "HY000" };
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "SIGNAL SQLSTATE '{sqlstate}' SET MYSQL_ERRNO = {number}, MESSAGE_TEXT = 'injected'"
        )))
        .execute(&mut **tx)
        .await?;
    }
    Ok(event.event_id)
}

/// Counts the orders twice, another connection committing one in between:
/// the second count sees it at READ COMMITTED, not at InnoDB's default
/// REPEATABLE READ (the first read fixed the snapshot).
async fn count_twice(
    tx: &mut Transaction<'_, MySql>,
    pool: &MySqlPool,
) -> Result<(i64, i64), Error> {
    let before: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&mut **tx)
        .await?;
    sqlx::query("INSERT INTO orders (amount) VALUES (0)")
        .execute(pool)
        .await?;
    let after: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&mut **tx)
        .await?;
    Ok((before, after))
}

#[outbox_handler]
async fn counts_at_the_default_level(
    tx: &mut Transaction<'_, MySql>,
    _events: &mut Events,
    pool: MySqlPool,
) -> Result<(i64, i64), Error> {
    count_twice(tx, &pool).await
}

#[outbox_handler(isolation = "read_committed")]
async fn counts_at_read_committed(
    tx: &mut Transaction<'_, MySql>,
    _events: &mut Events,
    pool: MySqlPool,
) -> Result<(i64, i64), Error> {
    count_twice(tx, &pool).await
}

#[tokio::test]
async fn the_isolation_level_applies_to_the_handlers_transaction() {
    let db = Scratch::create().await;
    let (before, after) = counts_at_the_default_level(&db.pool, db.pool.clone())
        .await
        .unwrap();
    assert_eq!(after, before, "REPEATABLE READ: one snapshot");
    let (before, after) = counts_at_read_committed(&db.pool, db.pool.clone())
        .await
        .unwrap();
    assert_eq!(
        after,
        before + 1,
        "READ COMMITTED: each read sees the commits before it"
    );
    // The level was for that one transaction: the next is at the default again.
    let (before, after) = counts_at_the_default_level(&db.pool, db.pool.clone())
        .await
        .unwrap();
    assert_eq!(after, before);
    // No event recorded: the in-transaction check ran and passed (three
    // commits, nothing in the outbox).
    assert_eq!(db.count("SELECT count(*) FROM outbox_event").await, 0);
    db.drop().await;
}

#[tokio::test]
async fn deadlocks_and_lock_wait_timeouts_are_retried() {
    let db = Scratch::create().await;
    for number in [1213u16, 1205] {
        ATTEMPTS.store(0, Ordering::SeqCst);
        let event_id = place_retried(&db.pool, number).await.unwrap();
        assert_eq!(
            ATTEMPTS.load(Ordering::SeqCst),
            2,
            "error {number} retried once"
        );
        assert_eq!(outbox_rows(&db.pool, event_id).await, 1);
    }
    assert_eq!(
        db.count("SELECT count(*) FROM orders").await,
        2,
        "the failed attempts' writes rolled back"
    );
    // Not transient: a duplicate key is the handler's own error, not retried.
    ATTEMPTS.store(0, Ordering::SeqCst);
    let err = place_retried(&db.pool, 1062).await.unwrap_err();
    assert_eq!(ATTEMPTS.load(Ordering::SeqCst), 1, "{err}");
    db.drop().await;
}

/// Takes counter 1, waits until the other transaction holds counter 2 and
/// waits for counter 1, then asks for counter 2: a deadlock in which InnoDB
/// rolls this (lighter) transaction back. The error is swallowed, the order
/// insert after it runs in autocommit, and the event is recorded.
#[outbox_handler]
async fn swallow_a_deadlock(
    tx: &mut Transaction<'_, MySql>,
    events: &mut Events,
    other_holds_2: tokio::sync::watch::Receiver<bool>,
) -> Result<(), Error> {
    sqlx::query("UPDATE counters SET v = v + 1 WHERE id = 1")
        .execute(&mut **tx)
        .await?;
    let mut other_holds_2 = other_holds_2;
    other_holds_2.wait_for(|held| *held).await.unwrap();
    // Let the other transaction block on counter 1.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let deadlock = sqlx::query("UPDATE counters SET v = v + 1 WHERE id = 2")
        .execute(&mut **tx)
        .await;
    let code = deadlock
        .as_ref()
        .err()
        .and_then(|e| e.as_database_error())
        .and_then(|e| e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
        .map(|e| e.number());
    assert_eq!(code, Some(1213), "the deadlock's victim: {deadlock:?}");
    let order_id = sqlx::query("INSERT INTO orders (amount, note) VALUES (3, 'after-deadlock')")
        .execute(&mut **tx)
        .await?
        .last_insert_id();
    events.record(OrderPlaced {
        event_id: Uuid::now_v7(),
        order_id,
        amount: 3,
    });
    Ok(())
}

#[tokio::test]
async fn a_swallowed_deadlock_publishes_nothing_and_is_reported() {
    let db = Scratch::create().await;
    // The other transaction: heavier (many rows changed), so InnoDB picks
    // the handler's as the victim.
    sqlx::query(
        "INSERT INTO orders (amount)
         WITH RECURSIVE s (n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < 200)
         SELECT n FROM s",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let (held_tx, held_rx) = tokio::sync::watch::channel(false);
    let mut other = db.connection().await;
    let handler = {
        let pool = db.pool.clone();
        tokio::spawn(async move { swallow_a_deadlock(&pool, held_rx).await })
    };
    // Wait until the handler holds counter 1.
    let mut watcher = db.connection().await;
    for _ in 0..100 {
        let locked: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM information_schema.INNODB_TRX WHERE trx_rows_modified > 0",
        )
        .fetch_one(&mut watcher)
        .await
        .unwrap();
        if locked > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut tx = other.begin().await.unwrap();
    sqlx::query("UPDATE orders SET amount = amount + 1")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("UPDATE counters SET v = v + 10 WHERE id = 2")
        .execute(&mut *tx)
        .await
        .unwrap();
    held_tx.send(true).unwrap();
    sqlx::query("UPDATE counters SET v = v + 10 WHERE id = 1")
        .execute(&mut *tx)
        .await
        .expect("the other transaction survives the deadlock");
    tx.commit().await.unwrap();

    let err = handler.await.unwrap().unwrap_err();
    assert!(matches!(err, Error::TransactionLost), "{err:?}");
    assert!(err.to_string().contains("1213"), "{err}");
    assert_eq!(
        db.count("SELECT count(*) FROM outbox_event").await,
        0,
        "no event of a transaction that was rolled back"
    );
    assert_eq!(
        db.count("SELECT v FROM counters WHERE id = 1").await,
        10,
        "the handler's first update went with the deadlock's rollback"
    );
    // What ran after the swallowed error committed on its own (autocommit):
    // the hazard the error reports.
    assert_eq!(
        db.count("SELECT count(*) FROM orders WHERE note = 'after-deadlock'")
            .await,
        1
    );
    drop(watcher);
    db.drop().await;
}

/// The insert's guard on its own, on a connection outside any transaction
/// (where a swallowed deadlock leaves a handler): nothing is written, in
/// strict mode (the NULL event id is refused) and without it (the CHECK
/// refuses the zero bytes the NULL becomes), and the error says why.
#[tokio::test]
async fn the_insert_writes_nothing_outside_a_transaction_in_any_sql_mode() {
    let db = Scratch::create().await;
    for sql_mode in ["STRICT_TRANS_TABLES", ""] {
        let mut conn = db.connection().await;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "SET SESSION sql_mode = '{sql_mode}'"
        )))
        .execute(&mut conn)
        .await
        .unwrap();
        let mut events = Events::new();
        for amount in [1, 2] {
            events.record(OrderPlaced {
                event_id: Uuid::now_v7(),
                order_id: 1,
                amount,
            });
        }
        events.record_after(
            OrderPlaced {
                event_id: Uuid::now_v7(),
                order_id: 1,
                amount: 3,
            },
            Duration::from_secs(5),
        );
        let err = txoutbox_core::mysql::insert_events(&mut conn, &events)
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::TransactionLost),
            "sql_mode '{sql_mode}': {err:?}"
        );
        assert_eq!(db.count("SELECT count(*) FROM outbox_event").await, 0);
        assert_eq!(db.count("SELECT count(*) FROM outbox_scheduled").await, 0);
        // Inside a transaction the same events go in.
        let mut tx = conn.begin().await.unwrap();
        assert_eq!(
            txoutbox_core::mysql::insert_events(&mut tx, &events)
                .await
                .unwrap(),
            3
        );
        tx.rollback().await.unwrap();
    }
    db.drop().await;
}

/// The check that a transaction is still open travels with its commit
/// (`commit_checked`, one round trip): a transaction left by the code that
/// ran in it is reported and nothing of it commits, directly and through a
/// unit of work that records no event; an intact one commits.
#[tokio::test]
async fn commit_checked_commits_or_reports_the_lost_transaction() {
    let db = Scratch::create().await;
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("INSERT INTO orders (amount, note) VALUES (1, 'checked')")
        .execute(&mut *tx)
        .await
        .unwrap();
    txoutbox_core::mysql::commit_checked(tx).await.unwrap();
    assert_eq!(
        db.count("SELECT count(*) FROM orders WHERE note = 'checked'")
            .await,
        1
    );

    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("INSERT INTO orders (amount, note) VALUES (2, 'rolled-back')")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::raw_sql("ROLLBACK").execute(&mut *tx).await.unwrap();
    let err = txoutbox_core::mysql::commit_checked(tx).await.unwrap_err();
    assert!(matches!(err, Error::TransactionLost), "{err:?}");

    let ended = txoutbox_core::mysql::transaction(&db.pool)
        .run(async |tx, _events| {
            sqlx::query("INSERT INTO orders (amount, note) VALUES (3, 'ended')")
                .execute(&mut **tx)
                .await?;
            sqlx::raw_sql("ROLLBACK").execute(&mut **tx).await?;
            Ok::<_, Error>(())
        })
        .await;
    assert!(matches!(ended, Err(Error::TransactionLost)), "{ended:?}");

    txoutbox_core::mysql::transaction(&db.pool)
        .run(async |tx, _events| {
            sqlx::query("INSERT INTO orders (amount, note) VALUES (4, 'no-event')")
                .execute(&mut **tx)
                .await?;
            Ok::<_, Error>(())
        })
        .await
        .unwrap();
    assert_eq!(
        db.count("SELECT count(*) FROM orders WHERE note IN ('rolled-back', 'ended')")
            .await,
        0
    );
    assert_eq!(
        db.count("SELECT count(*) FROM orders WHERE note = 'no-event'")
            .await,
        1
    );
    // No session of the test's database is left idle inside a transaction
    // (the asking session and one busy with a statement are not leaks).
    // InnoDB serves INNODB_TRX from a cache refreshed at most every 0.1 s,
    // so a transaction that committed a moment ago may still be listed
    // while PROCESSLIST (live) shows its session idle: ask until the cache
    // has caught up; a leaked transaction stays listed for good.
    let mut idle_in_transaction = i64::MAX;
    for _ in 0..20 {
        idle_in_transaction = db
            .count(
                "SELECT count(*) FROM information_schema.INNODB_TRX t
                 JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id
                 WHERE p.DB = DATABASE() AND p.ID <> CONNECTION_ID() AND p.COMMAND = 'Sleep'",
            )
            .await;
        if idle_in_transaction == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    }
    assert_eq!(idle_in_transaction, 0);
    db.drop().await;
}
