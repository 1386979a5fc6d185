-- outbox framework, migration 0017: the inbox reads inbox_key one key at a
-- time, whatever its statistics said when a plan was made.
-- Safe to run more than once (OR REPLACE).
--
-- The store's functions (migrations 0015 and 0016) and the update trigger
-- (migration 0005) looked their keys up in inbox_key with one
-- `(group, topic, key) IN (...)` join. Each connection caches the plans of
-- a plpgsql function's statements, and a plan made while inbox_key was
-- young (a new service, before autovacuum had analyzed the table) read
-- every key of the group through an index on the group alone, or the whole
-- table, and hashed it, for every store and every batch of handled rows,
-- while a backlog grew the table (8 ms per store at 50,000 pending keys),
-- until an analyze replaced the plan. Here each key of a batch is looked up
-- on its own, in a LATERAL subquery the planner cannot turn into a join of
-- the whole table: an index probe of ux_inbox_key per key, whatever the
-- table's size at planning time (tests/inbox_key_plans.rs).
--
-- The store's function also plans its statements once per connection
-- (plan_cache_mode = force_generic_plan, for the function's run only): with
-- the lookup written per key, PostgreSQL otherwise judged the generic plan
-- (ten keys a batch, by its estimate) dearer than a plan for the batch at
-- hand and planned every call afresh, 0.09 ms per store. The generic plan
-- is the same index probe per key.
--
-- Only those reads change; every function keeps its name, signature,
-- results and locking order (the update trigger locks the touched keys'
-- entries in (group, topic, key) order, as before). Migration 0015's
-- function now calls 0016's with no row to insert instead of repeating its
-- lock and read.

-- The store's function of migration 0016 (the one consumers call).
CREATE OR REPLACE FUNCTION outbox_inbox_store_on_receipt(
    lock_class integer,
    lock_texts text[],
    consumer text,
    topics text[],
    keys text[],
    row_event_ids uuid[],
    row_payloads text[],
    row_event_types text[],
    row_topics text[],
    row_keys text[],
    row_headers jsonb[])
RETURNS TABLE (locked boolean, pending_topic text, pending_key text, inserted_id uuid)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    IF NOT coalesce((SELECT bool_and(pg_try_advisory_xact_lock(lock_class, hashtext(p)))
                     FROM unnest(lock_texts) AS p), true) THEN
        RETURN QUERY SELECT false, NULL::text, NULL::text, NULL::uuid;
        RETURN;
    END IF;
    RETURN QUERY
        SELECT true, w.topic, w.partition_key, NULL::uuid
        FROM (SELECT DISTINCT * FROM unnest(topics, keys)) AS w(topic, partition_key)
        CROSS JOIN LATERAL (
            SELECT 1 FROM inbox_key k
            WHERE k.consumer_group = consumer AND k.topic = w.topic
              AND k.partition_key = w.partition_key
            LIMIT 1) AS found;
    IF FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY
        WITH inserted AS (
            INSERT INTO inbox_event
                (consumer_group, event_id, payload, payload_bytes, event_type, topic,
                 partition_key, headers, processed, processed_at)
            SELECT consumer, r.event_id, r.payload::jsonb, octet_length(r.payload),
                   r.event_type, r.topic, r.partition_key, r.headers, true, now()
            FROM unnest(row_event_ids, row_payloads, row_event_types, row_topics, row_keys,
                        row_headers)
                 AS r(event_id, payload, event_type, topic, partition_key, headers)
            ON CONFLICT (consumer_group, event_id) DO NOTHING
            RETURNING event_id)
        SELECT true, NULL::text, NULL::text, i.event_id FROM inserted i;
END
$$;

-- Migration 0015's function, still called by consumers of the version
-- before 0016 during a rolling deploy: the store's function above with no
-- row to insert answers the same (not locked; else the pending keys; else
-- nothing), so it now calls that one and keeps no read of its own.
CREATE OR REPLACE FUNCTION outbox_inbox_lock_and_read_pending(
    lock_class integer,
    lock_texts text[],
    consumer text,
    topics text[],
    keys text[])
RETURNS TABLE (locked boolean, pending_topic text, pending_key text)
LANGUAGE sql VOLATILE AS $$
    SELECT s.locked, s.pending_topic, s.pending_key
    FROM outbox_inbox_store_on_receipt(lock_class, lock_texts, consumer, topics, keys,
                                       '{}', '{}', '{}', '{}', '{}', '{}') AS s
$$;

-- Migration 0005's update trigger function (its trigger is unchanged).
CREATE OR REPLACE FUNCTION outbox_inbox_keys_after_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1
    FROM (SELECT DISTINCT c.consumer_group, c.topic, c.partition_key FROM changed c
          WHERE c.partition_key IS NOT NULL AND c.topic IS NOT NULL
          ORDER BY 1, 2, 3) AS t
    CROSS JOIN LATERAL (
        SELECT 1 FROM inbox_key k
        WHERE k.consumer_group = t.consumer_group AND k.topic = t.topic
          AND k.partition_key = t.partition_key
        FOR UPDATE OF k) AS locked;

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
