//! The saga workload: its messages, the saga, the participant's handlers and
//! both services' tables.
//!
//! Two services, each with a database of its own, talk only through their
//! outboxes and two topics: the saga service consumes [`SAGA_TOPIC`] (the
//! `Begin` requests, the participant's replies and its own timeouts), the
//! participant consumes [`PARTICIPANT_TOPIC`] (`Reserve`, `Charge`,
//! `Release`). Every message is keyed by its saga id, so the messages of one
//! saga keep their order on each topic.
//!
//! A saga reserves the amount, then charges it:
//!
//! ```text
//! Begin ──► Reserve ──► Reserved ──► Charge ──► Charged   → completed
//!   │                       │                 └► Declined  → compensated: Release
//!   │                       └ (the timeout is cancelled)
//!   │         └► Rejected                                  → compensated (nothing reserved)
//!   └ TimedOut while reserving (no answer in time)         → compensated: Release
//! ```
//!
//! The participant answers according to the request's [`Behaviour`]:
//! `Reject` is rejected, `Silent` never answered (the saga times out),
//! `Late`'s `Reserve` is held up in transit for longer than the saga's
//! timeout (the saga schedules it after the timeout); the others are
//! reserved, and charged unless the amount is over [`CHARGE_LIMIT`].
//!
//! **No reservation can leak.** A saga that times out while reserving cannot
//! know whether its `Reserve` was (or will be) applied, so it always sends
//! `Release`. The participant applies `Reserve`, `Charge` and `Release` of a
//! saga one at a time under the saga's row lock in `reservation`; a `Release`
//! that finds nothing reserved leaves a **tombstone**, and a `Reserve` that
//! finds the tombstone is refused. So whichever of the two the participant
//! applies first, the saga's reservation ends released or never made. A
//! `Reserved` that reaches a saga which has already ended is ignored by the
//! saga runtime (the saga is finished), and the `Release` the saga sent
//! takes care of the reservation.
//!
//! Every effect is logged in `participant_effect` without a unique
//! constraint, so a second application of a message shows as a second row
//! instead of failing; the checker reads it.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::{PgPool, Postgres, Transaction};
use txoutbox_core::{Command, DomainEvent, Events};
use txoutbox_runtime::consumer::{ConsumerBuilder, event_handler};
use txoutbox_runtime::saga::{Saga, SagaContext, saga};
use uuid::Uuid;

/// What the saga service consumes.
pub const SAGA_TOPIC: &str = "sagas.saga";
/// What the participant consumes.
pub const PARTICIPANT_TOPIC: &str = "sagas.participant";
/// The dead-letter topics of the two consumers (default `.dlq` suffix).
pub const DLQ_TOPICS: [&str; 2] = ["sagas.saga.dlq", "sagas.participant.dlq"];
/// The saga service's consumer group.
pub const SAGA_GROUP: &str = "saga";
/// The participant's consumer group.
pub const PARTICIPANT_GROUP: &str = "participant";
/// The saga type's name (`saga_state.saga_type`).
pub const SAGA_NAME: &str = <FaultSaga as Saga>::NAME;
/// Charges of more than this are declined.
pub const CHARGE_LIMIT: i64 = 1_000;

/// How long a saga waits for its reservation before it compensates. Long
/// enough that a reservation normally arrives in time, even behind a killed
/// process's restart; a broker outage makes some sagas time out anyway.
pub const RESERVE_TIMEOUT: Duration = Duration::from_secs(8);
/// How long a `Late` saga's `Reserve` is held up: it arrives after the
/// timeout fired (and usually after the saga's `Release`).
pub const LATE_BY: Duration = Duration::from_secs(10);

/// How the participant treats a saga's request (chosen by the test).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Behaviour {
    /// Reserved, then charged (or declined over [`CHARGE_LIMIT`]).
    Normal,
    /// Rejected: nothing reserved.
    Reject,
    /// Never answered: the saga times out.
    Silent,
    /// `Reserve` arrives after the saga timed out.
    Late,
}

impl Behaviour {
    /// The `saga_request.behaviour` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "normal",
            Self::Reject => "reject",
            Self::Silent => "silent",
            Self::Late => "late",
        }
    }
}

