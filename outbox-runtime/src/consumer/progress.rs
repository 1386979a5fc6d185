//! What the receive loop knows of each partition beyond librdkafka's
//! position: which received offsets are not finished yet, the event that
//! backs off between its attempts (dedup mode) with the messages waiting
//! behind it, and the dead letters being published.
//!
//! An offset may be stored once every message before it is finished. A
//! message is finished when it was handled, found to be a duplicate, stored
//! in the inbox, skipped by policy, or dead-lettered (published or parked).
//! Everything unfinished keeps its partition's stored offset below it, so a
//! crash or a rebalance only ever redelivers.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::Instant;

use rdkafka::Message;
use rdkafka::message::OwnedMessage;

use super::work::Retry;
use crate::wire::dead_letter::DeadLetterReason;

/// A topic and partition.
pub(crate) type PartitionId = (String, i32);

/// What one batch step decided, by index into the batch. A message in none
/// of the lists was not reached: it waits behind a retried event of its
/// partition, or the step was interrupted by shutdown.
#[derive(Default)]
pub(crate) struct Taken {
    /// Finished.
    pub(crate) done: Vec<usize>,
    /// To be dead-lettered, with the reason and the error.
    pub(crate) dead: Vec<(usize, DeadLetterReason, String)>,
    /// Dedup mode: the first failing event of a partition, to retry later;
    /// the partition's later messages wait behind it.
    pub(crate) retry: Vec<(usize, Retry)>,
    /// The consumer is shutting down; what is not finished stays so.
    pub(crate) interrupted: bool,
}

impl Taken {
    pub(crate) fn interrupted() -> Self {
        Self {
            interrupted: true,
            ..Self::default()
        }
    }
}

/// A dead letter waiting for its turn in its partition's queue.
pub(crate) struct DeadLetter {
    pub(crate) message: OwnedMessage,
    pub(crate) reason: DeadLetterReason,
    pub(crate) error: String,
}

/// A partition whose next event backs off between its handler attempts.
pub(crate) struct Blocked {
    /// The event's message (for its dead-letter copy).
    pub(crate) head: OwnedMessage,
    /// The event; `None` while an attempt of it runs.
    pub(crate) retry: Option<Retry>,
    /// When the next attempt is due.
    pub(crate) due: Instant,
    /// The partition's later messages, in offset order.
    pub(crate) behind: Vec<OwnedMessage>,
}

#[derive(Default)]
struct State {
    /// Tells this partition's state apart from an earlier one's (dropped at
    /// a rebalance): side tasks report with the epoch they started in.
    epoch: u64,
    unfinished: BTreeSet<i64>,
    /// The offset after the last one received.
    received_to: Option<i64>,
    /// The offset last stored.
    stored: Option<i64>,
    blocked: Option<Blocked>,
    dead_letters: VecDeque<DeadLetter>,
    /// Whether the head of `dead_letters` is being published.
    publishing: bool,
}

/// Every partition the receive loop has seen since it was (re)assigned.
#[derive(Default)]
pub(crate) struct Progress {
    partitions: HashMap<PartitionId, State>,
    epochs: u64,
}

fn id_of(message: &OwnedMessage) -> PartitionId {
    (message.topic().to_owned(), message.partition())
}

impl Progress {
    fn state(&mut self, partition: &PartitionId) -> &mut State {
        if !self.partitions.contains_key(partition) {
            self.epochs += 1;
            let state = State {
                epoch: self.epochs,
                ..State::default()
            };
            self.partitions.insert(partition.clone(), state);
        }
        self.partitions
            .get_mut(partition)
            .expect("inserted just above")
    }

    /// Notes a message received from the broker. `Err(message)` hands it
    /// back when its partition is blocked, for [`Progress::wait_behind`];
    /// a message at or before one already held is a redelivery and dropped.
    pub(crate) fn receive(&mut self, message: OwnedMessage) -> Option<OwnedMessage> {
        let offset = message.offset();
        let state = self.state(&id_of(&message));
        if let Some(blocked) = state.blocked.as_mut() {
            if state.received_to.is_some_and(|next| offset < next) {
                return None;
            }
            state.unfinished.insert(offset);
            state.received_to = Some(offset + 1);
            blocked.behind.push(message);
            return None;
        }
        state.unfinished.insert(offset);
        state.received_to = Some(
            state
                .received_to
                .map_or(offset + 1, |next| next.max(offset + 1)),
        );
        Some(message)
    }

    /// Whether `partition` is blocked by a retried event.
    pub(crate) fn is_blocked(&self, partition: &PartitionId) -> bool {
        self.partitions
            .get(partition)
            .is_some_and(|state| state.blocked.is_some())
    }

