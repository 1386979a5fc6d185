-- outbox framework on MySQL / MariaDB, migration 0001: the seed's outbox
-- table with the closest types, and the scheduled events.
-- InnoDB, utf8mb4 with a binary collation (text compares as PostgreSQL's
-- does, byte for byte). `event_id` is BINARY(16), sqlx's encoding of a Uuid
-- on MySQL; timestamps are DATETIME(6) in UTC (sqlx sessions use +00:00).
-- Safe to run more than once (IF NOT EXISTS everywhere; indexes are part of
-- CREATE TABLE, since MySQL has no CREATE INDEX IF NOT EXISTS).

CREATE TABLE IF NOT EXISTS outbox_event (
    id              BIGINT       NOT NULL AUTO_INCREMENT,
    event_id        BINARY(16)   NOT NULL,
    aggregate_type  TEXT         NOT NULL,
    aggregate_id    TEXT         NOT NULL,
    event_type      TEXT         NOT NULL,
    payload         JSON         NOT NULL,
    topic           VARCHAR(249) NOT NULL,
    partition_key   VARCHAR(1024) NOT NULL,
    created_at      DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    published_at    DATETIME(6)  NULL,
    -- Extension columns, as on PostgreSQL.
    traceparent     VARCHAR(55)  NULL,
    attempts        INT          NOT NULL DEFAULT 0,
    last_error      TEXT         NULL,
    next_attempt_at DATETIME(6)  NULL,
    parked_at       DATETIME(6)  NULL,
    deliver_after   DATETIME(6)  NULL,
    headers         JSON         NULL,
    PRIMARY KEY (id),
    UNIQUE KEY ux_outbox_event_event_id (event_id),
    -- MySQL has no partial index: the unpublished rows are the ones whose
    -- `published_at` is NULL, and NULLs sort first in this index, so a claim
    -- (`WHERE published_at IS NULL ORDER BY id`) reads the unpublished
    -- entries only, however many published rows the table keeps.
    KEY ix_outbox_event_unpublished (published_at, id),
    -- The insert's guard: outside a transaction it sends a NULL event id,
    -- which NOT NULL refuses in strict mode; without strict mode the NULL
    -- becomes sixteen zero bytes, which this refuses.
    CONSTRAINT ck_outbox_event_id CHECK (event_id <> X'00000000000000000000000000000000')
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS outbox_scheduled (
    id              BIGINT       NOT NULL AUTO_INCREMENT,
    event_id        BINARY(16)   NOT NULL,
    aggregate_type  TEXT         NOT NULL,
    aggregate_id    TEXT         NOT NULL,
    event_type      TEXT         NOT NULL,
    payload         JSON         NOT NULL,
    topic           VARCHAR(249) NOT NULL,
    partition_key   VARCHAR(1024) NOT NULL,
    traceparent     VARCHAR(55)  NULL,
    headers         JSON         NULL,
    created_at      DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    deliver_after   DATETIME(6)  NOT NULL,
    PRIMARY KEY (id),
    UNIQUE KEY ux_outbox_scheduled_event_id (event_id),
    KEY ix_outbox_scheduled_due (deliver_after, id),
    CONSTRAINT ck_outbox_scheduled_id CHECK (event_id <> X'00000000000000000000000000000000')
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
