-- Domain tables of the orders service on MariaDB (idempotent): the tables
-- of `../orders.sql` (see there for what each holds) in MariaDB's types:
-- uuids as BINARY(16) (sqlx's encoding of a `Uuid`), times as DATETIME(6)
-- in UTC (sqlx sessions run at `time_zone = '+00:00'`).
CREATE TABLE IF NOT EXISTS orders (
    id             BINARY(16)  NOT NULL PRIMARY KEY,
    customer_id    BINARY(16)  NOT NULL,
    product_id     BINARY(16)  NOT NULL,
    amount         BIGINT      NOT NULL,
    payment_status VARCHAR(16) NOT NULL DEFAULT 'pending',
    created_at     DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    paid_at        DATETIME(6) NULL,
    status         VARCHAR(16) NOT NULL DEFAULT 'pending',
    cancel_reason  VARCHAR(32) NULL,
    finished_at    DATETIME(6) NULL,
    CONSTRAINT ck_orders_amount CHECK (amount > 0),
    CONSTRAINT ck_orders_status CHECK (status IN ('pending', 'confirmed', 'cancelled'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS fulfilment_settings (
    id               BOOLEAN NOT NULL DEFAULT TRUE PRIMARY KEY,
    stock_timeout_ms INT     NOT NULL,
    CONSTRAINT ck_fulfilment_settings_one_row CHECK (id = TRUE),
    CONSTRAINT ck_fulfilment_settings_timeout CHECK (stock_timeout_ms > 0)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
INSERT IGNORE INTO fulfilment_settings (id, stock_timeout_ms) VALUES (TRUE, 30000);
