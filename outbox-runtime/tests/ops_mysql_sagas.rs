//! The saga operations (`txoutbox_runtime::ops::sagas`, the sagas part of
//! `ops::status`, the retention of finished sagas) on MariaDB (feature
//! `mysql`), against the machine's server (`MYSQL_URL`; each test creates
//! and drops its own database): on sagas a real consumer ran (`#[saga]` on
//! `SagaContext<'_, MySql>`, messages through the real broker), and on
//! `saga_state` rows written as that runtime writes them, with chosen ages:
//! list, show, stuck and the counts give PostgreSQL's figures (the same
//! bodies as `ops_sagas.rs`), retention deletes finished sagas in batches
//! (ties of `finished_at` across types on batch boundaries included),
//! never a running one, and passes over a saga whose row a step holds.
#![allow(missing_docs)]

mod consumer_support;
mod ops_mysql_support;

use std::time::{Duration, Instant};

use chrono::TimeDelta;
use consumer_support::{create_topic, kafka_config, produce_event, producer, start_group_at};
use ops_mysql_support::{SagaRow, count, lock_where, release};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::{MySql, MySqlPool};
use txoutbox_core::DomainEvent;
use txoutbox_runtime::consumer::{Consumer, HandlerError};
use txoutbox_runtime::ops::cleanup::{self, Purge, Target};
use txoutbox_runtime::ops::sagas::{self, SagaFilter, SagaSummary};
use txoutbox_runtime::ops::status::{self, Thresholds};
use txoutbox_runtime::ops::{Database, OpsError};
use txoutbox_runtime::saga::{SagaContext, SagaStatus, saga};
use txoutbox_testkit::broker::unique_group;
use txoutbox_testkit::mysql::MySqlScratch;
use txoutbox_testkit::{eventually, init_tracing, test_event};
use uuid::Uuid;

async fn scratch(connections: u32) -> MySqlScratch {
    init_tracing();
    let scratch = MySqlScratch::create(connections).await;
    txoutbox_runtime::migrations::run(&scratch.pool)
        .await
        .unwrap();
    scratch
}

fn ids(sagas: &[SagaSummary]) -> Vec<&str> {
    sagas.iter().map(|s| s.saga_id.as_str()).collect()
}

// ---------------------------------------------------------------------------
// Sagas a real consumer ran.
// ---------------------------------------------------------------------------

test_event!(Begin, "ops-mysql-sagas.orders", "Begin");
test_event!(Reserve, "ops-mysql-sagas.orders", "Reserve");
test_event!(Finish, "ops-mysql-sagas.orders", "Finish");
test_event!(Abort, "ops-mysql-sagas.orders", "Abort");
// The compensation of a `Reserve`.
test_event!(Release, "ops-mysql-sagas.commands", "Release");

/// Reserves items; a `Finish` completes it, an `Abort` compensates it
/// (one `Release` per reserved item, last first).
#[derive(Debug, Serialize, Deserialize)]
pub struct OrderFulfilment {
    order_id: Uuid,
    items: Vec<i64>,
}

#[saga(id = Uuid, correlate = order_id, starts_with(Begin), handles(Reserve, Finish, Abort))]
impl OrderFulfilment {
    async fn on_begin(event: Begin) -> Result<Self, HandlerError> {
        Ok(Self {
            order_id: event.order_id,
            items: Vec::new(),
        })
    }

    async fn on_reserve(
        &mut self,
        event: Reserve,
        ctx: &mut SagaContext<'_, MySql>,
    ) -> Result<(), HandlerError> {
        ctx.on_compensate(Release {
            event_id: Uuid::new_v4(),
            order_id: event.order_id,
            amount: event.amount,
        });
        self.items.push(event.amount);
        Ok(())
    }

    async fn on_finish(
        &mut self,
        _event: Finish,
        ctx: &mut SagaContext<'_, MySql>,
    ) -> Result<(), HandlerError> {
        ctx.complete();
        Ok(())
    }

    async fn on_abort(
        &mut self,
        _event: Abort,
        ctx: &mut SagaContext<'_, MySql>,
    ) -> Result<(), HandlerError> {
        ctx.compensate();
        Ok(())
    }
}

