//! The unit of work: one transaction for a command handler's writes and its
//! outbox rows. `#[outbox_handler]` expands to [`transaction`].

use std::future::Future;

use sqlx::{Acquire, PgConnection, PgPool, Postgres, Transaction};
use tracing::Instrument;

use crate::committable::{commit_checked_pooled, statement_error};
use crate::{Error, Events, retry};

/// Transaction isolation level of a unit of work.
///
/// Default: none set, so the database's default applies (PostgreSQL:
/// `READ COMMITTED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IsolationLevel {
    /// `READ COMMITTED`.
    ReadCommitted,
    /// `REPEATABLE READ` (snapshot isolation; may fail with SQLSTATE 40001).
    RepeatableRead,
    /// `SERIALIZABLE` (may fail with SQLSTATE 40001; pair it with retries).
    Serializable,
}

impl IsolationLevel {
    /// The statement that opens a transaction at this level, so choosing a level
    /// costs no extra round trip.
    fn begin_statement(self) -> &'static str {
        match self {
            Self::ReadCommitted => "BEGIN ISOLATION LEVEL READ COMMITTED",
            Self::RepeatableRead => "BEGIN ISOLATION LEVEL REPEATABLE READ",
            Self::Serializable => "BEGIN ISOLATION LEVEL SERIALIZABLE",
        }
    }
}

/// Anything a unit of work can open a transaction on: `&PgPool`, `PgPool`, or
/// `&mut PgConnection`.
///
/// A `&mut PgConnection` that is already inside a transaction gets a savepoint
/// (only without an isolation level, which PostgreSQL cannot change there); the
/// outbox rows then commit with the outer transaction.
pub trait TransactionSource: Send {
    /// Opens a transaction, at `isolation` if given.
    fn begin_transaction(
        &mut self,
        isolation: Option<IsolationLevel>,
    ) -> impl Future<Output = Result<Transaction<'_, Postgres>, sqlx::Error>> + Send;

    /// The database the transactions go to, so that a commit wakes only
    /// that database's relays in this process; `None` (the default, e.g. a
    /// bare connection) wakes them all.
    #[doc(hidden)]
    fn wakeup_scope(&self) -> Option<crate::wakeup::Scope> {
        None
    }

    /// Whether [`begin_transaction`](Self::begin_transaction) opens a
    /// pool's transaction: then a commit with nothing to insert checks and
    /// commits in one round trip ([`crate::commit_checked`]), and the empty
    /// transaction that leaves open ends at once, as the pool takes the
    /// connection back. On a bare connection it would stay open until the
    /// connection's next use, and in a savepoint the commit would end the
    /// outer transaction. `false` (the default) costs that round trip and
    /// is always right.
    #[doc(hidden)]
    fn opens_pool_transaction(&self) -> bool {
        false
    }
}

impl TransactionSource for &PgPool {
    async fn begin_transaction(
        &mut self,
        isolation: Option<IsolationLevel>,
    ) -> Result<Transaction<'_, Postgres>, sqlx::Error> {
        begin_on_pool(self, isolation).await
    }

    fn wakeup_scope(&self) -> Option<crate::wakeup::Scope> {
        crate::CommitTarget::wakeup_scope(self)
    }

    fn opens_pool_transaction(&self) -> bool {
        true
    }
}

impl TransactionSource for PgPool {
    async fn begin_transaction(
        &mut self,
        isolation: Option<IsolationLevel>,
    ) -> Result<Transaction<'_, Postgres>, sqlx::Error> {
        begin_on_pool(self, isolation).await
    }

    fn wakeup_scope(&self) -> Option<crate::wakeup::Scope> {
        crate::CommitTarget::wakeup_scope(self)
    }

    fn opens_pool_transaction(&self) -> bool {
        true
    }
}

async fn begin_on_pool(
    pool: &PgPool,
    isolation: Option<IsolationLevel>,
) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
    match isolation {
        Some(level) => pool.begin_with(level.begin_statement()).await,
        None => pool.begin().await,
    }
}

impl TransactionSource for &mut PgConnection {
    async fn begin_transaction(
        &mut self,
        isolation: Option<IsolationLevel>,
    ) -> Result<Transaction<'_, Postgres>, sqlx::Error> {
        match isolation {
            Some(level) => sqlx::Connection::begin_with(&mut **self, level.begin_statement()).await,
            None => (&mut **self).begin().await,
        }
    }
}

