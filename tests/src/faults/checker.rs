//! The checker: what the databases and the topics say happened.
//!
//! Truth is the source database: a command committed iff its `ledger` row
//! exists. From there it counts, per event id, how often it is on the topic and
//! how often each consumer group applied it, and checks per-key sequence order
//! on the topic and in each group's effects.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::db::{OutboxRow, ReceiverDb, SourceDb};
use super::poison::POISON_HEADER;
use super::topic::Record;

/// What the scenario set up, that the checker needs to know.
#[derive(Debug, Clone, Default)]
pub struct Expect {
    /// Consumer groups and whether each runs in inbox mode.
    pub groups: Vec<(String, bool)>,
    /// Poison messages produced to the topic, tagged `0..n` in [`POISON_HEADER`].
    pub poison_inbound: usize,
    /// Poison outbox rows inserted (keys starting with `poison-`).
    pub poison_outbox: usize,
    /// Broker restart scenario: the instant the broker came back empty; it
    /// lost every record acknowledged before, so only rows marked published
    /// after it must be on the topic, and per-key order there starts at any
    /// sequence number.
    pub broker_lost_before: Option<DateTime<Utc>>,
}

/// The figures of one consumer group.
#[derive(Debug, Clone, Default)]
pub struct GroupFigures {
    /// Group id.
    pub group: String,
    /// Inbox mode (else dedup).
    pub inbox: bool,
    /// Distinct events applied.
    pub applied: usize,
    /// Events applied more than once (must be 0).
    pub applied_twice: usize,
    /// Required events never applied (must be 0).
    pub missing: usize,
    /// Effects of events that were never committed (must be 0).
    pub phantoms: usize,
    /// Per-key order violations among first applications (must be 0).
    pub order_violations: usize,
    /// Events the broker lost in a restart before this group read them
    /// (memory storage; not the framework's doing).
    pub lost_by_broker: usize,
    /// Poison messages dead-lettered (or, inbox mode, parked) by this group.
    pub poison_set_aside: usize,
    /// Workload events this group dead-lettered (must be 0).
    pub dead_lettered_events: usize,
}

/// The figures of a scenario.
#[derive(Debug, Clone, Default)]
pub struct Figures {
    /// Scenario name.
    pub scenario: String,
    /// Commands committed (ledger rows) = events written.
    pub written: usize,
    /// Commands that recorded an event and rolled back on purpose.
    pub rolled_back: usize,
    /// Ledger rows without their outbox row, or outbox rows without their
    /// ledger row (a torn transaction; must be 0).
    pub torn: usize,
    /// Workload records on the topic (poison excluded).
    pub topic_records: usize,
    /// Distinct committed events on the topic.
    pub delivered: usize,
    /// Records on the topic beyond the first of their event id.
    pub duplicates: usize,
    /// Required committed events not on the topic (must be 0).
    pub lost: usize,
    /// Events on the topic that were never committed (must be 0).
    pub phantoms: usize,
    /// Per-key order violations on the topic (must be 0).
    pub order_violations: usize,
    /// Committed rows still unpublished and not parked at the end (must be 0).
    pub unpublished: usize,
    /// Outbox rows parked (the poison rows, and nothing else).
    pub parked: usize,
    /// Parked rows that are not poison rows (must be 0).
    pub parked_healthy: usize,
    /// Poison outbox rows that reached the topic (must be 0).
    pub poison_published: usize,
    /// Per consumer group.
    pub groups: Vec<GroupFigures>,
    /// Faults injected (kills, restarts).
    pub faults: u32,
    /// Faults that can make the relay publish a batch again (relay kills,
    /// broker and PostgreSQL restarts).
    pub crashes: u32,
    /// Whether everything was published and applied within the settle timeout.
    pub converged: bool,
    /// Offset gaps the consumers saw while reading (their `offset gap` log
    /// lines): on these topics, written only by idempotent producers, a gap
    /// means the broker served a later record before an earlier one.
    pub consumer_offset_gaps: usize,
    /// Gaps whose records a re-read found (`refetch_offset_gaps`): records the
    /// broker served late, which a consumer would otherwise have skipped.
    pub consumer_gaps_recovered: usize,
    /// Partition assignments the consumers logged (each start counts one).
    pub consumer_rebalances: usize,
    /// From the end of the last fault (and of the load) until everything was
    /// published and applied.
    pub recovery: Duration,
    /// Times a consumer process had to be started again because it died.
    pub consumer_restarts: u32,
    /// Consumer kill scenario: consumers the crash hook killed (right after
    /// their effects committed, before any offset commit).
    pub consumer_crash_hook_kills: usize,
    /// Handler panics the consumers caught (their panic messages in the logs).
    pub handler_panics: usize,
    /// Misbehaving-handler scenario: database errors the handlers swallowed.
    pub swallowed_errors: usize,
    /// Misbehaving-handler scenario: calls that would never have returned.
    pub hung_calls: usize,
    /// Blocked-key scenario: the longest commit-to-apply wait of an event of
    /// a healthy key committed while the key was blocked.
    pub healthy_wait_max: Option<Duration>,
    /// The consumer-side liveness figures of the scenario, one line each.
    pub notes: Vec<String>,
    /// Liveness figures of a freeze scenario, in seconds from the freeze
    /// (see [`super::freeze`]).
    pub liveness: Vec<(String, f64)>,
    /// A partial broker outage's figures (scenario `partial_broker_outage`).
    pub outage: Option<OutageFigures>,
}