/// `(status, version)` of a saga, read as the runtime stored it.
async fn stored(pool: &MySqlPool, order_id: Uuid) -> Option<(String, i64)> {
    sqlx::query_as("SELECT status, version FROM saga_state WHERE saga_id = ?")
        .bind(order_id.to_string().as_bytes())
        .fetch_optional(pool)
        .await
        .unwrap()
}

/// Three sagas through a consumer on MariaDB: one running with two
/// reservations, one completed, one compensated. Every operation reads
/// them as the runtime wrote them: the type and id from their bytes, the
/// state and the compensations from their JSON, the times by the
/// database's clock; retention removes the finished ones only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operations_read_the_sagas_a_consumer_ran() {
    let db = scratch(6).await;
    let pool = &db.pool;
    let group = unique_group("ops-mysql-sagas");
    create_topic(Begin::TOPIC, 2).await;
    start_group_at(&group, Begin::TOPIC, 2, true).await;
    let consumer = Consumer::builder(pool.clone(), kafka_config(), &group)
        .saga::<OrderFulfilment>()
        .build()
        .unwrap()
        .spawn();

    let (running, completed, compensated) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    let producer = producer();
    let reserve = |order_id, amount| Reserve {
        event_id: Uuid::new_v4(),
        order_id,
        amount,
    };
    for order_id in [running, completed, compensated] {
        let begin = Begin {
            order_id,
            ..Begin::new(0)
        };
        produce_event(&producer, &begin).await;
    }
    let last_reserve = reserve(running, 2);
    produce_event(&producer, &reserve(running, 1)).await;
    produce_event(&producer, &last_reserve).await;
    produce_event(&producer, &reserve(completed, 3)).await;
    let finish = Finish {
        order_id: completed,
        ..Finish::new(0)
    };
    produce_event(&producer, &finish).await;
    produce_event(&producer, &reserve(compensated, 4)).await;
    produce_event(&producer, &reserve(compensated, 5)).await;
    let abort = Abort {
        order_id: compensated,
        ..Abort::new(0)
    };
    produce_event(&producer, &abort).await;
    eventually("the sagas ran", Duration::from_secs(60), || async {
        stored(pool, running).await == Some(("running".into(), 3))
            && stored(pool, completed).await == Some(("completed".into(), 3))
            && stored(pool, compensated).await == Some(("compensated".into(), 4))
    })
    .await;
    consumer.shutdown().await.unwrap();
    let name = "order_fulfilment";

    // list: every saga, the most recently moved first.
    let all = sagas::list(pool, &SagaFilter::default()).await.unwrap();
    assert_eq!(all.len(), 3);
    assert!(all.iter().all(|s| s.saga_type == name), "{all:?}");
    assert!(
        all.windows(2).all(|w| w[0].updated_at >= w[1].updated_at),
        "{all:?}"
    );
    let by_id = |id: Uuid| {
        all.iter()
            .find(|s| s.saga_id == id.to_string())
            .unwrap_or_else(|| panic!("{id} listed: {all:?}"))
    };
    let r = by_id(running);
    assert_eq!(
        (r.status, r.version, r.pending_compensations, r.finished_at),
        (SagaStatus::Running, 3, 2, None)
    );
    assert_eq!(r.last_message_type.as_deref(), Some("Reserve"));
    assert!(r.started_at <= r.updated_at);
    assert!((0.0..60.0).contains(&r.idle_secs), "{}", r.idle_secs);
    let c = by_id(completed);
    assert_eq!(
        (c.status, c.version, c.pending_compensations),
        (SagaStatus::Completed, 3, 0),
        "a completed saga drops its compensations"
    );
    assert_eq!(c.finished_at, Some(c.updated_at));
    assert_eq!(c.last_message_type.as_deref(), Some("Finish"));
    let x = by_id(compensated);
    assert_eq!(
        (x.status, x.version, x.pending_compensations),
        (SagaStatus::Compensated, 4, 0),
        "a compensated saga sent its compensations"
    );
    let compensated_only = SagaFilter {
        saga_type: Some(name.into()),
        status: Some(SagaStatus::Compensated),
        ..SagaFilter::default()
    };
    assert_eq!(
        ids(&sagas::list(pool, &compensated_only).await.unwrap()),
        [compensated.to_string()]
    );
    let other_type = SagaFilter {
        saga_type: Some("refund".into()),
        ..SagaFilter::default()
    };
    assert!(sagas::list(pool, &other_type).await.unwrap().is_empty());

    // show: the state and the stored compensations, in registration order.
    let detail = sagas::show(pool, name, &running.to_string())
        .await
        .unwrap()
        .expect("the saga exists");
    let s = &detail.summary;
    assert_eq!(
        (&s.saga_type, &s.saga_id, s.status, s.version, s.updated_at),
        (&r.saga_type, &r.saga_id, r.status, r.version, r.updated_at)
    );
    assert_eq!(
        detail.state,
        json!({ "order_id": running, "items": [1, 2] })
    );
    assert_eq!(detail.last_event_id, Some(last_reserve.event_id));
    let shown: Vec<(&str, &str, &str)> = detail
        .compensations
        .iter()
        .map(|c| {
            (
                c.event_type.as_str(),
                c.topic.as_str(),
                c.partition_key.as_str(),
            )
        })
        .collect();
    let key = running.to_string();
    assert_eq!(
        shown,
        [
            ("Release", Release::TOPIC, key.as_str()),
            ("Release", Release::TOPIC, key.as_str())
        ]
    );
    let json = serde_json::to_value(&detail).unwrap();
    assert_eq!(
        json["saga_id"],
        running.to_string(),
        "the summary flattened"
    );
    assert_eq!(json["status"], "running");
    assert_eq!(json["pending_compensations"], 2);
    assert_eq!(json["state"]["items"], json!([1, 2]));
    let done = sagas::show(pool, name, &completed.to_string())
        .await
        .unwrap()
        .unwrap();
    assert!(done.compensations.is_empty());
    assert!(
        sagas::show(pool, name, &Uuid::new_v4().to_string())
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        sagas::show(pool, "refund", &running.to_string())
            .await
            .unwrap()
            .is_none()
    );

    // The counts, in overview and in status.
    let overview = sagas::overview(pool).await.unwrap();
    let counts: Vec<_> = overview
        .iter()
        .map(|o| (o.saga_type.as_str(), o.running, o.completed, o.compensated))
        .collect();
    assert_eq!(counts, [(name, 1, 1, 1)]);
    assert_eq!(overview[0].oldest_running_at, Some(r.updated_at));
    let status = status::collect(pool, 5).await.unwrap();
    assert!(status.not_on_this_database.is_empty(), "{status:?}");
    let json = serde_json::to_value(&status).unwrap();
    assert_eq!(json["sagas"][0]["saga_type"], name);
    assert_eq!(
        (
            &json["sagas"][0]["running"],
            &json["sagas"][0]["completed"],
            &json["sagas"][0]["compensated"]
        ),
        (&json!(1), &json!(1), &json!(1))
    );
    assert!(json.get("not_on_this_database").is_none());

    // stuck: the running saga only, whatever the age below its wait.
    let stuck = sagas::stuck(pool, Duration::ZERO, None, 10).await.unwrap();
    assert_eq!(ids(&stuck), [running.to_string()]);
    assert_eq!(
        sagas::count_stuck(pool, Duration::ZERO, Some(name))
            .await
            .unwrap(),
        1
    );
    let hour = Duration::from_secs(3_600);
    assert!(sagas::stuck(pool, hour, None, 10).await.unwrap().is_empty());

    // Retention: the finished sagas only, by the database clock.
    let now = Database::from(pool).now().await.unwrap() + TimeDelta::seconds(1);
    assert_eq!(
        cleanup::count(pool, Target::FinishedSaga, now)
            .await
            .unwrap(),
        2
    );
    let deleted = Purge::new(Target::FinishedSaga, now)
        .run(pool, |_| {})
        .await
        .unwrap();
    assert_eq!(deleted, 2);
    let left = sagas::list(pool, &SagaFilter::default()).await.unwrap();
    assert_eq!(ids(&left), [running.to_string()]);
    db.drop().await;
}

