//! The operator operations (`txoutbox_runtime::ops`) against real PostgreSQL:
//! status and thresholds, retention (also racing a relay), dead letters.

mod ops_support;

use std::time::Duration;

use chrono::{TimeDelta, Utc};
use ops_support::{OutboxRow, count, inbox_row, processed_row};
use sqlx::PgPool;
use txoutbox_runtime::ops::OpsError;
use txoutbox_runtime::ops::cleanup::{self, Purge, Target};
use txoutbox_runtime::ops::dead_letters::{self, Selection, Table};
use txoutbox_runtime::ops::status::{self, Thresholds};

type Time = chrono::DateTime<Utc>;

async fn migrated(pool: &PgPool) {
    txoutbox_runtime::migrations::run(pool).await.unwrap();
}

#[sqlx::test(migrations = false)]
async fn status_counts_every_state_and_thresholds_name_the_breach(pool: PgPool) {
    migrated(&pool).await;
    let mut oldest = OutboxRow::new("orders");
    oldest.created_ago = 3_600;
    oldest.insert(&pool).await;
    let mut failing = OutboxRow::new("orders");
    failing.created_ago = 60;
    failing.attempts = 2;
    failing.last_error = Some("broker transport failure");
    let (failing_id, _) = failing.insert(&pool).await;
    OutboxRow::new("payments").insert(&pool).await;
    let (parked_id, _) = OutboxRow::new("orders")
        .parked(10, "message too large")
        .insert(&pool)
        .await;
    let mut discarded = OutboxRow::new("orders").parked(10, "unknown topic");
    discarded.discarded_ago = Some(5);
    discarded.insert(&pool).await;
    OutboxRow::new("orders")
        .published(100, 90)
        .insert(&pool)
        .await;
    inbox_row(&pool, "payments", 120, None, None).await;
    inbox_row(&pool, "payments", 10, Some(5), None).await;
    inbox_row(&pool, "payments", 50, None, Some("handler panicked")).await;
    processed_row(&pool, "billing", 10).await;
    processed_row(&pool, "billing", 20).await;

    let status = status::collect(&pool, 10).await.unwrap();
    let outbox = &status.outbox;
    assert_eq!(
        outbox.pending, 3,
        "published, parked and discarded rows do not count"
    );
    let topics: Vec<_> = outbox
        .topics
        .iter()
        .map(|t| (t.topic.as_deref().unwrap(), t.pending))
        .collect();
    assert_eq!(topics, [("orders", 2), ("payments", 1)]);
    let age = outbox.oldest_pending_age_secs.unwrap();
    assert!((3_599.0..3_700.0).contains(&age), "age {age}");
    assert_eq!(outbox.failing, 1);
    assert_eq!(outbox.failing_rows[0].id, Some(failing_id));
    assert_eq!(
        outbox.failing_rows[0].last_error.as_deref(),
        Some("broker transport failure")
    );
    assert_eq!((outbox.parked, outbox.discarded), (1, 1));
    assert_eq!(outbox.parked_rows[0].id, Some(parked_id));
    assert_eq!(outbox.parked_rows[0].attempts, 10);

    let inbox = &status.inbox;
    assert_eq!((inbox.pending, inbox.parked, inbox.failing), (1, 1, 0));
    assert!(inbox.oldest_pending_age_secs.unwrap() >= 119.0);
    assert_eq!(
        inbox.parked_rows[0].last_error.as_deref(),
        Some("handler panicked")
    );

    let processed = status
        .tables
        .iter()
        .find(|t| t.table == "processed_event")
        .unwrap();
    assert_eq!((processed.rows, processed.estimated), (2, false));
    assert!(processed.total_bytes > 0);

    assert!(Thresholds::default().check(&status).is_empty());
    let within = Thresholds {
        max_backlog: Some(3),
        max_age: Some(Duration::from_secs(7_200)),
        max_parked: Some(2),
        max_inbox_backlog: Some(1),
        max_inbox_age: Some(Duration::from_secs(600)),
        max_saga_age: None,
    };
    assert!(within.check(&status).is_empty(), "limits are inclusive");
    let exceeded = Thresholds {
        max_backlog: Some(2),
        max_age: Some(Duration::from_secs(1_800)),
        max_parked: Some(1),
        max_inbox_backlog: None,
        max_inbox_age: Some(Duration::from_secs(60)),
        max_saga_age: None,
    };
    let breaches = exceeded.check(&status);
    let names: Vec<_> = breaches.iter().map(|b| b.threshold).collect();
    assert_eq!(
        names,
        ["max-backlog", "max-parked", "max-age", "max-inbox-age"]
    );
    assert_eq!(
        breaches[0].to_string(),
        "max-backlog exceeded: 3 unpublished events (limit 2)"
    );
}

