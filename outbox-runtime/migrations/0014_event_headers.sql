-- outbox framework, migration 0014: headers of the user's own.
-- Safe to run more than once (IF NOT EXISTS everywhere).
--
-- An event can carry headers of the application's (a tenant, a correlation
-- id, a schema version): static ones of its type and dynamic ones given when
-- it is recorded. They are stored with the row as a JSON object of strings,
-- NULL when there are none (most rows: nothing stored, nothing read), and
-- sent after the framework's headers. The seed's columns are untouched;
-- scheduled events keep theirs until they move into outbox_event.
ALTER TABLE outbox_event ADD COLUMN IF NOT EXISTS headers jsonb;
ALTER TABLE outbox_scheduled ADD COLUMN IF NOT EXISTS headers jsonb;