// ---------------------------------------------------------------------------
// Rows written as the runtime writes them, with chosen ages: the bodies of
// ops_sagas.rs (PostgreSQL), the same figures.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn list_filters_by_type_and_status_most_recently_moved_first() {
    let db = scratch(2).await;
    let pool = &db.pool;
    let mut reserving = SagaRow::running("OrderFulfilment", "o-1", 10);
    reserving.compensations = vec![("ReleaseStock", "inventory.commands", "o-1".into())];
    reserving.insert(pool).await;
    SagaRow::running("OrderFulfilment", "o-2", 3_600)
        .insert(pool)
        .await;
    SagaRow::finished("OrderFulfilment", "o-3", "completed", 100)
        .insert(pool)
        .await;
    SagaRow::finished("OrderFulfilment", "o-4", "compensated", 50)
        .insert(pool)
        .await;
    SagaRow::running("Refund", "r-1", 5).insert(pool).await;

    let all = sagas::list(pool, &SagaFilter::default()).await.unwrap();
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
    let orders = sagas::list(pool, &of_type("OrderFulfilment", None))
        .await
        .unwrap();
    assert_eq!(ids(&orders), ["o-1", "o-4", "o-3", "o-2"]);
    let running = sagas::list(pool, &of_type("OrderFulfilment", Some(SagaStatus::Running)))
        .await
        .unwrap();
    assert_eq!(ids(&running), ["o-1", "o-2"]);
    let compensated = SagaFilter {
        status: Some(SagaStatus::Compensated),
        ..SagaFilter::default()
    };
    let compensated = sagas::list(pool, &compensated).await.unwrap();
    assert_eq!(ids(&compensated), ["o-4"]);
    let two = SagaFilter {
        limit: 2,
        ..SagaFilter::default()
    };
    assert_eq!(ids(&sagas::list(pool, &two).await.unwrap()), ["r-1", "o-1"]);
    assert!(
        sagas::list(pool, &of_type("Nope", None))
            .await
            .unwrap()
            .is_empty()
    );
    let json = serde_json::to_value(&all[1]).unwrap();
    assert_eq!(json["status"], "running");
    assert_eq!(json["pending_compensations"], 1);
    db.drop().await;
}

