//! The relay on MariaDB >= 10.6 (feature `mysql`): [`Backend`] for a
//! `MySqlPool`, with SQL of its own. Where MySQL differs from PostgreSQL:
//!
//! - **Lanes and members are named locks** (`GET_LOCK`), session locks the
//!   server releases when the session ends, as PostgreSQL's advisory locks.
//!   Their names are server-wide, so every name carries the database's
//!   (`obx:<database>:l<lane>`, see [`LockNames`]): two services on one
//!   server never share lanes.
//! - **No `LISTEN`**: a relay wakes at once on commits of its own process
//!   and sees others' within `poll_interval` (`listen_notify` is refused).
//! - **Isolation**: the relay's session runs at `READ COMMITTED`, so a
//!   claim (`FOR UPDATE SKIP LOCKED`) locks the rows it returns and no gaps,
//!   and its marks lock no gaps either. A server whose binary log is
//!   statement-based refuses such writes: the relay says so at start.
//! - **No `UPDATE .. RETURNING`, no arrays**: lists travel as JSON arrays,
//!   read with `JSON_TABLE` and joined on the primary key; a settlement's
//!   two writes share one short transaction.
//! - **A vanished host**: the server ends an idle session after
//!   `wait_timeout`, set on the relay's session to twice its lease (the
//!   relay speaks at least every lease / 3), which frees its locks; a
//!   relay whose lease expired is ended by the others with `KILL`.

mod membership;
mod store;

#[cfg(feature = "test-hooks")]
pub use store::explain_claim;

use std::sync::Arc;

use sqlx::MySqlPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::backend::{Backend, Joined, Moved};
use super::membership::{Expired, Identity, JoinError, Renewal};
use super::store::{ClaimedRow, Retry, Settlement};

/// The relay's database on MariaDB: the service's pool and the names of
/// the locks of this database.
#[derive(Debug, Clone)]
pub(crate) struct MySqlRelay {
    pool: MySqlPool,
    names: Arc<LockNames>,
}

impl MySqlRelay {
    pub(crate) fn new(pool: MySqlPool) -> Self {
        let database = pool
            .connect_options()
            .get_database()
            .unwrap_or_default()
            .to_owned();
        Self {
            pool,
            names: Arc::new(LockNames::new(&database)),
        }
    }
}

/// The relay's own session on MariaDB.
#[derive(Debug)]
pub(crate) struct MySqlSession {
    conn: sqlx::MySqlConnection,
    names: Arc<LockNames>,
}

/// Names of the relay's named locks in one database. MySQL limits a lock
/// name to 64 characters: a database name longer than 40 is shortened to
/// 31 characters and a hash of the whole.
#[derive(Debug)]
pub(crate) struct LockNames {
    /// `obx:<database>:`
    prefix: String,
}

impl LockNames {
    pub(crate) fn new(database: &str) -> Self {
        let shown = if database.chars().count() <= 40 {
            database.to_owned()
        } else {
            let head: String = database.chars().take(31).collect();
            format!("{head}~{:08x}", fnv1a(database.as_bytes()) as u32)
        };
        Self {
            prefix: format!("obx:{shown}:"),
        }
    }

    /// Followed by a connection id: the lock that makes that session a
    /// live member.
    pub(crate) fn member_prefix(&self) -> String {
        format!("{}m", self.prefix)
    }

    /// Followed by a lane number: that lane's lock.
    pub(crate) fn lane_prefix(&self) -> String {
        format!("{}l", self.prefix)
    }

    /// The lock of lane `lane`.
    fn lane(&self, lane: i32) -> String {
        format!("{}{lane}", self.lane_prefix())
    }

    /// The lock that serializes joins.
    fn join(&self) -> String {
        format!("{}join", self.prefix)
    }

    /// The lock that serializes the scheduler's moves.
    fn schedule(&self) -> String {
        format!("{}sched", self.prefix)
    }
}

/// FNV-1a (64 bit): the same on every machine and version, unlike std's
/// hasher, so every relay shortens a long database name alike.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// MySQL's error number of a database error.
pub(crate) fn error_number(error: &sqlx::Error) -> Option<u16> {
    error
        .as_database_error()?
        .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
        .map(|e| e.number())
}

/// `ER_NO_SUCH_TABLE`.
pub(crate) const NO_SUCH_TABLE: u16 = 1146;

impl Backend for MySqlRelay {
    type Conn = MySqlSession;

