-- outbox framework on MySQL / MariaDB, migration 0002: what the relay needs
-- beyond the outbox table (PostgreSQL's 0002, 0006 and 0011 in one).
-- MariaDB only (ADD KEY IF NOT EXISTS); safe to run more than once.

-- Rows waiting for a retry hold back the later rows of their key: the
-- claim looks for them by due time. Most rows have NULL here, and NULLs
-- sort first, so the claim's range (`next_attempt_at > now`) reads only
-- the rows that wait.
ALTER TABLE outbox_event ADD KEY IF NOT EXISTS ix_outbox_event_retrying (next_attempt_at);

-- The relays running against this database, one row per relay session. A
-- member is live while its session holds the named lock
-- `obx:<database>:m<backend_pid>` (released by the server when the
-- session ends); the row adds the lane count, the lease and where the relay
-- runs. Timestamps are UTC (UTC_TIMESTAMP(6)).
CREATE TABLE IF NOT EXISTS outbox_relay_member (
    backend_pid          BIGINT       NOT NULL,
    session_id           BINARY(16)   NOT NULL,
    lanes                INT          NOT NULL,
    lease_ms             BIGINT       NOT NULL,
    host                 VARCHAR(255) NOT NULL,
    process_id           BIGINT       NOT NULL,
    client_addr          VARCHAR(255) NULL,
    joined_at            DATETIME(6)  NOT NULL,
    heartbeat_at         DATETIME(6)  NOT NULL,
    broker_failing_since DATETIME(6)  NULL,
    held_topics          JSON         NOT NULL DEFAULT '[]',
    PRIMARY KEY (backend_pid)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
