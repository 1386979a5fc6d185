//! The unit of work on MySQL / MariaDB: one transaction for a command
//! handler's writes and its outbox rows. `#[outbox_handler]` on a function
//! taking a MySQL transaction expands to [`transaction`].

use std::future::Future;

use sqlx::{Acquire, MySql, MySqlConnection, MySqlPool, Transaction};
use tracing::Instrument;

use super::{check_in_transaction, insert_events, is_transient};
use crate::unit_of_work::Failure;
use crate::{AfterCommit, Error, Events, IsolationLevel, retry};

/// Anything a MySQL unit of work can open a transaction on: `&MySqlPool`,
/// `MySqlPool`, or `&mut MySqlConnection` (inside a transaction already: a
/// savepoint, without an isolation level).
pub trait MySqlTransactionSource: Send {
    /// Opens a transaction, at `isolation` if given.
    fn begin_transaction(
        &mut self,
        isolation: Option<IsolationLevel>,
    ) -> impl Future<Output = Result<Transaction<'_, MySql>, sqlx::Error>> + Send;

    /// The database the transactions go to, so that a commit wakes only
    /// that database's relays in this process; `None` (the default, e.g. a
    /// bare connection) wakes them all.
    #[doc(hidden)]
    fn wakeup_scope(&self) -> Option<crate::wakeup::Scope> {
        None
    }

    /// Whether the transaction `begin_transaction` opens next is a
    /// transaction of its own, not a savepoint: then a commit with nothing
    /// to insert checks and commits in one round trip
    /// ([`commit_checked`](super::commit_checked)). `false` (the default)
    /// costs that round trip and is always right.
    #[doc(hidden)]
    fn begins_top_level(&self) -> bool {
        false
    }
}

impl MySqlTransactionSource for &MySqlPool {
    async fn begin_transaction(
        &mut self,
        isolation: Option<IsolationLevel>,
    ) -> Result<Transaction<'_, MySql>, sqlx::Error> {
        begin_on_pool(self, isolation).await
    }

    fn wakeup_scope(&self) -> Option<crate::wakeup::Scope> {
        crate::CommitTarget::wakeup_scope(self)
    }

    fn begins_top_level(&self) -> bool {
        true
    }
}

impl MySqlTransactionSource for MySqlPool {
    async fn begin_transaction(
        &mut self,
        isolation: Option<IsolationLevel>,
    ) -> Result<Transaction<'_, MySql>, sqlx::Error> {
        begin_on_pool(self, isolation).await
    }

    fn wakeup_scope(&self) -> Option<crate::wakeup::Scope> {
        crate::CommitTarget::wakeup_scope(self)
    }

    fn begins_top_level(&self) -> bool {
        true
    }
}

impl MySqlTransactionSource for &mut MySqlConnection {
    async fn begin_transaction(
        &mut self,
        isolation: Option<IsolationLevel>,
    ) -> Result<Transaction<'_, MySql>, sqlx::Error> {
        if let Some(level) = isolation {
            set_isolation(self, level).await?;
        }
        (&mut **self).begin().await
    }

    fn begins_top_level(&self) -> bool {
        !sqlx::Connection::is_in_transaction(&**self)
    }
}

/// `SET TRANSACTION ISOLATION LEVEL ..`: MySQL takes the level before the
/// transaction starts, for the next transaction only.
async fn set_isolation(
    conn: &mut MySqlConnection,
    level: IsolationLevel,
) -> Result<(), sqlx::Error> {
    let statement = match level {
        IsolationLevel::ReadCommitted => "SET TRANSACTION ISOLATION LEVEL READ COMMITTED",
        IsolationLevel::RepeatableRead => "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
        IsolationLevel::Serializable => "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
    };
    sqlx::raw_sql(statement).execute(conn).await.map(drop)
}

async fn begin_on_pool(
    pool: &MySqlPool,
    isolation: Option<IsolationLevel>,
) -> Result<Transaction<'static, MySql>, sqlx::Error> {
    match isolation {
        None => pool.begin().await,
        Some(level) => {
            let mut conn = pool.acquire().await?;
            set_isolation(&mut conn, level).await?;
            Transaction::begin(conn, None).await
        }
    }
}