    async fn join(&self, identity: &Identity) -> Result<Joined<MySqlSession>, JoinError> {
        let (conn, session, backend_id) =
            membership::join(&self.pool, &self.names, identity).await?;
        Ok(Joined {
            conn: MySqlSession {
                conn,
                names: Arc::clone(&self.names),
            },
            session,
            backend_id,
            records_held_topics: true,
        })
    }

    async fn renew(
        session: &mut MySqlSession,
        mark: Uuid,
        backend_id: i64,
        broker_failing: bool,
        held_topics: Option<&str>,
    ) -> sqlx::Result<Renewal> {
        membership::renew(
            &mut session.conn,
            mark,
            backend_id,
            broker_failing,
            held_topics,
        )
        .await
    }

    async fn evict_expired(session: &mut MySqlSession) -> sqlx::Result<Vec<Expired>> {
        membership::evict_expired(&mut session.conn, &session.names).await
    }

    async fn census(session: &mut MySqlSession) -> sqlx::Result<(u32, u32)> {
        membership::census(&mut session.conn, &session.names).await
    }

    async fn try_lock_lane(session: &mut MySqlSession, lane: i32) -> sqlx::Result<bool> {
        let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
            .bind(session.names.lane(lane))
            .fetch_one(&mut session.conn)
            .await?;
        Ok(got == Some(1))
    }

    async fn unlock_lane(session: &mut MySqlSession, lane: i32) -> sqlx::Result<()> {
        sqlx::query("DO RELEASE_LOCK(?)")
            .bind(session.names.lane(lane))
            .execute(&mut session.conn)
            .await
            .map(|_| ())
    }

    async fn leave(session: MySqlSession) -> sqlx::Result<()> {
        membership::leave(session.conn).await
    }

    /// MySQL's "Unknown prepared statement handler" (1243): the statement
    /// was prepared on another server session, i.e. a proxy multiplexing
    /// clients over sessions.
    fn shows_shared_session(error: &sqlx::Error) -> bool {
        error_number(error) == Some(1243)
    }

    async fn claim(
        session: &mut MySqlSession,
        lane_count: u32,
        lanes: &[i32],
        in_flight: &[i64],
        held_topics: &[String],
        limit: usize,
    ) -> sqlx::Result<Vec<ClaimedRow>> {
        store::claim(
            &mut session.conn,
            lane_count,
            lanes,
            in_flight,
            held_topics,
            limit,
        )
        .await
    }

    async fn settle(
        session: &mut MySqlSession,
        delivered: &[i64],
        retries: &[Retry],
        max_attempts: u32,
    ) -> sqlx::Result<Settlement> {
        super::store::settle(&mut session.conn, delivered, retries, max_attempts).await
    }

    async fn release_held(session: &mut MySqlSession, ids: &[i64]) -> sqlx::Result<u64> {
        store::release_held(&mut session.conn, ids).await
    }

    async fn backlog(&self) -> sqlx::Result<(i64, f64)> {
        store::backlog(&self.pool).await
    }

    async fn move_due(&self, limit: usize) -> sqlx::Result<Moved> {
        store::move_due(&self.pool, &self.names, limit).await
    }

    async fn next_due_in(&self) -> sqlx::Result<Option<f64>> {
        store::next_due_in(&self.pool).await
    }

    async fn scheduled_pending(&self) -> sqlx::Result<i64> {
        store::scheduled_pending(&self.pool).await
    }

    fn is_undefined_table(error: &sqlx::Error) -> bool {
        error_number(error) == Some(NO_SUCH_TABLE)
    }

    /// Never called: `build` refuses `listen_notify` on MySQL.
    fn spawn_listener(&self, _wake: Arc<Notify>, _cancel: CancellationToken) {}

    fn database_name(&self) -> Option<String> {
        self.pool
            .connect_options()
            .get_database()
            .map(str::to_owned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_names_carry_the_database_and_fit_mysql() {
        let names = LockNames::new("orders");
        assert_eq!(names.lane(7), "obx:orders:l7");
        assert_eq!(names.join(), "obx:orders:join");
        let long = "a".repeat(64);
        let names = LockNames::new(&long);
        assert!(names.lane(i32::MAX).len() <= 64, "{}", names.lane(i32::MAX));
        assert!(
            format!("{}{}", names.member_prefix(), u32::MAX).len() <= 64,
            "member lock names fit"
        );
        assert_ne!(
            LockNames::new(&format!("{long}x")).prefix,
            LockNames::new(&format!("{long}y")).prefix,
            "two long names that share their head get different locks"
        );
    }
}
