//! How a consumer uses its database: how each of its transactions begins,
//! what the dedup bookkeeping and the dead-letter table look like on each
//! database, and what it does when the database does not answer (count,
//! back off, try again unless the consumer is stopping).
//!
//! This is the consumer's seam between its loop and its SQL: the dedup
//! pass, the handler calls and the dead letters speak to a [`Tx`] or to
//! [`Database`], and each database's statements live in its own child
//! module ([`postgres`], `mysql`); inbox mode's statements are in
//! `inbox/postgres.rs` and `inbox/mysql.rs`. Sagas are PostgreSQL's alone
//! for now ([`Database::postgres`]).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use sqlx::{PgPool, Postgres, Transaction};
use tokio_util::sync::CancellationToken;
use txoutbox_core::{AfterCommit, Backoff, Events};
use uuid::Uuid;

use super::counts::Counts;

#[cfg(feature = "mysql")]
mod mysql;
mod postgres;

/// A consumer's pool, of one of the databases it runs on.
#[derive(Debug, Clone)]
pub(crate) enum Pool {
    Postgres(PgPool),
    #[cfg(feature = "mysql")]
    MySql(sqlx::MySqlPool),
}

impl Pool {
    /// Which relays of this process the consumer's commits wake: those of
    /// its database (by its name).
    pub(crate) fn wakeup_scope(&self) -> Option<txoutbox_core::__private::wakeup::Scope> {
        let name = match self {
            Self::Postgres(pool) => pool.connect_options().get_database().map(str::to_owned),
            #[cfg(feature = "mysql")]
            Self::MySql(pool) => pool.connect_options().get_database().map(str::to_owned),
        };
        txoutbox_core::__private::wakeup::Scope::of_database(name.as_deref())
    }

    /// How long the pool's acquire may wait (a bound of the consumer's
    /// waits, see [`super::stall`]).
    pub(crate) fn acquire_timeout(&self) -> Duration {
        match self {
            Self::Postgres(pool) => pool.options().get_acquire_timeout(),
            #[cfg(feature = "mysql")]
            Self::MySql(pool) => pool.options().get_acquire_timeout(),
        }
    }
}

/// One of the consumer's transactions.
pub(crate) enum Tx {
    Postgres(Transaction<'static, Postgres>),
    #[cfg(feature = "mysql")]
    MySql(Transaction<'static, sqlx::MySql>),
}

/// A consumer's transaction lent to a handler call.
pub(crate) enum TxRef<'a> {
    Postgres(&'a mut Transaction<'static, Postgres>),
    #[cfg(feature = "mysql")]
    MySql(&'a mut Transaction<'static, sqlx::MySql>),
}

/// The savepoint of one event in dedup mode's careful pass.
const EVENT_SAVEPOINT: &str = "outbox_dedup_event";

impl Tx {
    /// The transaction, for a handler call.
    pub(crate) fn lend(&mut self) -> TxRef<'_> {
        match self {
            Self::Postgres(tx) => TxRef::Postgres(tx),
            #[cfg(feature = "mysql")]
            Self::MySql(tx) => TxRef::MySql(tx),
        }
    }

    /// Inserts the dedup rows of `ids` for `group`; the ids that were new.
    pub(crate) async fn mark_processed_all(
        &mut self,
        group: &str,
        ids: &[Uuid],
    ) -> sqlx::Result<HashSet<Uuid>> {
        match self {
            Self::Postgres(tx) => postgres::mark_processed_all(tx, group, ids).await,
            #[cfg(feature = "mysql")]
            Self::MySql(tx) => mysql::mark_processed_all(tx, group, ids).await,
        }
    }

    /// Inserts the event's dedup row; `false` if the group had processed
    /// it already (a duplicate).
    pub(crate) async fn mark_processed(&mut self, group: &str, id: Uuid) -> sqlx::Result<bool> {
        match self {
            Self::Postgres(tx) => postgres::mark_processed(tx, group, id).await,
            #[cfg(feature = "mysql")]
            Self::MySql(tx) => mysql::mark_processed(tx, group, id).await,
        }
    }

    /// Sets the savepoint of one event (the same SQL on every database).
    pub(crate) async fn savepoint(&mut self) -> sqlx::Result<()> {
        self.set_savepoint(EVENT_SAVEPOINT).await
    }

