//! Topics the broker refuses as a whole: held, never counted against their
//! records.
//!
//! A topic that does not exist (and that the broker does not create), or
//! that this relay may not write to, refuses every record alike: that is the
//! topic's problem, which an operator fixes (create the topic, grant the
//! ACL), not the records'. Counting it as their failed attempts would park
//! the first row of every key of the topic, and let the key's next row
//! overtake it. So the first such refusal (in a delivery report, at send
//! time, or in the topic's metadata) **holds** the topic: its rows are left
//! out of claims (no attempt counted, nothing written to them), every other
//! topic keeps flowing, and the relay asks the broker for the topic's
//! metadata now and then (a probe, with the `error_backoff`). When
//! the metadata lists the topic without error, or a record of it is
//! delivered, the hold ends and the topic's rows are claimed again, in id
//! order, so every key stays in order.
//!
//! A topic the metadata lists fine but whose records are still refused (a
//! client allowed to describe the topic, not to write to it) is held again
//! at the next refusal, and its probes keep backing off until a delivery
//! proves it accepted.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::Serialize;
use txoutbox_core::Backoff;

use super::telemetry as metric;

/// One held topic.
#[derive(Debug)]
struct Held {
    reason: String,
    since: Instant,
    since_wall: DateTime<Utc>,
    /// Records of it refused since it was held (the first included).
    refusals: u64,
    /// Probes that found it still refused.
    failures: u32,
    next_probe: Instant,
    /// A metadata request for it is under way.
    probing: bool,
}

/// A held topic as `outbox status` shows it (the relay's membership row).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct HeldTopicRecord {
    pub topic: String,
    pub reason: String,
    pub since: DateTime<Utc>,
    pub refusals: u64,
}

/// The topics one relay holds.
#[derive(Debug)]
pub(crate) struct HeldTopics {
    held: HashMap<String, Held>,
    /// Topics released because their metadata looked fine, not yet proven by
    /// a delivery, with their failed probes: refused again, a topic goes on
    /// backing off where it was instead of probing from the start.
    unproven: HashMap<String, u32>,
    probe_backoff: Backoff,
    /// The held set changed since [`take_changed`](Self::take_changed).
    changed: bool,
}

impl HeldTopics {
    /// Probes back off with `probe_backoff`.
    pub(crate) fn new(probe_backoff: Backoff) -> Self {
        Self {
            held: HashMap::new(),
            unproven: HashMap::new(),
            probe_backoff,
            changed: false,
        }
    }

    pub(crate) fn is_held(&self, topic: &str) -> bool {
        self.held.contains_key(topic)
    }

    /// Whether deliveries must be reported (a topic is held or unproven).
    pub(crate) fn watching(&self) -> bool {
        !self.held.is_empty() || !self.unproven.is_empty()
    }

    /// The held topics, to leave out of claims.
    pub(crate) fn topics(&self) -> Vec<String> {
        self.held.keys().cloned().collect()
    }

    /// A record of `topic` was refused for its topic (`reason`): counted,
    /// and the topic held if it was not.
    pub(crate) fn refused(&mut self, topic: &str, reason: &str) {
        metrics::counter!(metric::TOPIC_REFUSALS, "topic" => topic.to_owned()).increment(1);
        match self.held.get_mut(topic) {
            Some(held) => held.refusals += 1,
            None => self.hold(topic, reason, 1),
        }
    }

    /// Holds `topic` (refused at send time: its remaining rows of the claim
    /// are not sent); the refusal itself is counted when its batch settles.
    pub(crate) fn hold_now(&mut self, topic: &str, reason: &str) {
        if !self.held.contains_key(topic) {
            self.hold(topic, reason, 0);
        }
    }

    fn hold(&mut self, topic: &str, reason: &str, refusals: u64) {
        let failures = self.unproven.remove(topic).unwrap_or(0);
        tracing::warn!(
            %topic,
            %reason,
            "outbox relay: the broker refuses this topic as a whole; its events wait in the \
             outbox (no attempt counted, nothing parked) until it accepts them, other topics \
             keep flowing (create the topic or grant the relay's producer access)"
        );
        let now = Instant::now();
        self.held.insert(
            topic.to_owned(),
            Held {
                reason: reason.to_owned(),
                since: now,
                since_wall: Utc::now(),
                refusals,
                failures,
                next_probe: now + self.backoff(failures),
                probing: false,
            },
        );
        self.count_changed();
    }

    /// The wait before the next probe of a topic whose probes failed
    /// `failures` times: probe number `failures + 1`.
    fn backoff(&self, failures: u32) -> Duration {
        self.probe_backoff.delay(failures.saturating_add(1))
    }

    /// Held topics due a probe, now marked as probing: ask the broker for
    /// their metadata and report the answer to [`metadata`](Self::metadata).
    pub(crate) fn due_probes(&mut self) -> Vec<String> {
        let now = Instant::now();
        let mut due = Vec::new();
        for (topic, held) in &mut self.held {
            if !held.probing && now >= held.next_probe {
                held.probing = true;
                due.push(topic.clone());
            }
        }
        due
    }