#[tokio::test]
async fn show_returns_the_state_and_the_compensations_in_registration_order() {
    let db = scratch(2).await;
    let pool = &db.pool;
    let mut saga = SagaRow::running("OrderFulfilment", "o-7", 30);
    saga.state = json!({ "order_id": "o-7", "stage": "charging", "items": [1, 2] });
    saga.version = 3;
    saga.compensations = vec![
        ("ReleaseStock", "inventory.commands", "o-7".into()),
        ("CancelShipment", "shipping.commands", "s-7".into()),
    ];
    let (compensation_ids, last_event_id) = saga.insert(pool).await;
    SagaRow::running("OrderFulfilment", "o-8", 30)
        .insert(pool)
        .await;
    // Ids are any UTF-8 the correlation's text has.
    SagaRow::running("OrderFulfilment", "ö/€ 9", 30)
        .insert(pool)
        .await;

    let detail = sagas::show(pool, "OrderFulfilment", "o-7")
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

    let plain = sagas::show(pool, "OrderFulfilment", "o-8")
        .await
        .unwrap()
        .unwrap();
    assert!(plain.compensations.is_empty());
    let unicode = sagas::show(pool, "OrderFulfilment", "ö/€ 9")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(unicode.summary.saga_id, "ö/€ 9");
    assert!(
        sagas::show(pool, "OrderFulfilment", "o-9")
            .await
            .unwrap()
            .is_none()
    );
    assert!(sagas::show(pool, "Refund", "o-7").await.unwrap().is_none());

    sqlx::query(
        "UPDATE saga_state SET compensations = '[{\"event_id\": \"not-a-uuid\"}]'
         WHERE saga_id = 'o-8'",
    )
    .execute(pool)
    .await
    .unwrap();
    let broken = sagas::show(pool, "OrderFulfilment", "o-8")
        .await
        .unwrap_err();
    assert!(
        matches!(&broken, OpsError::InvalidCompensation { saga_id, position: 1, field: "event_id", .. } if saga_id == "o-8")
            && broken
                .to_string()
                .contains("`o-8`: stored compensation 1 has no valid event_id"),
        "{broken}"
    );
    db.drop().await;
}

