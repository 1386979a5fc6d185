//! The unit of work on SeaORM: the handler's writes and its outbox rows in
//! one `DatabaseTransaction`. `#[outbox_handler]` on a function taking
//! `&DatabaseTransaction` expands to [`transaction`].

use std::future::Future;

use ::sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbErr, TransactionTrait,
};
use tracing::Instrument;

use super::{insert_events, is_transient, statement_error};
use crate::unit_of_work::Failure;
use crate::{AfterCommit, CommitTarget, Error, Events, IsolationLevel, retry};

/// Anything a SeaORM unit of work can open a transaction on: a
/// `DatabaseConnection` (owned or borrowed) or a `&DatabaseTransaction`.
///
/// A `&DatabaseTransaction` gets a savepoint (SeaORM's nested transaction;
/// only without an isolation level, which PostgreSQL cannot change there):
/// the outbox rows then commit with the outer transaction.
pub trait SeaTransactionSource: Send + Sync {
    /// Opens a transaction, at `isolation` if given.
    fn begin_transaction(
        &self,
        isolation: Option<IsolationLevel>,
    ) -> impl Future<Output = Result<DatabaseTransaction, DbErr>> + Send;

    /// The database the transactions go to, so that a commit wakes only
    /// that database's relays in this process; `None` (the default, e.g. a
    /// transaction given as the source) wakes them all.
    #[doc(hidden)]
    fn wakeup_scope(&self) -> Option<crate::wakeup::Scope> {
        None
    }
}

impl SeaTransactionSource for DatabaseConnection {
    fn begin_transaction(
        &self,
        isolation: Option<IsolationLevel>,
    ) -> impl Future<Output = Result<DatabaseTransaction, DbErr>> + Send {
        begin_on(self, isolation)
    }

    fn wakeup_scope(&self) -> Option<crate::wakeup::Scope> {
        CommitTarget::wakeup_scope(self)
    }
}

impl SeaTransactionSource for &DatabaseConnection {
    fn begin_transaction(
        &self,
        isolation: Option<IsolationLevel>,
    ) -> impl Future<Output = Result<DatabaseTransaction, DbErr>> + Send {
        begin_on(*self, isolation)
    }

    fn wakeup_scope(&self) -> Option<crate::wakeup::Scope> {
        CommitTarget::wakeup_scope(*self)
    }
}

impl SeaTransactionSource for &DatabaseTransaction {
    fn begin_transaction(
        &self,
        isolation: Option<IsolationLevel>,
    ) -> impl Future<Output = Result<DatabaseTransaction, DbErr>> + Send {
        begin_on(*self, isolation)
    }
}

async fn begin_on<C: TransactionTrait<Transaction = DatabaseTransaction> + Sync>(
    conn: &C,
    isolation: Option<IsolationLevel>,
) -> Result<DatabaseTransaction, DbErr> {
    match isolation {
        None => conn.begin().await,
        Some(level) => conn.begin_with_config(Some(sea_level(level)), None).await,
    }
}

fn sea_level(level: IsolationLevel) -> ::sea_orm::IsolationLevel {
    match level {
        IsolationLevel::ReadCommitted => ::sea_orm::IsolationLevel::ReadCommitted,
        IsolationLevel::RepeatableRead => ::sea_orm::IsolationLevel::RepeatableRead,
        IsolationLevel::Serializable => ::sea_orm::IsolationLevel::Serializable,
    }
}

