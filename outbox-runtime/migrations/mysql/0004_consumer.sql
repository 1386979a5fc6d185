-- outbox framework on MySQL / MariaDB, migration 0004: the consumer's
-- dedup table (PostgreSQL's `processed_event`, R-DIST-OBX-2) and the table
-- of dead letters their topic refused (PostgreSQL's 0009).
-- Safe to run more than once.
--
-- `consumer_group` is VARBINARY(1024): a group id is at most 1,024 bytes
-- (the consumer's build checks it), and as bytes it fits InnoDB's 3,072-byte
-- index key with the event id, where a utf8mb4 VARCHAR(1024) (4,096 bytes)
-- would not. Compared byte for byte, like PostgreSQL's text under its
-- equality.

CREATE TABLE IF NOT EXISTS processed_event (
    consumer_group VARBINARY(1024) NOT NULL,
    event_id       BINARY(16)      NOT NULL,
    processed_at   DATETIME(6)     NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (consumer_group, event_id),
    -- Retention deletes by age (`outbox cleanup --processed-older-than`).
    KEY ix_processed_event_processed_at (processed_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- A message whose dead-letter topic would not take it, kept with every
-- byte the broker delivered. MySQL has no arrays: the headers are one JSON
-- array of `[name, value]` pairs in hexadecimal (any bytes fit; `value` is
-- null for a null value), in the order the producer sent them; read them
-- with JSON_TABLE and UNHEX.
CREATE TABLE IF NOT EXISTS consumer_dead_letter (
    id                BIGINT          NOT NULL AUTO_INCREMENT,
    consumer_group    VARBINARY(1024) NOT NULL,
    topic             VARCHAR(249)    NOT NULL,
    `partition`       INT             NOT NULL,
    `offset`          BIGINT          NOT NULL,
    record_key        LONGBLOB        NULL,
    record_value      LONGBLOB        NULL,
    headers           JSON            NOT NULL,
    reason            VARCHAR(64)     NOT NULL,
    error             MEDIUMTEXT      NOT NULL,
    dead_letter_topic VARCHAR(255)    NOT NULL,
    publish_error     MEDIUMTEXT      NOT NULL,
    parked_at         DATETIME(6)     NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    republished_at    DATETIME(6)     NULL,
    PRIMARY KEY (id),
    -- A record redelivered before its offset was committed is kept once.
    UNIQUE KEY ux_consumer_dead_letter_record (consumer_group, topic, `partition`, `offset`),
    KEY ix_consumer_dead_letter_unpublished (republished_at, parked_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
