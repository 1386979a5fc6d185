-- Domain tables of the inventory service (idempotent).

-- Stock per product. `reply_delay_ms` simulates a slow warehouse: the
-- answer to a reservation of this product is sent that much later (the
-- demo sets it above the saga's timeout, so that timeouts happen).
CREATE TABLE IF NOT EXISTS stock (
    product_id     uuid    PRIMARY KEY,
    available      integer NOT NULL CHECK (available >= 0),
    reserved       integer NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    reply_delay_ms integer NOT NULL DEFAULT 0 CHECK (reply_delay_ms >= 0)
);
-- A backlogged warehouse: a reservation of this product is applied
-- `apply_delay_ms` after it arrives (the command is put back, scheduled).
-- The demo sets it above the saga's timeout, so that the saga's release
-- arrives first and leaves a tombstone.
ALTER TABLE stock ADD COLUMN IF NOT EXISTS apply_delay_ms integer NOT NULL DEFAULT 0
    CHECK (apply_delay_ms >= 0);

-- Reservations of a backlogged product put back for later, one per order.
CREATE TABLE IF NOT EXISTS deferred_reservation (
    order_id    uuid        PRIMARY KEY,
    command_id  uuid        NOT NULL,
    deferred_at timestamptz NOT NULL DEFAULT now()
);

-- One row per order the inventory heard of, locked while a command of that
-- order is applied:
-- * `reserved`: the stock is held for the order;
-- * `rejected`: nothing was reserved (not enough stock);
-- * `released`: the reservation was given back (a compensation);
-- * `tombstone`: a release came before its reservation (the saga gave up
--   waiting); the reservation, if it comes, reserves nothing.
CREATE TABLE IF NOT EXISTS reservation (
    order_id   uuid        PRIMARY KEY,
    product_id uuid        NOT NULL,
    quantity   integer     NOT NULL CHECK (quantity >= 0),
    status     text        NOT NULL
               CHECK (status IN ('reserved', 'rejected', 'released', 'tombstone')),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- What the inventory applied, one row per command, never updated: `reserve`
-- and `release` moved stock; `reject` (out of stock), `tombstone` (a release
-- before its reservation), `late_reserve` (a reservation after its release)
-- `release_nothing` (a release of a rejected or released reservation) and
-- `defer` (a reservation put back by a backlogged warehouse) did not. The demo and the tests check from it that each reservation was
-- released at most once and that no release ran for a reservation that
-- never happened.
CREATE TABLE IF NOT EXISTS stock_movement (
    id         bigserial   PRIMARY KEY,
    order_id   uuid        NOT NULL,
    product_id uuid        NOT NULL,
    kind       text        NOT NULL
               CHECK (kind IN ('reserve', 'reject', 'release', 'tombstone', 'late_reserve',
                               'release_nothing', 'defer')),
    quantity   integer     NOT NULL,
    command_id uuid        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS ix_stock_movement_order ON stock_movement(order_id);