#[sqlx::test(migrations = false)]
async fn cleanup_deletes_only_finished_rows_past_the_cutoff_in_batches(pool: PgPool) {
    migrated(&pool).await;
    let day = 86_400;
    let mut old_published = Vec::new();
    for _ in 0..7 {
        old_published.push(
            OutboxRow::new("t")
                .published(9 * day, 8 * day)
                .insert(&pool)
                .await
                .0,
        );
    }
    OutboxRow::new("t")
        .published(2 * day, day)
        .insert(&pool)
        .await; // too recent
    let mut unpublished = OutboxRow::new("t");
    unpublished.created_ago = 9 * day;
    unpublished.insert(&pool).await;
    let mut parked = OutboxRow::new("t").parked(3, "boom");
    parked.created_ago = 9 * day;
    parked.parked_ago = Some(8 * day);
    parked.insert(&pool).await;
    // A published row that is (inconsistently) also parked is still kept.
    let mut odd = OutboxRow::new("t")
        .published(9 * day, 8 * day)
        .parked(3, "boom");
    odd.parked_ago = Some(8 * day);
    odd.insert(&pool).await;
    let mut discarded_old = OutboxRow::new("t").parked(3, "boom");
    discarded_old.discarded_ago = Some(8 * day);
    discarded_old.insert(&pool).await;
    let mut discarded_new = OutboxRow::new("t").parked(3, "boom");
    discarded_new.discarded_ago = Some(60);
    discarded_new.insert(&pool).await;

    for ago in [8 * day, 8 * day, 60] {
        processed_row(&pool, "g1", ago).await;
        processed_row(&pool, "g2", ago).await;
    }
    for _ in 0..4 {
        inbox_row(&pool, "t", 9 * day, Some(8 * day), None).await; // deleted
    }
    inbox_row(&pool, "t", 9 * day, Some(60), None).await; // recent
    inbox_row(&pool, "t", 9 * day, None, None).await; // unprocessed
    inbox_row(&pool, "t", 9 * day, None, Some("boom")).await; // parked
    let discarded_inbox = inbox_row(&pool, "t", 9 * day, None, Some("boom")).await;
    sqlx::query(
        "UPDATE inbox_event SET discarded_at = now() - interval '8 days' WHERE event_id = $1",
    )
    .bind(discarded_inbox)
    .execute(&pool)
    .await
    .unwrap();

    let cutoff = Utc::now() - TimeDelta::days(7);
    let expected = [
        (Target::PublishedOutbox, 7),
        (Target::DiscardedOutbox, 1),
        (Target::ProcessedEvent, 4),
        (Target::ProcessedInbox, 4),
        (Target::DiscardedInbox, 1),
    ];
    for (target, n) in expected {
        assert_eq!(
            cleanup::count(&pool, target, cutoff).await.unwrap(),
            n,
            "{target:?}"
        );
    }
    for (target, n) in expected {
        let mut batches = Vec::new();
        let deleted = Purge::new(target, cutoff)
            .batch_size(3)
            .run(&pool, |b| batches.push(b))
            .await
            .unwrap();
        assert_eq!(deleted, n as u64, "{target:?}");
        assert_eq!(batches.iter().sum::<u64>(), deleted);
        assert!(
            batches.iter().all(|b| *b <= 3),
            "{target:?}: batches {batches:?}"
        );
        assert_eq!(cleanup::count(&pool, target, cutoff).await.unwrap(), 0);
    }
    let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM outbox_event WHERE id = ANY($1)")
        .bind(&old_published)
        .fetch_all(&pool)
        .await
        .unwrap();
    assert!(ids.is_empty());
    // Left: recent published, unpublished, parked, parked+published, recent discarded.
    assert_eq!(count(&pool, "SELECT count(*) FROM outbox_event").await, 5);
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM outbox_event WHERE published_at IS NULL"
        )
        .await,
        3
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM processed_event").await,
        2
    );
    assert_eq!(count(&pool, "SELECT count(*) FROM inbox_event").await, 3);
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM inbox_event WHERE NOT processed"
        )
        .await,
        2
    );
}

