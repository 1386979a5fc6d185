//! The saga scenario's checker: from both services' databases and the
//! topics, after convergence, every saga ended and no compensation
//! misbehaved.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;

use super::model::{CHARGE_LIMIT, SAGA_NAME, effect};
use crate::faults::topic::Record;

/// One saga as the checker sees it.
#[derive(Debug, Clone, Default)]
pub struct SagaRecord {
    /// Its id.
    pub saga_id: Uuid,
    /// `Begin`'s amount.
    pub amount: i64,
    /// `Begin`'s behaviour.
    pub behaviour: String,
    /// `saga_state.status`; `None`: no saga row (its `Begin` was never handled).
    pub status: Option<String>,
    /// The message of its last step (for a finished saga: what ended it).
    pub last_message: Option<String>,
    /// The participant's `reservation.status` (`None`: it never heard of the saga).
    pub reservation: Option<String>,
    /// The participant's effects of this saga, by kind.
    pub effects: HashMap<String, usize>,
}

impl SagaRecord {
    fn effect(&self, kind: &str) -> usize {
        self.effects.get(kind).copied().unwrap_or(0)
    }

    /// What is wrong with this saga's end, if anything.
    fn violations(&self) -> Vec<String> {
        let mut wrong = Vec::new();
        for (kind, count) in &self.effects {
            if *count > 1 {
                wrong.push(format!("{kind} applied {count} times"));
            }
        }
        for kind in [
            effect::RELEASE_CHARGED,
            effect::RELEASE_AGAIN,
            effect::CHARGE_UNRESERVED,
        ] {
            if self.effect(kind) > 0 {
                wrong.push(format!("{kind} happened"));
            }
        }
        let (reserved, charged, released, tombstone) = (
            self.effect(effect::RESERVE),
            self.effect(effect::CHARGE),
            self.effect(effect::RELEASE),
            self.effect(effect::TOMBSTONE),
        );
        match self.status.as_deref() {
            Some("completed") => {
                if !(reserved == 1 && charged == 1 && released == 0 && tombstone == 0) {
                    wrong.push("completed but not reserved, charged and unreleased".into());
                }
                if self.reservation.as_deref() != Some("charged") {
                    wrong.push(format!(
                        "completed but the reservation is {:?}",
                        self.reservation
                    ));
                }
                if matches!(self.behaviour.as_str(), "silent" | "reject")
                    || self.amount > CHARGE_LIMIT
                {
                    wrong.push("completed although it had to fail".into());
                }
            }
            Some("compensated") => {
                if charged != 0 {
                    wrong.push("compensated but charged".into());
                }
                if reserved != released {
                    wrong.push(format!(
                        "compensated with {reserved} reservation(s) and {released} release(s): leaked"
                    ));
                }
                if !matches!(
                    self.reservation.as_deref(),
                    None | Some("none" | "released" | "tombstone")
                ) {
                    wrong.push(format!(
                        "compensated but the reservation is {:?}",
                        self.reservation
                    ));
                }
                // Only a timeout sends `Release` without a reservation.
                if tombstone > 0 && self.last_message.as_deref() != Some("TimedOut") {
                    wrong.push(format!(
                        "released without a reservation, ended by {:?}, not by its timeout",
                        self.last_message
                    ));
                }
            }
            _ => {}
        }
        if self.effect(effect::RESERVE_REFUSED) > 0 && tombstone == 0 {
            wrong.push("a Reserve was refused without a tombstone".into());
        }
        if matches!(self.behaviour.as_str(), "silent" | "reject") && reserved > 0 {
            wrong.push(format!("reserved although {}", self.behaviour));
        }
        wrong
    }
}

