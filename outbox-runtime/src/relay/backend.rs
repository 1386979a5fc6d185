//! The relay's one seam to its database: everything the relay's loop, its
//! lanes and its scheduler ask of the database, as one trait with an
//! implementation per backend, each in a module of its own SQL
//! (`postgres.rs`; `mysql/`, feature `mysql`).
//!
//! The loop is generic over it, so each backend's relay is compiled on its
//! own: no backend pays for another one's existence, and no loop asks which
//! database it runs on.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::membership::{Expired, Identity, JoinError, Renewal};
use super::store::{ClaimedRow, Retry, Settlement};

/// What joining the relays of a database gives a relay: its own session,
/// marked, and its membership.
#[derive(Debug)]
pub(crate) struct Joined<C> {
    /// The relay's own connection (lane locks, claims, marks).
    pub conn: C,
    /// The mark set on that session.
    pub session: Uuid,
    /// The session's id on the server (PostgreSQL's backend pid, MySQL's
    /// connection id).
    pub backend_id: i64,
    /// The membership table records the topics this relay holds.
    pub records_held_topics: bool,
}

/// What one move of due scheduled rows did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Moved {
    /// Due rows taken out of `outbox_scheduled` (at most the limit).
    pub taken: i64,
    /// Rows inserted into `outbox_event` (fewer than `taken` only when an
    /// event id was in `outbox_event` already: that copy wins).
    pub inserted: i64,
}

/// A database the relay runs on: the service's pool is the value, the
/// relay's own session is [`Backend::Conn`].
///
/// Every statement named here runs within the caller's `database_timeout`
/// (the caller bounds it), and the ones on `Conn` only on the relay's own
/// session, whose end frees its lanes.
pub(crate) trait Backend: Clone + Send + Sync + 'static {
    /// The relay's own connection: a session that holds its lanes.
    type Conn: Send + 'static;

    /// Opens the relay's own session (configured for claims and marks, with
    /// a bound on how long the server keeps it after the relay's host went
    /// silent), marks it as the relay's, and joins the membership (refused
    /// for another lane count).
    fn join(
        &self,
        identity: &Identity,
    ) -> impl Future<Output = Result<Joined<Self::Conn>, JoinError>> + Send;

    /// Renews the lease (recording whether the relay reaches its broker and
    /// the held topics, a JSON array, where the table has them), checking
    /// that the statement ran on the session marked `session`.
    fn renew(
        conn: &mut Self::Conn,
        session: Uuid,
        backend_id: i64,
        broker_failing: bool,
        held_topics: Option<&str>,
    ) -> impl Future<Output = sqlx::Result<Renewal>> + Send;

    /// Ends the sessions of live members whose lease expired (freeing their
    /// lanes) and forgets the rows of ended sessions.
    fn evict_expired(
        conn: &mut Self::Conn,
    ) -> impl Future<Output = sqlx::Result<Vec<Expired>>> + Send;

    /// Live members, and those of them that reach their broker.
    fn census(conn: &mut Self::Conn) -> impl Future<Output = sqlx::Result<(u32, u32)>> + Send;

    /// Takes lane `lane` for this session if nobody holds it; whether it did.
    fn try_lock_lane(
        conn: &mut Self::Conn,
        lane: i32,
    ) -> impl Future<Output = sqlx::Result<bool>> + Send;

    /// Gives lane `lane` back.
    fn unlock_lane(
        conn: &mut Self::Conn,
        lane: i32,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// Leaves the membership and closes the session (graceful shutdown).
    fn leave(conn: Self::Conn) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// An error that shows the session is shared with other clients (a
    /// transaction-mode pooler): statements prepared on it are unknown, or
    /// exist already.
    fn shows_shared_session(error: &sqlx::Error) -> bool;

    /// Claims up to `limit` publishable rows of `lanes` (of `lane_count`)
    /// in id order, leaving out `in_flight` and the rows of `held_topics`,
    /// and the rows of a key of a topic whose earlier row waits for a retry.
    fn claim(
        conn: &mut Self::Conn,
        lane_count: u32,
        lanes: &[i32],
        in_flight: &[i64],
        held_topics: &[String],
        limit: usize,
    ) -> impl Future<Output = sqlx::Result<Vec<ClaimedRow>>> + Send;

    /// Marks `delivered` published, then records `retries` (parking the rows
    /// that reached `max_attempts`, or whose retry cannot be recorded).
    fn settle(
        conn: &mut Self::Conn,
        delivered: &[i64],
        retries: &[Retry],
        max_attempts: u32,
    ) -> impl Future<Output = sqlx::Result<Settlement>> + Send;

    /// Lets rows held back for an unavailable partition be claimed at once.
    fn release_held(
        conn: &mut Self::Conn,
        ids: &[i64],
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;

    /// Unpublished, unparked rows and the age of the oldest, in seconds.
    fn backlog(&self) -> impl Future<Output = sqlx::Result<(i64, f64)>> + Send;

    /// Moves up to `limit` due scheduled rows into `outbox_event`, in due
    /// order, one relay at a time.
    fn move_due(&self, limit: usize) -> impl Future<Output = sqlx::Result<Moved>> + Send;

    /// Seconds until the earliest due scheduled row (negative: due already),
    /// `None` if nothing is scheduled.
    fn next_due_in(&self) -> impl Future<Output = sqlx::Result<Option<f64>>> + Send;

    /// Scheduled rows not moved yet.
    fn scheduled_pending(&self) -> impl Future<Output = sqlx::Result<i64>> + Send;

    /// The error of a statement on a table that does not exist (a schema
    /// that predates scheduled delivery).
    fn is_undefined_table(error: &sqlx::Error) -> bool;

    /// Starts the task that wakes the relay when another process commits
    /// outbox rows (`listen_notify`); a backend without such notifications
    /// refuses the setting at build time.
    fn spawn_listener(&self, wake: Arc<Notify>, cancel: CancellationToken);

    /// The database's name, from the pool's settings (CloudEvents' default
    /// source).
    fn database_name(&self) -> Option<String>;
}
