-- outbox framework, migration 0004: what the operator tooling (`outbox` CLI) needs.
-- Safe to run more than once (IF NOT EXISTS everywhere).

-- A dead letter an operator gave up on: it stays parked (so neither the relay nor
-- the inbox processor ever picks it up again) and is kept for the audit trail until
-- the retention job removes it. Discarding never sets published_at / processed:
-- those columns must keep saying what actually happened.
ALTER TABLE outbox_event ADD COLUMN IF NOT EXISTS discarded_at timestamptz;
ALTER TABLE inbox_event  ADD COLUMN IF NOT EXISTS discarded_at timestamptz;

-- One row per `outbox replay` run: published rows are never modified by a replay,
-- this table is where the re-publication is recorded (R-DIST-OBX-3 audit trail).
CREATE TABLE IF NOT EXISTS outbox_replay_run (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    started_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    filter       jsonb       NOT NULL,
    target_topic text,
    selected     bigint      NOT NULL,
    published    bigint      NOT NULL DEFAULT 0,
    error        text
);
