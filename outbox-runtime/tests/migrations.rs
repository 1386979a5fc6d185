//! The shipped migrations create the seed's tables and are harmless to run twice.

use sqlx::PgPool;

#[sqlx::test(migrations = false)]
async fn migrations_create_tables_and_rerun_is_harmless(pool: PgPool) {
    let first = outbox_runtime::migrations::run(&pool).await.unwrap();
    assert_eq!(first, vec![1, 2]);
    let second = outbox_runtime::migrations::run(&pool).await.unwrap();
    assert!(second.is_empty(), "second run applied {second:?}");

    // The plain SQL files are idempotent on their own too (for other migration tools).
    for migration in outbox_runtime::migrations::MIGRATIONS {
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
        tokio::spawn(async move { outbox_runtime::migrations::run(&pool).await })
    });
    let mut applied = Vec::new();
    for run in runs {
        applied.extend(run.await.unwrap().unwrap());
    }
    assert_eq!(
        applied,
        vec![1, 2],
        "exactly one runner applies each migration"
    );
}
