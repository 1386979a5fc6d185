-- outbox framework, migration 0006: the relays' membership (lane count
-- agreement and leases). Safe to run more than once (IF NOT EXISTS everywhere).

-- One row per relay session (the relay's own connection, which holds its lane
-- locks). A row counts only while its backend holds the membership advisory
-- lock (class 0x6f62786d "obxm", key = backend pid); rows of ended sessions
-- are removed by the next relay that joins or rebalances.
--
-- * `lanes`: a relay refuses to run when a live member uses another lane
--   count (lanes of different counts cover different keys, so two relays
--   would publish the same key).
-- * `heartbeat_at` / `lease_ms`: renewed by the relay every few seconds on its
--   own connection; a member whose lease has expired is disconnected by another
--   relay (pg_terminate_backend), which frees its lanes at once.
-- * `broker_failing_since`: set while the relay cannot reach the broker
--   (whole batches failing as unavailable); such a member hands its lanes to
--   members that can publish.
CREATE TABLE IF NOT EXISTS outbox_relay_member (
    backend_pid          int         PRIMARY KEY,
    session_id           uuid        NOT NULL,
    lanes                int         NOT NULL,
    lease_ms             bigint      NOT NULL,
    host                 text        NOT NULL,
    process_id           bigint      NOT NULL,
    client_addr          inet,
    joined_at            timestamptz NOT NULL DEFAULT now(),
    heartbeat_at         timestamptz NOT NULL DEFAULT now(),
    broker_failing_since timestamptz
);
