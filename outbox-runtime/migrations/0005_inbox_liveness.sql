-- outbox framework, migration 0005: inbox liveness.
-- Safe to run more than once (IF NOT EXISTS / OR REPLACE everywhere).
--
-- 1. Several consumer groups may keep their inboxes in one database: a row
--    belongs to a group, and the same event may be in several groups' inboxes.
--    Rows stored before this migration get the group '' and are adopted by the
--    first inbox consumer that starts (one database held one inbox group until
--    now). The seed's columns and its partial index stay as they are.
ALTER TABLE inbox_event ADD COLUMN IF NOT EXISTS consumer_group text NOT NULL DEFAULT '';

DO $$
BEGIN
    IF EXISTS (
        SELECT 1 FROM pg_constraint
        WHERE conrelid = 'inbox_event'::regclass AND contype = 'p'
          AND conkey = ARRAY[(SELECT attnum FROM pg_attribute
                              WHERE attrelid = 'inbox_event'::regclass AND attname = 'event_id')]::int2[]
    ) THEN
        EXECUTE format('ALTER TABLE inbox_event DROP CONSTRAINT %I',
            (SELECT conname FROM pg_constraint WHERE conrelid = 'inbox_event'::regclass AND contype = 'p'));
        ALTER TABLE inbox_event ADD CONSTRAINT inbox_event_pkey PRIMARY KEY (consumer_group, event_id);
    END IF;
END $$;

-- A key's pending rows in arrival order: a key's head (its oldest pending
-- row) and the run behind it are found here, one index probe per key.
-- And pending rows by arrival sequence (globally unique), for claiming the
-- heads and runs found; it replaces 0003's index, which also covered parked
-- rows.
CREATE INDEX IF NOT EXISTS ix_inbox_event_pending_by_seq ON inbox_event (seq)
    WHERE NOT processed AND parked_at IS NULL;
DROP INDEX IF EXISTS ix_inbox_event_pending_seq;
CREATE INDEX IF NOT EXISTS ix_inbox_event_key_pending
    ON inbox_event (consumer_group, topic, partition_key, seq)
    WHERE NOT processed AND parked_at IS NULL;

-- 2. One row per key with pending rows: where its head is, of which event
--    type, and until when it backs off. A processor's claim reads due keys
--    here, so a key that cannot go (its head backing off for a retry, or of an
--    event type no running processor handles) costs nothing however many rows
--    it holds, and never hides other keys. Rows without a key have no order
--    to keep: each gets an entry of its own (partition_key NULL).
--    Maintained by the triggers below, whoever writes inbox_event.
CREATE TABLE IF NOT EXISTS inbox_key (
    consumer_group  text        NOT NULL,
    topic           text        NOT NULL,
    partition_key   text,
    head_seq        bigint      NOT NULL,
    head_event_type text,
    not_before      timestamptz
);

CREATE UNIQUE INDEX IF NOT EXISTS ux_inbox_key ON inbox_key (consumer_group, topic, partition_key);
CREATE UNIQUE INDEX IF NOT EXISTS ux_inbox_key_head ON inbox_key (consumer_group, head_seq);
-- Due keys, oldest head first.
CREATE INDEX IF NOT EXISTS ix_inbox_key_ready ON inbox_key (consumer_group, head_seq)
    WHERE not_before IS NULL;
-- Keys backing off, soonest first.
CREATE INDEX IF NOT EXISTS ix_inbox_key_waiting ON inbox_key (consumer_group, not_before)
    WHERE not_before IS NOT NULL;

-- New pending rows: their key gets an entry, or an earlier head.
--
-- The upsert takes the key row's lock even when it changes nothing, so it
-- waits for a processor that is moving that key's head (see the update
-- trigger) and the two never lose each other's rows. Keys are taken in one
-- order by everybody (group, topic, key), so they never deadlock.
CREATE OR REPLACE FUNCTION outbox_inbox_keys_after_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO inbox_key AS k (consumer_group, topic, partition_key, head_seq, head_event_type, not_before)
    SELECT DISTINCT ON (a.consumer_group, a.topic, a.partition_key)
           a.consumer_group, a.topic, a.partition_key, a.seq, a.event_type, a.next_attempt_at
    FROM added a
    WHERE NOT a.processed AND a.parked_at IS NULL AND a.topic IS NOT NULL
      AND a.partition_key IS NOT NULL AND a.seq IS NOT NULL
    ORDER BY a.consumer_group, a.topic, a.partition_key, a.seq
    ON CONFLICT (consumer_group, topic, partition_key) DO UPDATE
        SET head_seq = excluded.head_seq,
            head_event_type = excluded.head_event_type,
            not_before = excluded.not_before
        WHERE k.head_seq > excluded.head_seq;

    INSERT INTO inbox_key (consumer_group, topic, partition_key, head_seq, head_event_type, not_before)
    SELECT a.consumer_group, a.topic, NULL, a.seq, a.event_type, a.next_attempt_at
    FROM added a
    WHERE NOT a.processed AND a.parked_at IS NULL AND a.topic IS NOT NULL
      AND a.partition_key IS NULL AND a.seq IS NOT NULL
    ON CONFLICT (consumer_group, head_seq) DO NOTHING;
    RETURN NULL;
END $$;

