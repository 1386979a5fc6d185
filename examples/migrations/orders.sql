-- Domain tables of the orders service (idempotent).
CREATE TABLE IF NOT EXISTS orders (
    id             uuid        PRIMARY KEY,
    customer_id    uuid        NOT NULL,
    product_id     uuid        NOT NULL,
    amount         bigint      NOT NULL CHECK (amount > 0),
    payment_status text        NOT NULL DEFAULT 'pending',
    created_at     timestamptz NOT NULL DEFAULT now(),
    paid_at        timestamptz
);