/// What the scenario saw and did.
#[derive(Debug, Clone, Default)]
pub struct SagaFigures {
    /// The scenario's name.
    pub scenario: String,
    /// Sagas started.
    pub sagas: usize,
    /// Sagas ended completed.
    pub completed: usize,
    /// Sagas ended compensated.
    pub compensated: usize,
    /// ... of which ended by `Declined` (their reservation released).
    pub declined: usize,
    /// ... by `Rejected` (nothing reserved).
    pub rejected: usize,
    /// ... by their timeout.
    pub timed_out: usize,
    /// ... of which `Normal` sagas the faults delayed past their timeout.
    pub timed_out_normal: usize,
    /// Sagas not ended (must be 0), with the first few.
    pub open: Vec<SagaRecord>,
    /// Reservations released (compensations applied to a reservation).
    pub releases: usize,
    /// `Release`s that found nothing reserved and left a tombstone.
    pub tombstones: usize,
    /// `Reserve`s refused by a tombstone (they arrived after their `Release`).
    pub refused_after_release: usize,
    /// Reservations made after the saga had timed out, then released.
    pub reserved_after_timeout: usize,
    /// Sagas with a violation (must be 0), with what is wrong.
    pub violations: Vec<(Uuid, Vec<String>)>,
    /// Messages written to an outbox and never handled by their consumer.
    pub lost: usize,
    /// Outbox rows not published (or parked).
    pub unpublished: usize,
    /// Outbox rows parked.
    pub parked: usize,
    /// Scheduled messages left (not due, not cancelled).
    pub scheduled_left: usize,
    /// Records on the dead-letter topics.
    pub dead_lettered: usize,
    /// Records on the two topics.
    pub records: usize,
    /// Messages received again and absorbed by the consumers' dedup, as
    /// the processes reported them (a kill loses its last 100 ms).
    pub redelivered: usize,
    /// Records published more than once (by a relay that died before it
    /// marked them), counted once per extra copy.
    pub duplicates: usize,
    /// `kill -9` of saga hosts.
    pub saga_host_kills: u32,
    /// `kill -9` of participants.
    pub participant_kills: u32,
    /// Broker outages.
    pub outages: u32,
    /// Crashes of the processes with the crash hook (after their group
    /// handled so many messages, none of their offsets committed).
    pub crashes: u32,
    /// From `Begin` committed to the saga completed, in milliseconds: p50,
    /// p99 and max (completed sagas).
    pub completion_ms: (f64, f64, f64),
    /// Sagas that ended before the load (and the faults) did.
    pub finished_under_faults: usize,
    /// From the end of the faults to convergence.
    pub converged_after: Option<Duration>,
    /// The whole run.
    pub elapsed: Duration,
}

impl SagaFigures {
    /// One line of figures.
    pub fn print(&self) {
        println!(
            "[faults] {}: sagas={} completed={} compensated={} (declined={} rejected={} \
             timed_out={} of which normal={}) completion_ms(p50={:.0} p99={:.0} max={:.0}) open={} releases={} tombstones={} \
             refused_after_release={} reserved_after_timeout={} violations={} lost={} \
             finished_under_faults={} unpublished={} parked={} scheduled_left={} dead_lettered={} records={} \
             duplicates={} redelivered={} kills(saga_host={} participant={} crash_hook={}) outages={} converged_after={} \
             elapsed={:.1}s",
            self.scenario,
            self.sagas,
            self.completed,
            self.compensated,
            self.declined,
            self.rejected,
            self.timed_out,
            self.timed_out_normal,
            self.completion_ms.0,
            self.completion_ms.1,
            self.completion_ms.2,
            self.open.len(),
            self.releases,
            self.tombstones,
            self.refused_after_release,
            self.reserved_after_timeout,
            self.violations.len(),
            self.lost,
            self.finished_under_faults,
            self.unpublished,
            self.parked,
            self.scheduled_left,
            self.dead_lettered,
            self.records,
            self.duplicates,
            self.redelivered,
            self.saga_host_kills,
            self.participant_kills,
            self.crashes,
            self.outages,
            self.converged_after.map_or_else(
                || "never".to_owned(),
                |d| format!("{:.1}s", d.as_secs_f64())
            ),
            self.elapsed.as_secs_f64(),
        );
    }