/// Starts building a unit of work on `source`, the MySQL counterpart of
/// [`crate::transaction`]: `run` begins the transaction, runs your code with
/// it and a fresh [`Events`] collector, inserts the recorded events
/// ([`insert_events`](super::insert_events), guarded: nothing is written
/// outside a transaction), commits, and wakes an in-process relay. An `Err`,
/// a panic, a failed insert or commit rolls everything back; a transaction
/// MySQL rolled back under the handler (a swallowed deadlock) fails with
/// [`Error::TransactionLost`].
///
/// ```no_run
/// # #[derive(serde::Serialize, schemars::JsonSchema, txoutbox_core::DomainEvent)]
/// # #[event(topic = "orders", aggregate = "Order")]
/// # struct OrderCreated { event_id: uuid::Uuid, #[partition_key] order_id: u64 }
/// # async fn f(pool: sqlx::MySqlPool) -> Result<(), txoutbox_core::Error> {
/// let order_id = txoutbox_core::mysql::transaction(&pool)
///     .retries(3)
///     .run(async |tx, events| {
///         let id = sqlx::query("INSERT INTO orders (amount) VALUES (42)")
///             .execute(&mut **tx)
///             .await?
///             .last_insert_id();
///         events.record(OrderCreated { event_id: uuid::Uuid::now_v7(), order_id: id });
///         Ok::<_, txoutbox_core::Error>(id)
///     })
///     .await?;
/// # Ok(()) }
/// ```
pub fn transaction<S: MySqlTransactionSource>(source: S) -> MySqlUnitOfWork<S> {
    MySqlUnitOfWork {
        source,
        isolation: None,
        name: None,
    }
}

/// A MySQL unit of work being configured; see [`transaction`].
#[derive(Debug)]
#[must_use = "a unit of work does nothing until `run` is awaited"]
pub struct MySqlUnitOfWork<S> {
    source: S,
    isolation: Option<IsolationLevel>,
    name: Option<&'static str>,
}

impl<S: MySqlTransactionSource> MySqlUnitOfWork<S> {
    /// Runs the transaction at `level` (default: the server's, InnoDB's
    /// `REPEATABLE READ` unless configured).
    pub fn isolation(mut self, level: IsolationLevel) -> Self {
        self.isolation = Some(level);
        self
    }

    /// Names the handler in the unit of work's span, as
    /// [`UnitOfWork::named`](crate::UnitOfWork::named).
    pub fn named(mut self, handler: &'static str) -> Self {
        self.name = Some(handler);
        self
    }

    fn span(&self) -> tracing::Span {
        tracing::info_span!("outbox.unit_of_work", handler = self.name.unwrap_or(""))
    }

    /// Re-runs the whole handler in a fresh transaction, up to `retries` more
    /// times, on a deadlock (1213), a lock wait timeout (1205) or a
    /// serialization failure (SQLSTATE 40001), after a short jittered
    /// backoff, as [`UnitOfWork::retries`](crate::UnitOfWork::retries).
    pub fn retries(self, retries: u32) -> RetryingMySqlUnitOfWork<S> {
        RetryingMySqlUnitOfWork {
            inner: self,
            retries,
        }
    }

    /// Runs `handler` once in the transaction; see [`transaction`].
    pub async fn run<T, E, F>(mut self, handler: F) -> Result<T, E>
    where
        F: AsyncFnOnce(&mut Transaction<'_, MySql>, &mut Events) -> Result<T, E>,
        E: From<Error>,
    {
        let span = self.span();
        async move {
            let scope = self.source.wakeup_scope();
            let top_level = self.source.begins_top_level();
            let mut tx = begin(&mut self.source, self.isolation).await?;
            let mut events = Events::new();
            let outcome = handler(&mut tx, &mut events).await;
            finish(tx, events, outcome, scope, top_level)
                .await
                .map_err(Failure::into_user)
        }
        .instrument(span)
        .await
    }
}

/// A MySQL unit of work that retries on transient failures; see
/// [`MySqlUnitOfWork::retries`].
#[derive(Debug)]
#[must_use = "a unit of work does nothing until `run` is awaited"]
pub struct RetryingMySqlUnitOfWork<S> {
    inner: MySqlUnitOfWork<S>,
    retries: u32,
}

impl<S: MySqlTransactionSource> RetryingMySqlUnitOfWork<S> {
    /// Runs the transaction at `level`; see [`MySqlUnitOfWork::isolation`].
    pub fn isolation(mut self, level: IsolationLevel) -> Self {
        self.inner.isolation = Some(level);
        self
    }

