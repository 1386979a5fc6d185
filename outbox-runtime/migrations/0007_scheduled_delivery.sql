-- outbox framework, migration 0007: scheduled delivery ("deliver not before").
-- Safe to run more than once (IF NOT EXISTS everywhere).
--
-- Events recorded with `Events::record_after` / `record_at` wait here, not in
-- outbox_event. Every claim of the relay walks the partial index
-- ix_outbox_event_unpublished (`WHERE published_at IS NULL`) in id order: a
-- not-yet-due row kept there would be stepped over by every claim, a heap
-- fetch each, for as long as it waits (100,000 reminders due next week would
-- slow every claim until next week). So future rows wait in a table of their
-- own, and the relay's scheduler moves them into outbox_event when they are
-- due (one statement: DELETE ... RETURNING into INSERT, FOR UPDATE SKIP
-- LOCKED). The seed's columns, its indexes and the relay's claim stay exactly
-- as they are.
--
-- A moved row gets its outbox_event id when it is due, so per-key order holds
-- among due messages: a scheduled message takes its place in its key's order
-- at its due time (immediate messages of its key recorded meanwhile are not
-- held back by it); scheduled messages of one key due at the same time are
-- moved in recording order (deliver_after, id).
CREATE TABLE IF NOT EXISTS outbox_scheduled (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id        uuid        NOT NULL UNIQUE,
    aggregate_type  text        NOT NULL,
    aggregate_id    text        NOT NULL,
    event_type      text        NOT NULL,
    payload         jsonb       NOT NULL,
    topic           text        NOT NULL,
    partition_key   text        NOT NULL,
    traceparent     text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    deliver_after   timestamptz NOT NULL
);

-- The scheduler's two queries: the due rows in due order, and the earliest
-- due time (how long it may sleep).
CREATE INDEX IF NOT EXISTS ix_outbox_scheduled_due ON outbox_scheduled(deliver_after, id);

-- On a row moved from outbox_scheduled: its due time (NULL for every other
-- row), so lateness = published_at - deliver_after can be measured. Nullable
-- without a default: adding it rewrites nothing.
ALTER TABLE outbox_event ADD COLUMN IF NOT EXISTS deliver_after timestamptz;