    /// Every failed invariant, one per line; empty when sound.
    pub fn failures(&self) -> String {
        let mut out = String::new();
        if !self.open.is_empty() {
            let _ = writeln!(
                out,
                "{} saga(s) never ended (completed or compensated); the first:",
                self.open.len()
            );
            for saga in self.open.iter().take(20) {
                let _ = writeln!(
                    out,
                    "  {} behaviour={} amount={} status={:?} last_message={:?} reservation={:?} effects={:?}",
                    saga.saga_id,
                    saga.behaviour,
                    saga.amount,
                    saga.status,
                    saga.last_message,
                    saga.reservation,
                    saga.effects
                );
            }
        }
        for (saga_id, wrong) in self.violations.iter().take(20) {
            let _ = writeln!(out, "saga {saga_id}: {}", wrong.join("; "));
        }
        for (count, what) in [
            (self.lost, "message(s) lost (in an outbox, never handled)"),
            (self.unpublished, "outbox row(s) never published"),
            (self.parked, "outbox row(s) parked"),
            (self.scheduled_left, "scheduled message(s) left"),
            (self.dead_lettered, "record(s) dead-lettered"),
        ] {
            if count > 0 {
                let _ = writeln!(out, "{count} {what}");
            }
        }
        for (count, what) in [
            (self.completed, "completed"),
            (self.declined, "declined"),
            (self.rejected, "rejected"),
            (self.timed_out, "timed out"),
            (
                self.tombstones,
                "released without a reservation (tombstone)",
            ),
        ] {
            if count == 0 {
                let _ = writeln!(out, "no saga {what}: the scenario did not exercise it");
            }
        }
        if self.redelivered == 0 {
            let _ = writeln!(
                out,
                "no message was redelivered: the kills did not exercise it"
            );
        }
        if self.finished_under_faults == 0 {
            let _ = writeln!(out, "no saga ended while the faults went on");
        }
        if self.saga_host_kills == 0 || self.participant_kills == 0 || self.outages == 0 {
            let _ = writeln!(out, "a fault was not injected");
        }
        out
    }

    /// Panics with every failed invariant.
    ///
    /// # Panics
    /// If any invariant failed.
    pub fn assert_sound(&self) {
        let failures = self.failures();
        assert!(failures.is_empty(), "{}: {failures}", self.scenario);
    }
}

/// What the checker reads from the topics.
#[derive(Debug, Default)]
pub struct Topics {
    /// Every record of the saga and participant topics.
    pub records: Vec<Record>,
    /// Records on the dead-letter topics.
    pub dead_lettered: usize,
}

/// Reads both databases and checks every saga.
pub async fn check(saga_db: &PgPool, participant_db: &PgPool, topics: &Topics) -> SagaFigures {
    let mut sagas: HashMap<Uuid, SagaRecord> = HashMap::new();
    let requests: Vec<(Uuid, i64, String)> =
        sqlx::query_as("SELECT saga_id, amount, behaviour FROM saga_request")
            .fetch_all(saga_db)
            .await
            .expect("read saga_request");
    for (saga_id, amount, behaviour) in requests {
        sagas.insert(
            saga_id,
            SagaRecord {
                saga_id,
                amount,
                behaviour,
                ..SagaRecord::default()
            },
        );
    }
    let states: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT saga_id, status, last_message_type FROM saga_state WHERE saga_type = $1",
    )
    .bind(SAGA_NAME)
    .fetch_all(saga_db)
    .await
    .expect("read saga_state");
    let mut figures = SagaFigures {
        sagas: sagas.len(),
        ..SagaFigures::default()
    };
    for (saga_id, status, last) in states {
        let id: Uuid = saga_id.parse().expect("saga ids are uuids");
        match sagas.get_mut(&id) {
            Some(saga) => {
                saga.status = Some(status);
                saga.last_message = last;
            }
            None => figures
                .violations
                .push((id, vec!["a saga nobody started".into()])),
        }
    }
    let reservations: Vec<(Uuid, String)> =
        sqlx::query_as("SELECT saga_id, status FROM reservation")
            .fetch_all(participant_db)
            .await
            .expect("read reservation");
    for (saga_id, status) in reservations {
        match sagas.get_mut(&saga_id) {
            Some(saga) => saga.reservation = Some(status),
            None => figures
                .violations
                .push((saga_id, vec!["a reservation of no saga".into()])),
        }
    }
    let effects: Vec<(Uuid, String, i64)> = sqlx::query_as(
        "SELECT saga_id, kind, count(*) FROM participant_effect GROUP BY saga_id, kind",
    )
    .fetch_all(participant_db)
    .await
    .expect("read participant_effect");
    for (saga_id, kind, count) in effects {
        if let Some(saga) = sagas.get_mut(&saga_id) {
            saga.effects.insert(kind, count as usize);
        }
    }

    let mut ordered: Vec<&SagaRecord> = sagas.values().collect();
    ordered.sort_by_key(|s| s.saga_id);
    for saga in ordered {
        let wrong = saga.violations();
        if !wrong.is_empty() {
            figures.violations.push((saga.saga_id, wrong));
        }
        figures.releases += saga.effect(effect::RELEASE);
        figures.tombstones += saga.effect(effect::TOMBSTONE);
        figures.refused_after_release += saga.effect(effect::RESERVE_REFUSED);
        match (saga.status.as_deref(), saga.last_message.as_deref()) {
            (Some("completed"), _) => figures.completed += 1,
            (Some("compensated"), last) => {
                figures.compensated += 1;
                match last {
                    Some("Declined") => figures.declined += 1,
                    Some("Rejected") => figures.rejected += 1,
                    Some("TimedOut") => {
                        figures.timed_out += 1;
                        if saga.behaviour == "normal" {
                            figures.timed_out_normal += 1;
                        }
                        if saga.effect(effect::RESERVE) > 0 {
                            figures.reserved_after_timeout += 1;
                        }
                    }
                    _ => {}
                }
            }
            _ => figures.open.push(saga.clone()),
        }
    }

    let (p50, p99, max): (Option<f64>, Option<f64>, Option<f64>) = sqlx::query_as(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms),
                percentile_cont(0.99) WITHIN GROUP (ORDER BY ms), max(ms)
         FROM (SELECT (extract(epoch FROM s.finished_at - r.begun_at) * 1000)::float8 AS ms
               FROM saga_request r
               JOIN saga_state s ON s.saga_type = $1 AND s.saga_id = r.saga_id::text
               WHERE s.status = 'completed') AS completed",
    )
    .bind(SAGA_NAME)
    .fetch_one(saga_db)
    .await
    .expect("read completion times");
    figures.completion_ms = (p50.unwrap_or(0.0), p99.unwrap_or(0.0), max.unwrap_or(0.0));
    figures.lost = lost(saga_db, participant_db).await;
    for pool in [saga_db, participant_db] {
        let (unpublished, parked): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE published_at IS NULL AND parked_at IS NULL),
                    count(*) FILTER (WHERE parked_at IS NOT NULL)
             FROM outbox_event",
        )
        .fetch_one(pool)
        .await
        .expect("read outbox_event");
        figures.unpublished += unpublished as usize;
        figures.parked += parked as usize;
    }
    figures.scheduled_left = scheduled_left(saga_db).await;
    for pool in [saga_db, participant_db] {
        let redelivered: Option<i64> =
            sqlx::query_scalar("SELECT sum(duplicates)::bigint FROM process_report")
                .fetch_one(pool)
                .await
                .expect("read process_report");
        figures.redelivered += redelivered.unwrap_or(0) as usize;
    }
    figures.records = topics.records.len();
    let mut copies: HashMap<Uuid, usize> = HashMap::new();
    for id in topics.records.iter().filter_map(Record::event_id) {
        *copies.entry(id).or_default() += 1;
    }
    figures.duplicates = copies.values().map(|n| n - 1).sum();
    figures.dead_lettered = topics.dead_lettered;
    figures
}

