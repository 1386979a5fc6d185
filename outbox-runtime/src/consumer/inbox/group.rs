//! The inbox group's bookkeeping, done by processor 0 of each consumer:
//! adopting rows stored before inboxes had groups, the `inbox_processor`
//! heartbeat (which event types the running processors handle), and the
//! backlog gauges.

use uuid::Uuid;

#[cfg(feature = "mysql")]
use super::mysql;
use super::postgres;
use crate::consumer::database::Pool;
use crate::consumer::shared::Shared;
use crate::consumer::telemetry as m;

/// This consumer's entry in `inbox_processor`.
pub(crate) struct Membership {
    instance_id: Uuid,
    adopted: bool,
}

impl Membership {
    pub(crate) fn new() -> Self {
        Self {
            instance_id: Uuid::new_v4(),
            adopted: false,
        }
    }

    /// Adopts legacy rows (once), renews the heartbeat and refreshes the
    /// gauges. Best effort: a failure is logged and retried next time.
    pub(crate) async fn heartbeat(&mut self, ctx: &Shared) {
        if !self.adopted {
            match adopt_legacy_rows(ctx).await {
                Ok(()) => self.adopted = true,
                Err(error) => {
                    tracing::warn!(%error, "could not adopt inbox rows stored before groups")
                }
            }
        }
        if let Err(error) = self.beat(ctx).await {
            tracing::debug!(%error, "inbox heartbeat failed");
        }
        report_backlog(ctx).await;
    }

    async fn beat(&self, ctx: &Shared) -> sqlx::Result<()> {
        let handled = ctx.dispatch.routes();
        let heartbeat_ms =
            i32::try_from(ctx.settings.backlog_interval.as_millis()).unwrap_or(i32::MAX);
        let group = &ctx.settings.group_id;
        match ctx.db.pool() {
            Pool::Postgres(pool) => {
                postgres::heartbeat(pool, group, self.instance_id, host(), handled, heartbeat_ms)
                    .await
            }
            #[cfg(feature = "mysql")]
            Pool::MySql(pool) => {
                mysql::heartbeat(pool, group, self.instance_id, host(), handled, heartbeat_ms).await
            }
        }
    }

    /// Removes this consumer's entry (graceful shutdown).
    pub(crate) async fn leave(self, ctx: &Shared) {
        let group = &ctx.settings.group_id;
        let _ = match ctx.db.pool() {
            Pool::Postgres(pool) => postgres::leave(pool, group, self.instance_id).await,
            #[cfg(feature = "mysql")]
            Pool::MySql(pool) => mysql::leave(pool, group, self.instance_id).await,
        };
    }
}

fn host() -> Option<String> {
    std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty())
}

/// Rows stored before PostgreSQL's migration 0005 have the group `''`: the
/// first inbox consumer to start takes them over (see
/// `postgres::adopt_legacy_rows`). MySQL's inbox had groups from its start.
async fn adopt_legacy_rows(ctx: &Shared) -> sqlx::Result<()> {
    #[cfg(feature = "mysql")]
    if ctx.db.mysql().is_some() {
        return Ok(());
    }
    let pool = ctx.db.postgres();
    let group = &ctx.settings.group_id;
    let adopted = postgres::adopt_legacy_rows(pool, ctx.db.begin_postgres(), group).await?;
    if adopted > 0 {
        tracing::info!(
            group = %ctx.settings.group_id,
            rows = adopted,
            "adopted inbox rows stored before inboxes had consumer groups"
        );
    }
    Ok(())
}

async fn report_backlog(ctx: &Shared) {
    let group = &ctx.settings.group_id;
    let counts = match ctx.db.pool() {
        Pool::Postgres(pool) => postgres::backlog(pool, group).await,
        #[cfg(feature = "mysql")]
        Pool::MySql(pool) => mysql::backlog(pool, group).await,
    };
    if let Ok((backlog, parked)) = counts {
        metrics::gauge!(m::INBOX_BACKLOG, "group" => ctx.group()).set(backlog as f64);
        metrics::gauge!(m::INBOX_PARKED_ROWS, "group" => ctx.group()).set(parked as f64);
    }
    let unclaimed = match ctx.db.pool() {
        Pool::Postgres(pool) => super::unclaimed::inbox_unclaimed(pool, Some(group)).await,
        #[cfg(feature = "mysql")]
        Pool::MySql(pool) => mysql::inbox_unclaimed(pool, Some(group)).await,
    };
    match unclaimed {
        Ok(waiting) => {
            let keys: i64 = waiting.iter().map(|w| w.keys).sum();
            metrics::gauge!(m::INBOX_UNCLAIMED_KEYS, "group" => ctx.group()).set(keys as f64);
            for w in &waiting {
                tracing::warn!(
                    group = %ctx.settings.group_id,
                    topic = %w.topic,
                    event_type = w.event_type.as_deref().unwrap_or("(none)"),
                    keys = w.keys,
                    rows = w.rows,
                    "inbox keys wait for an event type no running processor of the group handles"
                );
            }
        }
        Err(error) => tracing::debug!(%error, "could not count unclaimed inbox keys"),
    }
}
