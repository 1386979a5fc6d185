//! Replay on MariaDB (feature `mysql`): the selection of `outbox_event`
//! rows, the rebuild's one snapshot, and the run's record in
//! `outbox_replay_run` (MySQL migration 0007).
//!
//! The selection is PostgreSQL's (the same conditions, id order, a page
//! after the previous page's last id up to the run's highest id), with only
//! the filters given bound. The payload and the user's headers are the
//! `JSON` columns' stored text, the bytes MariaDB's relay sends.
//!
//! A rebuild's snapshot is an InnoDB read view on a connection of its own:
//! `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ` (whatever the server's
//! default) and `START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY`,
//! which creates the read view at once (without `WITH CONSISTENT SNAPSHOT`
//! InnoDB would create it at the first read). The parent module opens it
//! only after the end offsets were read: the read view then sees every
//! transaction committed before, hence every row the relay had claimed.
//! MariaDB's idle-transaction timeouts are turned off for that session, so
//! a long pause between pages (deliveries awaited, a rate) does not end
//! it; the connection is closed when the run drops it, never returned to
//! the pool with those settings or an open transaction. While it is open,
//! InnoDB's purge cannot remove the undo history younger than it (the
//! history list grows with every change to any table), and reads of rows
//! changed since it rebuild their old versions from that history.

use chrono::{DateTime, Utc};
use sqlx::pool::PoolConnection;
use sqlx::{MySql, MySqlPool, QueryBuilder};

use super::{Mode, ReplayFilter, Row, RunStart};
use crate::ops::OpsError;

/// Where a run reads its rows on MariaDB (see [`super::Source`]).
pub(super) enum Source<'p> {
    /// The pool: every statement its own read view (a republish run).
    Pool(&'p MySqlPool),
    /// The rebuild's one read view, on a connection of its own.
    Snapshot(PoolConnection<MySql>),
}

impl<'p> Source<'p> {
    /// The source of a run of `mode` (a rebuild's snapshot taken now).
    pub(super) async fn open(pool: &'p MySqlPool, mode: Mode) -> Result<Self, OpsError> {
        Ok(match mode {
            Mode::Republish => Source::Pool(pool),
            Mode::Rebuild => Source::Snapshot(snapshot(pool).await?),
        })
    }

    async fn fetch_all<O>(&mut self, mut query: QueryBuilder<MySql>) -> sqlx::Result<Vec<O>>
    where
        O: for<'r> sqlx::FromRow<'r, sqlx::mysql::MySqlRow> + Send + Unpin,
    {
        let query = query.build_query_as::<O>();
        match self {
            Source::Pool(pool) => query.fetch_all(*pool).await,
            Source::Snapshot(conn) => query.fetch_all(&mut **conn).await,
        }
    }

    pub(super) async fn max_id(&mut self) -> Result<i64, OpsError> {
        let rows: Vec<(Option<i64>,)> = self
            .fetch_all(QueryBuilder::new("SELECT MAX(id) FROM outbox_event"))
            .await?;
        Ok(rows.into_iter().next().and_then(|(id,)| id).unwrap_or(0))
    }

    pub(super) async fn count(
        &mut self,
        filter: &ReplayFilter,
        mode: Mode,
        max_id: i64,
    ) -> Result<i64, OpsError> {
        let mut query = QueryBuilder::new("SELECT COUNT(*)");
        selection(&mut query, filter, mode, max_id);
        let rows: Vec<(i64,)> = self.fetch_all(query).await?;
        Ok(rows.into_iter().next().map_or(0, |(n,)| n))
    }

    pub(super) async fn page(
        &mut self,
        filter: &ReplayFilter,
        mode: Mode,
        max_id: i64,
        after: i64,
        limit: usize,
    ) -> Result<Vec<Row>, OpsError> {
        let mut query = QueryBuilder::new(
            "SELECT t.id, t.event_id, t.aggregate_type, t.aggregate_id, t.event_type,
                    t.payload, t.topic, t.partition_key, t.traceparent, t.headers,
                    t.created_at",
        );
        selection(&mut query, filter, mode, max_id);
        query
            .push(" AND t.id > ")
            .push_bind(after)
            .push(" ORDER BY t.id LIMIT ")
            .push_bind(limit as i64);
        Ok(self.fetch_all(query).await?)
    }
}

