//! The relay's own session and its membership on MariaDB
//! (`outbox_relay_member`, MySQL migration 0002): the session's settings and
//! mark, joining under the join lock, renewals, the census and ending the
//! sessions of relays whose lease expired. A member is live while its
//! session holds its member lock, `obx:<database>:m<connection id>`.

use std::time::Duration;

use sqlx::{Connection, MySqlConnection, MySqlPool};
use uuid::Uuid;

use super::{LockNames, NO_SUCH_TABLE, error_number};
use crate::relay::membership::{Expired, Identity, JoinError, Member, Renewal};

/// The oldest MariaDB with `FOR UPDATE SKIP LOCKED`.
const MARIADB_MIN: (u32, u32) = (10, 6);

/// How long a relay waits for another one's join to finish.
const JOIN_WAIT_SECS: u32 = 10;

/// `ER_KILL_DENIED_ERROR`: not allowed to end another user's session.
const KILL_DENIED: u16 = 1095;
/// `ER_NO_SUCH_THREAD`: the session ended meanwhile.
const NO_SUCH_THREAD: u16 = 1094;

/// Whether a row's member lock is held by the row's own session.
const LIVE: &str = "IS_USED_LOCK(CONCAT(?, m.backend_pid)) = m.backend_pid";

fn database_error(error: sqlx::Error) -> JoinError {
    if error_number(&error) == Some(NO_SUCH_TABLE) {
        JoinError::NotMigrated
    } else {
        JoinError::Database(error)
    }
}

/// Opens the relay's own session, checks the server, sets the session up,
/// marks it, and joins: returns the session, its mark and connection id.
pub(super) async fn join(
    pool: &MySqlPool,
    names: &LockNames,
    me: &Identity,
) -> Result<(MySqlConnection, Uuid, i64), JoinError> {
    let mut conn = MySqlConnection::connect_with(&pool.connect_options())
        .await
        .map_err(JoinError::Database)?;
    check_server(&mut conn).await?;
    configure(&mut conn, me.lease)
        .await
        .map_err(JoinError::Database)?;
    let (session, backend_id) = claim_session(&mut conn).await?;
    let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, ?)")
        .bind(names.join())
        .bind(JOIN_WAIT_SECS)
        .fetch_one(&mut conn)
        .await
        .map_err(JoinError::Database)?;
    if got != Some(1) {
        return Err(JoinError::Database(sqlx::Error::Protocol(format!(
            "another relay held the join lock {} for {JOIN_WAIT_SECS} s",
            names.join()
        ))));
    }
    let joined = join_locked(&mut conn, names, me, session).await;
    let released = sqlx::query("DO RELEASE_LOCK(?)")
        .bind(names.join())
        .execute(&mut conn)
        .await;
    joined?;
    released.map_err(JoinError::Database)?;
    Ok((conn, session, backend_id))
}

/// Refuses a server the relay cannot run on: MariaDB older than 10.6 (no
/// `SKIP LOCKED`), MySQL (not supported yet), or a statement-based binary
/// log, which refuses `READ COMMITTED` writes to InnoDB (error 1665).
async fn check_server(conn: &mut MySqlConnection) -> Result<(), JoinError> {
    let (version, log_bin, binlog_format): (String, i64, String) =
        sqlx::query_as("SELECT VERSION(), @@log_bin, @@binlog_format")
            .fetch_one(&mut *conn)
            .await
            .map_err(JoinError::Database)?;
    if !version.contains("MariaDB") {
        return Err(JoinError::Unsupported(format!(
            "MySQL {version} is not supported yet; use MariaDB >= {}.{}",
            MARIADB_MIN.0, MARIADB_MIN.1
        )));
    }
    let mut parts = version.split(|c: char| !c.is_ascii_digit());
    let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    if (major, minor) < MARIADB_MIN {
        return Err(JoinError::Unsupported(format!(
            "MariaDB {version} has no FOR UPDATE SKIP LOCKED; the relay needs MariaDB >= {}.{}",
            MARIADB_MIN.0, MARIADB_MIN.1
        )));
    }
    if log_bin == 1 && binlog_format.eq_ignore_ascii_case("STATEMENT") {
        return Err(JoinError::Unsupported(
            "the server writes a statement-based binary log (binlog_format=STATEMENT), \
             which refuses the relay's READ COMMITTED writes to InnoDB (error 1665); set \
             binlog_format=ROW (or MIXED) on the server"
                .to_owned(),
        ));
    }
    Ok(())
}