/// Starts a saga (inserted by the test into the saga service's outbox).
#[derive(Debug, Clone, Command, Serialize, Deserialize, JsonSchema)]
#[command(topic = "sagas.saga", aggregate = "Saga")]
pub struct Begin {
    /// Unique per message.
    #[event_id]
    pub event_id: Uuid,
    /// The saga's id.
    #[partition_key]
    #[aggregate_id]
    pub saga_id: Uuid,
    /// What to reserve and charge.
    pub amount: i64,
    /// How the participant treats it.
    pub behaviour: Behaviour,
}

/// Saga → participant: reserve the amount.
#[derive(Debug, Clone, Command, Serialize, Deserialize, JsonSchema)]
#[command(topic = "sagas.participant", aggregate = "Saga")]
pub struct Reserve {
    /// Unique per message.
    #[event_id]
    pub event_id: Uuid,
    /// The saga's id.
    #[partition_key]
    #[aggregate_id]
    pub saga_id: Uuid,
    /// What to reserve.
    pub amount: i64,
    /// How the participant treats it.
    pub behaviour: Behaviour,
}

/// Saga → participant: charge the reserved amount.
#[derive(Debug, Clone, Command, Serialize, Deserialize, JsonSchema)]
#[command(topic = "sagas.participant", aggregate = "Saga")]
pub struct Charge {
    /// Unique per message.
    #[event_id]
    pub event_id: Uuid,
    /// The saga's id.
    #[partition_key]
    #[aggregate_id]
    pub saga_id: Uuid,
}

/// Saga → participant, the compensation: release the reservation (or leave
/// a tombstone if there is none yet).
#[derive(Debug, Clone, Command, Serialize, Deserialize, JsonSchema)]
#[command(topic = "sagas.participant", aggregate = "Saga")]
pub struct Release {
    /// Unique per message.
    #[event_id]
    pub event_id: Uuid,
    /// The saga's id.
    #[partition_key]
    #[aggregate_id]
    pub saga_id: Uuid,
}

/// Participant → saga: reserved.
#[derive(Debug, Clone, DomainEvent, Serialize, Deserialize, JsonSchema)]
#[event(topic = "sagas.saga", event_type = "Reserved", aggregate = "Saga")]
pub struct Reserved {
    /// Unique per message.
    #[event_id]
    pub event_id: Uuid,
    /// The saga's id.
    #[partition_key]
    #[aggregate_id]
    pub saga_id: Uuid,
}

/// Participant → saga: not reserved.
#[derive(Debug, Clone, DomainEvent, Serialize, Deserialize, JsonSchema)]
#[event(topic = "sagas.saga", event_type = "Rejected", aggregate = "Saga")]
pub struct Rejected {
    /// Unique per message.
    #[event_id]
    pub event_id: Uuid,
    /// The saga's id.
    #[partition_key]
    #[aggregate_id]
    pub saga_id: Uuid,
}

/// Participant → saga: charged.
#[derive(Debug, Clone, DomainEvent, Serialize, Deserialize, JsonSchema)]
#[event(topic = "sagas.saga", event_type = "Charged", aggregate = "Saga")]
pub struct Charged {
    /// Unique per message.
    #[event_id]
    pub event_id: Uuid,
    /// The saga's id.
    #[partition_key]
    #[aggregate_id]
    pub saga_id: Uuid,
}

/// Participant → saga: the charge was declined (over [`CHARGE_LIMIT`]).
#[derive(Debug, Clone, DomainEvent, Serialize, Deserialize, JsonSchema)]
#[event(topic = "sagas.saga", event_type = "Declined", aggregate = "Saga")]
pub struct Declined {
    /// Unique per message.
    #[event_id]
    pub event_id: Uuid,
    /// The saga's id.
    #[partition_key]
    #[aggregate_id]
    pub saga_id: Uuid,
}

/// The saga to itself, [`RESERVE_TIMEOUT`] after it started.
#[derive(Debug, Clone, DomainEvent, Serialize, Deserialize, JsonSchema)]
#[event(topic = "sagas.saga", event_type = "TimedOut", aggregate = "Saga")]
pub struct TimedOut {
    /// Unique per message.
    #[event_id]
    pub event_id: Uuid,
    /// The saga's id.
    #[partition_key]
    #[aggregate_id]
    pub saga_id: Uuid,
}

/// Where a saga is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// `Reserve` sent; waiting for `Reserved`, `Rejected` or the timeout.
    Reserving,
    /// `Charge` sent; waiting for `Charged` or `Declined`.
    Charging,
}

/// The saga's state (`saga_state.state`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FaultSaga {
    /// Its id.
    pub saga_id: Uuid,
    /// The amount.
    pub amount: i64,
    /// Where it is.
    pub stage: Stage,
    /// The scheduled `TimedOut` while reserving.
    pub timeout: Option<Uuid>,
}