    /// Releases the event's savepoint (see [`Tx::release`]).
    pub(crate) async fn release_savepoint(&mut self) -> Result<(), TxFailure> {
        self.release(EVENT_SAVEPOINT).await
    }

    /// Undoes what ran since the event's savepoint.
    pub(crate) async fn rollback_to_savepoint(&mut self) -> sqlx::Result<()> {
        self.simple(&format!("ROLLBACK TO SAVEPOINT {EVENT_SAVEPOINT}"))
            .await
    }

    /// Sets the savepoint `name` (the same SQL on every database).
    pub(crate) async fn set_savepoint(&mut self, name: &str) -> sqlx::Result<()> {
        self.simple(&format!("SAVEPOINT {name}")).await
    }

    /// Releases the savepoint `name`. On failure, [`TxFailure`] says whether
    /// the transaction could no longer commit (the handler left it aborted
    /// or lost) rather than the statement failing on its own.
    pub(crate) async fn release(&mut self, name: &str) -> Result<(), TxFailure> {
        let released = self.simple(&format!("RELEASE SAVEPOINT {name}")).await;
        self.classify(released).await
    }

    /// Undoes what ran since the savepoint `name`. On failure, [`TxFailure`]
    /// says whether the transaction is gone (on MySQL, rolled back under a
    /// handler by a deadlock, savepoints and all; on PostgreSQL, ended by
    /// the handler).
    pub(crate) async fn rollback_to(&mut self, name: &str) -> Result<(), TxFailure> {
        let undone = self.simple(&format!("ROLLBACK TO SAVEPOINT {name}")).await;
        self.classify(undone).await
    }

    async fn classify(&mut self, result: sqlx::Result<()>) -> Result<(), TxFailure> {
        match result {
            Ok(()) => Ok(()),
            Err(error) => Err(match self.not_committable(&error).await {
                Some(unusable) => TxFailure::Unusable(unusable),
                None => TxFailure::Database(error),
            }),
        }
    }

    async fn simple(&mut self, statement: &str) -> sqlx::Result<()> {
        let statement = sqlx::AssertSqlSafe(statement.to_owned());
        match self {
            Self::Postgres(tx) => sqlx::raw_sql(statement).execute(&mut **tx).await.map(drop),
            #[cfg(feature = "mysql")]
            Self::MySql(tx) => sqlx::raw_sql(statement).execute(&mut **tx).await.map(drop),
        }
    }

    /// Why `error`, of a statement of the framework's after a handler ran,
    /// means the transaction cannot commit: PostgreSQL's aborted or ended
    /// transaction, or MySQL's transaction rolled back under the handler (a
    /// deadlock); `None` when the statement failed on its own.
    async fn not_committable(&mut self, error: &sqlx::Error) -> Option<txoutbox_core::Error> {
        match self {
            Self::Postgres(_) => txoutbox_core::not_committable(error),
            #[cfg(feature = "mysql")]
            Self::MySql(tx) => mysql::not_committable(tx, error).await,
        }
    }

    /// Checks, with one statement, that the transaction can still commit
    /// after a handler had it ([`txoutbox_core::check_committable`];
    /// [`txoutbox_core::mysql::check_in_transaction`] on MySQL).
    pub(crate) async fn check_committable(&mut self) -> Result<(), txoutbox_core::Error> {
        match self {
            Self::Postgres(tx) => txoutbox_core::check_committable(tx).await,
            #[cfg(feature = "mysql")]
            Self::MySql(tx) => txoutbox_core::mysql::check_in_transaction(tx).await,
        }
    }

    /// Commits after [`Tx::check_committable`]'s check, in the same round
    /// trip ([`txoutbox_core::commit_checked`],
    /// [`txoutbox_core::mysql::commit_checked`]): the end of every
    /// transaction a handler had last. On failure the transaction is over:
    /// [`txoutbox_core::Error::Database`] when the database failed (the
    /// check or the commit), the other errors when the handler left it
    /// unable to commit.
    pub(crate) async fn commit_checked(self) -> Result<(), txoutbox_core::Error> {
        match self {
            Self::Postgres(tx) => txoutbox_core::commit_checked(tx).await,
            #[cfg(feature = "mysql")]
            Self::MySql(tx) => txoutbox_core::mysql::commit_checked(tx).await,
        }
    }

