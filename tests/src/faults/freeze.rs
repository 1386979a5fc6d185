//! Freeze scenarios: the connections of one process stop passing data
//! without closing (through a [`Proxy`]), and the rest of the system must
//! take over its work within a bound.
//!
//! * [`FreezeTarget::RelayDatabase`]: relay 0 reaches PostgreSQL through a
//!   proxy of its own, which freezes every one of its connections. PostgreSQL
//!   keeps its session and lane locks; the other relay must end that session
//!   when its lease expires and publish its keys.
//! * [`FreezeTarget::RelayBroker`]: the broker is behind a proxy (its
//!   advertised address, so every client goes through it) that freezes relay
//!   0's connections. Its batch in flight fails by the delivery timeout; it
//!   must hand its lanes to the relay that can publish, and take lanes again
//!   after the thaw.
//! * [`FreezeTarget::ConsumersBroker`]: the same proxy freezes the first
//!   consumer of each group. The broker must evict it after
//!   `session.timeout.ms` and give its partitions to the group's other
//!   consumer.
//!
//! The figures (seconds, measured from the freeze): when the frozen relay's
//! lanes were all held by others, when every key flowed again (for each key,
//! its first event written after the freeze was published, or applied by a
//! group), and when a relay frozen from the broker was back after the thaw.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::proxy::Proxy;

/// Whose connections freeze.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreezeTarget {
    /// Relay 0's connections to PostgreSQL.
    RelayDatabase,
    /// Relay 0's connections to the broker.
    RelayBroker,
    /// The first consumer of each group: its connections to the broker.
    ConsumersBroker,
}

