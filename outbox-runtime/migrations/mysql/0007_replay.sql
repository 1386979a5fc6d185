-- outbox framework on MySQL / MariaDB, migration 0007: the runs of
-- `outbox replay` (PostgreSQL's migrations 0004 and 0012 for
-- `outbox_replay_run`). Safe to run more than once.
--
-- One row per replay run: published rows are never modified by a replay,
-- this table is where the re-publication is recorded (R-DIST-OBX-3 audit
-- trail), updated after every batch, so a crashed run shows how far it got
-- and a failed one its error.
--
-- * `mode`: 'republish' (published rows, page by page) or 'rebuild' (one
--   snapshot, rows published or waiting for the relay, sent to a topic of
--   its own).
-- * `filter`: the run's selection (txoutbox_runtime::ops::replay::ReplayFilter
--   as JSON).
-- * `rebuild_group`: the consumer group whose start offsets a rebuild
--   committed, if any.
-- * `handover`: a rebuild's hand-over (txoutbox_runtime::ops::replay::Handover
--   as JSON): the live topic's offsets where the rebuilding group continues,
--   the replay topic's range (its end once the run finished), the
--   snapshot's highest id.
--
-- Timestamps are DATETIME(6) in UTC, written with UTC_TIMESTAMP(6). Topics
-- and groups are TEXT: the table records what it was given, and a long
-- name is refused by the broker, not here.
CREATE TABLE IF NOT EXISTS outbox_replay_run (
    id            BIGINT      NOT NULL AUTO_INCREMENT,
    started_at    DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    finished_at   DATETIME(6) NULL,
    filter        JSON        NOT NULL,
    target_topic  TEXT        NULL,
    selected      BIGINT      NOT NULL,
    published     BIGINT      NOT NULL DEFAULT 0,
    error         MEDIUMTEXT  NULL,
    mode          VARCHAR(16) NOT NULL DEFAULT 'republish',
    rebuild_group TEXT        NULL,
    handover      JSON        NULL,
    PRIMARY KEY (id),
    CONSTRAINT ck_outbox_replay_run_mode CHECK (mode IN ('republish', 'rebuild'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