/// Starts building a unit of work on `source` (a pool or a connection).
///
/// `run` opens a transaction, runs your code with it and a fresh [`Events`]
/// collector, then inserts the recorded events into `outbox_event` (one
/// statement, after your writes: [`Events::write`]), commits, and wakes an
/// in-process relay ([`AfterCommit::committed`](crate::AfterCommit::committed)).
/// If your code returns `Err` (including a `?` early return), panics, or the
/// insert or commit fails, the transaction is rolled back and nothing of it
/// is written.
///
/// Your error type needs only `From<txoutbox_core::Error>` (framework failures:
/// begin, serialization, outbox insert, commit, are converted into it).
///
/// ```no_run
/// # #[derive(serde::Serialize, schemars::JsonSchema, txoutbox_core::DomainEvent)]
/// # #[event(topic = "orders", aggregate = "Order")]
/// # struct OrderCreated { event_id: uuid::Uuid, #[partition_key] order_id: i64 }
/// # async fn f(pool: sqlx::PgPool) -> Result<(), txoutbox_core::Error> {
/// use txoutbox_core::IsolationLevel;
///
/// let order_id: i64 = txoutbox_core::transaction(&pool)
///     .isolation(IsolationLevel::Serializable)
///     .retries(3)
///     .run(async |tx, events| {
///         let id: i64 = sqlx::query_scalar("INSERT INTO orders (amount) VALUES (42) RETURNING id")
///             .fetch_one(&mut **tx)
///             .await
///             .map_err(txoutbox_core::Error::from)?;
///         events.record(OrderCreated { event_id: uuid::Uuid::new_v4(), order_id: id });
///         Ok::<_, txoutbox_core::Error>(id)
///     })
///     .await?;
/// # Ok(()) }
/// ```
pub fn transaction<S: TransactionSource>(source: S) -> UnitOfWork<S> {
    UnitOfWork {
        source,
        isolation: None,
        name: None,
    }
}

/// A unit of work being configured; see [`transaction`].
#[derive(Debug)]
#[must_use = "a unit of work does nothing until `run` is awaited"]
pub struct UnitOfWork<S> {
    source: S,
    isolation: Option<IsolationLevel>,
    name: Option<&'static str>,
}

impl<S: TransactionSource> UnitOfWork<S> {
    /// Runs the transaction at `level` (default: the database's default).
    pub fn isolation(mut self, level: IsolationLevel) -> Self {
        self.isolation = Some(level);
        self
    }

    /// Names the handler in the unit of work's span (`outbox.unit_of_work`,
    /// field `handler`; default: empty). `#[outbox_handler]` sets the
    /// function's name. The span covers the attempts and the commit; events
    /// recorded inside it carry its trace context (see [`crate::trace`]).
    pub fn named(mut self, handler: &'static str) -> Self {
        self.name = Some(handler);
        self
    }

    fn span(&self) -> tracing::Span {
        tracing::info_span!("outbox.unit_of_work", handler = self.name.unwrap_or(""))
    }

    /// Re-runs the whole handler, in a fresh transaction with a fresh
    /// collector, up to `retries` more times when it fails with a
    /// serialization failure or a deadlock (SQLSTATE 40001 / 40P01), after a
    /// short jittered backoff (a few milliseconds, doubling, at most 100 ms).
    ///
    /// Default: no retry. The handler must then be `Clone` (each attempt runs
    /// a fresh clone, see [`RetryingUnitOfWork::run`]) and its error type must implement `std::error::Error + 'static`
    /// and keep the `sqlx::Error` in its `source()` chain (as `#[from]` /
    /// `#[source]` of thiserror do), so that a failure inside the handler can be
    /// recognized.
    pub fn retries(self, retries: u32) -> RetryingUnitOfWork<S> {
        RetryingUnitOfWork {
            inner: self,
            retries,
        }
    }

    /// Runs `handler` once in the transaction; see [`transaction`].
    pub async fn run<T, E, F>(mut self, handler: F) -> Result<T, E>
    where
        F: AsyncFnOnce(&mut Transaction<'_, Postgres>, &mut Events) -> Result<T, E>,
        E: From<Error>,
    {
        let span = self.span();
        async move {
            let scope = self.source.wakeup_scope();
            let pooled = self.source.opens_pool_transaction();
            let mut tx = begin(&mut self.source, self.isolation).await?;
            let mut events = Events::new();
            let outcome = handler(&mut tx, &mut events).await;
            finish(tx, events, outcome, scope, pooled)
                .await
                .map_err(Failure::into_user)
        }
        .instrument(span)
        .await
    }
}

/// A unit of work that retries on serialization failures; see [`UnitOfWork::retries`].
#[derive(Debug)]
#[must_use = "a unit of work does nothing until `run` is awaited"]
pub struct RetryingUnitOfWork<S> {
    inner: UnitOfWork<S>,
    retries: u32,
}

impl<S: TransactionSource> RetryingUnitOfWork<S> {
    /// Runs the transaction at `level` (default: the database's default).
    pub fn isolation(mut self, level: IsolationLevel) -> Self {
        self.inner.isolation = Some(level);
        self
    }

    /// Names the handler in the unit of work's span; see [`UnitOfWork::named`].
    pub fn named(mut self, handler: &'static str) -> Self {
        self.inner.name = Some(handler);
        self
    }