/// Starts building a unit of work on `source`, SeaORM's counterpart of
/// [`crate::transaction`].
///
/// `run` begins a `DatabaseTransaction`, runs your code with it and a fresh
/// [`Events`] collector, then inserts the recorded events through the same
/// transaction (after your writes), commits, and wakes an in-process relay.
/// If your code returns `Err` (including a `?` early return), panics, or the
/// insert or commit fails, the transaction is rolled back and nothing of it
/// is written. A handler that swallowed a failed statement and returned `Ok`
/// gets [`Error::TransactionAborted`]: PostgreSQL would answer the commit
/// with a silent rollback.
///
/// Your error type needs only `From<txoutbox_core::Error>`; SeaORM's `DbErr`
/// has it (with feature `sea-orm`).
///
/// ```no_run
/// # #[derive(serde::Serialize, schemars::JsonSchema, txoutbox_core::DomainEvent)]
/// # #[event(topic = "orders", aggregate = "Order")]
/// # struct OrderCreated { event_id: uuid::Uuid, #[partition_key] order_id: i64 }
/// # async fn f(db: sea_orm::DatabaseConnection) -> Result<(), sea_orm::DbErr> {
/// use sea_orm::ConnectionTrait;
/// use txoutbox_core::IsolationLevel;
///
/// txoutbox_core::sea_orm::transaction(&db)
///     .isolation(IsolationLevel::Serializable)
///     .retries(3)
///     .run(async |tx, events| {
///         tx.execute_unprepared("UPDATE stock SET reserved = reserved + 1 WHERE sku = 'A'").await?;
///         events.record(OrderCreated { event_id: uuid::Uuid::now_v7(), order_id: 7 });
///         Ok::<_, sea_orm::DbErr>(())
///     })
///     .await?;
/// # Ok(()) }
/// ```
pub fn transaction<S: SeaTransactionSource>(source: S) -> SeaUnitOfWork<S> {
    SeaUnitOfWork {
        source,
        isolation: None,
        name: None,
    }
}

/// A SeaORM unit of work being configured; see [`transaction`].
#[derive(Debug)]
#[must_use = "a unit of work does nothing until `run` is awaited"]
pub struct SeaUnitOfWork<S> {
    source: S,
    isolation: Option<IsolationLevel>,
    name: Option<&'static str>,
}

impl<S: SeaTransactionSource> SeaUnitOfWork<S> {
    /// Runs the transaction at `level` (default: the database's default).
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

    /// Re-runs the whole handler in a fresh transaction with a fresh
    /// collector, up to `retries` more times, on a serialization failure or
    /// a deadlock (SQLSTATE 40001 / 40P01), as
    /// [`UnitOfWork::retries`](crate::UnitOfWork::retries) does; the
    /// error type must implement `std::error::Error + 'static` and keep the
    /// `DbErr` (or the `sqlx::Error`) in its `source()` chain, or be `DbErr`.
    pub fn retries(self, retries: u32) -> RetryingSeaUnitOfWork<S> {
        RetryingSeaUnitOfWork {
            inner: self,
            retries,
        }
    }

    /// Runs `handler` once in the transaction; see [`transaction`].
    pub async fn run<T, E, F>(self, handler: F) -> Result<T, E>
    where
        F: AsyncFnOnce(&DatabaseTransaction, &mut Events) -> Result<T, E>,
        E: From<Error>,
    {
        let span = self.span();
        async move {
            let scope = self.source.wakeup_scope();
            let txn = begin(&self.source, self.isolation).await?;
            let mut events = Events::new();
            let outcome = handler(&txn, &mut events).await;
            finish(txn, events, outcome, scope)
                .await
                .map_err(Failure::into_user)
        }
        .instrument(span)
        .await
    }
}

/// A SeaORM unit of work that retries on serialization failures; see
/// [`SeaUnitOfWork::retries`].
#[derive(Debug)]
#[must_use = "a unit of work does nothing until `run` is awaited"]
pub struct RetryingSeaUnitOfWork<S> {
    inner: SeaUnitOfWork<S>,
    retries: u32,
}

impl<S: SeaTransactionSource> RetryingSeaUnitOfWork<S> {
    /// Runs the transaction at `level` (default: the database's default).
    pub fn isolation(mut self, level: IsolationLevel) -> Self {
        self.inner.isolation = Some(level);
        self
    }

    /// Names the handler in the unit of work's span; see [`SeaUnitOfWork::named`].
    pub fn named(mut self, handler: &'static str) -> Self {
        self.inner.name = Some(handler);
        self
    }