    /// Whether `message` is finished (or was never received).
    pub(crate) fn is_finished(&self, message: &OwnedMessage) -> bool {
        self.partitions
            .get(&id_of(message))
            .is_none_or(|state| !state.unfinished.contains(&message.offset()))
    }

    /// The epoch of `partition`'s current state.
    pub(crate) fn epoch(&mut self, partition: &PartitionId) -> u64 {
        self.state(partition).epoch
    }

    pub(crate) fn finish(&mut self, message: &OwnedMessage) {
        let offset = message.offset();
        self.state(&id_of(message)).unfinished.remove(&offset);
    }

    /// Blocks `message`'s partition behind `retry`, due at `due`; `behind`
    /// are the partition's later messages of the same batch.
    pub(crate) fn block(
        &mut self,
        message: &OwnedMessage,
        retry: Retry,
        due: Instant,
        behind: Vec<OwnedMessage>,
    ) {
        self.state(&id_of(message)).blocked = Some(Blocked {
            head: message.clone(),
            retry: Some(retry),
            due,
            behind,
        });
    }

    /// The blocked partitions with an attempt due by `now`, taking their
    /// events out (they come back with [`Progress::attempted`]).
    pub(crate) fn due(&mut self, now: Instant) -> Vec<(PartitionId, u64, Retry)> {
        let mut due = Vec::new();
        for (partition, state) in &mut self.partitions {
            if let Some(blocked) = state.blocked.as_mut()
                && blocked.due <= now
                && let Some(retry) = blocked.retry.take()
            {
                due.push((partition.clone(), state.epoch, retry));
            }
        }
        due
    }

