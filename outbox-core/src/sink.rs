//! The event sink: the one operation that writes what a collector recorded
//! ([`Events::write`]), used by the unit of work, the test helper and the
//! runtime's consumers, and what it leaves to do after the commit.

use sqlx::PgConnection;

use crate::{Error, Events, check_committable, committable, insert, wakeup};

impl Events {
    /// Writes what was recorded, on `conn` (use `&mut *tx`, or `&mut tx`,
    /// inside your transaction): the one way recorded events reach the
    /// database, used by the unit of work, the test helper and the consumers.
    ///
    /// In order, before anything is sent: the deferred failure of
    /// [`record`](Events::record) and its siblings (taken out, and returned
    /// as it is: [`Error::Serialize`], [`Error::PayloadNotObject`] or
    /// [`Error::PartitionKeyTooLong`]); then every partition key, including
    /// those of [prepared](Events::record_prepared) records. Then the
    /// immediate records go into `outbox_event` and the scheduled ones into
    /// `outbox_scheduled`, one statement each ([`insert_events`](crate::insert_events));
    /// a collector with no event sends nothing. A failed statement is
    /// [`Error::TransactionAborted`] or [`Error::TransactionEnded`] when the
    /// transaction could no longer commit (the code before left it so), or
    /// [`Error::Database`].
    ///
    /// Returns what to do once the transaction commits: call
    /// [`AfterCommit::committed_on`] with the pool then, so that a relay in
    /// this process publishes at once instead of at its next poll.
    ///
    /// ```no_run
    /// # #[derive(serde::Serialize, schemars::JsonSchema, txoutbox_core::DomainEvent)]
    /// # #[event(topic = "orders", aggregate = "Order")]
    /// # struct PaymentTimedOut { event_id: uuid::Uuid, #[partition_key] order_id: i64 }
    /// # async fn f(pool: sqlx::PgPool) -> Result<(), txoutbox_core::Error> {
    /// use std::time::Duration;
    ///
    /// let mut events = txoutbox_core::Events::new();
    /// events.record_after(
    ///     PaymentTimedOut { event_id: uuid::Uuid::now_v7(), order_id: 7 },
    ///     Duration::from_secs(900),
    /// );
    /// let mut tx = pool.begin().await?;
    /// // ... your own statements on &mut *tx ...
    /// let after_commit = events.write(&mut tx).await?;
    /// assert_eq!(after_commit.rows(), 1);
    /// tx.commit().await?;
    /// after_commit.committed_on(&pool);
    /// # Ok(()) }
    /// ```
    pub async fn write(&mut self, conn: &mut PgConnection) -> Result<AfterCommit, Error> {
        self.take_failure()?;
        let rows = insert::insert_events(conn, self)
            .await
            .map_err(committable::statement_error)?;
        Ok(AfterCommit { rows })
    }

    /// [`write`](Events::write) at the end of a transaction the framework
    /// commits after the handler's code: with nothing to write, one
    /// statement checks that the transaction can still commit
    /// ([`check_committable`]), since no insert proves it.
    pub(crate) async fn write_last(
        &mut self,
        conn: &mut PgConnection,
    ) -> Result<AfterCommit, Error> {
        let after_commit = self.write(&mut *conn).await?;
        if self.is_empty() {
            check_committable(conn).await?;
        }
        Ok(after_commit)
    }
}

/// What [`Events::write`] leaves to do once its transaction commits: wake a
/// relay running in this process if rows were written.
///
/// The wake-up is an optimisation, never needed for correctness (the relay
/// polls), but without it an event waits for the relay's next poll. Call
/// [`committed`](AfterCommit::committed) only after a successful commit:
/// after a rollback there is nothing to publish, so drop the value.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[must_use = "call `committed_on(&pool)` after the transaction commits, so that a relay in this process publishes the events at once"]
pub struct AfterCommit {
    rows: u64,
}

impl AfterCommit {
    /// For `rows` written by another path than [`Events::write`] (the
    /// SeaORM and MySQL inserts).
    #[cfg(any(feature = "sea-orm", feature = "mysql"))]
    pub(crate) fn for_rows(rows: u64) -> Self {
        Self { rows }
    }

    /// The rows written, immediate and scheduled together.
    pub fn rows(self) -> u64 {
        self.rows
    }