    /// What the broker's metadata says of `topic`: `Some(reason)` refused,
    /// `None` listed without error. A refusal holds a topic that was not
    /// held (before any of its records is refused) and backs off the next
    /// probe of a held one; a clean listing ends the hold.
    pub(crate) fn metadata(&mut self, topic: &str, refused: Option<&str>) {
        match (refused, self.held.contains_key(topic)) {
            (Some(reason), false) => self.hold(topic, reason, 0),
            (Some(reason), true) => {
                let failures = {
                    let held = self.held.get_mut(topic).expect("checked");
                    held.failures += 1;
                    held.probing = false;
                    if held.reason != reason {
                        held.reason = reason.to_owned();
                        self.changed = true;
                    }
                    held.failures
                };
                let next = Instant::now() + self.backoff(failures);
                self.held.get_mut(topic).expect("checked").next_probe = next;
            }
            (None, true) => {
                let held = self.held.remove(topic).expect("checked");
                self.unproven.insert(topic.to_owned(), held.failures + 1);
                self.release(topic, held, "the broker lists it again");
            }
            (None, false) => {}
        }
    }

    /// A probe got no answer (the request failed): tried again after the
    /// backoff, the hold unchanged.
    pub(crate) fn probe_failed(&mut self, topic: &str) {
        let failures = match self.held.get_mut(topic) {
            Some(held) => {
                held.probing = false;
                held.failures
            }
            None => return,
        };
        let next = Instant::now() + self.backoff(failures);
        if let Some(held) = self.held.get_mut(topic) {
            held.next_probe = next;
        }
    }

    /// A record of `topic` was delivered: the topic is accepted.
    pub(crate) fn delivered(&mut self, topic: &str) {
        self.unproven.remove(topic);
        if let Some(held) = self.held.remove(topic) {
            self.release(topic, held, "a record of it was delivered");
        }
    }

    fn release(&mut self, topic: &str, held: Held, why: &str) {
        tracing::info!(
            %topic,
            held_for_s = held.since.elapsed().as_secs_f64(),
            refusals = held.refusals,
            failed_probes = held.failures,
            "outbox relay: the broker accepts this topic again ({why}); its events flow"
        );
        self.count_changed();
    }

    fn count_changed(&mut self) {
        metrics::gauge!(metric::HELD_TOPICS).set(self.held.len() as f64);
        self.changed = true;
    }

    /// The held topics, if the set (or a reason) changed since the last
    /// call: for the membership row that `outbox status` reads.
    pub(crate) fn take_changed(&mut self) -> Option<Vec<HeldTopicRecord>> {
        if !std::mem::take(&mut self.changed) {
            return None;
        }
        let mut records: Vec<HeldTopicRecord> = self
            .held
            .iter()
            .map(|(topic, held)| HeldTopicRecord {
                topic: topic.clone(),
                reason: held.reason.clone(),
                since: held.since_wall,
                refusals: held.refusals,
            })
            .collect();
        records.sort_by(|a, b| a.topic.cmp(&b.topic));
        Some(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topics() -> HeldTopics {
        HeldTopics::new(Backoff::new(Duration::ZERO, Duration::ZERO))
    }

    #[test]
    fn a_refusal_holds_the_topic_until_its_metadata_or_a_delivery_clears_it() {
        let mut held = topics();
        held.refused("orders", "Broker: Unknown topic or partition");
        assert!(held.is_held("orders"));
        assert_eq!(held.topics(), vec!["orders".to_owned()]);
        let records = held.take_changed().expect("changed");
        assert_eq!(records[0].topic, "orders");
        assert_eq!(records[0].refusals, 1);
        assert!(held.take_changed().is_none(), "reported once");

        held.refused("orders", "again");
        assert_eq!(held.due_probes(), vec!["orders".to_owned()]);
        assert!(held.due_probes().is_empty(), "one probe at a time");
        held.metadata("orders", Some("Broker: Unknown topic or partition"));
        assert!(held.is_held("orders"), "still refused");
        assert_eq!(held.due_probes().len(), 1);
        held.metadata("orders", None);
        assert!(!held.is_held("orders"));
        assert!(held.watching(), "unproven until a delivery");
        assert!(held.take_changed().unwrap().is_empty());

        // Refused again right after (write not allowed, describe allowed):
        // the backoff goes on where it was.
        held.refused("orders", "Broker: Topic authorization failed");
        assert_eq!(held.held["orders"].failures, 2);
        held.delivered("orders");
        assert!(!held.is_held("orders"));
        assert!(!held.watching());
    }

    #[test]
    fn a_send_time_refusal_holds_without_counting_and_a_failed_probe_keeps_the_hold() {
        let mut held = topics();
        held.hold_now("payments", "Local: Unknown topic");
        assert_eq!(held.held["payments"].refusals, 0);
        held.refused("payments", "Local: Unknown topic");
        assert_eq!(held.held["payments"].refusals, 1);
        assert_eq!(held.due_probes().len(), 1);
        held.probe_failed("payments");
        assert!(held.is_held("payments"));
        assert_eq!(held.due_probes().len(), 1, "probed again after the backoff");
        held.metadata("elsewhere", None);
        assert!(held.is_held("payments"));
    }
}
