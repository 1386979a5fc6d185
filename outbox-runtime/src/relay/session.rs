//! The relay's own connection: a database session of its own (marked and
//! checked, see [`claim_session`]), server-side keepalive, and a bound on
//! every operation run on it.

use std::future::Future;
use std::time::Duration;

use sqlx::PgConnection;
use uuid::Uuid;

use super::membership::JoinError;

/// Session variable marking the relay's own session (see [`claim_session`]).
const SESSION_SETTING: &str = "outbox.relay_session";

/// An error standing for "the relay's own connection did not answer in time".
pub(crate) fn timed_out(limit: Duration, what: &str) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!(
            "the relay's own database connection did not answer within {limit:?} ({what}); \
             it is dropped with its lanes"
        ),
    ))
}

/// Runs one operation on the relay's own connection, at most `limit`: a
/// frozen connection (a partition that keeps the socket open) would
/// otherwise hang the relay for as long as TCP keeps it.
pub(crate) async fn bounded<T>(
    limit: Duration,
    what: &str,
    operation: impl Future<Output = sqlx::Result<T>>,
) -> sqlx::Result<T> {
    match tokio::time::timeout(limit, operation).await {
        Ok(result) => result,
        Err(_elapsed) => Err(timed_out(limit, what)),
    }
}

/// Marks the fresh session as the relay's own and checks that it was fresh.
///
/// The relay's lanes are session state (advisory locks). Behind a
/// transaction-mode pooler (PgBouncer `pool_mode = transaction`) consecutive
/// statements may run on different server sessions, and one server session
/// may serve several relays: locks would then be owned by whoever runs on
/// that session next. A session variable set here and checked at every
/// renewal exposes both: a "new" session that already carries a relay's
/// mark, or a renewal that finds another mark or none.
pub(crate) async fn claim_session(conn: &mut PgConnection) -> Result<(Uuid, i32), JoinError> {
    let (existing, pid): (Option<String>, i32) = sqlx::query_as(
        "SELECT NULLIF(current_setting('outbox.relay_session', true), ''), pg_backend_pid()",
    )
    .fetch_one(&mut *conn)
    .await?;
    if let Some(existing) = existing {
        return Err(JoinError::SharedSession(format!(
            "a new connection already carries relay session {existing}"
        )));
    }
    let session = Uuid::new_v4();
    sqlx::query("SELECT set_config($1, $2, false)")
        .bind(SESSION_SETTING)
        .bind(session.to_string())
        .execute(&mut *conn)
        .await?;
    Ok((session, pid))
}

/// Server-side settings of the relay's own connection: how soon PostgreSQL
/// notices that the relay's host vanished (power loss, partition) when no
/// other relay ends the session first.
///
/// TCP keepalive probes start after `lease` of silence, every `lease / 5`,
/// five of them; `tcp_user_timeout` bounds how long data sent to the relay
/// may stay unacknowledged. Either way the session, and its locks, end about
/// `2 x lease` after the host went silent. On PostgreSQL 14 and later,
/// `client_connection_check_interval` also lets a running statement notice a
/// closed connection.
pub(crate) async fn configure_keepalive(
    conn: &mut PgConnection,
    lease: Duration,
    server_version: u32,
) -> sqlx::Result<()> {
    let idle = lease.as_secs().max(1);
    let interval = (lease.as_secs() / 5).max(1);
    let user_timeout_ms = (lease.as_millis() * 2).max(1000);
    let mut settings = format!(
        "SET tcp_keepalives_idle = {idle}; SET tcp_keepalives_interval = {interval}; \
         SET tcp_keepalives_count = 5;"
    );
    if server_version >= 120_000 {
        settings.push_str(&format!(" SET tcp_user_timeout = {user_timeout_ms};"));
    }
    if server_version >= 140_000 {
        settings.push_str(" SET client_connection_check_interval = 2000;");
    }
    sqlx::raw_sql(sqlx::AssertSqlSafe(settings))
        .execute(conn)
        .await
        .map(|_| ())
}