    /// Between two handlers of one transaction: on MySQL, checks that the
    /// transaction is still open (a handler that swallowed a deadlock leaves
    /// the session in autocommit, where the next handler's writes would
    /// commit on their own); nothing on PostgreSQL, where an aborted
    /// transaction refuses every later statement anyway.
    pub(crate) async fn check_still_open(&mut self) -> Result<(), txoutbox_core::Error> {
        match self {
            Self::Postgres(_) => Ok(()),
            #[cfg(feature = "mysql")]
            Self::MySql(tx) => txoutbox_core::mysql::check_in_transaction(tx).await,
        }
    }

    pub(crate) async fn rollback(self) -> sqlx::Result<()> {
        match self {
            Self::Postgres(tx) => tx.rollback().await,
            #[cfg(feature = "mysql")]
            Self::MySql(tx) => tx.rollback().await,
        }
    }

    pub(crate) async fn commit(self) -> sqlx::Result<()> {
        match self {
            Self::Postgres(tx) => tx.commit().await,
            #[cfg(feature = "mysql")]
            Self::MySql(tx) => tx.commit().await,
        }
    }
}

impl TxRef<'_> {
    /// Writes the events a handler recorded, in its transaction.
    pub(crate) async fn write_events(
        &mut self,
        events: &mut Events,
    ) -> Result<AfterCommit, txoutbox_core::Error> {
        match self {
            Self::Postgres(tx) => events.write(tx).await,
            #[cfg(feature = "mysql")]
            Self::MySql(tx) => txoutbox_core::mysql::write_events(tx, events).await,
        }
    }

    /// The same transaction, lent again for a shorter while.
    pub(crate) fn reborrow(&mut self) -> TxRef<'_> {
        match self {
            Self::Postgres(tx) => TxRef::Postgres(tx),
            #[cfg(feature = "mysql")]
            Self::MySql(tx) => TxRef::MySql(tx),
        }
    }
}

/// A framework statement after a handler failed.
#[derive(Debug)]
pub(crate) enum TxFailure {
    /// The handler left the transaction unable to commit.
    Unusable(txoutbox_core::Error),
    /// The statement failed on its own (an outage, say).
    Database(sqlx::Error),
}

/// A message kept in `consumer_dead_letter` because its dead-letter topic
/// refused it.
pub(crate) struct ParkedDeadLetter<'a> {
    pub(crate) group: &'a str,
    pub(crate) topic: &'a str,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) key: Option<&'a [u8]>,
    pub(crate) value: Option<&'a [u8]>,
    /// Header names and values as the producer sent them.
    pub(crate) headers: Vec<(&'a [u8], Option<&'a [u8]>)>,
    pub(crate) reason: &'a str,
    pub(crate) error: &'a str,
    pub(crate) dead_letter_topic: &'a str,
    pub(crate) publish_error: &'a str,
}

/// A consumer's database side.
pub(crate) struct Database {
    pool: Pool,
    /// How every PostgreSQL transaction of the consumer begins (see
    /// [`Database::begin`]).
    begin_statement: Arc<str>,
    backoff: Backoff,
    token: CancellationToken,
    counts: Counts,
}

impl Database {
    pub(crate) fn new(
        pool: Pool,
        handler_timeout: Duration,
        stall_limit: Option<Duration>,
        backoff: Backoff,
        token: CancellationToken,
        counts: Counts,
    ) -> Self {
        let begin_statement = match &pool {
            Pool::Postgres(_) => postgres::begin_statement(handler_timeout, stall_limit),
            #[cfg(feature = "mysql")]
            Pool::MySql(_) => mysql::BEGIN.to_owned(),
        };
        Self {
            pool,
            begin_statement: begin_statement.into(),
            backoff,
            token,
            counts,
        }
    }

