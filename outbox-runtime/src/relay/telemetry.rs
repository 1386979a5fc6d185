//! Metric names (documented in `docs/relay.md`).

/// Gauge: unpublished, unparked rows (refreshed every `metrics_interval`).
pub const BACKLOG: &str = "outbox_relay_backlog";
/// Gauge: age in seconds of the oldest unpublished, unparked row.
pub const OLDEST_UNPUBLISHED_AGE: &str = "outbox_relay_oldest_unpublished_age_seconds";
/// Counter: rows published (delivery confirmed and marked).
pub const PUBLISHED: &str = "outbox_relay_published_total";
/// Counter: rows parked after `max_attempts` failed attempts.
pub const PARKED: &str = "outbox_relay_parked_total";
/// Counter: errors, labelled `kind` (`database`, `broker_unavailable`,
/// `partition_unavailable`, `rejected`, `topic_refused`, `fatal_producer`).
pub const ERRORS: &str = "outbox_relay_errors_total";
/// Counter: claim statements run, labelled `result` (`rows` or `empty`).
/// Empty claims are the relay's polling cost: with every writer signalling
/// it (in-process, or `listen_notify`), about one claim per batch.
pub const CLAIMS: &str = "outbox_relay_claims_total";
/// Histogram: rows claimed per non-empty batch.
pub const BATCH_SIZE: &str = "outbox_relay_batch_size";
/// Histogram: seconds from claim to commit of a non-empty batch.
pub const BATCH_DURATION: &str = "outbox_relay_batch_duration_seconds";
/// Gauge: lanes this relay owns.
pub const LANES_OWNED: &str = "outbox_relay_lanes_owned";
/// Gauge: partitions this relay holds back because they are unavailable
/// (leader down); each is also named in a warning every `metrics_interval`.
pub const UNAVAILABLE_PARTITIONS: &str = "outbox_relay_unavailable_partitions";
/// Gauge: topics this relay holds because the broker refuses them as a
/// whole (unknown topic, not authorized): their rows wait in the outbox, no
/// attempt counted; each is named in a warning when held, in `outbox
/// status`, and in [`TOPIC_REFUSALS`].
pub const HELD_TOPICS: &str = "outbox_relay_held_topics";
/// Counter: records the broker refused for their topic as a whole, labelled
/// `topic` (never counted as attempts; the topic is held).
pub const TOPIC_REFUSALS: &str = "outbox_relay_topic_refusals_total";
/// Counter: times a row was held back (not sent, no attempt counted) because
/// its partition was unavailable.
pub const HELD_BACK: &str = "outbox_relay_held_back_total";
/// Gauge: rows sent whose delivery report is late (after their batch was
/// settled without them), typically rows of a partition whose leader is down.
pub const STRAGGLING: &str = "outbox_relay_straggling_rows";
/// Counter: sessions of other relays this relay ended because their lease
/// had expired (a frozen or vanished relay; its lanes were taken over).
pub const MEMBERS_EVICTED: &str = "outbox_relay_members_evicted_total";
/// Gauge: 1 while this relay's batches fail because the broker cannot be
/// reached (it then hands its lanes to relays that can publish), else 0.
pub const BROKER_FAILING: &str = "outbox_relay_broker_failing";

/// Counter: scheduled events moved from `outbox_scheduled` into
/// `outbox_event` when due (then published like any other row).
pub const SCHEDULED_MOVED: &str = "outbox_relay_scheduled_moved_total";
/// Gauge: scheduled events not moved yet, due or not (`count(*)` of
/// `outbox_scheduled`, refreshed every `metrics_interval`).
pub const SCHEDULED_PENDING: &str = "outbox_relay_scheduled_pending";

pub(crate) fn error(kind: &'static str) {
    metrics::counter!(ERRORS, "kind" => kind).increment(1);
}

pub(crate) fn claim(empty: bool) {
    let result = if empty { "empty" } else { "rows" };
    metrics::counter!(CLAIMS, "result" => result).increment(1);
}