/// What the relays published while one broker of several was down.
#[derive(Debug, Clone, Default)]
pub struct OutageFigures {
    /// The broker taken down.
    pub broker: i32,
    /// The partitions it leads.
    pub partitions: Vec<i32>,
    /// How long it was down.
    pub down_for: Duration,
    /// Events of the other partitions published while it was down.
    pub healthy_published: usize,
    /// Their rate while it was down, events per second.
    pub healthy_rate: f64,
    /// Their rate in the same time before it went down.
    pub healthy_rate_before: f64,
    /// Median commit-to-publish latency of the other partitions' events
    /// written while it was down, and before, in milliseconds.
    pub healthy_latency_ms: (f64, f64),
    /// Events of its partitions published while it was down, from its first
    /// second on (must be 0: nothing can reach them).
    pub down_published: usize,
}

impl Figures {
    /// The liveness figure whose name starts with `name`.
    pub fn liveness(&self, name: &str) -> Option<f64> {
        self.liveness
            .iter()
            .find(|(figure, _)| figure.starts_with(name))
            .map(|(_, seconds)| *seconds)
    }
}

impl fmt::Display for Figures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "[faults] {}: written={} rolled_back={} torn={} faults={} (relay-side {}) converged={} recovery={:.2}s",
            self.scenario,
            self.written,
            self.rolled_back,
            self.torn,
            self.faults,
            self.crashes,
            self.converged,
            self.recovery.as_secs_f64()
        )?;
        writeln!(
            f,
            "[faults] {}: consumer offset gaps seen={} recovered by a re-read={} partition assignments={}",
            self.scenario,
            self.consumer_offset_gaps,
            self.consumer_gaps_recovered,
            self.consumer_rebalances
        )?;
        writeln!(
            f,
            "[faults] {}: topic records={} delivered={} duplicates={} lost={} phantoms={} \
             order_violations={} unpublished={} parked={} (healthy {}) poison_published={}",
            self.scenario,
            self.topic_records,
            self.delivered,
            self.duplicates,
            self.lost,
            self.phantoms,
            self.order_violations,
            self.unpublished,
            self.parked,
            self.parked_healthy,
            self.poison_published
        )?;
        if let Some(o) = &self.outage {
            writeln!(
                f,
                "[faults] {}: broker {} down {:.1} s (partitions {:?}): the other partitions' events \
                 published meanwhile={} ({:.0}/s; {:.0}/s in the same time before), median latency \
                 {:.0} ms ({:.0} ms before); its partitions' events published meanwhile={}",
                self.scenario,
                o.broker,
                o.down_for.as_secs_f64(),
                o.partitions,
                o.healthy_published,
                o.healthy_rate,
                o.healthy_rate_before,
                o.healthy_latency_ms.0,
                o.healthy_latency_ms.1,
                o.down_published
            )?;
        }
        for (figure, seconds) in &self.liveness {
            writeln!(
                f,
                "[faults] {}: liveness: {figure}: {seconds:.2} s",
                self.scenario
            )?;
        }
        for g in &self.groups {
            writeln!(
                f,
                "[faults] {}: group {} ({}): applied={} applied_twice={} missing={} phantoms={} \
                 order_violations={} lost_by_broker={} poison_set_aside={} \
                 dead_lettered_events={}",
                self.scenario,
                g.group,
                if g.inbox { "inbox" } else { "dedup" },
                g.applied,
                g.applied_twice,
                g.missing,
                g.phantoms,
                g.order_violations,
                g.lost_by_broker,
                g.poison_set_aside,
                g.dead_lettered_events
            )?;
        }
        for line in &self.notes {
            writeln!(f, "[faults] {}: {line}", self.scenario)?;
        }
        Ok(())
    }
}