    /// Both writes, for one transaction that wrote several collectors: the
    /// relay is woken if either wrote rows.
    ///
    /// ```
    /// use txoutbox_core::AfterCommit;
    ///
    /// let nothing = AfterCommit::default();
    /// assert_eq!(nothing.and(AfterCommit::default()).rows(), 0);
    /// ```
    pub fn and(self, other: AfterCommit) -> AfterCommit {
        AfterCommit {
            rows: self.rows.saturating_add(other.rows),
        }
    }

    /// The transaction committed: wakes the relays of this process if rows
    /// were written (a scheduled event is moved by the relay's scheduler
    /// when due, whether or not it is woken).
    ///
    /// This names no database, so it wakes every relay of the process, those
    /// of other databases too (they find nothing and wait again). Prefer
    /// [`committed_on`](Self::committed_on) where the pool is at hand.
    pub fn committed(self) {
        self.committed_in(None);
    }

    /// The transaction committed to `database` (the pool it ran on): wakes
    /// the relays of this process that publish from that database, if rows
    /// were written. A process with several services, each with a database
    /// of its own, then wakes only the one relay that has work.
    ///
    /// `database` is a `PgPool`; with the `mysql` feature a `MySqlPool`; with
    /// `sea-orm` a `DatabaseConnection`. The database is known by its name in
    /// the pool's settings; a pool whose settings name none wakes every
    /// relay, as [`committed`](Self::committed) does.
    ///
    /// ```no_run
    /// # #[derive(serde::Serialize, schemars::JsonSchema, txoutbox_core::DomainEvent)]
    /// # #[event(topic = "orders", aggregate = "Order")]
    /// # struct OrderCreated { event_id: uuid::Uuid, #[partition_key] order_id: i64 }
    /// # async fn f(pool: sqlx::PgPool) -> Result<(), txoutbox_core::Error> {
    /// let mut events = txoutbox_core::Events::new();
    /// events.record(OrderCreated { event_id: uuid::Uuid::now_v7(), order_id: 7 });
    /// let mut tx = pool.begin().await?;
    /// let after_commit = events.write(&mut tx).await?;
    /// tx.commit().await?;
    /// after_commit.committed_on(&pool);
    /// # Ok(()) }
    /// ```
    pub fn committed_on(self, database: &impl CommitTarget) {
        self.committed_in(database.wakeup_scope());
    }

    /// As [`committed`](Self::committed), naming the database the
    /// transaction went to, so that only its relays are woken.
    pub(crate) fn committed_in(self, scope: Option<wakeup::Scope>) {
        if self.rows > 0 {
            wakeup::notify_committed_in(scope);
        }
    }
}

/// A database a transaction commits to, as
/// [`AfterCommit::committed_on`] names it: `PgPool`; with the `mysql`
/// feature `MySqlPool`; with `sea-orm` SeaORM's `DatabaseConnection`.
///
/// Sealed: the wake-up knows these pools' settings only.
pub trait CommitTarget: sealed::Sealed {
    /// The scope of this database's relays; `None` if its settings name no
    /// database.
    #[doc(hidden)]
    fn wakeup_scope(&self) -> Option<wakeup::Scope>;
}

mod sealed {
    pub trait Sealed {}
    impl<T: Sealed + ?Sized> Sealed for &T {}
    impl Sealed for sqlx::PgPool {}
    #[cfg(feature = "mysql")]
    impl Sealed for sqlx::MySqlPool {}
    #[cfg(feature = "sea-orm")]
    impl Sealed for ::sea_orm::DatabaseConnection {}
}

impl<T: CommitTarget + ?Sized> CommitTarget for &T {
    fn wakeup_scope(&self) -> Option<wakeup::Scope> {
        (**self).wakeup_scope()
    }
}

impl CommitTarget for sqlx::PgPool {
    fn wakeup_scope(&self) -> Option<wakeup::Scope> {
        wakeup::Scope::of_database(self.connect_options().get_database())
    }
}

#[cfg(feature = "mysql")]
impl CommitTarget for sqlx::MySqlPool {
    fn wakeup_scope(&self) -> Option<wakeup::Scope> {
        wakeup::Scope::of_database(self.connect_options().get_database())
    }
}

#[cfg(feature = "sea-orm")]
impl CommitTarget for ::sea_orm::DatabaseConnection {
    fn wakeup_scope(&self) -> Option<wakeup::Scope> {
        match &self.inner {
            ::sea_orm::DatabaseConnectionType::SqlxPostgresPoolConnection(_) => {
                self.get_postgres_connection_pool().wakeup_scope()
            }
            // Another backend (a mock in a user's tests, a disconnected
            // value): no pool settings to read; wake every relay.
            _ => None,
        }
    }
}