/// A saga handler's failure: a statement of the step failed.
#[derive(Debug, thiserror::Error)]
#[error("saga step failed: {0}")]
pub struct SagaError(#[from] sqlx::Error);

/// One consumer handler per message: each message is one step of the saga
/// its `saga_id` names.
#[saga(
    name = "fault_saga",
    id = Uuid,
    correlate = saga_id,
    starts_with(Begin),
    handles(Reserved, Rejected, Charged, Declined, TimedOut)
)]
impl FaultSaga {
    /// `Begin`: send `Reserve` (a `Late` one after the timeout) and schedule
    /// the timeout.
    pub async fn on_begin(event: Begin, ctx: &mut SagaContext<'_>) -> Result<Self, SagaError> {
        let reserve = Reserve {
            event_id: Uuid::new_v4(),
            saga_id: event.saga_id,
            amount: event.amount,
            behaviour: event.behaviour,
        };
        if event.behaviour == Behaviour::Late {
            ctx.send_after(reserve, LATE_BY);
        } else {
            ctx.send(reserve);
        }
        let timeout = ctx.send_after(
            TimedOut {
                event_id: Uuid::new_v4(),
                saga_id: event.saga_id,
            },
            RESERVE_TIMEOUT,
        );
        Ok(Self {
            saga_id: event.saga_id,
            amount: event.amount,
            stage: Stage::Reserving,
            timeout: Some(timeout),
        })
    }

    /// `Reserved`: register the release, cancel the timeout, charge.
    pub async fn on_reserved(
        &mut self,
        _event: Reserved,
        ctx: &mut SagaContext<'_>,
    ) -> Result<(), SagaError> {
        if self.stage != Stage::Reserving {
            return Ok(());
        }
        ctx.on_compensate(Release {
            event_id: Uuid::new_v4(),
            saga_id: self.saga_id,
        });
        cancel_timeout(self, ctx).await?;
        ctx.send(Charge {
            event_id: Uuid::new_v4(),
            saga_id: self.saga_id,
        });
        self.stage = Stage::Charging;
        Ok(())
    }

    /// `Rejected`: nothing was reserved; the saga ends compensated.
    pub async fn on_rejected(
        &mut self,
        _event: Rejected,
        ctx: &mut SagaContext<'_>,
    ) -> Result<(), SagaError> {
        if self.stage != Stage::Reserving {
            return Ok(());
        }
        cancel_timeout(self, ctx).await?;
        ctx.compensate();
        Ok(())
    }

    /// `Charged`: done.
    pub async fn on_charged(
        &mut self,
        _event: Charged,
        ctx: &mut SagaContext<'_>,
    ) -> Result<(), SagaError> {
        if self.stage == Stage::Charging {
            ctx.complete();
        }
        Ok(())
    }

    /// `Declined`: compensate (the registered `Release` goes out).
    pub async fn on_declined(
        &mut self,
        _event: Declined,
        ctx: &mut SagaContext<'_>,
    ) -> Result<(), SagaError> {
        if self.stage == Stage::Charging {
            ctx.compensate();
        }
        Ok(())
    }

    /// `TimedOut`: while still reserving, give up: send `Release` (the
    /// `Reserve` may be applied yet, or may have been and its answer is on
    /// the way) and end compensated. Once charging (the timeout was due
    /// before `Reserved` could cancel it), ignore it.
    pub async fn on_timed_out(
        &mut self,
        _event: TimedOut,
        ctx: &mut SagaContext<'_>,
    ) -> Result<(), SagaError> {
        if self.stage != Stage::Reserving {
            return Ok(());
        }
        self.timeout = None;
        ctx.send(Release {
            event_id: Uuid::new_v4(),
            saga_id: self.saga_id,
        });
        ctx.compensate();
        Ok(())
    }
}

/// Cancels the saga's scheduled timeout, if it still has one.
async fn cancel_timeout(saga: &mut FaultSaga, ctx: &mut SagaContext<'_>) -> Result<(), SagaError> {
    if let Some(timeout) = saga.timeout.take() {
        // `false`: already due; `on_timed_out` ignores it then.
        ctx.cancel_scheduled(timeout).await?;
    }
    Ok(())
}