-- Rows that changed (handled, parked, backing off, retried by an operator,
-- adopted by a group): their keys' heads are recomputed.
--
-- First the key rows are locked (waiting for a store transaction that is
-- adding rows to the same key), then, in a new statement and so with a new
-- snapshot under READ COMMITTED, each key's oldest pending row is looked up:
-- rows another transaction committed while we waited are seen, and rows it
-- has not committed yet are added by its own trigger after ours commits.
CREATE OR REPLACE FUNCTION outbox_inbox_keys_after_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM inbox_key k
    WHERE (k.consumer_group, k.topic, k.partition_key) IN (
        SELECT c.consumer_group, c.topic, c.partition_key FROM changed c
        WHERE c.partition_key IS NOT NULL AND c.topic IS NOT NULL)
    ORDER BY k.consumer_group, k.topic, k.partition_key
    FOR UPDATE OF k;

    WITH touched AS (
        SELECT DISTINCT c.consumer_group, c.topic, c.partition_key FROM changed c
        WHERE c.partition_key IS NOT NULL AND c.topic IS NOT NULL),
    heads AS (
        SELECT t.consumer_group, t.topic, t.partition_key, h.seq, h.event_type, h.next_attempt_at
        FROM touched t
        LEFT JOIN LATERAL (
            SELECT i.seq, i.event_type, i.next_attempt_at FROM inbox_event i
            WHERE i.consumer_group = t.consumer_group AND i.topic = t.topic
              AND i.partition_key = t.partition_key
              AND NOT i.processed AND i.parked_at IS NULL
            ORDER BY i.seq LIMIT 1) h ON true),
    emptied AS (
        DELETE FROM inbox_key k USING heads h
        WHERE h.seq IS NULL AND k.consumer_group = h.consumer_group
          AND k.topic = h.topic AND k.partition_key = h.partition_key)
    INSERT INTO inbox_key AS k (consumer_group, topic, partition_key, head_seq, head_event_type, not_before)
    SELECT h.consumer_group, h.topic, h.partition_key, h.seq, h.event_type, h.next_attempt_at
    FROM heads h WHERE h.seq IS NOT NULL
    ORDER BY h.consumer_group, h.topic, h.partition_key
    ON CONFLICT (consumer_group, topic, partition_key) DO UPDATE
        SET head_seq = excluded.head_seq,
            head_event_type = excluded.head_event_type,
            not_before = excluded.not_before
        WHERE (k.head_seq, k.head_event_type, k.not_before)
              IS DISTINCT FROM (excluded.head_seq, excluded.head_event_type, excluded.not_before);

    -- Rows without a key: the entry follows its one row.
    DELETE FROM inbox_key k USING changed c
    WHERE c.partition_key IS NULL AND k.partition_key IS NULL AND k.head_seq = c.seq
      AND (c.processed OR c.parked_at IS NOT NULL OR k.consumer_group <> c.consumer_group);
    INSERT INTO inbox_key AS k (consumer_group, topic, partition_key, head_seq, head_event_type, not_before)
    SELECT c.consumer_group, c.topic, NULL, c.seq, c.event_type, c.next_attempt_at
    FROM changed c
    WHERE c.partition_key IS NULL AND c.topic IS NOT NULL AND c.seq IS NOT NULL
      AND NOT c.processed AND c.parked_at IS NULL
    ON CONFLICT (consumer_group, head_seq) DO UPDATE
        SET not_before = excluded.not_before, head_event_type = excluded.head_event_type;
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS outbox_inbox_keys_insert ON inbox_event;
CREATE TRIGGER outbox_inbox_keys_insert AFTER INSERT ON inbox_event
    REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_inbox_keys_after_insert();

DROP TRIGGER IF EXISTS outbox_inbox_keys_update ON inbox_event;
CREATE TRIGGER outbox_inbox_keys_update AFTER UPDATE ON inbox_event
    REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_inbox_keys_after_update();

-- Keys of the rows already pending (stored before this migration).
INSERT INTO inbox_key (consumer_group, topic, partition_key, head_seq, head_event_type, not_before)
SELECT DISTINCT ON (consumer_group, topic, partition_key)
       consumer_group, topic, partition_key, seq, event_type, next_attempt_at
FROM inbox_event
WHERE NOT processed AND parked_at IS NULL AND topic IS NOT NULL AND partition_key IS NOT NULL
ORDER BY consumer_group, topic, partition_key, seq
ON CONFLICT DO NOTHING;
INSERT INTO inbox_key (consumer_group, topic, partition_key, head_seq, head_event_type, not_before)
SELECT consumer_group, topic, NULL, seq, event_type, next_attempt_at
FROM inbox_event
WHERE NOT processed AND parked_at IS NULL AND topic IS NOT NULL AND partition_key IS NULL
ON CONFLICT DO NOTHING;

-- 3. The inbox processors that run, with the event types they handle (a
--    heartbeat every few seconds), so that `outbox status` can show rows that
--    wait for an event type no running processor handles (during a rolling
--    deploy that adds a handler, say).
CREATE TABLE IF NOT EXISTS inbox_processor (
    consumer_group text        NOT NULL,
    instance_id    uuid        NOT NULL,
    host           text,
    topics         text[]      NOT NULL,
    event_types    text[]      NOT NULL,
    heartbeat_ms   integer     NOT NULL,
    started_at     timestamptz NOT NULL DEFAULT now(),
    seen_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, instance_id)
);
