//! The relay on PostgreSQL: [`Backend`] for a `PgPool`. Its SQL lives in
//! the relay's PostgreSQL modules: claims and marks in `store.rs`, the
//! membership in `membership.rs`, the session's settings in `session.rs`,
//! the scheduler's moves in `scheduler.rs`, `LISTEN` in `wakeup.rs`.

use std::sync::Arc;

use sqlx::{Connection, PgConnection, PgPool};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::backend::{Backend, Joined, Moved};
use super::membership::{self, Expired, Identity, JoinError, LANE_LOCK, Renewal};
use super::store::{self, ClaimedRow, Retry, Settlement};
use super::{scheduler, session, wakeup};

/// The relay's own session on PostgreSQL.
#[derive(Debug)]
pub(crate) struct PgSession {
    conn: PgConnection,
    /// `server_version_num`, for what older servers lack.
    server_version: u32,
}

impl Backend for PgPool {
    type Conn = PgSession;

    async fn join(&self, identity: &Identity) -> Result<Joined<PgSession>, JoinError> {
        let mut conn = PgConnection::connect_with(&self.connect_options()).await?;
        let server_version = conn.server_version_num().unwrap_or(0);
        store::configure_connection(&mut conn).await?;
        session::configure_keepalive(&mut conn, identity.lease, server_version).await?;
        let (session, backend_pid) = session::claim_session(&mut conn).await?;
        membership::join(&mut conn, session, identity).await?;
        let records_held_topics = membership::records_held_topics(&mut conn).await?;
        Ok(Joined {
            conn: PgSession {
                conn,
                server_version,
            },
            session,
            backend_id: i64::from(backend_pid),
            records_held_topics,
        })
    }

    async fn renew(
        session: &mut PgSession,
        mark: Uuid,
        backend_id: i64,
        broker_failing: bool,
        held_topics: Option<&str>,
    ) -> sqlx::Result<Renewal> {
        membership::renew(
            &mut session.conn,
            mark,
            backend_id as i32,
            broker_failing,
            held_topics,
        )
        .await
    }

    async fn evict_expired(session: &mut PgSession) -> sqlx::Result<Vec<Expired>> {
        membership::evict_expired(&mut session.conn, session.server_version).await
    }

    async fn census(session: &mut PgSession) -> sqlx::Result<(u32, u32)> {
        membership::census(&mut session.conn).await
    }

    async fn try_lock_lane(session: &mut PgSession, lane: i32) -> sqlx::Result<bool> {
        sqlx::query_scalar("SELECT pg_try_advisory_lock($1, $2)")
            .bind(LANE_LOCK)
            .bind(lane)
            .fetch_one(&mut session.conn)
            .await
    }

    async fn unlock_lane(session: &mut PgSession, lane: i32) -> sqlx::Result<()> {
        sqlx::query("SELECT pg_advisory_unlock($1, $2)")
            .bind(LANE_LOCK)
            .bind(lane)
            .execute(&mut session.conn)
            .await
            .map(|_| ())
    }

    async fn leave(mut session: PgSession) -> sqlx::Result<()> {
        sqlx::query("DELETE FROM outbox_relay_member WHERE backend_pid = pg_backend_pid()")
            .execute(&mut session.conn)
            .await?;
        session.conn.close().await
    }

    /// PostgreSQL's "prepared statement already exists" / "does not exist":
    /// a pooler handing statements to other server sessions (PgBouncer in
    /// transaction or statement mode before 1.21).
    fn shows_shared_session(error: &sqlx::Error) -> bool {
        let code = match error {
            sqlx::Error::Database(db) => db.code(),
            _ => None,
        };
        matches!(code.as_deref(), Some("42P05" | "26000"))
    }

    async fn claim(
        session: &mut PgSession,
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
        session: &mut PgSession,
        delivered: &[i64],
        retries: &[Retry],
        max_attempts: u32,
    ) -> sqlx::Result<Settlement> {
        store::settle(&mut session.conn, delivered, retries, max_attempts).await
    }

    async fn release_held(session: &mut PgSession, ids: &[i64]) -> sqlx::Result<u64> {
        store::release_held(&mut session.conn, ids).await
    }

    async fn backlog(&self) -> sqlx::Result<(i64, f64)> {
        store::backlog(self).await
    }

    async fn move_due(&self, limit: usize) -> sqlx::Result<Moved> {
        scheduler::move_due(self, limit).await
    }

    async fn next_due_in(&self) -> sqlx::Result<Option<f64>> {
        scheduler::next_due_in(self).await
    }

    async fn scheduled_pending(&self) -> sqlx::Result<i64> {
        scheduler::scheduled_pending(self).await
    }

    /// `undefined_table`.
    fn is_undefined_table(error: &sqlx::Error) -> bool {
        error
            .as_database_error()
            .and_then(|e| e.code())
            .is_some_and(|code| code == "42P01")
    }

    fn spawn_listener(&self, wake: Arc<Notify>, cancel: CancellationToken) {
        wakeup::spawn_listener(self, wake, cancel);
    }

    fn database_name(&self) -> Option<String> {
        self.connect_options().get_database().map(str::to_owned)
    }
}
