-- Domain tables of the inventory service on MariaDB (idempotent): the
-- tables of `../inventory.sql` (see there for what each holds) in MariaDB's
-- types: uuids as BINARY(16) (sqlx's encoding of a `Uuid`), times as
-- DATETIME(6) in UTC (sqlx sessions run at `time_zone = '+00:00'`).

CREATE TABLE IF NOT EXISTS stock (
    product_id     BINARY(16) NOT NULL PRIMARY KEY,
    available      INT        NOT NULL,
    reserved       INT        NOT NULL DEFAULT 0,
    reply_delay_ms INT        NOT NULL DEFAULT 0,
    apply_delay_ms INT        NOT NULL DEFAULT 0,
    CONSTRAINT ck_stock_available CHECK (available >= 0),
    CONSTRAINT ck_stock_reserved CHECK (reserved >= 0),
    CONSTRAINT ck_stock_delays CHECK (reply_delay_ms >= 0 AND apply_delay_ms >= 0)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS deferred_reservation (
    order_id    BINARY(16)  NOT NULL PRIMARY KEY,
    command_id  BINARY(16)  NOT NULL,
    deferred_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- One row per order a command arrived for, locked by every command of the
-- order before it reads the order's reservation (PostgreSQL takes a
-- transaction-level advisory lock instead): MariaDB's named locks
-- (GET_LOCK) belong to the session, not to the transaction the consumer
-- commits, and a `SELECT .. FOR UPDATE` of a row that does not exist yet
-- locks nothing at READ COMMITTED, the consumers' isolation.
CREATE TABLE IF NOT EXISTS reservation_lock (
    order_id BINARY(16) NOT NULL PRIMARY KEY
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS reservation (
    order_id   BINARY(16)  NOT NULL PRIMARY KEY,
    product_id BINARY(16)  NOT NULL,
    quantity   INT         NOT NULL,
    status     VARCHAR(16) NOT NULL,
    updated_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    CONSTRAINT ck_reservation_quantity CHECK (quantity >= 0),
    CONSTRAINT ck_reservation_status
        CHECK (status IN ('reserved', 'rejected', 'released', 'tombstone'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS stock_movement (
    id         BIGINT      NOT NULL AUTO_INCREMENT PRIMARY KEY,
    order_id   BINARY(16)  NOT NULL,
    product_id BINARY(16)  NOT NULL,
    kind       VARCHAR(16) NOT NULL,
    quantity   INT         NOT NULL,
    command_id BINARY(16)  NOT NULL,
    applied_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    KEY ix_stock_movement_order (order_id),
    CONSTRAINT ck_stock_movement_kind
        CHECK (kind IN ('reserve', 'reject', 'release', 'tombstone', 'late_reserve',
                        'release_nothing', 'defer'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
