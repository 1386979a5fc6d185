//! The relays' membership table (`outbox_relay_member`, migration 0006): who
//! is running against this database, with which lane count, and whose lease
//! has expired.
//!
//! A member is a relay's own connection (session). It counts as live while
//! that session holds the membership advisory lock `(MEMBER_LOCK, its
//! backend pid)`; the row adds what the lock cannot say: the lane count, the
//! lease and its last renewal, and where the relay runs. Every statement here
//! runs on the relay's own connection.

use std::time::Duration;

use sqlx::PgConnection;
use uuid::Uuid;

/// Advisory lock class of lane locks ("obxl").
pub(crate) const LANE_LOCK: i32 = 0x6f62_786c;
/// Advisory lock class of relay membership locks ("obxm").
pub(crate) const MEMBER_LOCK: i32 = 0x6f62_786d;
/// Transaction lock that serializes joins ("obxjoin"), so that two relays
/// with different lane counts cannot both join before seeing each other.
const JOIN_LOCK: i64 = 0x006f_6278_6a6f_696e;

/// The live members (sessions holding the membership lock in this database).
const LIVE: &str = "SELECT l.pid FROM pg_locks l
     WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
       AND l.classid = 1868724333::oid
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())";

/// Who this relay is, as recorded in its row.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    pub lanes: u32,
    pub lease: Duration,
    pub host: String,
    pub process_id: u32,
}

impl Identity {
    pub(crate) fn new(lanes: u32, lease: Duration) -> Self {
        Self {
            lanes,
            lease,
            host: host_name(),
            process_id: std::process::id(),
        }
    }
}

/// The machine's name, for operators reading the membership table.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// Another relay that is running against the database.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct Member {
    /// The member's session on the server (PostgreSQL's backend pid,
    /// MySQL's connection id).
    pub backend_pid: i64,
    pub lanes: i32,
    pub host: String,
    pub process_id: i64,
}

impl std::fmt::Display for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "process {} on {} (backend pid {})",
            self.process_id, self.host, self.backend_pid
        )
    }
}

/// Why joining failed.
#[derive(Debug)]
pub(crate) enum JoinError {
    /// The database is unreachable or a statement failed: try again later.
    Database(sqlx::Error),
    /// A live member runs with another lane count.
    LaneCount(Member),
    /// This connection's session is not ours alone (a transaction-mode pooler).
    SharedSession(String),
    /// The membership table does not exist (migration 0006 not applied).
    NotMigrated,
    /// The server cannot run the relay as configured (e.g. MySQL's
    /// statement-based binary log with `READ COMMITTED`).
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    Unsupported(String),
}

impl From<sqlx::Error> for JoinError {
    fn from(error: sqlx::Error) -> Self {
        match &error {
            sqlx::Error::Database(db) if db.code().as_deref() == Some("42P01") => Self::NotMigrated,
            _ => Self::Database(error),
        }
    }
}

/// Joins the membership: under a lock that serializes joins, removes the
/// rows of ended sessions, refuses if a live member runs with another lane
/// count, then takes the membership lock and records this relay.
pub(crate) async fn join(
    conn: &mut PgConnection,
    session: Uuid,
    me: &Identity,
) -> Result<(), JoinError> {
    let mut tx = crate::txn::begin_on(conn).await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(JOIN_LOCK)
        .execute(&mut *tx)
        .await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DELETE FROM outbox_relay_member WHERE backend_pid NOT IN ({LIVE})"
    )))
    .execute(&mut *tx)
    .await?;
    let other: Option<Member> = sqlx::query_as(
        "SELECT backend_pid::int8 AS backend_pid, lanes, host, process_id FROM outbox_relay_member
         WHERE lanes <> $1 ORDER BY joined_at LIMIT 1",
    )
    .bind(me.lanes as i32)
    .fetch_optional(&mut *tx)
    .await?;
    if let Some(other) = other {
        return Err(JoinError::LaneCount(other));
    }
    let unknown: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM ({LIVE}) live
         WHERE live.pid NOT IN (SELECT backend_pid FROM outbox_relay_member)"
    )))
    .fetch_one(&mut *tx)
    .await?;
    if unknown > 0 {
        tracing::warn!(
            relays = unknown,
            "outbox relay: relays of an older version run against this database; \
             their lane count cannot be checked (it must be {})",
            me.lanes
        );
    }
    // The lock first, then the row: whoever sees the row also sees the lock.
    sqlx::query("SELECT pg_advisory_lock($1, pg_backend_pid())")
        .bind(MEMBER_LOCK)
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "INSERT INTO outbox_relay_member
             (backend_pid, session_id, lanes, lease_ms, host, process_id, client_addr)
         VALUES (pg_backend_pid(), $1, $2, $3, $4, $5, inet_client_addr())
         ON CONFLICT (backend_pid) DO UPDATE SET
             session_id = EXCLUDED.session_id, lanes = EXCLUDED.lanes,
             lease_ms = EXCLUDED.lease_ms, host = EXCLUDED.host,
             process_id = EXCLUDED.process_id, client_addr = EXCLUDED.client_addr,
             joined_at = now(), heartbeat_at = now(), broker_failing_since = NULL",
    )
    .bind(session)
    .bind(me.lanes as i32)
    .bind(me.lease.as_millis() as i64)
    .bind(&me.host)
    .bind(i64::from(me.process_id))
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// What a renewal found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// The lease runs again from now.
    Renewed,
    /// This session's row is gone (removed by hand): join again.
    RowGone,
    /// The statement ran on a session that is not ours: a pooler.
    SharedSession(String),
}