    /// Opens one of the consumer's transactions at `READ COMMITTED`,
    /// whatever the database's or role's default, in the round trip that
    /// begins it.
    ///
    /// On PostgreSQL the inbox triggers and the dedup and saga statements
    /// need a fresh snapshot per statement (under `REPEATABLE READ` a
    /// trigger could miss a pending row committed meanwhile, and `ON
    /// CONFLICT` on a row committed after the snapshot fails with a
    /// serialization error), and `statement_timeout` is set to the handler
    /// timeout. On MySQL `READ COMMITTED` takes no gap locks, so two
    /// consumers inserting dedup rows of neighbouring ids do not block or
    /// deadlock each other, and a handler's reads see what committed since
    /// its transaction began, as on PostgreSQL.
    pub(crate) async fn begin(&self) -> sqlx::Result<Tx> {
        let statement = sqlx::AssertSqlSafe(Arc::clone(&self.begin_statement));
        match &self.pool {
            Pool::Postgres(pool) => pool.begin_with(statement).await.map(Tx::Postgres),
            #[cfg(feature = "mysql")]
            Pool::MySql(pool) => pool.begin_with(statement).await.map(Tx::MySql),
        }
    }

    /// A PostgreSQL transaction, for what runs on PostgreSQL only (the
    /// inbox's adoption of rows stored before groups).
    pub(crate) async fn begin_postgres(&self) -> sqlx::Result<Transaction<'static, Postgres>> {
        let statement = sqlx::AssertSqlSafe(Arc::clone(&self.begin_statement));
        self.postgres().begin_with(statement).await
    }

    /// The PostgreSQL pool, for what runs on PostgreSQL only: the inbox's
    /// adoption of legacy rows, and sagas' periodic work (a saga's builder
    /// takes a PostgreSQL consumer).
    pub(crate) fn postgres(&self) -> &PgPool {
        match &self.pool {
            Pool::Postgres(pool) => pool,
            #[cfg(feature = "mysql")]
            Pool::MySql(_) => unreachable!("sagas and legacy inbox rows are PostgreSQL's"),
        }
    }

    /// The MySQL pool, if the consumer runs on MySQL.
    #[cfg(feature = "mysql")]
    pub(crate) fn mysql(&self) -> Option<&sqlx::MySqlPool> {
        match &self.pool {
            Pool::MySql(pool) => Some(pool),
            Pool::Postgres(_) => None,
        }
    }

    /// The pool, for statements outside the consumer's transactions.
    pub(crate) fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Keeps a dead letter in `consumer_dead_letter`; a record redelivered
    /// before its offset was committed is kept once.
    pub(crate) async fn park_dead_letter(&self, row: &ParkedDeadLetter<'_>) -> sqlx::Result<()> {
        match &self.pool {
            Pool::Postgres(pool) => postgres::park_dead_letter(pool, row).await,
            #[cfg(feature = "mysql")]
            Pool::MySql(pool) => mysql::park_dead_letter(pool, row).await,
        }
    }

    /// Sleeps `delay`; false if the consumer is shutting down.
    pub(crate) async fn pause(&self, delay: Duration) -> bool {
        tokio::select! {
            () = self.token.cancelled() => false,
            () = tokio::time::sleep(delay) => true,
        }
    }

    /// After a database error: counts it and waits before the next try.
    /// False if the consumer is shutting down.
    pub(crate) async fn failed(&self, error: &sqlx::Error, retry: &mut u32) -> bool {
        *retry += 1;
        self.counts.database_error();
        tracing::warn!(error = %txoutbox_core::DbErrorDisplay(error), retry = *retry, "database unavailable; pausing before retry");
        self.pause(self.backoff.delay(*retry)).await
    }

    /// After a handler's transient failure (a deadlock, a lock wait timeout,
    /// a serialization failure): waits before the attempt runs again,
    /// uncounted. False if the consumer is shutting down.
    pub(crate) async fn transient(&self, handler: &str, error: &str, retry: &mut u32) -> bool {
        *retry += 1;
        tracing::info!(
            handler,
            error,
            retry = *retry,
            "transient failure of a handler's transaction; running the attempt again"
        );
        self.pause(self.backoff.delay(*retry)).await
    }

    /// Whether the database answers; a handler error while it does not is an
    /// outage, not the event's fault, and must not use up the event's attempts.
    pub(crate) async fn reachable(&self) -> bool {
        let ping = async {
            match &self.pool {
                Pool::Postgres(pool) => sqlx::query("SELECT 1").execute(pool).await.map(drop),
                #[cfg(feature = "mysql")]
                Pool::MySql(pool) => sqlx::query("SELECT 1").execute(pool).await.map(drop),
            }
        };
        matches!(
            tokio::time::timeout(Duration::from_secs(5), ping).await,
            Ok(Ok(()))
        )
    }
}
