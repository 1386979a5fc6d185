//! Names of the metrics the consumer records (through the `metrics` facade).
//! Every metric carries a `group` label; per-message counters also `topic`.

/// Counter: messages received from Kafka.
pub const CONSUMED: &str = "outbox_consumer_messages_total";
/// Counter: events whose handler ran and committed (label `event_type`).
pub const HANDLED: &str = "outbox_consumer_handled_total";
/// Counter: events skipped because their id was already processed / stored.
pub const DUPLICATES: &str = "outbox_consumer_duplicates_total";
/// Counter: failed handler attempts (label `event_type`).
pub const HANDLER_ERRORS: &str = "outbox_consumer_handler_errors_total";
/// Counter: messages published to the dead-letter topic (label `reason`).
pub const DEAD_LETTERED: &str = "outbox_consumer_dead_lettered_total";
/// Counter: dead letters the dead-letter topic refused (missing, not
/// writable, too large for it), kept in `consumer_dead_letter` instead
/// (labels `topic`, `reason`).
pub const DEAD_LETTERS_PARKED: &str = "outbox_consumer_dead_letters_parked_total";
/// Counter: handler calls abandoned at the handler timeout (label
/// `event_type`); each is also counted in `outbox_consumer_handler_errors_total`.
pub const HANDLER_TIMEOUTS: &str = "outbox_consumer_handler_timeouts_total";
/// Gauge: partitions whose next event backs off between handler attempts
/// (dedup mode); their later messages wait, every other partition goes on.
pub const PARTITIONS_BACKING_OFF: &str = "outbox_consumer_partitions_backing_off";
/// Gauge: batches being handled (dedup mode) or stored (inbox mode) at
/// once, at most `concurrent_batches`; each holds its partitions until it
/// commits.
pub const BATCHES_IN_FLIGHT: &str = "outbox_consumer_batches_in_flight";
/// Counter: messages of event types without a handler, skipped by policy.
pub const UNKNOWN_SKIPPED: &str = "outbox_consumer_unknown_skipped_total";
/// Counter: database failures that made the consumer pause and retry.
pub const DB_ERRORS: &str = "outbox_consumer_db_errors_total";
/// Counter: rows written to `inbox_event`.
pub const INBOX_STORED: &str = "outbox_inbox_stored_total";
/// Counter: inbox rows parked after failing (label `reason`).
pub const INBOX_PARKED: &str = "outbox_inbox_parked_total";
/// Counter: inbox stores that waited for another transaction storing rows
/// of the same partitions (their previous owner, still finishing its last
/// batch after a rebalance), so as not to overtake its rows.
pub const INBOX_STORE_WAITS: &str = "outbox_inbox_store_waits_total";
/// Gauge: unprocessed, unparked rows in `inbox_event`.
pub const INBOX_BACKLOG: &str = "outbox_inbox_backlog";
/// Gauge: messages between the group's position and the end of a partition
/// (labels `topic`, `partition`), from librdkafka's statistics.
pub const LAG: &str = "outbox_consumer_lag";
/// Gauge: parked rows in `inbox_event`.
pub const INBOX_PARKED_ROWS: &str = "outbox_inbox_parked_rows";
/// Gauge: inbox keys of the group whose oldest pending row is of an event
/// type no running processor of the group handles (they wait for one; see
/// `outbox status`). Refreshed every backlog interval.
pub const INBOX_UNCLAIMED_KEYS: &str = "outbox_inbox_unclaimed_keys";
/// Counter: times a partition's next message had a higher offset than the
/// one after the previous message (labels `topic`, `partition`). A
/// diagnostic, not an error: transaction markers, compaction and aborted
/// records leave such gaps on Kafka; on a topic written only by
/// idempotent producers it means the broker served records out of order.
/// Each gap is also logged at debug level, target
/// `txoutbox_runtime::consumer::offsets`.
pub const OFFSET_GAPS: &str = "outbox_consumer_offset_gaps_total";