/// The relay session's settings: `READ COMMITTED` for every statement (a
/// claim locks the rows it returns, not the gaps between index entries);
/// lock waits bounded by the lease; and `wait_timeout` at twice the lease,
/// so the server ends the session of a relay whose host went silent (the
/// relay speaks at least every lease / 3), which frees its locks.
async fn configure(conn: &mut MySqlConnection, lease: Duration) -> sqlx::Result<()> {
    let idle = (lease.as_secs() * 2).max(2);
    let lock_wait = lease.as_secs().max(1);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED; \
         SET SESSION wait_timeout = {idle}; \
         SET SESSION innodb_lock_wait_timeout = {lock_wait}"
    )))
    .execute(conn)
    .await
    .map(|_| ())
}

/// Marks the fresh session as the relay's own (a user variable) and checks
/// that it was fresh: a proxy that multiplexes clients over server sessions
/// would show another relay's mark here, or none at a renewal.
async fn claim_session(conn: &mut MySqlConnection) -> Result<(Uuid, i64), JoinError> {
    let (existing, id): (Option<String>, i64) =
        sqlx::query_as("SELECT @outbox_relay_session, CAST(CONNECTION_ID() AS SIGNED)")
            .fetch_one(&mut *conn)
            .await
            .map_err(JoinError::Database)?;
    if let Some(existing) = existing {
        return Err(JoinError::SharedSession(format!(
            "a new connection already carries relay session {existing}"
        )));
    }
    let session = Uuid::new_v4();
    sqlx::query("SET @outbox_relay_session = ?")
        .bind(session.to_string())
        .execute(&mut *conn)
        .await
        .map_err(JoinError::Database)?;
    Ok((session, id))
}

/// Under the join lock: forgets the rows of ended sessions, refuses if a
/// live member runs with another lane count, takes the member lock, then
/// records this relay (the lock first: whoever sees the row sees the lock).
async fn join_locked(
    conn: &mut MySqlConnection,
    names: &LockNames,
    me: &Identity,
    session: Uuid,
) -> Result<(), JoinError> {
    forget_ended(conn, names).await.map_err(database_error)?;
    let other: Option<(i64, i32, String, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT m.backend_pid, m.lanes, m.host, m.process_id FROM outbox_relay_member m
         WHERE m.lanes <> ? AND {LIVE} ORDER BY m.joined_at LIMIT 1"
    )))
    .bind(me.lanes as i32)
    .bind(names.member_prefix())
    .fetch_optional(&mut *conn)
    .await
    .map_err(database_error)?;
    if let Some((backend_pid, lanes, host, process_id)) = other {
        return Err(JoinError::LaneCount(Member {
            backend_pid,
            lanes,
            host,
            process_id,
        }));
    }
    let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(CONCAT(?, CONNECTION_ID()), 0)")
        .bind(names.member_prefix())
        .fetch_one(&mut *conn)
        .await
        .map_err(JoinError::Database)?;
    if got != Some(1) {
        return Err(JoinError::SharedSession(
            "the member lock of this connection id is held by another session".to_owned(),
        ));
    }
    sqlx::query(
        "INSERT INTO outbox_relay_member
             (backend_pid, session_id, lanes, lease_ms, host, process_id, client_addr,
              joined_at, heartbeat_at)
         VALUES (CONNECTION_ID(), ?, ?, ?, ?, ?,
                 (SELECT host FROM information_schema.PROCESSLIST WHERE ID = CONNECTION_ID()),
                 UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))
         ON DUPLICATE KEY UPDATE
             session_id = VALUES(session_id), lanes = VALUES(lanes),
             lease_ms = VALUES(lease_ms), host = VALUES(host),
             process_id = VALUES(process_id), client_addr = VALUES(client_addr),
             joined_at = VALUES(joined_at), heartbeat_at = VALUES(heartbeat_at),
             broker_failing_since = NULL, held_topics = '[]'",
    )
    .bind(session)
    .bind(me.lanes as i32)
    .bind(me.lease.as_millis() as i64)
    .bind(&me.host)
    .bind(i64::from(me.process_id))
    .execute(&mut *conn)
    .await
    .map_err(database_error)?;
    Ok(())
}

/// Removes the rows of sessions that no longer hold their member lock.
async fn forget_ended(conn: &mut MySqlConnection, names: &LockNames) -> sqlx::Result<()> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DELETE m FROM outbox_relay_member m WHERE NOT COALESCE({LIVE}, FALSE)"
    )))
    .bind(names.member_prefix())
    .execute(conn)
    .await
    .map(|_| ())
}

