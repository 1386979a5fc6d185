-- outbox framework, migration 0011: topics a relay holds. Safe to run more
-- than once (IF NOT EXISTS).
--
-- A relay holds a topic the broker refuses as a whole (it does not exist,
-- or the relay may not write to it): the topic's rows wait in the outbox,
-- no attempt counted, while other topics flow. Each relay records its held
-- topics in its membership row, at every renewal, for `outbox status`:
-- a JSON array of {"topic", "reason", "since", "refusals"}, empty when it
-- holds none.
ALTER TABLE outbox_relay_member ADD COLUMN IF NOT EXISTS held_topics jsonb NOT NULL DEFAULT '[]';
