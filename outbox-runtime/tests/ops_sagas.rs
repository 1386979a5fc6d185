//! The saga operations (`txoutbox_runtime::ops::sagas`, and the sagas part of
//! `ops::status`) against real PostgreSQL, on `saga_state` rows written with
//! plain SQL.

mod ops_support;

use std::time::Duration;

use ops_support::SagaRow;
use serde_json::json;
use sqlx::PgPool;
use txoutbox_runtime::ops::OpsError;
use txoutbox_runtime::ops::sagas::{self, SagaFilter};
use txoutbox_runtime::ops::status::{self, Thresholds};
use txoutbox_runtime::saga::SagaStatus;

async fn migrated(pool: &PgPool) {
    txoutbox_runtime::migrations::run(pool).await.unwrap();
}

fn ids(sagas: &[sagas::SagaSummary]) -> Vec<&str> {
    sagas.iter().map(|s| s.saga_id.as_str()).collect()
}

#[sqlx::test(migrations = false)]
async fn list_filters_by_type_and_status_most_recently_moved_first(pool: PgPool) {
    migrated(&pool).await;
    let mut reserving = SagaRow::running("OrderFulfilment", "o-1", 10);
    reserving.compensations = vec![("ReleaseStock", "inventory.commands", "o-1")];
    reserving.insert(&pool).await;
    SagaRow::running("OrderFulfilment", "o-2", 3_600)
        .insert(&pool)
        .await;
    SagaRow::finished("OrderFulfilment", "o-3", "completed", 100)
        .insert(&pool)
        .await;
    SagaRow::finished("OrderFulfilment", "o-4", "compensated", 50)
        .insert(&pool)
        .await;
    SagaRow::running("Refund", "r-1", 5).insert(&pool).await;

    let all = sagas::list(&pool, &SagaFilter::default()).await.unwrap();
    assert_eq!(ids(&all), ["r-1", "o-1", "o-4", "o-3", "o-2"]);
    let first = &all[1];
    assert_eq!(first.saga_type, "OrderFulfilment");
    assert_eq!(first.status, SagaStatus::Running);
    assert_eq!(first.version, 2);
    assert_eq!(first.last_message_type.as_deref(), Some("StockReserved"));
    assert_eq!(first.pending_compensations, 1);
    assert_eq!(first.finished_at, None);
    assert_eq!((first.updated_at - first.started_at).num_seconds(), 60);
    assert!(
        (first.idle_secs - 10.0).abs() < 5.0,
        "idle {}",
        first.idle_secs
    );
    assert_eq!(all[4].pending_compensations, 0);
    assert!(all[2].finished_at.is_some());

    let of_type = |saga_type: &str, status: Option<SagaStatus>| SagaFilter {
        saga_type: Some(saga_type.to_owned()),
        status,
        ..SagaFilter::default()
    };
    let orders = sagas::list(&pool, &of_type("OrderFulfilment", None))
        .await
        .unwrap();
    assert_eq!(ids(&orders), ["o-1", "o-4", "o-3", "o-2"]);
    let running = sagas::list(
        &pool,
        &of_type("OrderFulfilment", Some(SagaStatus::Running)),
    )
    .await
    .unwrap();
    assert_eq!(ids(&running), ["o-1", "o-2"]);
    let compensated = SagaFilter {
        status: Some(SagaStatus::Compensated),
        ..SagaFilter::default()
    };
    let compensated = sagas::list(&pool, &compensated).await.unwrap();
    assert_eq!(ids(&compensated), ["o-4"]);
    assert_eq!(compensated[0].status, SagaStatus::Compensated);
    let two = SagaFilter {
        limit: 2,
        ..SagaFilter::default()
    };
    assert_eq!(
        ids(&sagas::list(&pool, &two).await.unwrap()),
        ["r-1", "o-1"]
    );
    let unknown = sagas::list(&pool, &of_type("Nope", None)).await.unwrap();
    assert!(unknown.is_empty());

    let json = serde_json::to_value(&all[1]).unwrap();
    assert_eq!(json["status"], "running");
    assert_eq!(json["pending_compensations"], 1);
}