/// Whether the membership table records held topics (migration 0011).
pub(crate) async fn records_held_topics(conn: &mut PgConnection) -> sqlx::Result<bool> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_attribute
                        WHERE attrelid = to_regclass('outbox_relay_member')
                          AND attname = 'held_topics' AND NOT attisdropped)",
    )
    .fetch_one(conn)
    .await
}

/// Renews the lease (and records whether the relay can reach its broker,
/// and the topics it holds, a JSON array, when the table has the column),
/// checking that the statement ran on the relay's own session.
pub(crate) async fn renew(
    conn: &mut PgConnection,
    session: Uuid,
    backend_pid: i32,
    broker_failing: bool,
    held_topics: Option<&str>,
) -> sqlx::Result<Renewal> {
    let held_topics_set = if held_topics.is_some() {
        ", held_topics = $3::jsonb"
    } else {
        ""
    };
    let mut renew = sqlx::query_as::<_, (i32, Option<String>, bool)>(sqlx::AssertSqlSafe(format!(
        "WITH renewed AS (
                 UPDATE outbox_relay_member SET heartbeat_at = clock_timestamp(),
                     broker_failing_since =
                         CASE WHEN $2 THEN COALESCE(broker_failing_since, now()) END
                     {held_topics_set}
                 WHERE backend_pid = pg_backend_pid() AND session_id = $1
                 RETURNING 1)
             SELECT pg_backend_pid(), NULLIF(current_setting('outbox.relay_session', true), ''),
                    EXISTS (SELECT 1 FROM renewed)"
    )))
    .bind(session)
    .bind(broker_failing);
    if let Some(held_topics) = held_topics {
        renew = renew.bind(held_topics);
    }
    let (pid, mark, renewed) = renew.fetch_one(conn).await?;
    let mark_is_ours = mark.as_deref() == Some(session.to_string().as_str());
    if pid != backend_pid || !mark_is_ours {
        return Ok(Renewal::SharedSession(format!(
            "the relay joined on backend pid {backend_pid} with session {session}, \
             but a later statement ran on backend pid {pid} marked {}",
            mark.as_deref().unwrap_or("by no relay")
        )));
    }
    Ok(if renewed {
        Renewal::Renewed
    } else {
        Renewal::RowGone
    })
}

/// A member whose lease expired, as found by [`evict_expired`].
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct Expired {
    #[sqlx(flatten)]
    pub member: Member,
    /// Seconds since its last renewal.
    pub silent_for: f64,
}

/// Ends the sessions of live members whose lease has expired, which frees
/// their lanes at once, and removes the rows of ended sessions. Returns the
/// members it ended; a member it may not end (another database role without
/// `pg_signal_backend`) is logged and left to TCP keepalive.
pub(crate) async fn evict_expired(
    conn: &mut PgConnection,
    server_version: u32,
) -> sqlx::Result<Vec<Expired>> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DELETE FROM outbox_relay_member WHERE backend_pid NOT IN ({LIVE})"
    )))
    .execute(&mut *conn)
    .await?;
    let expired: Vec<Expired> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT backend_pid::int8 AS backend_pid, lanes, host, process_id,
                EXTRACT(EPOCH FROM clock_timestamp() - heartbeat_at)::float8 AS silent_for
         FROM outbox_relay_member
         WHERE backend_pid <> pg_backend_pid()
           AND heartbeat_at < clock_timestamp() - lease_ms * interval '1 millisecond'
           AND backend_pid IN ({LIVE})"
    )))
    .fetch_all(&mut *conn)
    .await?;
    let mut ended = Vec::new();
    for expired in expired {
        // From PostgreSQL 14 on, wait (up to 1 s) for the session to end, so
        // that its lanes are free for the lane round that follows.
        let terminate = if server_version >= 140_000 {
            "SELECT pg_terminate_backend($1, 1000)"
        } else {
            "SELECT pg_terminate_backend($1)"
        };
        match sqlx::query_scalar::<_, bool>(terminate)
            .bind(expired.member.backend_pid as i32)
            .fetch_one(&mut *conn)
            .await
        {
            Ok(_) => ended.push(expired),
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("42501") => {
                tracing::warn!(
                    member = %expired.member,
                    silent_for_s = expired.silent_for,
                    error = %db,
                    "outbox relay: a relay's lease expired but this relay may not end its \
                     session (run every relay as the same database role, or grant \
                     pg_signal_backend); its lanes stay blocked until TCP keepalive ends it"
                );
            }
            Err(error) => return Err(error),
        }
    }
    Ok(ended)
}