/// The participant's effects, one row per application (no unique constraint
/// on purpose).
pub mod effect {
    /// A reservation made.
    pub const RESERVE: &str = "reserve";
    /// A `Reserve` refused because the saga's `Release` came first.
    pub const RESERVE_REFUSED: &str = "reserve_refused";
    /// A reservation charged.
    pub const CHARGE: &str = "charge";
    /// A reservation released.
    pub const RELEASE: &str = "release";
    /// A `Release` that found nothing reserved: the tombstone.
    pub const TOMBSTONE: &str = "tombstone";
    /// A `Release` of a charged reservation: a compensation that must never happen.
    pub const RELEASE_CHARGED: &str = "release_charged";
    /// A `Release` of a saga released before (a second compensation).
    pub const RELEASE_AGAIN: &str = "release_again";
    /// A `Charge` of a reservation that is not (or no longer) reserved.
    pub const CHARGE_UNRESERVED: &str = "charge_unreserved";
}

/// The participant process's tag in `participant_effect.process` (set once
/// by the binary), to tell which process applied what.
pub static PROCESS_TAG: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Locks the saga's row in `reservation` (creating it as `none`) and returns
/// its status: every message of one saga is applied under this lock.
async fn lock(tx: &mut Transaction<'_, Postgres>, saga_id: Uuid) -> Result<String, sqlx::Error> {
    sqlx::query("INSERT INTO reservation (saga_id) VALUES ($1) ON CONFLICT DO NOTHING")
        .bind(saga_id)
        .execute(&mut **tx)
        .await?;
    sqlx::query_scalar("SELECT status FROM reservation WHERE saga_id = $1 FOR UPDATE")
        .bind(saga_id)
        .fetch_one(&mut **tx)
        .await
}

