-- outbox framework on MySQL / MariaDB, migration 0005: inbox mode
-- (PostgreSQL's inbox_event, inbox_key and inbox_processor, as they stand
-- after its migrations 0003, 0005 and 0013), and the store locks.
-- Safe to run more than once.
--
-- Types: `consumer_group` and `partition_key` are VARBINARY(1024) (UTF-8
-- bytes, compared byte for byte as PostgreSQL's text is under its
-- equality): a group id and a key are at most 1,024 bytes (the consumer's
-- build and its admission check them), and as bytes the key index below
-- fits InnoDB's 3,072-byte limit, where utf8mb4 columns (4 bytes a
-- character) would not. Topic names are ASCII (Kafka's legal characters).
-- The payload is LONGTEXT, not JSON: MariaDB's JSON is LONGTEXT with a
-- JSON_VALID check, which could refuse a payload the consumer's own parser
-- accepted and fail its whole batch; the consumer has checked it is JSON
-- before it is stored, and MariaDB's JSON functions read it as it is.

CREATE TABLE IF NOT EXISTS inbox_event (
    consumer_group  VARBINARY(1024) NOT NULL,
    event_id        BINARY(16)      NOT NULL,
    -- Arrival order (PostgreSQL's identity column): a multi-row insert
    -- numbers its rows in their order, which is the consumed order.
    seq             BIGINT          NOT NULL AUTO_INCREMENT,
    received_at     DATETIME(6)     NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    payload         LONGTEXT        NOT NULL,
    payload_bytes   INT             NULL,
    event_type      MEDIUMTEXT      NULL,
    topic           VARCHAR(249) CHARACTER SET ascii COLLATE ascii_bin NULL,
    partition_key   VARBINARY(1024) NULL,
    headers         LONGTEXT        NULL,
    processed       BOOLEAN         NOT NULL DEFAULT FALSE,
    processed_at    DATETIME(6)     NULL,
    attempts        INT             NOT NULL DEFAULT 0,
    last_error      MEDIUMTEXT      NULL,
    next_attempt_at DATETIME(6)     NULL,
    parked_at       DATETIME(6)     NULL,
    discarded_at    DATETIME(6)     NULL,
    PRIMARY KEY (consumer_group, event_id),
    UNIQUE KEY ux_inbox_event_seq (seq),
    -- A key's rows in arrival order, pending ones apart (MySQL has no
    -- partial index: `processed` before `seq` keeps a key's processed
    -- history out of the range a head or a run is looked up in). Parked
    -- rows are in the range and skipped; they are few, and an operator
    -- retries or discards them.
    KEY ix_inbox_event_key_pending (consumer_group, topic, partition_key, processed, seq),
    -- Retention and status by group.
    KEY ix_inbox_event_group_processed (consumer_group, processed, processed_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- One row per key with pending rows: where its head (oldest pending row)
-- is, of which event type, and until when it backs off; rows without a key
-- have no order to keep and get an entry each (partition_key NULL, which a
-- unique index lets repeat). Kept by the consumer's own statements in the
-- transactions that store and settle rows (MySQL has no statement
-- triggers): whoever changes the pending state of an inbox row outside the
-- framework must mend its key's entry, as `outbox dead-letters` does.
CREATE TABLE IF NOT EXISTS inbox_key (
    consumer_group  VARBINARY(1024) NOT NULL,
    topic           VARCHAR(249) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    partition_key   VARBINARY(1024) NULL,
    head_seq        BIGINT          NOT NULL,
    head_event_type MEDIUMTEXT      NULL,
    not_before      DATETIME(6)     NULL,
    UNIQUE KEY ux_inbox_key (consumer_group, topic, partition_key),
    UNIQUE KEY ux_inbox_key_head (consumer_group, head_seq),
    -- Due keys oldest head first (NULLs sort first), and keys backing off
    -- soonest first: one index for both halves of a claim.
    KEY ix_inbox_key_due (consumer_group, not_before, head_seq)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- The inbox processors that run, with the (topic, event type) pairs they
-- handle as a JSON array of pairs, heartbeat every few seconds.
CREATE TABLE IF NOT EXISTS inbox_processor (
    consumer_group VARBINARY(1024) NOT NULL,
    instance_id    BINARY(16)      NOT NULL,
    host           VARCHAR(255)    NULL,
    handled        LONGTEXT        NOT NULL,
    heartbeat_ms   INT             NOT NULL,
    started_at     DATETIME(6)     NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    seen_at        DATETIME(6)     NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (consumer_group, instance_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- One row per (group, topic, partition) an inbox has stored: a store locks
-- the rows of its batch's partitions (FOR UPDATE, released at its commit),
-- PostgreSQL's transaction-scoped advisory locks, so that while a
-- partition's ownership overlaps after a rebalance the new owner's store
-- waits for the evicted owner's to end.
CREATE TABLE IF NOT EXISTS inbox_store_lock (
    consumer_group VARBINARY(1024) NOT NULL,
    topic          VARCHAR(249) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    `partition`    INT             NOT NULL,
    PRIMARY KEY (consumer_group, topic, `partition`)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