    /// Runs `handler`, again on serialization failure, at most `1 + retries` times.
    /// The error of the last attempt is returned when all fail.
    ///
    /// Each attempt runs a fresh clone of `handler`, so it starts from the same
    /// captured state: a closure capturing by reference (`async |tx, events|`)
    /// or owning `Clone` values (`async move |tx, events|`) works; one that
    /// mutates its captures does not compile (count attempts with an atomic).
    pub async fn run<T, E, F>(self, handler: F) -> Result<T, E>
    where
        F: AsyncFnOnce(&mut Transaction<'_, Postgres>, &mut Events) -> Result<T, E> + Clone,
        E: From<Error> + std::error::Error + 'static,
    {
        let span = self.inner.span();
        self.run_attempts(handler).instrument(span).await
    }

    async fn run_attempts<T, E, F>(mut self, handler: F) -> Result<T, E>
    where
        F: AsyncFnOnce(&mut Transaction<'_, Postgres>, &mut Events) -> Result<T, E> + Clone,
        E: From<Error> + std::error::Error + 'static,
    {
        let mut retried = 0;
        loop {
            // An owned clone per attempt rather than `AsyncFnMut`: the futures of
            // an `AsyncFnMut` borrow the closure, and rustc then fails to prove
            // the caller's future `Send` (higher-ranked auto-trait inference,
            // rust-lang/rust#110338), which would make handlers unusable in
            // `tokio::spawn` or axum.
            let scope = self.inner.source.wakeup_scope();
            let pooled = self.inner.source.opens_pool_transaction();
            let mut tx = begin(&mut self.inner.source, self.inner.isolation).await?;
            let mut events = Events::new();
            let outcome = handler.clone()(&mut tx, &mut events).await;
            let failure = match finish(tx, events, outcome, scope, pooled).await {
                Ok(output) => return Ok(output),
                Err(failure) => failure,
            };
            let retryable = match &failure {
                Failure::Handler(error) => retry::is_serialization_failure(error),
                Failure::Framework(error) => retry::is_serialization_failure(error),
            };
            if !retryable || retried == self.retries {
                return Err(failure.into_user());
            }
            retried += 1;
            tracing::debug!(
                attempt = retried + 1,
                "outbox unit of work: retrying after a serialization failure"
            );
            tokio::time::sleep(retry::TRANSACTION_RETRY.delay(retried)).await;
        }
    }
}

/// Who failed an attempt: the handler (its own error) or the framework.
pub(crate) enum Failure<E> {
    Handler(E),
    Framework(Error),
}

impl<E: From<Error>> Failure<E> {
    pub(crate) fn into_user(self) -> E {
        match self {
            Self::Handler(error) => error,
            Self::Framework(error) => E::from(error),
        }
    }
}

/// Opens the transaction of one attempt.
async fn begin<S: TransactionSource>(
    source: &mut S,
    isolation: Option<IsolationLevel>,
) -> Result<Transaction<'_, Postgres>, Error> {
    Ok(source.begin_transaction(isolation).await?)
}

/// Ends one attempt after the handler ran: on its success inserts the events,
/// commits and wakes the relay; otherwise rolls back.
///
/// A panic in the handler never reaches this: it unwinds through the caller,
/// where dropping the transaction queues a rollback that sqlx runs before the
/// connection is used again, so no half-open transaction survives it.
async fn finish<T, E>(
    mut tx: Transaction<'_, Postgres>,
    mut events: Events,
    outcome: Result<T, E>,
    scope: Option<crate::wakeup::Scope>,
    pooled: bool,
) -> Result<T, Failure<E>> {
    let output = match outcome {
        Ok(output) => output,
        Err(error) => {
            rollback(tx).await;
            return Err(Failure::Handler(error));
        }
    };
    // A deferred serialization failure fails the attempt before anything is
    // sent. The insert is the first statement after the handler's: if the
    // handler left the transaction aborted, it fails with 25P02, which says
    // so. With nothing to insert, a statement asks (see `check_committable`):
    // in the commit's round trip when the transaction is a pool's.
    let checked_with_commit = pooled && events.is_empty();
    let written = match checked_with_commit {
        true => events.write(&mut tx).await,
        false => events.write_last(&mut tx).await,
    };
    let after_commit = match written {
        Ok(after_commit) => after_commit,
        Err(error) => {
            rollback(tx).await;
            return Err(Failure::Framework(error));
        }
    };
    // A failed commit (deferred constraint, serialization failure) has rolled
    // the transaction back on the server; nothing to undo here. An aborted or
    // ended transaction is the handler's doing and says so.
    let committed = match checked_with_commit {
        true => commit_checked_pooled(tx).await,
        false => tx.commit().await.map_err(statement_error),
    };
    committed.map_err(Failure::Framework)?;
    after_commit.committed_in(scope);
    Ok(output)
}

/// Rolls back eagerly so the connection is clean when the error reaches the
/// caller. Its own failure is not reported: the caller's error matters more,
/// and a connection that cannot roll back is closed by sqlx.
async fn rollback(tx: Transaction<'_, Postgres>) {
    if let Err(error) = tx.rollback().await {
        tracing::debug!(error = %crate::DbErrorDisplay(&error), "outbox unit of work: rollback failed");
    }
}
