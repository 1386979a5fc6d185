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

-- Where the order fulfilment saga left the order: `pending` while it runs,
-- then `confirmed` (stock reserved and paid) or `cancelled` (`cancel_reason`:
-- out_of_stock, payment_declined, stock_timeout).
ALTER TABLE orders ADD COLUMN IF NOT EXISTS status text NOT NULL DEFAULT 'pending'
    CHECK (status IN ('pending', 'confirmed', 'cancelled'));
ALTER TABLE orders ADD COLUMN IF NOT EXISTS cancel_reason text;
ALTER TABLE orders ADD COLUMN IF NOT EXISTS finished_at timestamptz;

-- Settings of the order fulfilment saga, one row: how long it waits for the
-- inventory's answer before it gives up on the order.
CREATE TABLE IF NOT EXISTS fulfilment_settings (
    id               boolean PRIMARY KEY DEFAULT true CHECK (id),
    stock_timeout_ms integer NOT NULL CHECK (stock_timeout_ms > 0)
);
INSERT INTO fulfilment_settings (stock_timeout_ms) VALUES (30000) ON CONFLICT (id) DO NOTHING;
