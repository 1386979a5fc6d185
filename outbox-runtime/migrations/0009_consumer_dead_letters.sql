-- outbox framework, migration 0009: dead letters the broker would not take.
-- Safe to run more than once (IF NOT EXISTS everywhere).
--
-- A consumer publishes a message it cannot handle to its dead-letter topic.
-- When the broker refuses that copy for good (the topic is missing or the
-- consumer may not write to it, the record is too large for it even without
-- its value) or keeps failing it, the consumer keeps the record here instead
-- after a bounded number of tries, and then stores its offset: nothing is
-- lost, and no partition waits for a broker that will never say yes.
-- `outbox status` counts these rows; `republished_at` is set when an
-- operator has sent one to its dead-letter topic after all.
--
-- The record is kept as it came, bytes for bytes: key, value, and each
-- header's name and value (NULL for a null value), in order.
CREATE TABLE IF NOT EXISTS consumer_dead_letter (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer_group    text        NOT NULL,
    topic             text        NOT NULL,
    "partition"       integer     NOT NULL,
    "offset"          bigint      NOT NULL,
    record_key        bytea,
    record_value      bytea,
    header_names      bytea[]     NOT NULL DEFAULT '{}',
    header_values     bytea[]     NOT NULL DEFAULT '{}',
    reason            text        NOT NULL,
    error             text        NOT NULL,
    dead_letter_topic text        NOT NULL,
    publish_error     text        NOT NULL,
    parked_at         timestamptz NOT NULL DEFAULT now(),
    republished_at    timestamptz,
    -- A record redelivered before its offset was committed is kept once.
    UNIQUE (consumer_group, topic, "partition", "offset")
);

CREATE INDEX IF NOT EXISTS ix_consumer_dead_letter_unpublished
    ON consumer_dead_letter (parked_at) WHERE republished_at IS NULL;
