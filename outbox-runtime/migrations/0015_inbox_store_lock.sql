-- outbox framework, migration 0015: the inbox store's locks and its read of
-- pending keys in one round trip.
-- Safe to run more than once (OR REPLACE).
--
-- Every store of an inbox consumer first takes a transaction lock per
-- partition of its batch, then reads which keys of the batch have pending
-- rows (inbox_key): a key with none is handled on receipt. The read must see
-- the commit of any store that held one of those locks before, so it cannot
-- be part of the locking statement, whose snapshot is taken before the
-- locks. A VOLATILE function takes a new snapshot for each statement it
-- runs, under READ COMMITTED: here the read runs after the locks are held,
-- and the store saves a round trip to the database.
--
-- Returns one row (false, NULL, NULL) if another transaction holds one of
-- the locks (the store then rolls back, waits for it, and reads after it);
-- otherwise the keys of (topics[i], keys[i]) that have pending rows, each
-- with true, and no row if none has.
CREATE OR REPLACE FUNCTION outbox_inbox_lock_and_read_pending(
    lock_class integer,
    lock_texts text[],
    consumer text,
    topics text[],
    keys text[])
RETURNS TABLE (locked boolean, pending_topic text, pending_key text)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF NOT coalesce((SELECT bool_and(pg_try_advisory_xact_lock(lock_class, hashtext(p)))
                     FROM unnest(lock_texts) AS p), true) THEN
        RETURN QUERY SELECT false, NULL::text, NULL::text;
        RETURN;
    END IF;
    RETURN QUERY
        SELECT true, k.topic, k.partition_key FROM inbox_key k
        WHERE k.consumer_group = consumer
          AND (k.topic, k.partition_key) IN (SELECT * FROM unnest(topics, keys));
END
$$;
