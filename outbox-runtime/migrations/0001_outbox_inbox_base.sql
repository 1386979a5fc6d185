-- outbox framework, migration 0001: the seed's tables, exactly, plus processed_event.
-- Safe to run more than once (IF NOT EXISTS everywhere).

CREATE TABLE IF NOT EXISTS outbox_event (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id        uuid        NOT NULL UNIQUE,
    aggregate_type  text        NOT NULL,
    aggregate_id    text        NOT NULL,
    event_type      text        NOT NULL,
    payload         jsonb       NOT NULL,
    topic           text        NOT NULL,
    partition_key   text        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    published_at    timestamptz
);

CREATE INDEX IF NOT EXISTS ix_outbox_event_unpublished ON outbox_event(id)
    WHERE published_at IS NULL;

-- Extension columns (never renames): trace context and delivery bookkeeping.
ALTER TABLE outbox_event ADD COLUMN IF NOT EXISTS traceparent     text;
ALTER TABLE outbox_event ADD COLUMN IF NOT EXISTS attempts        integer NOT NULL DEFAULT 0;
ALTER TABLE outbox_event ADD COLUMN IF NOT EXISTS last_error      text;
ALTER TABLE outbox_event ADD COLUMN IF NOT EXISTS next_attempt_at timestamptz;
ALTER TABLE outbox_event ADD COLUMN IF NOT EXISTS parked_at       timestamptz;

CREATE TABLE IF NOT EXISTS inbox_event (
    event_id     uuid        PRIMARY KEY,
    received_at  timestamptz NOT NULL DEFAULT now(),
    payload      jsonb       NOT NULL,
    processed    boolean     NOT NULL DEFAULT false,
    processed_at timestamptz
);

CREATE INDEX IF NOT EXISTS ix_inbox_event_unprocessed ON inbox_event(received_at)
    WHERE NOT processed;

-- Extension columns: what the processor needs to dispatch and to park poison rows.
ALTER TABLE inbox_event ADD COLUMN IF NOT EXISTS event_type      text;
ALTER TABLE inbox_event ADD COLUMN IF NOT EXISTS topic           text;
ALTER TABLE inbox_event ADD COLUMN IF NOT EXISTS partition_key   text;
ALTER TABLE inbox_event ADD COLUMN IF NOT EXISTS headers         jsonb;
ALTER TABLE inbox_event ADD COLUMN IF NOT EXISTS attempts        integer NOT NULL DEFAULT 0;
ALTER TABLE inbox_event ADD COLUMN IF NOT EXISTS last_error      text;
ALTER TABLE inbox_event ADD COLUMN IF NOT EXISTS next_attempt_at timestamptz;
ALTER TABLE inbox_event ADD COLUMN IF NOT EXISTS parked_at       timestamptz;

-- Dedup table of the default consumer mode (R-DIST-OBX-2).
CREATE TABLE IF NOT EXISTS processed_event (
    consumer_group text        NOT NULL,
    event_id       uuid        NOT NULL,
    processed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, event_id)
);