/// A relay marks rows published while two cleanups delete everything
/// published: nothing unpublished or parked is ever deleted, every published
/// row ends up deleted, and no statement waits on another (SKIP LOCKED).
#[sqlx::test(migrations = false)]
async fn cleanup_racing_a_relay_never_deletes_unpublished_or_parked_rows(pool: PgPool) {
    migrated(&pool).await;
    const TOTAL: i64 = 3_000;
    sqlx::query(
        "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type, payload,
             topic, partition_key, parked_at, attempts, last_error)
         SELECT gen_random_uuid(), 'Order', n::text, 'OrderCreated', '{}', 't', n::text,
                CASE WHEN n % 50 = 0 THEN now() END,
                CASE WHEN n % 50 = 0 THEN 9 ELSE 0 END,
                CASE WHEN n % 50 = 0 THEN 'poison' END
         FROM generate_series(1, $1) AS n",
    )
    .bind(TOTAL)
    .execute(&pool)
    .await
    .unwrap();
    // Every deletion is logged with the row as it was when deleted.
    sqlx::raw_sql(
        "CREATE TABLE deleted_log (id bigint, published_at timestamptz, parked_at timestamptz);
         CREATE FUNCTION log_delete() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN INSERT INTO deleted_log VALUES (OLD.id, OLD.published_at, OLD.parked_at); RETURN OLD; END $$;
         CREATE TRIGGER log_delete AFTER DELETE ON outbox_event FOR EACH ROW EXECUTE FUNCTION log_delete();",
    )
    .execute(&pool)
    .await
    .unwrap();

    let relay = {
        let pool = pool.clone();
        tokio::spawn(async move {
            loop {
                // The relay's claim-and-mark shape, in small batches.
                let marked = sqlx::query(
                    "UPDATE outbox_event SET published_at = now() WHERE id IN (
                         SELECT id FROM outbox_event
                         WHERE published_at IS NULL AND parked_at IS NULL
                         ORDER BY id LIMIT 50 FOR UPDATE SKIP LOCKED)",
                )
                .execute(&pool)
                .await
                .unwrap()
                .rows_affected();
                if marked == 0 {
                    break;
                }
            }
        })
    };
    // Cutoff in the future: every published row is eligible the moment it is
    // marked, which makes the race as tight as it gets.
    let cutoff = Utc::now() + TimeDelta::hours(1);
    let cleaners: Vec<_> = (0..2)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let mut deleted = 0;
                for _ in 0..200 {
                    deleted += Purge::new(Target::PublishedOutbox, cutoff)
                        .batch_size(40)
                        .run(&pool, |_| {})
                        .await
                        .unwrap();
                    let unpublished: i64 = sqlx::query_scalar(
                        "SELECT count(*) FROM outbox_event WHERE published_at IS NULL AND parked_at IS NULL",
                    )
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                    if unpublished == 0 {
                        break;
                    }
                }
                deleted
            })
        })
        .collect();
    relay.await.unwrap();
    let mut deleted = 0;
    for cleaner in cleaners {
        deleted += cleaner.await.unwrap();
    }
    // A final pass takes whatever the relay marked after the cleaners' last pass.
    deleted += Purge::new(Target::PublishedOutbox, cutoff)
        .run(&pool, |_| {})
        .await
        .unwrap();

    let parked = TOTAL / 50;
    assert_eq!(deleted as i64, TOTAL - parked);
    assert_eq!(
        count(&pool, "SELECT count(*) FROM deleted_log").await,
        TOTAL - parked
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM deleted_log WHERE published_at IS NULL OR parked_at IS NOT NULL"
        )
        .await,
        0,
        "a deleted row was unpublished or parked"
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM outbox_event WHERE parked_at IS NOT NULL AND published_at IS NULL"
        )
        .await,
        parked
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM outbox_event").await,
        parked
    );
}

