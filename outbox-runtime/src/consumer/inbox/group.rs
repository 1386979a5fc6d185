//! The inbox group's bookkeeping, done by processor 0 of each consumer:
//! adopting rows stored before inboxes had groups, the `inbox_processor`
//! heartbeat (which event types the running processors handle), and the
//! backlog gauges.

use uuid::Uuid;

use crate::consumer::shared::Shared;
use crate::consumer::telemetry as m;

/// This consumer's entry in `inbox_processor`.
pub(crate) struct Membership {
    instance_id: Uuid,
    adopted: bool,
}

/// Advisory lock class serializing the adoption of legacy rows ("obxa").
const ADOPT_LOCK: i32 = 0x6f62_7861;

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
        let (topics, types) = ctx.dispatch.routes();
        let heartbeat_ms =
            i32::try_from(ctx.settings.backlog_interval.as_millis()).unwrap_or(i32::MAX);
        sqlx::query(
            "INSERT INTO inbox_processor
                 (consumer_group, instance_id, host, topics, event_types, heartbeat_ms)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (consumer_group, instance_id) DO UPDATE
                 SET seen_at = now(), topics = excluded.topics,
                     event_types = excluded.event_types, heartbeat_ms = excluded.heartbeat_ms",
        )
        .bind(&ctx.settings.group_id)
        .bind(self.instance_id)
        .bind(host())
        .bind(topics)
        .bind(types)
        .bind(heartbeat_ms)
        .execute(ctx.db.postgres())
        .await?;
        // Entries of processors gone for long (killed, not shut down).
        sqlx::query(
            "DELETE FROM inbox_processor
             WHERE consumer_group = $1 AND seen_at < now() - interval '1 hour'",
        )
        .bind(&ctx.settings.group_id)
        .execute(ctx.db.postgres())
        .await?;
        Ok(())
    }

    /// Removes this consumer's entry (graceful shutdown).
    pub(crate) async fn leave(self, ctx: &Shared) {
        let _ = sqlx::query(
            "DELETE FROM inbox_processor WHERE consumer_group = $1 AND instance_id = $2",
        )
        .bind(&ctx.settings.group_id)
        .bind(self.instance_id)
        .execute(ctx.db.postgres())
        .await;
    }
}

fn host() -> Option<String> {
    std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty())
}

/// Rows stored before migration 0005 have the group `''`: one database held
/// one inbox group then, so the first inbox consumer to start takes them
/// over (rows it already holds itself are left alone). Their keys follow
/// (the update trigger files them under the new group).
async fn adopt_legacy_rows(ctx: &Shared) -> sqlx::Result<()> {
    let legacy: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM inbox_event WHERE consumer_group = '')")
            .fetch_one(ctx.db.postgres())
            .await?;
    if !legacy || ctx.settings.group_id.is_empty() {
        return Ok(());
    }
    let mut tx = ctx.db.begin_postgres().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1, 0)")
        .bind(ADOPT_LOCK)
        .execute(&mut *tx)
        .await?;
    let adopted = sqlx::query(
        "UPDATE inbox_event l SET consumer_group = $1
         WHERE l.consumer_group = ''
           AND NOT EXISTS (SELECT 1 FROM inbox_event g
                           WHERE g.consumer_group = $1 AND g.event_id = l.event_id)",
    )
    .bind(&ctx.settings.group_id)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    sqlx::query(
        "DELETE FROM inbox_key k WHERE k.consumer_group = ''
           AND NOT EXISTS (SELECT 1 FROM inbox_event i
                           WHERE i.consumer_group = '' AND i.topic = k.topic
                             AND i.partition_key IS NOT DISTINCT FROM k.partition_key
                             AND NOT i.processed AND i.parked_at IS NULL)",
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
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
    let counts: Result<(i64, i64), _> = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE parked_at IS NULL), count(*) FILTER (WHERE parked_at IS NOT NULL)
         FROM inbox_event WHERE consumer_group = $1 AND NOT processed",
    )
    .bind(&ctx.settings.group_id)
    .fetch_one(ctx.db.postgres())
    .await;
    if let Ok((backlog, parked)) = counts {
        metrics::gauge!(m::INBOX_BACKLOG, "group" => ctx.group()).set(backlog as f64);
        metrics::gauge!(m::INBOX_PARKED_ROWS, "group" => ctx.group()).set(parked as f64);
    }
    match super::unclaimed::inbox_unclaimed(ctx.db.postgres(), Some(&ctx.settings.group_id)).await {
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
