-- outbox framework, migration 0012: rebuild runs of `outbox replay`.
-- Safe to run more than once (IF NOT EXISTS everywhere).

-- What a run selected and how: 'republish' (published rows, page by page) or
-- 'rebuild' (one snapshot, rows published or waiting for the relay, sent to a
-- topic of its own). Runs recorded before this migration were republish runs.
ALTER TABLE outbox_replay_run ADD COLUMN IF NOT EXISTS mode text NOT NULL DEFAULT 'republish';
-- The consumer group whose start offsets a rebuild committed, if any.
ALTER TABLE outbox_replay_run ADD COLUMN IF NOT EXISTS rebuild_group text;
-- A rebuild's hand-over (txoutbox_runtime::ops::replay::Handover as JSON):
-- the live topic's offsets where the rebuilding group continues, the replay
-- topic's range (its end once the run finished), the snapshot's highest id.
ALTER TABLE outbox_replay_run ADD COLUMN IF NOT EXISTS handover jsonb;
