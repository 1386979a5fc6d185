-- outbox framework on MySQL / MariaDB, migration 0008: parked rows out of
-- the claim's walk (PostgreSQL's migration 0010). Safe to run more than
-- once.
--
-- `ix_outbox_event_unpublished` was `(published_at, id)`: its NULL head
-- held every unpublished row, the parked ones (dead letters, kept until an
-- operator discards them and `outbox cleanup` removes them) included, and
-- the claim walks that head in id order. Parked rows are the oldest, so
-- every claim stepped over all of them first, reading each one's
-- `parked_at` from the table: 200,000 parked rows made a 1,000-row claim
-- read 201,000 rows (49 ms instead of 1.6 ms), and the optimizer preferred
-- scanning the primary key. With `parked_at` second, the head
-- `(NULL, NULL)` is exactly the claimable rows, in id order (InnoDB appends
-- the primary key to every secondary index); the parked rows are the
-- range `(NULL, not NULL)` after it, and published rows keep their
-- `(published_at, id)` order behind a constant NULL. Same name, same
-- meaning as PostgreSQL's partial index: unpublished and not parked.
ALTER TABLE outbox_event
    DROP KEY IF EXISTS ix_outbox_event_unpublished,
    ADD KEY ix_outbox_event_unpublished (published_at, parked_at, id);