    /// Names the handler in the unit of work's span.
    pub fn named(mut self, handler: &'static str) -> Self {
        self.inner.name = Some(handler);
        self
    }

    /// Runs `handler`, again on a transient failure, at most `1 + retries`
    /// times, each attempt on a fresh clone of `handler` (see
    /// [`RetryingUnitOfWork::run`](crate::RetryingUnitOfWork::run)).
    pub async fn run<T, E, F>(self, handler: F) -> Result<T, E>
    where
        F: AsyncFnOnce(&mut Transaction<'_, MySql>, &mut Events) -> Result<T, E> + Clone,
        E: From<Error> + std::error::Error + 'static,
    {
        let span = self.inner.span();
        self.run_attempts(handler).instrument(span).await
    }

    async fn run_attempts<T, E, F>(mut self, handler: F) -> Result<T, E>
    where
        F: AsyncFnOnce(&mut Transaction<'_, MySql>, &mut Events) -> Result<T, E> + Clone,
        E: From<Error> + std::error::Error + 'static,
    {
        let mut retried = 0;
        loop {
            let scope = self.inner.source.wakeup_scope();
            let top_level = self.inner.source.begins_top_level();
            let mut tx = begin(&mut self.inner.source, self.inner.isolation).await?;
            let mut events = Events::new();
            let outcome = handler.clone()(&mut tx, &mut events).await;
            let failure = match finish(tx, events, outcome, scope, top_level).await {
                Ok(output) => return Ok(output),
                Err(failure) => failure,
            };
            let retryable = match &failure {
                Failure::Handler(error) => is_transient(error),
                Failure::Framework(error) => is_transient(error),
            };
            if !retryable || retried == self.retries {
                return Err(failure.into_user());
            }
            retried += 1;
            tracing::debug!(
                attempt = retried + 1,
                "outbox unit of work (MySQL): retrying after a deadlock or lock wait timeout"
            );
            tokio::time::sleep(retry::TRANSACTION_RETRY.delay(retried)).await;
        }
    }
}

async fn begin<S: MySqlTransactionSource>(
    source: &mut S,
    isolation: Option<IsolationLevel>,
) -> Result<Transaction<'_, MySql>, Error> {
    Ok(source.begin_transaction(isolation).await?)
}

/// Ends one attempt: on the handler's success inserts the events (guarded
/// by `@@in_transaction`; with none, a statement checks it, in the commit's
/// round trip when the transaction is not a savepoint), commits and wakes
/// the relay; otherwise rolls back. A panic in the handler unwinds past
/// this; dropping the transaction queues its rollback.
async fn finish<T, E>(
    mut tx: Transaction<'_, MySql>,
    mut events: Events,
    outcome: Result<T, E>,
    scope: Option<crate::wakeup::Scope>,
    top_level: bool,
) -> Result<T, Failure<E>> {
    let output = match outcome {
        Ok(output) => output,
        Err(error) => {
            rollback(tx).await;
            return Err(Failure::Handler(error));
        }
    };
    let checked_with_commit = top_level && events.is_empty();
    let written = async {
        events.take_failure()?;
        if events.is_empty() {
            if !checked_with_commit {
                check_in_transaction(&mut tx).await?;
            }
            return Ok(0);
        }
        insert_events(&mut tx, &events).await
    }
    .await;
    let rows = match written {
        Ok(rows) => rows,
        Err(error) => {
            rollback(tx).await;
            return Err(Failure::Framework(error));
        }
    };
    let committed = match checked_with_commit {
        true => super::commit_checked_top_level(tx).await,
        false => tx.commit().await.map_err(Error::Database),
    };
    committed.map_err(Failure::Framework)?;
    AfterCommit::for_rows(rows).committed_in(scope);
    Ok(output)
}

async fn rollback(tx: Transaction<'_, MySql>) {
    if let Err(error) = tx.rollback().await {
        tracing::debug!(error = %crate::DbErrorDisplay(&error), "outbox unit of work (MySQL): rollback failed");
    }
}