#[sqlx::test(migrations = false)]
async fn dead_letters_list_retry_and_discard(pool: PgPool) {
    migrated(&pool).await;
    let (a1, a1_event) = OutboxRow::new("a")
        .parked(5, "too large")
        .insert(&pool)
        .await;
    let (a2, _) = OutboxRow::new("a")
        .parked(5, "too large")
        .insert(&pool)
        .await;
    let (b1, b1_event) = OutboxRow::new("b")
        .parked(7, "unknown topic")
        .insert(&pool)
        .await;
    OutboxRow::new("a").insert(&pool).await; // pending, not a dead letter
    OutboxRow::new("c").published(10, 5).insert(&pool).await;

    let all = dead_letters::list(&pool, Table::Outbox, &Selection::All, 100)
        .await
        .unwrap();
    assert_eq!(
        all.iter().map(|d| d.id.unwrap()).collect::<Vec<_>>(),
        [a1, a2, b1]
    );
    assert_eq!(all[2].last_error.as_deref(), Some("unknown topic"));
    let limited = dead_letters::list(&pool, Table::Outbox, &Selection::All, 1)
        .await
        .unwrap();
    assert_eq!(limited.len(), 1);
    let topic_a = Selection::Topic("a".into());
    assert_eq!(
        dead_letters::count(&pool, Table::Outbox, &topic_a)
            .await
            .unwrap(),
        2
    );

    let retried = dead_letters::retry(&pool, Table::Outbox, &topic_a)
        .await
        .unwrap();
    assert_eq!(retried.len(), 2);
    assert!(retried.contains(&a1_event));
    type Retried = (Option<Time>, i32, Option<Time>, Option<String>);
    let (parked_at, attempts, next, error): Retried = sqlx::query_as(
        "SELECT parked_at, attempts, next_attempt_at, last_error FROM outbox_event WHERE id = $1",
    )
    .bind(a1)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((parked_at, attempts, next), (None, 0, None));
    assert_eq!(error.as_deref(), Some("too large"), "last_error is kept");

    let discarded = dead_letters::discard(&pool, Table::Outbox, &Selection::Ids(vec![b1]))
        .await
        .unwrap();
    assert_eq!(discarded, [b1_event]);
    let (parked, discarded_at, published): (bool, bool, bool) = sqlx::query_as(
        "SELECT parked_at IS NOT NULL, discarded_at IS NOT NULL, published_at IS NOT NULL
         FROM outbox_event WHERE id = $1",
    )
    .bind(b1)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((parked, discarded_at, published), (true, true, false));
    assert!(
        dead_letters::list(&pool, Table::Outbox, &Selection::All, 100)
            .await
            .unwrap()
            .is_empty()
    );
    // Acting again finds nothing: discarded rows are no longer dead letters.
    let again = dead_letters::retry(&pool, Table::Outbox, &Selection::EventIds(vec![b1_event]))
        .await
        .unwrap();
    assert!(again.is_empty());

    // The inbox: selected by event id; numeric ids are refused.
    let poisoned = inbox_row(&pool, "payments", 30, None, Some("handler failed")).await;
    inbox_row(&pool, "payments", 30, None, Some("handler failed")).await;
    inbox_row(&pool, "payments", 30, None, None).await;
    let inbox = dead_letters::list(&pool, Table::Inbox, &Selection::All, 10)
        .await
        .unwrap();
    assert_eq!(inbox.len(), 2);
    assert!(inbox.iter().all(|d| d.id.is_none()));
    let refused = dead_letters::retry(&pool, Table::Inbox, &Selection::Ids(vec![1])).await;
    assert!(
        matches!(refused, Err(ref e @ OpsError::InboxRowsHaveNoId) if e.to_string().contains("event id"))
    );
    let retried = dead_letters::retry(&pool, Table::Inbox, &Selection::EventIds(vec![poisoned]))
        .await
        .unwrap();
    assert_eq!(retried, [poisoned]);
    let discarded = dead_letters::discard(&pool, Table::Inbox, &Selection::All)
        .await
        .unwrap();
    assert_eq!(discarded.len(), 1);
    assert_eq!(
        count(&pool, "SELECT count(*) FROM inbox_event WHERE parked_at IS NULL AND attempts = 0 AND NOT processed").await,
        2
    );
}