/// Pushes `FROM outbox_event t WHERE <mode's rows> AND t.id <= max_id
/// AND <the filter's conditions>` to `query`, the filter's values bound.
fn selection(query: &mut QueryBuilder<MySql>, filter: &ReplayFilter, mode: Mode, max_id: i64) {
    query
        .push(format!(
            " FROM outbox_event t WHERE {} AND t.id <= ",
            mode.state()
        ))
        .push_bind(max_id);
    let mut time = |condition: &str, at: Option<DateTime<Utc>>| {
        if let Some(at) = at {
            query.push(condition).push_bind(at);
        }
    };
    time(" AND t.created_at >= ", filter.from);
    time(" AND t.created_at < ", filter.to);
    for (condition, value) in [
        (" AND t.topic = ", &filter.topic),
        (" AND t.event_type = ", &filter.event_type),
        (" AND t.aggregate_type = ", &filter.aggregate_type),
        (" AND t.aggregate_id = ", &filter.aggregate_id),
    ] {
        if let Some(value) = value {
            query.push(condition).push_bind(value.clone());
        }
    }
}

/// The rebuild's one snapshot (see the module documentation): a connection
/// of the pool that is closed, not returned, when dropped.
pub(super) async fn snapshot(pool: &MySqlPool) -> Result<PoolConnection<MySql>, OpsError> {
    let mut conn = pool.acquire().await?;
    conn.close_on_drop();
    sqlx::raw_sql(
        "SET SESSION idle_transaction_timeout = 0, idle_readonly_transaction_timeout = 0;
         SET TRANSACTION ISOLATION LEVEL REPEATABLE READ;
         START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY",
    )
    .execute(&mut *conn)
    .await?;
    Ok(conn)
}

/// The text of a JSON value for a JSON column.
fn json(value: &serde_json::Value) -> String {
    value.to_string()
}

pub(super) async fn record_start(pool: &MySqlPool, run: &RunStart<'_>) -> Result<i64, OpsError> {
    let done = sqlx::query(
        "INSERT INTO outbox_replay_run
             (started_at, filter, target_topic, selected, mode, rebuild_group, handover)
         VALUES (UTC_TIMESTAMP(6), ?, ?, ?, ?, ?, ?)",
    )
    .bind(json(&run.filter))
    .bind(run.target_topic)
    .bind(run.selected)
    .bind(run.mode.name())
    .bind(run.group)
    .bind(run.handover.as_ref().map(json))
    .execute(pool)
    .await?;
    Ok(done.last_insert_id() as i64)
}

pub(super) async fn record_progress(
    pool: &MySqlPool,
    run_id: i64,
    published: u64,
) -> Result<(), OpsError> {
    sqlx::query("UPDATE outbox_replay_run SET published = ? WHERE id = ?")
        .bind(published as i64)
        .bind(run_id)
        .execute(pool)
        .await?;
    Ok(())
}

pub(super) async fn record_end(
    pool: &MySqlPool,
    run_id: i64,
    published: u64,
    error: Option<String>,
    handover: Option<serde_json::Value>,
) -> Result<(), OpsError> {
    sqlx::query(
        "UPDATE outbox_replay_run
         SET finished_at = UTC_TIMESTAMP(6), published = ?, error = ?, handover = ?
         WHERE id = ?",
    )
    .bind(published as i64)
    .bind(error)
    .bind(handover.as_ref().map(json))
    .bind(run_id)
    .execute(pool)
    .await?;
    Ok(())
}

/// The hand-over recorded by run `run_id`, as stored (JSON text).
pub(super) async fn load_handover(
    pool: &MySqlPool,
    run_id: i64,
) -> Result<Option<Option<String>>, OpsError> {
    Ok(
        sqlx::query_scalar("SELECT handover FROM outbox_replay_run WHERE id = ?")
            .bind(run_id)
            .fetch_optional(pool)
            .await?,
    )
}
