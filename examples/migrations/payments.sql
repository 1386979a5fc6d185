-- Domain tables of the payments service (idempotent).
CREATE TABLE IF NOT EXISTS payments (
    id           uuid        PRIMARY KEY,
    order_id     uuid        NOT NULL UNIQUE,
    amount       bigint      NOT NULL,
    completed_at timestamptz NOT NULL DEFAULT now()
);
