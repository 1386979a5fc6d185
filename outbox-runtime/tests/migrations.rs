//! The shipped migrations create the seed's tables and are harmless to run twice.

use sqlx::PgPool;

fn all_versions() -> Vec<i64> {
    txoutbox_runtime::migrations::MIGRATIONS
        .iter()
        .map(|m| m.version)
        .collect()
}

#[sqlx::test(migrations = false)]
async fn migrations_create_tables_and_rerun_is_harmless(pool: PgPool) {
    let first = txoutbox_runtime::migrations::run(&pool).await.unwrap();
    assert_eq!(first, all_versions());
    let second = txoutbox_runtime::migrations::run(&pool).await.unwrap();
    assert!(second.is_empty(), "second run applied {second:?}");

    // The plain SQL files are idempotent on their own too (for other migration tools).
    for migration in txoutbox_runtime::migrations::MIGRATIONS {
        sqlx::raw_sql(migration.sql).execute(&pool).await.unwrap();
    }

    let columns: Vec<(String, String)> = sqlx::query_as(
        "SELECT column_name::text, data_type::text FROM information_schema.columns
         WHERE table_name = 'outbox_event' ORDER BY ordinal_position",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let seed = [
        ("id", "bigint"),
        ("event_id", "uuid"),
        ("aggregate_type", "text"),
        ("aggregate_id", "text"),
        ("event_type", "text"),
        ("payload", "jsonb"),
        ("topic", "text"),
        ("partition_key", "text"),
        ("created_at", "timestamp with time zone"),
        ("published_at", "timestamp with time zone"),
    ];
    for (i, (name, ty)) in seed.iter().enumerate() {
        assert_eq!((columns[i].0.as_str(), columns[i].1.as_str()), (*name, *ty));
    }

    for table in ["inbox_event", "processed_event"] {
        let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
            .bind(table)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert!(exists, "{table} missing");
    }
}

#[sqlx::test(migrations = false)]
async fn concurrent_migrators_do_not_conflict(pool: PgPool) {
    let runs = (0..4).map(|_| {
        let pool = pool.clone();
        tokio::spawn(async move { txoutbox_runtime::migrations::run(&pool).await })
    });
    let mut applied = Vec::new();
    for run in runs {
        applied.extend(run.await.unwrap().unwrap());
    }
    applied.sort_unstable();
    assert_eq!(
        applied,
        all_versions(),
        "exactly one runner applies each migration"
    );
}

/// Migration 0005 (inbox groups and keys) on a database that already holds
/// inbox rows: the seed's columns and partial index stay, the primary key
/// becomes (consumer_group, event_id), and every pending key gets its entry.
#[sqlx::test(migrations = false)]
async fn inbox_rows_stored_before_groups_are_migrated(pool: PgPool) {
    for migration in &txoutbox_runtime::migrations::MIGRATIONS[..4] {
        sqlx::raw_sql(migration.sql).execute(&pool).await.unwrap();
    }
    // A pending key of three rows (the oldest parked), a pending row without
    // a key, a processed row.
    sqlx::raw_sql(
        "INSERT INTO inbox_event (event_id, payload, event_type, topic, partition_key, parked_at)
         VALUES (gen_random_uuid(), '{}', 'A', 't', 'k1', now());
         INSERT INTO inbox_event (event_id, payload, event_type, topic, partition_key)
         VALUES (gen_random_uuid(), '{}', 'B', 't', 'k1'), (gen_random_uuid(), '{}', 'A', 't', 'k1'),
                (gen_random_uuid(), '{}', 'A', 't', NULL);
         INSERT INTO inbox_event (event_id, payload, event_type, topic, partition_key, processed)
         VALUES (gen_random_uuid(), '{}', 'A', 't', 'k2', true);",
    )
    .execute(&pool)
    .await
    .unwrap();
    // The migration runner records nothing yet: it applies all, 1-4 again harmlessly.
    txoutbox_runtime::migrations::run(&pool).await.unwrap();

    let primary_key: Vec<String> = sqlx::query_scalar(
        "SELECT a.attname::text FROM pg_constraint c
         JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY(c.conkey)
         WHERE c.conrelid = 'inbox_event'::regclass AND c.contype = 'p'
         ORDER BY array_position(c.conkey, a.attnum)",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(primary_key, ["consumer_group", "event_id"]);
    let seed_index: String = sqlx::query_scalar(
        "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_inbox_event_unprocessed'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        seed_index.contains("(received_at) WHERE (NOT processed)"),
        "{seed_index}"
    );
    let keys: Vec<(String, Option<String>, String)> = sqlx::query_as(
        "SELECT k.consumer_group, k.partition_key, k.head_event_type FROM inbox_key k
         JOIN inbox_event i ON i.seq = k.head_seq ORDER BY k.head_seq",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        keys,
        vec![
            (String::new(), Some("k1".into()), "B".into()),
            (String::new(), None, "A".into()),
        ],
        "the parked row holds nothing back; the keyless row has an entry of its own"
    );
}