/// A relay running against the database, from its membership row
/// (`outbox_relay_member`) and its locks.
#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow)]
pub struct RelayMember {
    /// The relay's machine.
    pub host: String,
    /// The relay's process id on that machine.
    pub process_id: i64,
    /// Its own connection's session on the server (PostgreSQL's backend
    /// pid, MariaDB's connection id).
    pub backend_pid: i64,
    /// Its configured lane count (the same for every relay).
    pub lanes: i32,
    /// Lanes it owns right now.
    pub lanes_owned: i64,
    /// Seconds since it last renewed its lease.
    pub renewed_secs_ago: f64,
    /// Its lease: after that long without renewal another relay ends its
    /// session and takes its lanes.
    pub lease_secs: f64,
    /// Whether the lease has expired (frozen or vanished; another relay ends
    /// its session at its next rebalance, if it may).
    pub lease_expired: bool,
    /// Since when its batches fail because it cannot reach the broker (it
    /// then hands its lanes to relays that can).
    pub broker_failing_since: Option<chrono::DateTime<chrono::Utc>>,
    /// Topics it holds because the broker refuses them as a whole (unknown
    /// topic, not authorized): their events wait in the outbox, no attempt
    /// counted, until the broker accepts the topic (empty before migration
    /// 10). As of the relay's last renewal.
    #[sqlx(json)]
    pub held_topics: Vec<HeldTopic>,
}

/// A topic a relay holds (see [`RelayMember::held_topics`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HeldTopic {
    /// The topic.
    pub topic: String,
    /// What the broker answered, e.g. `UnknownTopicOrPartition (Broker:
    /// Unknown topic or partition), in the topic's metadata`.
    pub reason: String,
    /// Since when the relay holds it.
    pub since: chrono::DateTime<chrono::Utc>,
    /// Records of it the broker refused since then.
    pub refusals: u64,
}

/// Live members, and those of them that can reach their broker, as counted
/// for the fair share. Members of older versions (no row) count as able.
pub(crate) async fn census(conn: &mut PgConnection) -> sqlx::Result<(u32, u32)> {
    let (members, able): (i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT count(*), count(*) FILTER (WHERE m.broker_failing_since IS NULL)
         FROM ({LIVE}) live LEFT JOIN outbox_relay_member m ON m.backend_pid = live.pid"
    )))
    .fetch_one(conn)
    .await?;
    Ok((members.max(1) as u32, able as u32))
}

/// The live members, for `outbox status`; empty before migration 0006.
pub(crate) async fn members(pool: &sqlx::PgPool) -> sqlx::Result<Vec<RelayMember>> {
    let migrated: bool =
        sqlx::query_scalar("SELECT to_regclass('outbox_relay_member') IS NOT NULL")
            .fetch_one(pool)
            .await?;
    if !migrated {
        return Ok(Vec::new());
    }
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT m.host, m.process_id, m.backend_pid::int8 AS backend_pid, m.lanes,
                (SELECT count(*) FROM pg_locks l
                 WHERE l.pid = m.backend_pid AND l.locktype = 'advisory' AND l.granted
                   AND l.objsubid = 2 AND l.classid = 1868724332::oid) AS lanes_owned,
                EXTRACT(EPOCH FROM clock_timestamp() - m.heartbeat_at)::float8 AS renewed_secs_ago,
                m.lease_ms / 1000.0::float8 AS lease_secs,
                m.heartbeat_at < clock_timestamp() - m.lease_ms * interval '1 millisecond'
                    AS lease_expired,
                m.broker_failing_since,
                -- held_topics comes with migration 0011: absent before it.
                COALESCE(to_jsonb(m) -> 'held_topics', '[]') AS held_topics
         FROM outbox_relay_member m
         WHERE m.backend_pid IN ({LIVE})
         ORDER BY m.joined_at"
    )))
    .fetch_all(pool)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_live_query_names_the_membership_lock_class() {
        assert!(LIVE.contains(&format!("{}::oid", MEMBER_LOCK)));
    }
}