/// Lanes locked per backend of the source database: (lane, backend pid).
async fn lane_owners(source: &PgPool) -> Vec<(i32, i32)> {
    sqlx::query_as(
        "SELECT objid::int, pid FROM pg_locks
         WHERE locktype = 'advisory' AND granted AND objsubid = 2
           AND classid = 1868724332::oid
           AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .fetch_all(source)
    .await
    .unwrap_or_default()
}

/// One freeze in progress or done, and what was measured.
#[derive(Debug)]
pub struct Freeze {
    target: FreezeTarget,
    at: Instant,
    at_db: DateTime<Utc>,
    /// Source-database backends of the frozen relay (relay targets).
    backends: HashSet<i32>,
    /// The lanes they held when the freeze began.
    lanes: Vec<i32>,
    /// The frozen relay's process (relay broker target).
    relay_pid: Option<u32>,
    thawed: Option<Instant>,
    handed_over: Option<Duration>,
    back_after_thaw: Option<Duration>,
}

impl Freeze {
    /// Freezes `target`: `db_proxy` carries relay 0's database connections,
    /// `broker_proxy` every broker connection; `pids` are the processes to
    /// freeze at the broker (relay 0, or the first consumer of each group).
    pub async fn begin(
        target: FreezeTarget,
        source: &PgPool,
        db_proxy: Option<&Proxy>,
        broker_proxy: Option<&Proxy>,
        pids: &[u32],
    ) -> Self {
        let at_db: DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
            .fetch_one(source)
            .await
            .expect("database clock");
        let backends: HashSet<i32> = match target {
            FreezeTarget::RelayDatabase => {
                let ports: Vec<i32> = db_proxy
                    .expect("relay 0 behind a database proxy")
                    .upstream_ports(false)
                    .into_iter()
                    .map(i32::from)
                    .collect();
                sqlx::query_scalar(
                    "SELECT pid FROM pg_stat_activity
                     WHERE datname = current_database() AND client_port = ANY($1)",
                )
                .bind(&ports)
                .fetch_all(source)
                .await
                .unwrap_or_default()
                .into_iter()
                .collect()
            }
            FreezeTarget::RelayBroker => sqlx::query_scalar(
                "SELECT backend_pid FROM outbox_relay_member WHERE process_id = ANY($1)",
            )
            .bind(pids.iter().map(|&p| i64::from(p)).collect::<Vec<_>>())
            .fetch_all(source)
            .await
            .unwrap_or_default()
            .into_iter()
            .collect(),
            FreezeTarget::ConsumersBroker => HashSet::new(),
        };
        let lanes = lane_owners(source)
            .await
            .into_iter()
            .filter(|(_, pid)| backends.contains(pid))
            .map(|(lane, _)| lane)
            .collect();
        let at = Instant::now();
        match target {
            FreezeTarget::RelayDatabase => db_proxy.expect("database proxy").freeze_all(),
            FreezeTarget::RelayBroker | FreezeTarget::ConsumersBroker => {
                let proxy = broker_proxy.expect("broker behind a proxy");
                for &pid in pids {
                    let frozen = proxy.freeze_process(pid);
                    println!("[faults] freeze: process {pid}: {frozen} broker connections frozen");
                }
            }
        }
        let freeze = Self {
            target,
            at,
            at_db,
            backends,
            lanes,
            relay_pid: (target == FreezeTarget::RelayBroker)
                .then(|| pids.first().copied())
                .flatten(),
            thawed: None,
            handed_over: None,
            back_after_thaw: None,
        };
        println!(
            "[faults] freeze {:?} at {}: backends {:?} held lanes {:?}",
            freeze.target, freeze.at_db, freeze.backends, freeze.lanes
        );
        freeze
    }

    /// Thaws everything frozen.
    pub fn thaw(&mut self, db_proxy: Option<&Proxy>, broker_proxy: Option<&Proxy>) {
        for proxy in [db_proxy, broker_proxy].into_iter().flatten() {
            proxy.thaw();
        }
        self.thawed = Some(Instant::now());
        println!("[faults] thawed at {}", Utc::now());
    }

    /// Whether the freeze has been thawed.
    pub fn thawed(&self) -> bool {
        self.thawed.is_some()
    }

    /// Measures what can only be seen while it happens: when the frozen
    /// relay's lanes were all held by others, and when a relay frozen from
    /// the broker held lanes again (reaching the broker) after the thaw.
    pub async fn observe(&mut self, source: &PgPool) {
        if self.target == FreezeTarget::ConsumersBroker {
            return;
        }
        let owners = lane_owners(source).await;
        if self.handed_over.is_none() && !self.lanes.is_empty() {
            let taken = self.lanes.iter().all(|lane| {
                owners
                    .iter()
                    .any(|(l, pid)| l == lane && !self.backends.contains(pid))
            });
            if taken {
                self.handed_over = Some(self.at.elapsed());
            }
        }
        if let (Some(thawed), None, Some(pid)) = (self.thawed, self.back_after_thaw, self.relay_pid)
        {
            let back: Option<i32> = sqlx::query_scalar(
                "SELECT backend_pid FROM outbox_relay_member
                 WHERE process_id = $1 AND broker_failing_since IS NULL",
            )
            .bind(i64::from(pid))
            .fetch_optional(source)
            .await
            .ok()
            .flatten();
            if back.is_some_and(|backend| owners.iter().any(|(_, p)| *p == backend)) {
                self.back_after_thaw = Some(thawed.elapsed());
            }
        }
    }

    /// The figures, in seconds: measured while it ran, and from the
    /// databases (every key flowing again, per consumer group for consumer
    /// freezes).
    pub async fn figures(
        &self,
        source: &PgPool,
        receiver: &PgPool,
        groups: &[(String, bool)],
    ) -> Vec<(String, f64)> {
        let mut figures = Vec::new();
        if let Some(handed_over) = self.handed_over {
            figures.push((
                format!(
                    "the frozen relay's {} lanes held by others, after the freeze",
                    self.lanes.len()
                ),
                handed_over.as_secs_f64(),
            ));
        }
        match self.target {
            FreezeTarget::RelayDatabase | FreezeTarget::RelayBroker => {
                let again: Option<f64> = sqlx::query_scalar(
                    "SELECT max(first)::float8 FROM (
                         SELECT EXTRACT(EPOCH FROM min(published_at) - $1) AS first
                         FROM outbox_event
                         WHERE created_at > $1 AND partition_key NOT LIKE 'poison-%'
                         GROUP BY partition_key) k",
                )
                .bind(self.at_db)
                .fetch_one(source)
                .await
                .ok()
                .flatten();
                figures.push((
                    "every key published again, after the freeze".into(),
                    again.unwrap_or(f64::NAN),
                ));
            }
            FreezeTarget::ConsumersBroker => {
                // Events written after the freeze, per key: the first one's
                // effect in each group.
                let written: Vec<(uuid::Uuid, String)> =
                    sqlx::query_as("SELECT event_id, key FROM ledger WHERE committed_at > $1")
                        .bind(self.at_db)
                        .fetch_all(source)
                        .await
                        .unwrap_or_default();
                let ids: Vec<uuid::Uuid> = written.iter().map(|(id, _)| *id).collect();
                let keys: Vec<&str> = written.iter().map(|(_, key)| key.as_str()).collect();
                for (group, _) in groups {
                    let again: Option<f64> = sqlx::query_scalar(
                        "SELECT max(first)::float8 FROM (
                             SELECT EXTRACT(EPOCH FROM min(e.applied_at) - $1) AS first
                             FROM effect e
                             JOIN unnest($3::uuid[], $4::text[]) AS w(id, key) ON w.id = e.event_id
                             WHERE e.consumer_group = $2
                             GROUP BY w.key) k",
                    )
                    .bind(self.at_db)
                    .bind(group)
                    .bind(&ids)
                    .bind(&keys)
                    .fetch_one(receiver)
                    .await
                    .ok()
                    .flatten();
                    figures.push((
                        format!("every key applied again by group {group}, after the freeze"),
                        again.unwrap_or(f64::NAN),
                    ));
                }
            }
        }
        if let Some(back) = self.back_after_thaw {
            figures.push((
                "the frozen relay holding lanes again, after the thaw".into(),
                back.as_secs_f64(),
            ));
        }
        figures
    }
}