/// Renews the lease (and records whether the relay reaches its broker, and
/// the topics it holds), checking that the statement ran on the relay's own
/// session.
pub(super) async fn renew(
    conn: &mut MySqlConnection,
    session: Uuid,
    backend_id: i64,
    broker_failing: bool,
    held_topics: Option<&str>,
) -> sqlx::Result<Renewal> {
    let (id, mark): (i64, Option<String>) =
        sqlx::query_as("SELECT CAST(CONNECTION_ID() AS SIGNED), @outbox_relay_session")
            .fetch_one(&mut *conn)
            .await?;
    if id != backend_id || mark.as_deref() != Some(session.to_string().as_str()) {
        return Ok(Renewal::SharedSession(format!(
            "the relay joined on connection {backend_id} with session {session}, but a later \
             statement ran on connection {id} marked {}",
            mark.as_deref().unwrap_or("by no relay")
        )));
    }
    // sqlx asks for found rows: an unchanged row counts too.
    let renewed = sqlx::query(
        "UPDATE outbox_relay_member
         SET heartbeat_at = UTC_TIMESTAMP(6),
             broker_failing_since =
                 CASE WHEN ? THEN COALESCE(broker_failing_since, UTC_TIMESTAMP(6)) END,
             held_topics = COALESCE(?, held_topics)
         WHERE backend_pid = CONNECTION_ID() AND session_id = ?",
    )
    .bind(broker_failing)
    .bind(held_topics)
    .bind(session)
    .execute(&mut *conn)
    .await?;
    Ok(if renewed.rows_affected() > 0 {
        Renewal::Renewed
    } else {
        Renewal::RowGone
    })
}

/// Ends the sessions of live members whose lease expired (`KILL
/// CONNECTION`, which frees their locks at once) and forgets the rows of
/// ended sessions. A member this relay may not end (another user, without
/// `CONNECTION ADMIN`) is logged and left to the server's `wait_timeout`.
pub(super) async fn evict_expired(
    conn: &mut MySqlConnection,
    names: &LockNames,
) -> sqlx::Result<Vec<Expired>> {
    forget_ended(conn, names).await?;
    let expired: Vec<(i64, i32, String, i64, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT m.backend_pid, m.lanes, m.host, m.process_id,
                    TIMESTAMPDIFF(MICROSECOND, m.heartbeat_at, UTC_TIMESTAMP(6))
             FROM outbox_relay_member m
             WHERE m.backend_pid <> CONNECTION_ID()
               AND m.heartbeat_at < UTC_TIMESTAMP(6) - INTERVAL m.lease_ms * 1000 MICROSECOND
               AND {LIVE}"
    )))
    .bind(names.member_prefix())
    .fetch_all(&mut *conn)
    .await?;
    let mut ended = Vec::new();
    for (backend_pid, lanes, host, process_id, silent_us) in expired {
        let expired = Expired {
            member: Member {
                backend_pid,
                lanes,
                host,
                process_id,
            },
            silent_for: silent_us as f64 / 1e6,
        };
        // An integer read from the table: nothing to quote.
        let kill = format!("KILL CONNECTION {backend_pid}");
        match sqlx::raw_sql(sqlx::AssertSqlSafe(kill))
            .execute(&mut *conn)
            .await
        {
            Ok(_) => ended.push(expired),
            Err(error) if error_number(&error) == Some(NO_SUCH_THREAD) => {}
            Err(error) if error_number(&error) == Some(KILL_DENIED) => {
                tracing::warn!(
                    member = %expired.member,
                    silent_for_s = expired.silent_for,
                    %error,
                    "outbox relay: a relay's lease expired but this relay may not end its \
                     session (run every relay as the same database user, or grant CONNECTION \
                     ADMIN); its lanes stay blocked until the server's wait_timeout ends it"
                );
            }
            Err(error) => return Err(error),
        }
    }
    Ok(ended)
}

/// Live members, and those of them that reach their broker.
pub(super) async fn census(
    conn: &mut MySqlConnection,
    names: &LockNames,
) -> sqlx::Result<(u32, u32)> {
    let (members, able): (i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT COUNT(*), CAST(COALESCE(SUM(m.broker_failing_since IS NULL), 0) AS SIGNED)
         FROM outbox_relay_member m WHERE {LIVE}"
    )))
    .bind(names.member_prefix())
    .fetch_one(conn)
    .await?;
    Ok((members.max(1) as u32, able as u32))
}

/// Leaves the membership and closes the session (its locks go with it).
pub(super) async fn leave(mut conn: MySqlConnection) -> sqlx::Result<()> {
    sqlx::query("DELETE FROM outbox_relay_member WHERE backend_pid = CONNECTION_ID()")
        .execute(&mut conn)
        .await?;
    conn.close().await
}