/// Counts order violations in a sequence of (key, seq) first occurrences:
/// per key, each seq must be the previous one plus one (starting at 1, or
/// anywhere if `any_start`).
fn order_violations<'a>(firsts: impl Iterator<Item = (&'a str, i64)>, any_start: bool) -> usize {
    let mut last: HashMap<&str, i64> = HashMap::new();
    let mut violations = 0;
    for (key, seq) in firsts {
        let expected = match last.get(key) {
            Some(previous) => Some(previous + 1),
            None if any_start => None,
            None => Some(1),
        };
        if expected.is_some_and(|e| e != seq) {
            violations += 1;
        }
        last.insert(key, seq);
    }
    violations
}

/// Computes the figures from both databases and the topic records.
pub async fn check(
    source: &SourceDb,
    receiver: &ReceiverDb,
    topic: &[Record],
    dlq: &[Record],
    expect: &Expect,
) -> Figures {
    let ledger = source.ledger().await.expect("read ledger");
    let outbox = source.outbox().await.expect("read outbox");
    let rolled_back = source.rolled_back().await.expect("read rollbacks");
    let committed: HashMap<Uuid, (&str, i64)> = ledger
        .iter()
        .map(|(id, key, seq)| (*id, (key.as_str(), *seq)))
        .collect();
    let poison_row = |r: &OutboxRow| r.partition_key.starts_with("poison-");
    let outbox_ids: HashSet<Uuid> = outbox
        .iter()
        .filter(|r| !poison_row(r))
        .map(|r| r.event_id)
        .collect();
    let mut figures = Figures {
        written: ledger.len(),
        rolled_back: rolled_back.len(),
        ..Figures::default()
    };
    figures.torn = committed
        .keys()
        .filter(|id| !outbox_ids.contains(id))
        .count()
        + outbox_ids
            .iter()
            .filter(|id| !committed.contains_key(id))
            .count();
    figures.unpublished = outbox
        .iter()
        .filter(|r| r.published_at.is_none() && r.parked_at.is_none())
        .count();
    figures.parked = outbox.iter().filter(|r| r.parked_at.is_some()).count();
    figures.parked_healthy = outbox
        .iter()
        .filter(|r| r.parked_at.is_some() && !poison_row(r))
        .count();
    let poison_ids: HashSet<Uuid> = outbox
        .iter()
        .filter(|r| poison_row(r))
        .map(|r| r.event_id)
        .collect();

    // The topic.
    let mut seen: HashMap<Uuid, usize> = HashMap::new();
    let mut firsts: Vec<(&str, i64)> = Vec::new();
    for record in topic.iter().filter(|r| r.header(POISON_HEADER).is_none()) {
        figures.topic_records += 1;
        let Some(id) = record.event_id() else {
            figures.phantoms += 1;
            continue;
        };
        if poison_ids.contains(&id) {
            figures.poison_published += 1;
            continue;
        }
        let count = seen.entry(id).or_default();
        *count += 1;
        if *count > 1 {
            figures.duplicates += 1;
            continue;
        }
        match committed.get(&id) {
            Some(&(key, seq)) => firsts.push((key, seq)),
            None => figures.phantoms += 1,
        }
    }
    figures.delivered = firsts.len();
    figures.order_violations =
        order_violations(firsts.iter().copied(), expect.broker_lost_before.is_some());
    // Rows whose publishing could only have reached the broker that is
    // still up (marked published after it came back).
    let required: HashSet<Uuid> = match expect.broker_lost_before {
        None => committed.keys().copied().collect(),
        Some(instant) => outbox
            .iter()
            .filter(|r| !poison_row(r) && r.published_at.is_some_and(|p| p >= instant))
            .map(|r| r.event_id)
            .collect(),
    };
    figures.lost = required.iter().filter(|id| !seen.contains_key(id)).count();
    if std::env::var_os("FAULTS_DEBUG").is_some() {
        let mut offsets: HashMap<(i32, i64), usize> = HashMap::new();
        for r in topic {
            *offsets.entry((r.partition, r.offset)).or_default() += 1;
        }
        let shared = offsets.values().filter(|&&n| n > 1).count();
        eprintln!(
            "[faults-debug] records={} shared offsets={shared}",
            topic.len()
        );
        let mut copies: HashMap<Uuid, Vec<(i32, i64)>> = HashMap::new();
        for r in topic {
            if let Some(id) = r.event_id() {
                copies.entry(id).or_default().push((r.partition, r.offset));
            }
        }
        for (id, at) in copies.iter().filter(|(_, at)| at.len() > 1) {
            eprintln!(
                "[faults-debug] duplicate {id} {:?} at {at:?}",
                committed.get(id)
            );
        }
        for id in required.iter().filter(|id| !seen.contains_key(id)) {
            let published = outbox
                .iter()
                .find(|r| r.event_id == *id)
                .map(|r| r.published_at);
            eprintln!(
                "[faults-debug] lost {id} {:?} published_at={published:?}",
                committed.get(id)
            );
        }
    }

    // The receivers.
    for (group, inbox) in &expect.groups {
        let effects = receiver.effects(group).await.expect("read effects");
        let mut g = GroupFigures {
            group: group.clone(),
            inbox: *inbox,
            ..GroupFigures::default()
        };
        let mut applied: HashMap<Uuid, usize> = HashMap::new();
        let mut firsts = Vec::new();
        for (id, key, seq) in &effects {
            let count = applied.entry(*id).or_default();
            *count += 1;
            if *count == 2 {
                g.applied_twice += 1;
            }
            if *count == 1 {
                if committed.contains_key(id) {
                    firsts.push((key.as_str(), *seq));
                } else {
                    g.phantoms += 1;
                }
            }
        }
        g.applied = applied.len();
        let must_apply: HashSet<Uuid> = match expect.broker_lost_before {
            None => committed.keys().copied().collect(),
            Some(_) => seen
                .keys()
                .filter(|id| committed.contains_key(id))
                .copied()
                .collect(),
        };
        g.missing = must_apply
            .iter()
            .filter(|id| !applied.contains_key(id))
            .count();
        if std::env::var_os("FAULTS_DEBUG").is_some() {
            for id in must_apply.iter().filter(|id| !applied.contains_key(id)) {
                let at: Vec<(i32, i64)> = topic
                    .iter()
                    .filter(|r| r.event_id() == Some(*id))
                    .map(|r| (r.partition, r.offset))
                    .collect();
                eprintln!(
                    "[faults-debug] {group}: never applied {id} {:?} on the topic at {at:?}",
                    committed.get(id)
                );
            }
        }
        g.lost_by_broker = committed
            .keys()
            .filter(|id| !must_apply.contains(id) && !applied.contains_key(id))
            .count();
        // After a broker restart some events may never reach a group: order
        // is then checked as strictly increasing, not gapless.
        g.order_violations = match expect.broker_lost_before {
            None => order_violations(firsts.iter().copied(), false),
            Some(_) => {
                let mut last: HashMap<&str, i64> = HashMap::new();
                firsts
                    .iter()
                    .filter(|(key, seq)| {
                        let previous = last.insert(key, *seq);
                        previous.is_some_and(|p| p >= *seq)
                    })
                    .count()
            }
        };
        g.dead_lettered_events = dlq
            .iter()
            .filter(|r| r.header("dlq_consumer_group") == Some(group.as_str()))
            .filter(|r| r.header(POISON_HEADER).is_none())
            .count();
        let mut set_aside: HashSet<String> = dlq
            .iter()
            .filter(|r| r.header("dlq_consumer_group") == Some(group.as_str()))
            .filter_map(|r| r.header(POISON_HEADER).map(str::to_owned))
            .collect();
        if *inbox {
            let parked = receiver
                .parked_poison(POISON_HEADER)
                .await
                .expect("read parked inbox rows");
            set_aside.extend(parked);
        }
        g.poison_set_aside = set_aside.len();
        figures.groups.push(g);
    }
    figures
}

