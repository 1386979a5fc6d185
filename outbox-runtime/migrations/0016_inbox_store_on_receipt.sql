-- outbox framework, migration 0016: an inbox store that handles its batch on
-- receipt takes its locks, reads pending keys and inserts its rows in one
-- round trip.
-- Safe to run more than once (OR REPLACE).
--
-- Migration 0015's function took the locks and read which keys of the batch
-- have pending rows (inbox_key); the store then inserted the rows it handles
-- on receipt in a statement of its own. This one also inserts them, already
-- processed, when no key of the batch has pending rows: the usual case, in
-- which the consumer's choice of the rows it handles on receipt does not
-- depend on the read. When some key has pending rows, it inserts nothing and
-- returns those keys, and the consumer chooses again and inserts itself.
-- Which rows are handled on receipt stays the consumer's decision: the rows
-- passed in are exactly those it handles if nothing is pending.
--
-- As in 0015, the read and the insert run after the locks are held, each as
-- a statement of its own with a snapshot of its own (VOLATILE, READ
-- COMMITTED), so they see the commit of any store that held a lock before.
--
-- Returns:
--   * one row (false, NULL, NULL, NULL) if another transaction holds one of
--     the locks (nothing read or inserted);
--   * else a row (true, topic, key, NULL) per key of (topics[i], keys[i])
--     that has pending rows (nothing inserted);
--   * else a row (true, NULL, NULL, id) per row inserted (a row already in
--     the group's inbox is left as it is and not returned).
--
-- Migration 0015's function stays: a consumer of the version before this
-- one may still call it during a rolling deploy.
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
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF NOT coalesce((SELECT bool_and(pg_try_advisory_xact_lock(lock_class, hashtext(p)))
                     FROM unnest(lock_texts) AS p), true) THEN
        RETURN QUERY SELECT false, NULL::text, NULL::text, NULL::uuid;
        RETURN;
    END IF;
    RETURN QUERY
        SELECT true, k.topic, k.partition_key, NULL::uuid FROM inbox_key k
        WHERE k.consumer_group = consumer
          AND (k.topic, k.partition_key) IN (SELECT * FROM unnest(topics, keys));
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
