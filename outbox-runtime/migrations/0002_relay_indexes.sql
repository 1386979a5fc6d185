-- outbox framework, migration 0002: indexes the relay's claim relies on.
-- Safe to run more than once (IF NOT EXISTS everywhere).

-- Rows waiting for a retry, by key: the claim skips later rows of such a key
-- (per-key order) with an anti-join on this index. It only holds rows in
-- retry, so it stays tiny.
CREATE INDEX IF NOT EXISTS ix_outbox_event_retrying ON outbox_event(partition_key, id)
    WHERE published_at IS NULL AND parked_at IS NULL AND next_attempt_at IS NOT NULL;

-- Parked rows, for `relay::parked` and `relay::retry_parked`.
CREATE INDEX IF NOT EXISTS ix_outbox_event_parked ON outbox_event(id)
    WHERE published_at IS NULL AND parked_at IS NOT NULL;
