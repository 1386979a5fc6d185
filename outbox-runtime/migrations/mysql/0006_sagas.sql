-- outbox framework on MySQL / MariaDB, migration 0006: saga state
-- (PostgreSQL's migration 0008). Safe to run more than once.
--
-- One row per saga instance; a step locks its row (`SELECT .. FOR UPDATE`),
-- runs the saga's handler and writes the new state with the messages it
-- sends and the incoming message's dedup, in one transaction; `version`
-- counts the steps applied (1 after the start). `saga_type` is the saga's
-- name (`[a-z0-9_.-]`, checked by `#[saga]`), `saga_id` the correlation's
-- text as UTF-8 bytes (at most 1,024: the consumer refuses longer ones).
-- `status` is `running`, then `completed` or `compensated` (`finished_at`
-- set); `compensations` the compensation messages registered so far, as
-- outbox records, sent in reverse order if the saga is compensated.
CREATE TABLE IF NOT EXISTS saga_state (
    saga_type         VARBINARY(255)  NOT NULL,
    saga_id           VARBINARY(1024) NOT NULL,
    status            VARCHAR(16)     NOT NULL DEFAULT 'running',
    state             JSON            NOT NULL,
    compensations     JSON            NOT NULL DEFAULT '[]',
    version           BIGINT          NOT NULL DEFAULT 1,
    last_message_type MEDIUMTEXT      NULL,
    last_event_id     BINARY(16)      NULL,
    started_at        DATETIME(6)     NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    updated_at        DATETIME(6)     NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    finished_at       DATETIME(6)     NULL,
    PRIMARY KEY (saga_type, saga_id),
    -- Open sagas by age (`finished_at` NULL sorts first): `outbox sagas
    -- stuck`, the open-saga gauges.
    KEY ix_saga_state_open (saga_type, finished_at, updated_at),
    -- Finished sagas by end time: the retention job.
    KEY ix_saga_state_finished (finished_at),
    CONSTRAINT ck_saga_state_status CHECK (status IN ('running', 'completed', 'compensated'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
