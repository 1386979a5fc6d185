-- outbox framework, migration 0008: saga state. Safe to run more than once
-- (IF NOT EXISTS everywhere).

-- One row per saga instance. A step (one incoming message) locks its saga's
-- row (`SELECT ... FOR UPDATE`), runs the saga's handler, and writes the new
-- state together with the messages it sends (`outbox_event`) and the dedup
-- of the incoming message, in one transaction; `version` counts the steps
-- applied (1 after the start).
--
-- * `status`: `running`, then `completed` or `compensated` (`finished_at` set);
--   a finished saga ignores later messages and is removed by the retention job
--   (`outbox cleanup`) once `finished_at` is older than the retention.
-- * `compensations`: the compensation messages of the steps done so far, as
--   outbox records, in the order they were registered; compensating sends them
--   in reverse order, once, and clears the list.
CREATE TABLE IF NOT EXISTS saga_state (
    saga_type         text        NOT NULL,
    saga_id           text        NOT NULL,
    status            text        NOT NULL DEFAULT 'running'
                      CHECK (status IN ('running', 'completed', 'compensated')),
    state             jsonb       NOT NULL,
    compensations     jsonb       NOT NULL DEFAULT '[]',
    version           bigint      NOT NULL DEFAULT 1,
    last_message_type text,
    last_event_id     uuid,
    started_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    finished_at       timestamptz,
    PRIMARY KEY (saga_type, saga_id)
);

-- Open sagas by age: `outbox sagas stuck --older-than`, the open-saga gauges.
CREATE INDEX IF NOT EXISTS ix_saga_state_open ON saga_state(saga_type, updated_at)
    WHERE finished_at IS NULL;

-- Finished sagas by end time: the retention job.
CREATE INDEX IF NOT EXISTS ix_saga_state_finished ON saga_state(finished_at)
    WHERE finished_at IS NOT NULL;
