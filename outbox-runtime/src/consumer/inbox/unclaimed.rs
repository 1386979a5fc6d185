//! The inbox's own fact about its keys that nobody processes: pending keys
//! whose head event type no live processor of their group handles. The
//! inbox processors log and count them; `outbox status` lists them.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

/// Inbox keys that no running processor claims, by group and event type (see
/// [`Status::inbox_unclaimed`](crate::ops::status::Status::inbox_unclaimed)).
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct UnclaimedKeys {
    /// The consumer group (`""` for rows stored before inboxes had groups and
    /// not adopted by a consumer yet).
    pub consumer_group: String,
    /// The topic of the keys' waiting rows.
    pub topic: String,
    /// The event type of the keys' oldest pending rows (`None`: rows stored
    /// without an event type, which no processor can handle).
    pub event_type: Option<String>,
    /// Keys waiting.
    pub keys: i64,
    /// Pending rows of those keys.
    pub rows: i64,
    /// When the oldest of those rows was received.
    pub oldest_received_at: Option<DateTime<Utc>>,
}

/// Inbox keys that no running processor claims (see
/// `outbox status`), of one group or (`None`) of every group.
///
/// A processor counts as running while its consumer's heartbeat in
/// `inbox_processor` is younger than three heartbeat intervals.
pub(crate) async fn inbox_unclaimed(
    pool: &PgPool,
    group: Option<&str>,
) -> sqlx::Result<Vec<UnclaimedKeys>> {
    sqlx::query_as(
        "WITH waiting AS (
             SELECT k.* FROM inbox_key k
             WHERE ($1::text IS NULL OR k.consumer_group = $1)
               AND NOT EXISTS (
                   SELECT 1 FROM inbox_processor p,
                        unnest(p.topics, p.event_types) AS h(topic, event_type)
                   WHERE p.consumer_group = k.consumer_group
                     AND p.seen_at > now() - 3 * p.heartbeat_ms * interval '1 millisecond'
                     AND h.topic = k.topic AND h.event_type = k.head_event_type))
         SELECT w.consumer_group, w.topic, w.head_event_type AS event_type,
                count(*)::int8 AS keys, sum(r.rows)::int8 AS rows,
                min(r.oldest) AS oldest_received_at
         FROM waiting w CROSS JOIN LATERAL (
             SELECT count(*) AS rows, min(i.received_at) AS oldest FROM inbox_event i
             WHERE i.consumer_group = w.consumer_group AND i.topic = w.topic
               AND (i.partition_key = w.partition_key
                    OR (w.partition_key IS NULL AND i.seq = w.head_seq))
               AND NOT i.processed AND i.parked_at IS NULL) r
         GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
    )
    .bind(group)
    .fetch_all(pool)
    .await
}
