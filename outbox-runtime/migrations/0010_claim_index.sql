-- outbox framework, migration 0010: parked rows leave the claim's index.
-- Safe to run more than once (it checks what is there first).
--
-- The relay's claim walks ix_outbox_event_unpublished in id order. Until
-- now that index held every unpublished row (`WHERE published_at IS NULL`,
-- the seed's definition), so parked rows, and discarded ones (a discarded
-- row stays parked), sat in it at the lowest ids, and every claim stepped
-- over all of them, reading each one's heap tuple to test `parked_at IS
-- NULL`: about 1.6 us per parked row per claim, for as long as they stayed
-- parked (200,000 dead letters: a third of a second in front of every
-- batch).
--
-- The index keeps its name and its purpose (the hot set the relay works
-- on, R-DIST-OBX-1), with the predicate narrowed to the rows the relay may
-- still publish:
--
--     ix_outbox_event_unpublished ON outbox_event(id)
--         WHERE published_at IS NULL AND parked_at IS NULL
--
-- Together with ix_outbox_event_parked (`published_at IS NULL AND parked_at
-- IS NOT NULL`, migration 0002) it still covers every unpublished row: a
-- query on "unpublished" alone (`WHERE published_at IS NULL`) matches
-- neither, so the framework's own queries say which of the two they mean.
-- A row moves between them by itself: parking it takes it out of this one,
-- `outbox dead-letters retry` (which clears parked_at) puts it back.
--
-- Building the new index reads the whole table, and writes to outbox_event
-- wait for it (seconds per few million rows). On a large table, build it
-- beforehand without blocking writes, under the name this migration looks
-- for, and the migration only swaps the two (milliseconds):
--
--     CREATE INDEX CONCURRENTLY ix_outbox_event_unpublished_0010 ON outbox_event(id)
--         WHERE published_at IS NULL AND parked_at IS NULL;
DO $$
DECLARE
    current_predicate text;
BEGIN
    SELECT pg_get_expr(i.indpred, i.indrelid) INTO current_predicate
    FROM pg_index i WHERE i.indexrelid = to_regclass('ix_outbox_event_unpublished');
    IF current_predicate IS NOT NULL AND current_predicate LIKE '%parked_at IS NULL%' THEN
        RETURN; -- applied already
    END IF;
    -- A concurrent build that failed leaves an invalid index behind.
    IF EXISTS (SELECT 1 FROM pg_index i
               WHERE i.indexrelid = to_regclass('ix_outbox_event_unpublished_0010')
                 AND NOT i.indisvalid) THEN
        DROP INDEX ix_outbox_event_unpublished_0010;
    END IF;
    CREATE INDEX IF NOT EXISTS ix_outbox_event_unpublished_0010 ON outbox_event(id)
        WHERE published_at IS NULL AND parked_at IS NULL;
    DROP INDEX IF EXISTS ix_outbox_event_unpublished;
    ALTER INDEX ix_outbox_event_unpublished_0010 RENAME TO ix_outbox_event_unpublished;
END $$;
