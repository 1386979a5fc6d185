-- Domain tables of the payments service on MariaDB (idempotent): the tables
-- of `../payments.sql` in MariaDB's types (uuids BINARY(16), times
-- DATETIME(6) in UTC).

-- One row per order charged, `completed` or `declined`.
CREATE TABLE IF NOT EXISTS payments (
    id           BINARY(16)  NOT NULL PRIMARY KEY,
    order_id     BINARY(16)  NOT NULL,
    amount       BIGINT      NOT NULL,
    completed_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    status       VARCHAR(16) NOT NULL DEFAULT 'completed',
    UNIQUE KEY ux_payments_order (order_id),
    CONSTRAINT ck_payments_status CHECK (status IN ('completed', 'declined'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- The payment policy, one row: charges above `decline_over` cents are declined.
CREATE TABLE IF NOT EXISTS payment_policy (
    id           BOOLEAN NOT NULL DEFAULT TRUE PRIMARY KEY,
    decline_over BIGINT  NOT NULL,
    CONSTRAINT ck_payment_policy_one_row CHECK (id = TRUE)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
INSERT IGNORE INTO payment_policy (id, decline_over) VALUES (TRUE, 100000);