#[sqlx::test(migrations = false)]
async fn show_returns_the_state_and_the_compensations_in_registration_order(pool: PgPool) {
    migrated(&pool).await;
    let mut saga = SagaRow::running("OrderFulfilment", "o-7", 30);
    saga.state = json!({ "order_id": "o-7", "stage": "charging", "items": [1, 2] });
    saga.version = 3;
    saga.compensations = vec![
        ("ReleaseStock", "inventory.commands", "o-7"),
        ("CancelShipment", "shipping.commands", "s-7"),
    ];
    let (compensation_ids, last_event_id) = saga.insert(&pool).await;
    SagaRow::running("OrderFulfilment", "o-8", 30)
        .insert(&pool)
        .await;

    let detail = sagas::show(&pool, "OrderFulfilment", "o-7")
        .await
        .unwrap()
        .expect("the saga exists");
    assert_eq!(detail.summary.saga_id, "o-7");
    assert_eq!(detail.summary.version, 3);
    assert_eq!(detail.summary.pending_compensations, 2);
    assert_eq!(detail.state, saga.state);
    assert_eq!(detail.last_event_id, Some(last_event_id));
    let shown: Vec<_> = detail
        .compensations
        .iter()
        .map(|c| {
            (
                c.event_id,
                c.event_type.as_str(),
                c.topic.as_str(),
                c.partition_key.as_str(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            (
                compensation_ids[0],
                "ReleaseStock",
                "inventory.commands",
                "o-7"
            ),
            (
                compensation_ids[1],
                "CancelShipment",
                "shipping.commands",
                "s-7"
            ),
        ]
    );
    let json = serde_json::to_value(&detail).unwrap();
    assert_eq!(json["saga_id"], "o-7", "the summary is flattened");
    assert_eq!(json["state"]["stage"], "charging");
    assert_eq!(json["compensations"][1]["event_type"], "CancelShipment");

    let plain = sagas::show(&pool, "OrderFulfilment", "o-8")
        .await
        .unwrap()
        .unwrap();
    assert!(plain.compensations.is_empty());
    assert!(
        sagas::show(&pool, "OrderFulfilment", "o-9")
            .await
            .unwrap()
            .is_none()
    );
    assert!(sagas::show(&pool, "Refund", "o-7").await.unwrap().is_none());

    sqlx::query(
        "UPDATE saga_state SET compensations = '[{\"event_id\": \"not-a-uuid\"}]'
         WHERE saga_id = 'o-8'",
    )
    .execute(&pool)
    .await
    .unwrap();
    let broken = sagas::show(&pool, "OrderFulfilment", "o-8")
        .await
        .unwrap_err();
    assert!(
        matches!(&broken, OpsError::InvalidCompensation { saga_id, position: 1, field: "event_id", .. } if saga_id == "o-8")
            && broken
                .to_string()
                .contains("`o-8`: stored compensation 1 has no valid event_id"),
        "{broken}"
    );
}

#[sqlx::test(migrations = false)]
async fn stuck_lists_running_sagas_idle_longer_than_the_age_oldest_first(pool: PgPool) {
    migrated(&pool).await;
    SagaRow::running("OrderFulfilment", "o-recent", 30)
        .insert(&pool)
        .await;
    SagaRow::running("OrderFulfilment", "o-hour", 3_600)
        .insert(&pool)
        .await;
    SagaRow::running("Refund", "r-day", 86_400)
        .insert(&pool)
        .await;
    SagaRow::running("OrderFulfilment", "o-20m", 1_200)
        .insert(&pool)
        .await;
    // Finished long ago: never stuck, whatever its age.
    SagaRow::finished("OrderFulfilment", "o-done", "completed", 90_000)
        .insert(&pool)
        .await;
    SagaRow::finished("Refund", "r-undone", "compensated", 90_000)
        .insert(&pool)
        .await;

    let ten_minutes = Duration::from_secs(600);
    let stuck = sagas::stuck(&pool, ten_minutes, None, 100).await.unwrap();
    assert_eq!(ids(&stuck), ["r-day", "o-hour", "o-20m"]);
    assert!(stuck.iter().all(|s| s.status == SagaStatus::Running));
    assert!(
        (stuck[0].idle_secs - 86_400.0).abs() < 5.0,
        "{}",
        stuck[0].idle_secs
    );
    assert_eq!(
        sagas::count_stuck(&pool, ten_minutes, None).await.unwrap(),
        3
    );

    let orders = sagas::stuck(&pool, ten_minutes, Some("OrderFulfilment"), 100)
        .await
        .unwrap();
    assert_eq!(ids(&orders), ["o-hour", "o-20m"]);
    let oldest = sagas::stuck(&pool, ten_minutes, None, 1).await.unwrap();
    assert_eq!(ids(&oldest), ["r-day"]);
    let two_hours = Duration::from_secs(7_200);
    assert_eq!(
        ids(&sagas::stuck(&pool, two_hours, None, 100).await.unwrap()),
        ["r-day"]
    );
    assert_eq!(
        sagas::count_stuck(&pool, two_hours, Some("OrderFulfilment"))
            .await
            .unwrap(),
        0
    );
    // Any age is a valid question (never an "out of range" from the database).
    assert!(
        sagas::stuck(&pool, Duration::MAX, None, 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        sagas::count_stuck(&pool, Duration::MAX, None)
            .await
            .unwrap(),
        0
    );
}

#[sqlx::test(migrations = false)]
async fn overview_counts_per_type_and_status_checks_the_oldest_running_saga(pool: PgPool) {
    migrated(&pool).await;
    for (id, ago) in [("o-1", 60), ("o-2", 1_800), ("o-3", 5)] {
        SagaRow::running("OrderFulfilment", id, ago)
            .insert(&pool)
            .await;
    }
    SagaRow::finished("OrderFulfilment", "o-4", "completed", 10)
        .insert(&pool)
        .await;
    SagaRow::finished("OrderFulfilment", "o-5", "compensated", 10)
        .insert(&pool)
        .await;
    SagaRow::finished("Refund", "r-1", "completed", 10_000)
        .insert(&pool)
        .await;

    let overview = sagas::overview(&pool).await.unwrap();
    let counts: Vec<_> = overview
        .iter()
        .map(|o| (o.saga_type.as_str(), o.running, o.completed, o.compensated))
        .collect();
    assert_eq!(
        counts,
        [("OrderFulfilment", 3, 1, 1), ("Refund", 0, 1, 0)],
        "types in name order"
    );
    let age = overview[0].oldest_running_age_secs.unwrap();
    assert!((age - 1_800.0).abs() < 5.0, "{age}");
    assert!(overview[0].oldest_running_at.is_some());
    assert_eq!(
        (
            overview[1].oldest_running_at,
            overview[1].oldest_running_age_secs
        ),
        (None, None),
        "a type without running sagas has no oldest one"
    );

    let status = status::collect(&pool, 5).await.unwrap();
    let same = |a: &sagas::SagaTypeOverview, b: &sagas::SagaTypeOverview| {
        (a.saga_type == b.saga_type)
            && (a.running, a.completed, a.compensated) == (b.running, b.completed, b.compensated)
            && a.oldest_running_at == b.oldest_running_at
    };
    assert_eq!(status.sagas.len(), 2);
    assert!(
        status.sagas.iter().zip(&overview).all(|(a, b)| same(a, b)),
        "{:?}",
        status.sagas
    );
    let within = Thresholds {
        max_saga_age: Some(Duration::from_secs(3_600)),
        ..Thresholds::default()
    };
    assert!(within.check(&status).is_empty());
    let exceeded = Thresholds {
        max_saga_age: Some(Duration::from_secs(600)),
        ..Thresholds::default()
    };
    let breaches = exceeded.check(&status);
    assert_eq!(breaches.len(), 1, "{breaches:?}");
    assert_eq!(breaches[0].threshold, "max-saga-age");
    assert_eq!(breaches[0].limit, "600s");
    assert!(
        breaches[0].to_string().starts_with(
            "max-saga-age exceeded: a running OrderFulfilment saga has not moved for 18"
        ),
        "{}",
        breaches[0]
    );

    // A database migrated before 0008 has no saga_state: the status still works.
    sqlx::query("DROP TABLE saga_state")
        .execute(&pool)
        .await
        .unwrap();
    assert!(sagas::overview(&pool).await.unwrap().is_empty());
    let status = status::collect(&pool, 5).await.unwrap();
    assert!(status.sagas.is_empty());
    assert!(exceeded.check(&status).is_empty());
}