/// Inserts an inbox row of `group` with event id `event_id`, received 9
/// days ago: processed 8 days ago, or (`discarded`) parked and discarded 8
/// days ago.
async fn grouped_inbox_row(pool: &PgPool, group: &str, event_id: uuid::Uuid, discarded: bool) {
    sqlx::query(
        "INSERT INTO inbox_event (consumer_group, event_id, received_at, payload, processed,
             processed_at, event_type, topic, attempts, last_error, parked_at, discarded_at)
         VALUES ($1, $2, now() - interval '9 days', '{}', NOT $3,
             CASE WHEN $3 THEN NULL ELSE now() - interval '8 days' END,
             'PaymentTaken', 't', CASE WHEN $3 THEN 5 ELSE 0 END,
             CASE WHEN $3 THEN 'boom' END,
             CASE WHEN $3 THEN now() - interval '8 days' END,
             CASE WHEN $3 THEN now() - interval '8 days' END)",
    )
    .bind(group)
    .bind(event_id)
    .bind(discarded)
    .execute(pool)
    .await
    .unwrap();
}

/// The inbox's key is `(consumer_group, event_id)`: the same event ids in
/// two groups, batches of 3 over 6 rows, so that a batch ends between the
/// two groups' rows of one event id, whichever order they come in. Each
/// batch deletes at most its size, one pass deletes every row, and a row
/// of the second group held by another transaction is passed over without
/// waiting (and deleted by the next run once released). Paging on
/// `event_id` alone, a batch's delete matched the other group's row of
/// its last event id too: more rows than the batch (4 of 3), and a wait for
/// that row's lock.
#[sqlx::test(migrations = false)]
async fn inbox_retention_pages_on_group_and_event_id(pool: PgPool) {
    migrated(&pool).await;
    for (target, discarded) in [
        (Target::ProcessedInbox, false),
        (Target::DiscardedInbox, true),
    ] {
        sqlx::query("DELETE FROM inbox_event")
            .execute(&pool)
            .await
            .unwrap();
        let mut ids: Vec<uuid::Uuid> = (0..3).map(|_| uuid::Uuid::new_v4()).collect();
        ids.sort();
        for group in ["billing", "shipping"] {
            for id in &ids {
                grouped_inbox_row(&pool, group, *id, discarded).await;
            }
        }
        let cutoff = Utc::now() - TimeDelta::days(7);
        assert_eq!(cleanup::count(&pool, target, cutoff).await.unwrap(), 6);

        let mut batches = Vec::new();
        let deleted = tokio::time::timeout(
            Duration::from_secs(10),
            Purge::new(target, cutoff)
                .batch_size(3)
                .run(&pool, |b| batches.push(b)),
        )
        .await
        .expect("no wait")
        .unwrap();
        assert_eq!(deleted, 6, "{target:?}: batches {batches:?}");
        assert_eq!(batches, [3, 3, 0], "{target:?}");
        assert_eq!(count(&pool, "SELECT count(*) FROM inbox_event").await, 0);

        // Again, with the second group's row of the middle event id held.
        for group in ["billing", "shipping"] {
            for id in &ids {
                grouped_inbox_row(&pool, group, *id, discarded).await;
            }
        }
        let mut holder = pool.begin().await.unwrap();
        sqlx::query(
            "SELECT 1 FROM inbox_event WHERE consumer_group = 'shipping' AND event_id = $1
             FOR UPDATE",
        )
        .bind(ids[1])
        .execute(&mut *holder)
        .await
        .unwrap();
        let mut batches = Vec::new();
        let deleted = tokio::time::timeout(
            Duration::from_secs(10),
            Purge::new(target, cutoff)
                .batch_size(3)
                .run(&pool, |b| batches.push(b)),
        )
        .await
        .unwrap_or_else(|_| panic!("{target:?}: the purge waited for the held row"))
        .unwrap();
        assert_eq!(deleted, 5, "{target:?}: batches {batches:?}");
        assert!(batches.iter().all(|b| *b <= 3), "{target:?}: {batches:?}");
        holder.rollback().await.unwrap();
        let left: Vec<(String, uuid::Uuid)> =
            sqlx::query_as("SELECT consumer_group, event_id FROM inbox_event")
                .fetch_all(&pool)
                .await
                .unwrap();
        assert_eq!(left, [("shipping".to_owned(), ids[1])], "{target:?}");
        let next = Purge::new(target, cutoff).run(&pool, |_| {}).await.unwrap();
        assert_eq!(next, 1, "{target:?}: the next run takes it");
    }
}