/// Scheduled messages not moved to the outbox nor cancelled.
pub async fn scheduled_left(saga_db: &PgPool) -> usize {
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_scheduled")
        .fetch_one(saga_db)
        .await
        .expect("read outbox_scheduled");
    left as usize
}

/// Messages written to either outbox that the consumer of their topic has
/// not handled (not in its `processed_event`): the saga service's to the
/// participant and to itself (`Begin`, timeouts), the participant's replies
/// to the saga service.
pub async fn lost(saga_db: &PgPool, participant_db: &PgPool) -> usize {
    use super::model::{PARTICIPANT_GROUP, PARTICIPANT_TOPIC, SAGA_GROUP, SAGA_TOPIC};
    let mut missing = 0;
    for (source, topic, target, group) in [
        (
            saga_db,
            PARTICIPANT_TOPIC,
            participant_db,
            PARTICIPANT_GROUP,
        ),
        (saga_db, SAGA_TOPIC, saga_db, SAGA_GROUP),
        (participant_db, SAGA_TOPIC, saga_db, SAGA_GROUP),
    ] {
        let sent: Vec<Uuid> =
            sqlx::query_scalar("SELECT event_id FROM outbox_event WHERE topic = $1")
                .bind(topic)
                .fetch_all(source)
                .await
                .expect("read outbox_event");
        let handled: HashSet<Uuid> = sqlx::query_scalar::<_, Uuid>(
            "SELECT event_id FROM processed_event WHERE consumer_group = $1",
        )
        .bind(group)
        .fetch_all(target)
        .await
        .expect("read processed_event")
        .into_iter()
        .collect();
        missing += sent.iter().filter(|id| !handled.contains(id)).count();
    }
    missing
}