    /// When the next attempt of a blocked partition is due.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.partitions
            .values()
            .filter_map(|state| state.blocked.as_ref())
            .filter(|blocked| blocked.retry.is_some())
            .map(|blocked| blocked.due)
            .min()
    }

    /// An attempt of `partition`'s retried event failed: it is due again at
    /// `due`. False if the partition's state is gone (revoked meanwhile).
    pub(crate) fn retry_later(
        &mut self,
        partition: &PartitionId,
        epoch: u64,
        retry: Retry,
        due: Instant,
    ) -> bool {
        match self
            .current(partition, epoch)
            .and_then(|s| s.blocked.as_mut())
        {
            Some(blocked) => {
                blocked.retry = Some(retry);
                blocked.due = due;
                true
            }
            None => false,
        }
    }

    /// Unblocks `partition`: returns its retried event's message and the
    /// messages that waited behind it (`None` if the state is gone).
    pub(crate) fn unblock(
        &mut self,
        partition: &PartitionId,
        epoch: u64,
    ) -> Option<(OwnedMessage, Vec<OwnedMessage>)> {
        let blocked = self.current(partition, epoch)?.blocked.take()?;
        Some((blocked.head, blocked.behind))
    }

    /// Unblocks `partition` whose retried event is out of attempts: returns
    /// the event's message and retry, and the messages behind it (`None` if
    /// the state is gone or an attempt is running).
    pub(crate) fn unblock_spent(
        &mut self,
        partition: &PartitionId,
        epoch: u64,
    ) -> Option<(OwnedMessage, Retry, Vec<OwnedMessage>)> {
        let state = self.current(partition, epoch)?;
        let retry = state.blocked.as_mut()?.retry.take()?;
        let blocked = state.blocked.take()?;
        Some((blocked.head, retry, blocked.behind))
    }

    fn current(&mut self, partition: &PartitionId, epoch: u64) -> Option<&mut State> {
        self.partitions
            .get_mut(partition)
            .filter(|state| state.epoch == epoch)
    }

    /// Whether `epoch` is still `partition`'s.
    pub(crate) fn is_current(&self, partition: &PartitionId, epoch: u64) -> bool {
        self.partitions
            .get(partition)
            .is_some_and(|state| state.epoch == epoch)
    }

    /// Queues a dead letter behind its partition's others (published one at
    /// a time, in offset order).
    pub(crate) fn queue_dead_letter(&mut self, dead: DeadLetter) {
        let state = self.state(&id_of(&dead.message));
        state.dead_letters.push_back(dead);
    }

    /// The dead letters to start publishing now: the head of each queue
    /// whose partition publishes none.
    pub(crate) fn dead_letters_to_start(&mut self) -> Vec<(PartitionId, u64, DeadLetter)> {
        let mut start = Vec::new();
        for (partition, state) in &mut self.partitions {
            if !state.publishing
                && let Some(dead) = state.dead_letters.pop_front()
            {
                state.publishing = true;
                start.push((partition.clone(), state.epoch, dead));
            }
        }
        start
    }

    /// A dead letter of `partition` settled (`finished`: its offset may be
    /// stored); the next of its queue may start.
    pub(crate) fn dead_letter_settled(
        &mut self,
        partition: &PartitionId,
        epoch: u64,
        offset: i64,
        finished: bool,
    ) {
        if let Some(state) = self.current(partition, epoch) {
            state.publishing = false;
            if finished {
                state.unfinished.remove(&offset);
            }
        }
    }

    /// Forgets `partition` (revoked or assigned anew: the broker redelivers
    /// from its committed offset). Side tasks still running for it report
    /// into the void.
    pub(crate) fn forget(&mut self, partition: &PartitionId) {
        self.partitions.remove(partition);
    }

    /// How many partitions are blocked by a retried event.
    pub(crate) fn blocked_count(&self) -> usize {
        self.partitions
            .values()
            .filter(|state| state.blocked.is_some())
            .count()
    }

    /// The offsets to store: per partition, the first unfinished offset (or
    /// the one after the last received), where that moved since the last
    /// store. Marks them stored.
    pub(crate) fn offsets_to_store(&mut self) -> Vec<(PartitionId, i64)> {
        let mut store = Vec::new();
        for (partition, state) in &mut self.partitions {
            let Some(next) = state.unfinished.first().copied().or(state.received_to) else {
                continue;
            };
            if state.stored.is_none_or(|stored| stored < next) {
                state.stored = Some(next);
                store.push((partition.clone(), next));
            }
        }
        store
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::message::Timestamp;

    use super::*;

    fn message(topic: &str, partition: i32, offset: i64) -> OwnedMessage {
        OwnedMessage::new(
            None,
            None,
            topic.to_owned(),
            Timestamp::NotAvailable,
            partition,
            offset,
            None,
        )
    }

    #[test]
    fn offsets_stop_at_the_first_unfinished_message_of_each_partition() {
        let batch = [
            message("a", 0, 10),
            message("a", 1, 5),
            message("a", 0, 11),
            message("a", 1, 6),
            message("a", 0, 12),
            message("b", 0, 3),
        ];
        let done = [true, false, true, true, false, true];
        let mut progress = Progress::default();
        for message in &batch {
            assert!(progress.receive(message.clone()).is_some());
        }
        for (message, done) in batch.iter().zip(done) {
            if done {
                progress.finish(message);
            }
        }
        let mut next = progress.offsets_to_store();
        next.sort();
        // a/0: 10 and 11 done, 12 not: next is 12. a/1: 5 not done, so 6 must
        // not be committed either. b/0: 3 done.
        assert_eq!(
            next,
            vec![
                (("a".to_owned(), 0), 12),
                (("a".to_owned(), 1), 5),
                (("b".to_owned(), 0), 4)
            ]
        );
        // Nothing moved: nothing to store again. Then a/1's 5 finishes.
        assert!(progress.offsets_to_store().is_empty());
        progress.finish(&batch[1]);
        assert_eq!(progress.offsets_to_store(), vec![(("a".to_owned(), 1), 7)]);
    }

    #[test]
    fn messages_of_a_blocked_partition_wait_behind_its_retried_event() {
        let mut progress = Progress::default();
        let head = message("a", 0, 1);
        assert!(progress.receive(head.clone()).is_some());
        assert!(!progress.is_blocked(&("a".to_owned(), 0)));
        progress.state(&("a".to_owned(), 0)).blocked = Some(Blocked {
            head: head.clone(),
            retry: None,
            due: Instant::now(),
            behind: Vec::new(),
        });
        // Later messages are held; a redelivery of an earlier one is dropped.
        assert!(progress.receive(message("a", 0, 2)).is_none());
        assert!(progress.receive(message("a", 0, 1)).is_none());
        assert!(progress.receive(message("b", 0, 7)).is_some());
        let epoch = progress.epoch(&("a".to_owned(), 0));
        let (unblocked_head, behind) = progress.unblock(&("a".to_owned(), 0), epoch).unwrap();
        assert_eq!(unblocked_head.offset(), 1);
        assert_eq!(behind.iter().map(|m| m.offset()).collect::<Vec<_>>(), [2]);
        // The stored offset stays at the first unfinished message.
        let mut next = progress.offsets_to_store();
        next.sort();
        assert_eq!(
            next,
            vec![(("a".to_owned(), 0), 1), (("b".to_owned(), 0), 7)]
        );
        // A state forgotten at a rebalance ignores its old side tasks.
        progress.forget(&("a".to_owned(), 0));
        assert!(!progress.is_current(&("a".to_owned(), 0), epoch));
    }
}