#[tokio::test]
async fn stuck_lists_running_sagas_idle_longer_than_the_age_oldest_first() {
    let db = scratch(2).await;
    let pool = &db.pool;
    SagaRow::running("OrderFulfilment", "o-recent", 30)
        .insert(pool)
        .await;
    SagaRow::running("OrderFulfilment", "o-hour", 3_600)
        .insert(pool)
        .await;
    SagaRow::running("Refund", "r-day", 86_400)
        .insert(pool)
        .await;
    SagaRow::running("OrderFulfilment", "o-20m", 1_200)
        .insert(pool)
        .await;
    // Finished long ago: never stuck, whatever its age.
    SagaRow::finished("OrderFulfilment", "o-done", "completed", 90_000)
        .insert(pool)
        .await;
    SagaRow::finished("Refund", "r-undone", "compensated", 90_000)
        .insert(pool)
        .await;

    let ten_minutes = Duration::from_secs(600);
    let stuck = sagas::stuck(pool, ten_minutes, None, 100).await.unwrap();
    assert_eq!(ids(&stuck), ["r-day", "o-hour", "o-20m"]);
    assert!(stuck.iter().all(|s| s.status == SagaStatus::Running));
    assert!(
        (stuck[0].idle_secs - 86_400.0).abs() < 5.0,
        "{}",
        stuck[0].idle_secs
    );
    assert_eq!(
        sagas::count_stuck(pool, ten_minutes, None).await.unwrap(),
        3
    );
    let orders = sagas::stuck(pool, ten_minutes, Some("OrderFulfilment"), 100)
        .await
        .unwrap();
    assert_eq!(ids(&orders), ["o-hour", "o-20m"]);
    let oldest = sagas::stuck(pool, ten_minutes, None, 1).await.unwrap();
    assert_eq!(ids(&oldest), ["r-day"]);
    let two_hours = Duration::from_secs(7_200);
    assert_eq!(
        ids(&sagas::stuck(pool, two_hours, None, 100).await.unwrap()),
        ["r-day"]
    );
    assert_eq!(
        sagas::count_stuck(pool, two_hours, Some("OrderFulfilment"))
            .await
            .unwrap(),
        0
    );
    assert!(
        sagas::stuck(pool, ten_minutes, Some("Nope"), 100)
            .await
            .unwrap()
            .is_empty()
    );
    // Any age is a valid question (a cutoff before year 1000 selects none).
    assert!(
        sagas::stuck(pool, Duration::MAX, None, 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        sagas::count_stuck(pool, Duration::MAX, None).await.unwrap(),
        0
    );
    let years = Duration::from_secs(900 * 365 * 86_400);
    assert!(
        sagas::stuck(pool, years, None, 100)
            .await
            .unwrap()
            .is_empty()
    );
    db.drop().await;
}

#[tokio::test]
async fn overview_counts_per_type_and_status_checks_the_oldest_running_saga() {
    let db = scratch(2).await;
    let pool = &db.pool;
    for (id, ago) in [("o-1", 60), ("o-2", 1_800), ("o-3", 5)] {
        SagaRow::running("OrderFulfilment", id, ago)
            .insert(pool)
            .await;
    }
    SagaRow::finished("OrderFulfilment", "o-4", "completed", 10)
        .insert(pool)
        .await;
    SagaRow::finished("OrderFulfilment", "o-5", "compensated", 10)
        .insert(pool)
        .await;
    SagaRow::finished("Refund", "r-1", "completed", 10_000)
        .insert(pool)
        .await;

    let overview = sagas::overview(pool).await.unwrap();
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

    let status = status::collect(pool, 5).await.unwrap();
    assert_eq!(status.sagas.len(), 2);
    assert!(status.not_on_this_database.is_empty());
    for (a, b) in status.sagas.iter().zip(&overview) {
        assert_eq!(
            (&a.saga_type, a.running, a.completed, a.compensated),
            (&b.saga_type, b.running, b.completed, b.compensated)
        );
        assert_eq!(a.oldest_running_at, b.oldest_running_at);
    }
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
    let json = serde_json::to_value(&status).unwrap();
    assert_eq!(json["sagas"][0]["saga_type"], "OrderFulfilment");
    assert_eq!(
        json["sagas"][1]["oldest_running_age_secs"],
        serde_json::Value::Null
    );

    // A schema migrated before MySQL migration 0006 has no saga_state: the
    // status names it and leaves the part empty; overview is empty.
    sqlx::query("DROP TABLE saga_state")
        .execute(pool)
        .await
        .unwrap();
    assert!(sagas::overview(pool).await.unwrap().is_empty());
    let status = status::collect(pool, 5).await.unwrap();
    assert!(status.sagas.is_empty());
    assert_eq!(status.not_on_this_database, ["saga_state"]);
    assert!(exceeded.check(&status).is_empty());
    let error = sagas::list(pool, &SagaFilter::default()).await.unwrap_err();
    assert!(error.to_string().contains("doesn't exist"), "{error}");
    db.drop().await;
}

/// Finished sagas older than the cutoff go, in batches: running sagas never
/// (however long they waited), recent ones stay; five sagas of two types
/// finished at the same instant are walked on `(finished_at, type, id)`, so
/// batch boundaries inside the tie pass over none; a saga whose row a step
/// holds is passed over without waiting and taken by the next run.
#[tokio::test]
async fn retention_deletes_finished_sagas_in_batches_past_held_rows() {
    let db = scratch(4).await;
    let pool = &db.pool;
    let day = 86_400;
    for (saga_type, id) in [
        ("OrderFulfilment", "tie-1"),
        ("Refund", "tie-2"),
        ("OrderFulfilment", "tie-3"),
        ("Refund", "tie-4"),
        ("OrderFulfilment", "tie-5"),
    ] {
        SagaRow::finished(saga_type, id, "completed", 9 * day)
            .insert(pool)
            .await;
    }
    sqlx::query(
        "UPDATE saga_state SET finished_at = UTC_TIMESTAMP(6) - INTERVAL 9 DAY - INTERVAL 1 SECOND",
    )
    .execute(pool)
    .await
    .unwrap();
    assert_eq!(
        count(pool, "SELECT COUNT(DISTINCT finished_at) FROM saga_state").await,
        1,
        "one instant"
    );
    SagaRow::finished("OrderFulfilment", "old-compensated", "compensated", 8 * day)
        .insert(pool)
        .await;
    SagaRow::finished("Refund", "held", "completed", 8 * day)
        .insert(pool)
        .await;
    SagaRow::finished("OrderFulfilment", "recent", "completed", day)
        .insert(pool)
        .await;
    // Running for a month without a step: stuck, but never deleted.
    SagaRow::running("OrderFulfilment", "running", 30 * day)
        .insert(pool)
        .await;

    let cutoff = Database::from(pool).now().await.unwrap() - TimeDelta::days(7);
    assert_eq!(
        cleanup::count(pool, Target::FinishedSaga, cutoff)
            .await
            .unwrap(),
        7
    );
    // A step of the finished saga `held` has its row (it ignores the
    // message, but loads the row FOR UPDATE first).
    let step = lock_where(
        &db,
        "SELECT saga_id FROM saga_state WHERE saga_type = 'Refund' AND saga_id = 'held'",
    )
    .await;
    let started = Instant::now();
    let mut batches = Vec::new();
    let deleted = tokio::time::timeout(
        Duration::from_secs(10),
        Purge::new(Target::FinishedSaga, cutoff)
            .batch_size(2)
            .run(pool, |b| batches.push(b)),
    )
    .await
    .expect("the purge waited for the held saga")
    .unwrap();
    assert_eq!(deleted, 6, "batches {batches:?}");
    assert!(batches.iter().all(|b| *b <= 2), "{batches:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
    release(step).await;
    let mut left: Vec<Vec<u8>> = sqlx::query_scalar("SELECT saga_id FROM saga_state")
        .fetch_all(pool)
        .await
        .unwrap();
    left.sort();
    assert_eq!(
        left,
        [b"held".to_vec(), b"recent".to_vec(), b"running".to_vec()]
    );
    let next = Purge::new(Target::FinishedSaga, cutoff)
        .run(pool, |_| {})
        .await
        .unwrap();
    assert_eq!(next, 1, "the next run takes the saga once released");

    // Everything finished, by now: the running saga stays.
    let now = Database::from(pool).now().await.unwrap() + TimeDelta::seconds(1);
    let all = Purge::new(Target::FinishedSaga, now)
        .batch_size(1)
        .run(pool, |_| {})
        .await
        .unwrap();
    assert_eq!(all, 1);
    let left = sagas::list(pool, &SagaFilter::default()).await.unwrap();
    assert_eq!(ids(&left), ["running"], "a running saga is never deleted");
    db.drop().await;
}