impl Figures {
    /// Asserts every invariant; `batch` is the relay batch size: topic
    /// duplicates must not exceed `batch x crashes`.
    ///
    /// # Panics
    /// On the first broken invariant, with all figures in the message.
    pub fn assert_sound(&self, expect: &Expect, batch: usize) {
        let crash_bound = batch * self.crashes as usize;
        let fail = |what: &str| panic!("{what}\n{self}");
        if !self.converged {
            fail("did not converge: something is stuck (see the logs)");
        }
        if self.written == 0 {
            fail("no command committed: the scenario proved nothing");
        }
        if self.torn != 0 {
            fail("torn transactions: ledger and outbox disagree");
        }
        if self.lost != 0 || self.unpublished != 0 {
            fail("events lost");
        }
        if self.phantoms != 0 {
            fail("phantom events on the topic");
        }
        if self.order_violations != 0 {
            fail("per-key order violated on the topic");
        }
        if self.duplicates > crash_bound {
            fail("more duplicates on the topic than batch size x crashes explain");
        }
        if self.parked != expect.poison_outbox || self.parked_healthy != 0 {
            fail("parked rows are not exactly the poison rows");
        }
        if self.poison_published != 0 {
            fail("a poison outbox row reached the topic");
        }
        for g in &self.groups {
            if g.applied_twice != 0
                || g.missing != 0
                || g.phantoms != 0
                || g.dead_lettered_events != 0
            {
                fail("an effect is missing, doubled or phantom");
            }
            if g.order_violations != 0 {
                fail("per-key order violated in a consumer's effects");
            }
            if g.poison_set_aside != expect.poison_inbound {
                fail("a poison message was neither dead-lettered nor parked");
            }
        }
    }
}