    /// Runs `handler`, again on serialization failure, at most `1 + retries`
    /// times; each attempt runs a fresh clone of `handler`, as in
    /// [`RetryingUnitOfWork::run`](crate::RetryingUnitOfWork::run). The
    /// error of the last attempt is returned when all fail.
    pub async fn run<T, E, F>(self, handler: F) -> Result<T, E>
    where
        F: AsyncFnOnce(&DatabaseTransaction, &mut Events) -> Result<T, E> + Clone,
        E: From<Error> + std::error::Error + 'static,
    {
        let span = self.inner.span();
        self.run_attempts(handler).instrument(span).await
    }

    async fn run_attempts<T, E, F>(self, handler: F) -> Result<T, E>
    where
        F: AsyncFnOnce(&DatabaseTransaction, &mut Events) -> Result<T, E> + Clone,
        E: From<Error> + std::error::Error + 'static,
    {
        let mut retried = 0;
        loop {
            let scope = self.inner.source.wakeup_scope();
            let txn = begin(&self.inner.source, self.inner.isolation).await?;
            let mut events = Events::new();
            let outcome = handler.clone()(&txn, &mut events).await;
            let failure = match finish(txn, events, outcome, scope).await {
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
                "outbox unit of work (SeaORM): retrying after a serialization failure"
            );
            tokio::time::sleep(retry::TRANSACTION_RETRY.delay(retried)).await;
        }
    }
}

/// Opens the transaction of one attempt.
async fn begin<S: SeaTransactionSource>(
    source: &S,
    isolation: Option<IsolationLevel>,
) -> Result<DatabaseTransaction, Error> {
    Ok(source.begin_transaction(isolation).await?)
}

/// Ends one attempt after the handler ran: on its success inserts the
/// events, commits and wakes the relays of `scope`'s database; otherwise
/// rolls back.
///
/// A panic in the handler never reaches this: it unwinds through the
/// caller, where dropping the `DatabaseTransaction` starts its rollback
/// (SeaORM's `Drop`), which sqlx completes before the connection is reused.
async fn finish<T, E>(
    txn: DatabaseTransaction,
    mut events: Events,
    outcome: Result<T, E>,
    scope: Option<crate::wakeup::Scope>,
) -> Result<T, Failure<E>> {
    let output = match outcome {
        Ok(output) => output,
        Err(error) => {
            rollback(txn).await;
            return Err(Failure::Handler(error));
        }
    };
    let rows = match write_last(&txn, &mut events).await {
        Ok(rows) => rows,
        Err(error) => {
            rollback(txn).await;
            return Err(Failure::Framework(error));
        }
    };
    // SeaORM commits through sqlx, which does not read the command tag: the
    // statement above is what proves the commit will commit.
    txn.commit()
        .await
        .map_err(|error| Failure::Framework(statement_error(error)))?;
    AfterCommit::for_rows(rows).committed_in(scope);
    Ok(output)
}

/// The events' insert, the first statement after the handler's: it fails
/// with 25P02 if the handler left the transaction aborted. With nothing to
/// insert, a `SAVEPOINT` asks, as
/// [`check_committable`](crate::check_committable) does on the sqlx path.
async fn write_last(txn: &DatabaseTransaction, events: &mut Events) -> Result<u64, Error> {
    events.take_failure()?;
    if events.is_empty() {
        txn.execute_unprepared("SAVEPOINT txoutbox_committable")
            .await
            .map_err(statement_error)?;
        return Ok(0);
    }
    insert_events(txn, events).await.map_err(statement_error)
}

/// Rolls back eagerly so the connection is clean when the error reaches the
/// caller; its own failure is not reported (the caller's error matters more).
async fn rollback(txn: DatabaseTransaction) {
    if let Err(error) = txn.rollback().await {
        tracing::debug!(error = %super::DbErrDisplay(&error), "outbox unit of work (SeaORM): rollback failed");
    }
}
