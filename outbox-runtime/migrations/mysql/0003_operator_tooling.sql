-- outbox framework on MySQL / MariaDB, migration 0003: what the operator
-- tool needs on the outbox table (PostgreSQL's 0004 for `outbox_event`).
-- MariaDB only (ADD COLUMN IF NOT EXISTS); safe to run more than once.

-- When an operator gave up on a parked row (`outbox dead-letters
-- discard`): the row stays parked, never published, as evidence, until
-- `outbox cleanup --older-than` removes it. Appending a nullable column
-- is instant on InnoDB (no table rebuild). No index: the operator's
-- queries read parked rows among the unpublished ones, the NULL head of
-- `ix_outbox_event_unpublished`, and a further index would cost every
-- insert of the outbox.
ALTER TABLE outbox_event ADD COLUMN IF NOT EXISTS discarded_at DATETIME(6) NULL;
