-- Domain tables of the payments service (idempotent).
CREATE TABLE IF NOT EXISTS payments (
    id           uuid        PRIMARY KEY,
    order_id     uuid        NOT NULL UNIQUE,
    amount       bigint      NOT NULL,
    completed_at timestamptz NOT NULL DEFAULT now()
);
-- `completed`, or `declined` (over the limit below): one row per order either way.
ALTER TABLE payments ADD COLUMN IF NOT EXISTS status text NOT NULL DEFAULT 'completed'
    CHECK (status IN ('completed', 'declined'));

-- The payment policy, one row: charges above `decline_over` cents are
-- declined (the demo's way to make payments fail on purpose).
CREATE TABLE IF NOT EXISTS payment_policy (
    id           boolean PRIMARY KEY DEFAULT true CHECK (id),
    decline_over bigint  NOT NULL
);
INSERT INTO payment_policy (decline_over) VALUES (100000) ON CONFLICT (id) DO NOTHING;