async fn apply(
    tx: &mut Transaction<'_, Postgres>,
    saga_id: Uuid,
    event_id: Uuid,
    kind: &str,
    status: Option<&str>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO participant_effect (saga_id, kind, event_id, process) VALUES ($1, $2, $3, $4)",
    )
    .bind(saga_id)
    .bind(kind)
    .bind(event_id)
    .bind(PROCESS_TAG.get().map_or("", String::as_str))
    .execute(&mut **tx)
    .await?;
    if let Some(status) = status {
        sqlx::query(
            "UPDATE reservation SET status = $2, updated_at = clock_timestamp() WHERE saga_id = $1",
        )
        .bind(saga_id)
        .bind(status)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// `Reserve`: reserve and answer `Reserved`, unless rejected (`Rejected`),
/// silent (no answer) or already released (refused, no answer: the saga has
/// ended).
#[event_handler]
pub async fn on_reserve(
    tx: &mut Transaction<'_, Postgres>,
    event: Reserve,
    events: &mut Events,
) -> Result<(), sqlx::Error> {
    let status = lock(tx, event.saga_id).await?;
    match event.behaviour {
        Behaviour::Silent => return Ok(()),
        Behaviour::Reject => {
            events.record(Rejected {
                event_id: Uuid::new_v4(),
                saga_id: event.saga_id,
            });
            return Ok(());
        }
        Behaviour::Normal | Behaviour::Late => {}
    }
    match status.as_str() {
        "none" => {
            sqlx::query("UPDATE reservation SET amount = $2 WHERE saga_id = $1")
                .bind(event.saga_id)
                .bind(event.amount)
                .execute(&mut **tx)
                .await?;
            apply(
                tx,
                event.saga_id,
                event.event_id,
                effect::RESERVE,
                Some("reserved"),
            )
            .await?;
            events.record(Reserved {
                event_id: Uuid::new_v4(),
                saga_id: event.saga_id,
            });
        }
        "tombstone" => {
            apply(
                tx,
                event.saga_id,
                event.event_id,
                effect::RESERVE_REFUSED,
                None,
            )
            .await?;
        }
        // A second `Reserve` of one saga: the saga sends one; nothing to do.
        _ => {}
    }
    Ok(())
}

/// `Charge`: charge the reservation and answer `Charged`, or `Declined` over
/// [`CHARGE_LIMIT`].
#[event_handler]
pub async fn on_charge(
    tx: &mut Transaction<'_, Postgres>,
    event: Charge,
    events: &mut Events,
) -> Result<(), sqlx::Error> {
    let status = lock(tx, event.saga_id).await?;
    let amount: Option<i64> =
        sqlx::query_scalar("SELECT amount FROM reservation WHERE saga_id = $1")
            .bind(event.saga_id)
            .fetch_one(&mut **tx)
            .await?;
    if status != "reserved" {
        apply(
            tx,
            event.saga_id,
            event.event_id,
            effect::CHARGE_UNRESERVED,
            None,
        )
        .await?;
        events.record(Declined {
            event_id: Uuid::new_v4(),
            saga_id: event.saga_id,
        });
    } else if amount.unwrap_or(0) > CHARGE_LIMIT {
        events.record(Declined {
            event_id: Uuid::new_v4(),
            saga_id: event.saga_id,
        });
    } else {
        apply(
            tx,
            event.saga_id,
            event.event_id,
            effect::CHARGE,
            Some("charged"),
        )
        .await?;
        events.record(Charged {
            event_id: Uuid::new_v4(),
            saga_id: event.saga_id,
        });
    }
    Ok(())
}

/// `Release`: release the reservation, or leave a tombstone if there is none
/// yet (so that a later `Reserve` is refused).
#[event_handler]
pub async fn on_release(
    tx: &mut Transaction<'_, Postgres>,
    event: Release,
) -> Result<(), sqlx::Error> {
    let status = lock(tx, event.saga_id).await?;
    let (kind, next) = match status.as_str() {
        "none" => (effect::TOMBSTONE, Some("tombstone")),
        "reserved" => (effect::RELEASE, Some("released")),
        "charged" => (effect::RELEASE_CHARGED, None),
        _ => (effect::RELEASE_AGAIN, None),
    };
    apply(tx, event.saga_id, event.event_id, kind, next).await
}

/// Registers the participant's handlers.
pub fn participant(consumer: ConsumerBuilder) -> ConsumerBuilder {
    consumer
        .handler(on_reserve)
        .handler(on_charge)
        .handler(on_release)
}

/// The saga service's tables: the framework's, `saga_request` (every saga
/// the test started, committed with its `Begin`) and `process_report` (what
/// each process's consumer counted).
pub async fn migrate_saga_service(pool: &PgPool) -> sqlx::Result<()> {
    txoutbox_runtime::migrations::run(pool)
        .await
        .map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS saga_request (
             saga_id uuid PRIMARY KEY, amount bigint NOT NULL, behaviour text NOT NULL,
             begun_at timestamptz NOT NULL DEFAULT clock_timestamp());
         CREATE TABLE IF NOT EXISTS process_report (
             process text PRIMARY KEY, consumer_group text NOT NULL,
             handled bigint NOT NULL, duplicates bigint NOT NULL);",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// The participant's tables: the framework's, `reservation` (one row per
/// saga it heard of, the lock of its messages), `participant_effect` and
/// `process_report`.
pub async fn migrate_participant(pool: &PgPool) -> sqlx::Result<()> {
    txoutbox_runtime::migrations::run(pool)
        .await
        .map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS reservation (
             saga_id uuid PRIMARY KEY, amount bigint,
             status text NOT NULL DEFAULT 'none'
                 CHECK (status IN ('none', 'reserved', 'charged', 'released', 'tombstone')),
             updated_at timestamptz NOT NULL DEFAULT clock_timestamp());
         CREATE TABLE IF NOT EXISTS participant_effect (
             id bigserial PRIMARY KEY, saga_id uuid NOT NULL, kind text NOT NULL,
             event_id uuid NOT NULL, process text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT clock_timestamp());
         CREATE INDEX IF NOT EXISTS participant_effect_saga ON participant_effect (saga_id);
         CREATE TABLE IF NOT EXISTS process_report (
             process text PRIMARY KEY, consumer_group text NOT NULL,
             handled bigint NOT NULL, duplicates bigint NOT NULL);",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Starts one saga: its `saga_request` row and its `Begin` in the saga
/// service's outbox, in one transaction.
pub async fn begin(
    pool: &PgPool,
    saga_id: Uuid,
    amount: i64,
    behaviour: Behaviour,
) -> Result<(), sqlx::Error> {
    let begin = Begin {
        event_id: Uuid::new_v4(),
        saga_id,
        amount,
        behaviour,
    };
    let record = txoutbox_core::OutboxRecord::from_event(&begin)
        .map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO saga_request (saga_id, amount, behaviour) VALUES ($1, $2, $3)")
        .bind(saga_id)
        .bind(amount)
        .bind(behaviour.as_str())
        .execute(&mut *tx)
        .await?;
    let mut events = txoutbox_core::Events::new();
    events.record_prepared(record);
    txoutbox_core::insert_events(&mut tx, &events).await?;
    tx.commit().await
}
