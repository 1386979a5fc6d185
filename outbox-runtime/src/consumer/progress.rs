//! What the receive loop knows of each partition beyond librdkafka's
//! position: which received offsets are not finished yet, the messages
//! waiting for their partition's batch in flight to end, the event that
//! backs off between its attempts (dedup mode) with the messages waiting
//! behind it, and the dead letters being published.
//!
//! Batches of different partitions run at once; a partition has at most one
//! batch in flight (it is *busy*), so its messages are taken in offset
//! order, one batch after the other. [`Progress::next_batch`] takes the
//! waiting messages of the partitions that are neither busy nor blocked.
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
    /// Received, waiting for a batch: for the partition's batch in flight
    /// to end, or for room among the batches in flight.
    ready: VecDeque<OwnedMessage>,
    /// The bytes of `ready` (see [`size_of`]).
    ready_bytes: usize,
    /// Whether a batch of this partition is in flight.
    busy: bool,
    /// Whether fetching this partition is paused (see [`Progress::pauses`]).
    paused: bool,
    blocked: Option<Blocked>,
    dead_letters: VecDeque<DeadLetter>,
    /// Whether the head of `dead_letters` is being published.
    publishing: bool,
}

/// Messages taken for one batch, with the epoch of each of their
/// partitions (see [`Progress::batch_done`]).
pub(crate) struct NextBatch {
    pub(crate) messages: Vec<OwnedMessage>,
    pub(crate) partitions: Vec<(PartitionId, u64)>,
}

/// Every partition the receive loop has seen since it was (re)assigned.
#[derive(Default)]
pub(crate) struct Progress {
    partitions: HashMap<PartitionId, State>,
    epochs: u64,
    /// Rotates the partition a batch starts with, so that the byte bound
    /// never leaves the same partition out batch after batch.
    turn: usize,
}

fn id_of(message: &OwnedMessage) -> PartitionId {
    (message.topic().to_owned(), message.partition())
}

/// What a message weighs against a batch's byte bound: its key and value.
pub(crate) fn size_of(message: &OwnedMessage) -> usize {
    message.payload().map_or(0, <[u8]>::len) + message.key().map_or(0, <[u8]>::len)
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

    /// Notes a message received from the broker: it waits behind its
    /// partition's retried event if there is one (a redelivery of a message
    /// before it is dropped), and for [`Progress::next_batch`] otherwise.
    pub(crate) fn receive(&mut self, message: OwnedMessage) {
        let offset = message.offset();
        let state = self.state(&id_of(&message));
        if let Some(blocked) = state.blocked.as_mut() {
            if state.received_to.is_some_and(|next| offset < next) {
                return;
            }
            state.unfinished.insert(offset);
            state.received_to = Some(offset + 1);
            blocked.behind.push(message);
            return;
        }
        state.unfinished.insert(offset);
        state.received_to = Some(
            state
                .received_to
                .map_or(offset + 1, |next| next.max(offset + 1)),
        );
        state.ready_bytes += size_of(&message);
        state.ready.push_back(message);
    }

    /// The next batch: the waiting messages of partitions that are neither
    /// busy nor blocked, up to `slots` batches' worth of partitions spread
    /// evenly over the `slots` free batch slots (so that one slow partition
    /// shares its batch with as few others as the slots allow). Each of the
    /// batch's partitions gets its share of `max_messages` (none is left out
    /// while another's backlog fills batches), up to `max_bytes` (at least
    /// one message). Those partitions are busy until
    /// [`Progress::batch_done`]. `None` if no partition is ready.
    pub(crate) fn next_batch(
        &mut self,
        max_messages: usize,
        max_bytes: usize,
        slots: usize,
    ) -> Option<NextBatch> {
        let mut ready: Vec<&PartitionId> = self
            .partitions
            .iter()
            .filter(|(_, s)| !s.busy && s.blocked.is_none() && !s.ready.is_empty())
            .map(|(partition, _)| partition)
            .collect();
        if ready.is_empty() {
            return None;
        }
        ready.sort_unstable();
        let turn = self.turn % ready.len();
        ready.rotate_left(turn);
        self.turn = self.turn.wrapping_add(1);
        let per_batch = ready.len().div_ceil(slots.max(1));
        let ready: Vec<PartitionId> = ready.into_iter().take(per_batch).cloned().collect();
        let share = max_messages.div_ceil(ready.len()).max(1);
        let mut batch = NextBatch {
            messages: Vec::new(),
            partitions: Vec::new(),
        };
        let mut bytes = 0;
        for partition in ready {
            let state = self.partitions.get_mut(&partition).expect("listed above");
            let mut took = 0;
            while took < share
                && batch.messages.len() < max_messages
                && (bytes < max_bytes || batch.messages.is_empty())
            {
                let Some(message) = state.ready.pop_front() else {
                    break;
                };
                let size = size_of(&message);
                state.ready_bytes -= size;
                bytes += size;
                batch.messages.push(message);
                took += 1;
            }
            if took > 0 {
                state.busy = true;
                batch.partitions.push((partition, state.epoch));
            }
        }
        Some(batch)
    }

    /// The batch in flight of `partition` (taken in `epoch`) ended: the
    /// partition may have its next. False, and nothing changes, if the
    /// partition's state is no longer that epoch's (revoked or assigned anew
    /// meanwhile): what the batch decided about its messages must then not
    /// touch the new state, whose offsets may be the same.
    pub(crate) fn batch_done(&mut self, partition: &PartitionId, epoch: u64) -> bool {
        match self.current(partition, epoch) {
            Some(state) => {
                state.busy = false;
                true
            }
            None => false,
        }
    }

    /// The partitions whose fetching is to be paused (`true`) or resumed
    /// (`false`) now: paused while blocked by a retried event, or while a
    /// batch's worth of its messages (`max_messages` or `max_bytes`) wait
    /// for a batch (its batch in flight is slow: what librdkafka fetches
    /// meanwhile stays in librdkafka's bounded queue instead of piling up
    /// here).
    pub(crate) fn pauses(
        &mut self,
        max_messages: usize,
        max_bytes: usize,
    ) -> Vec<(PartitionId, bool)> {
        let mut changes = Vec::new();
        for (partition, state) in &mut self.partitions {
            let pause = state.blocked.is_some()
                || state.ready.len() >= max_messages
                || state.ready_bytes >= max_bytes;
            if pause != state.paused {
                state.paused = pause;
                changes.push((partition.clone(), pause));
            }
        }
        changes
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
    /// are the partition's later messages of the same batch, and the
    /// messages that waited for that batch follow them.
    pub(crate) fn block(
        &mut self,
        message: &OwnedMessage,
        retry: Retry,
        due: Instant,
        mut behind: Vec<OwnedMessage>,
    ) {
        let state = self.state(&id_of(message));
        behind.extend(state.ready.drain(..));
        state.ready_bytes = 0;
        state.blocked = Some(Blocked {
            head: message.clone(),
            retry: Some(retry),
            due,
            behind,
        });
    }

    /// Puts the messages that waited behind `partition`'s retried event
    /// back in line for a batch, ahead of anything received since (nothing,
    /// while it was blocked). Nothing if the state is gone (revoked).
    pub(crate) fn requeue(
        &mut self,
        partition: &PartitionId,
        epoch: u64,
        behind: Vec<OwnedMessage>,
    ) {
        if let Some(state) = self.current(partition, epoch) {
            for message in behind.into_iter().rev() {
                state.ready_bytes += size_of(&message);
                state.ready.push_front(message);
            }
        }
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
            progress.receive(message.clone());
        }
        let taken = progress.next_batch(100, usize::MAX, 1).unwrap();
        assert_eq!(taken.messages.len(), 6);
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
        progress.receive(head.clone());
        assert_eq!(offsets(progress.next_batch(10, usize::MAX, 1)), ["a/0/1"]);
        assert_eq!(progress.blocked_count(), 0);
        progress.state(&("a".to_owned(), 0)).blocked = Some(Blocked {
            head: head.clone(),
            retry: None,
            due: Instant::now(),
            behind: Vec::new(),
        });
        // Later messages are held; a redelivery of an earlier one is dropped.
        progress.receive(message("a", 0, 2));
        progress.receive(message("a", 0, 1));
        progress.receive(message("b", 0, 7));
        assert_eq!(offsets(progress.next_batch(10, usize::MAX, 1)), ["b/0/7"]);
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

    /// A batch's messages as `topic/partition/offset`, sorted.
    fn offsets(batch: Option<NextBatch>) -> Vec<String> {
        let mut taken: Vec<_> = batch
            .map(|b| b.messages)
            .unwrap_or_default()
            .iter()
            .map(|m| format!("{}/{}/{}", m.topic(), m.partition(), m.offset()))
            .collect();
        taken.sort();
        taken
    }

    /// A message of topic `a` with a value of 100 bytes.
    fn message_of_100_bytes(partition: i32, offset: i64) -> OwnedMessage {
        OwnedMessage::new(
            Some(vec![0; 100]),
            None,
            "a".to_owned(),
            Timestamp::NotAvailable,
            partition,
            offset,
            None,
        )
    }

    fn a(partition: i32) -> PartitionId {
        ("a".to_owned(), partition)
    }

    #[test]
    fn a_busy_partition_waits_for_its_batch_and_the_others_go_on() {
        let mut progress = Progress::default();
        progress.receive(message("a", 0, 1));
        let first = progress.next_batch(10, usize::MAX, 1).unwrap();
        assert_eq!(first.partitions, [(a(0), progress.epoch(&a(0)))]);
        // a/0 is busy: its next messages wait; a/1's go in the next batch.
        progress.receive(message("a", 0, 2));
        progress.receive(message("a", 1, 5));
        progress.receive(message("a", 0, 3));
        assert_eq!(offsets(progress.next_batch(10, usize::MAX, 1)), ["a/1/5"]);
        assert!(progress.next_batch(10, usize::MAX, 1).is_none());
        // Nothing of a/0 is stored past its batch in flight.
        progress.finish(&message("a", 1, 5));
        let mut stored = progress.offsets_to_store();
        stored.sort();
        assert_eq!(stored, [(a(0), 1), (a(1), 6)]);
        // a/0's batch ends: its waiting messages follow, in offset order.
        let (partition, epoch) = first.partitions[0].clone();
        assert!(progress.batch_done(&partition, epoch));
        assert_eq!(
            offsets(progress.next_batch(10, usize::MAX, 1)),
            ["a/0/2", "a/0/3"]
        );
    }

    #[test]
    fn a_batch_ending_after_its_partition_was_reassigned_touches_nothing() {
        let mut progress = Progress::default();
        progress.receive(message("a", 0, 7));
        let before = progress.next_batch(10, usize::MAX, 1).unwrap();
        // Revoked and assigned again while the batch ran: offset 7 comes
        // again and is in flight in a batch of the new epoch.
        progress.forget(&a(0));
        progress.receive(message("a", 0, 7));
        let after = progress.next_batch(10, usize::MAX, 1).unwrap();
        let (partition, epoch) = before.partitions[0].clone();
        assert!(!progress.batch_done(&partition, epoch));
        // The old batch's end neither frees the new one's partition ...
        progress.receive(message("a", 0, 8));
        assert!(progress.next_batch(10, usize::MAX, 1).is_none());
        // ... nor may the caller finish offset 7 for it: it stays unstored.
        assert_eq!(progress.offsets_to_store(), [(a(0), 7)]);
        let (partition, epoch) = after.partitions[0].clone();
        assert!(progress.batch_done(&partition, epoch));
        assert_eq!(offsets(progress.next_batch(10, usize::MAX, 1)), ["a/0/8"]);
    }

    #[test]
    fn every_ready_partition_gets_its_share_of_a_batch() {
        let mut progress = Progress::default();
        for offset in 0..100 {
            progress.receive(message("a", 0, offset));
        }
        for offset in 0..3 {
            progress.receive(message("a", 1, offset));
        }
        progress.receive(message("a", 2, 0));
        // A share is 10 / 3 rounded up: a/0's backlog does not fill it.
        let batch = progress.next_batch(10, usize::MAX, 1).unwrap().messages;
        let of = |partition: i32| -> Vec<i64> {
            batch
                .iter()
                .filter(|m| m.partition() == partition)
                .map(|m| m.offset())
                .collect()
        };
        // Within a partition, offset order.
        assert_eq!(of(0), [0, 1, 2, 3]);
        assert_eq!(of(1), [0, 1, 2]);
        assert_eq!(of(2), [0]);
    }

    #[test]
    fn the_byte_bound_takes_turns_among_partitions() {
        let mut progress = Progress::default();
        for offset in 0..4 {
            for partition in 0..2 {
                progress.receive(message_of_100_bytes(partition, offset));
            }
        }
        // One message fits the byte bound (at least one is taken): the
        // partitions alternate instead of a/0 taking every batch.
        let mut order = Vec::new();
        for _ in 0..4 {
            let batch = progress.next_batch(10, 50, 1).unwrap();
            assert_eq!(batch.messages.len(), 1);
            order.push(batch.messages[0].partition());
            for (partition, epoch) in batch.partitions {
                progress.batch_done(&partition, epoch);
            }
        }
        assert_eq!(order.iter().filter(|&&p| p == 0).count(), 2, "{order:?}");
    }

    #[test]
    fn a_partition_is_paused_while_blocked_or_while_its_waiting_messages_reach_the_limit() {
        let mut progress = Progress::default();
        progress.receive(message("a", 0, 0));
        let _in_flight = progress.next_batch(10, usize::MAX, 1).unwrap();
        progress.receive(message("a", 0, 1));
        assert!(progress.pauses(2, usize::MAX).is_empty());
        progress.receive(message("a", 0, 2));
        assert_eq!(progress.pauses(2, usize::MAX), [(a(0), true)]);
        assert!(progress.pauses(2, usize::MAX).is_empty());
        let epoch = progress.epoch(&a(0));
        progress.batch_done(&a(0), epoch);
        progress.next_batch(10, usize::MAX, 1).unwrap();
        assert_eq!(progress.pauses(2, usize::MAX), [(a(0), false)]);
        // The same by bytes.
        progress.receive(message_of_100_bytes(0, 3));
        assert!(progress.pauses(10, 101).is_empty());
        assert_eq!(progress.pauses(10, 100), [(a(0), true)]);
    }

    #[test]
    fn free_slots_split_the_ready_partitions_between_batches() {
        let mut progress = Progress::default();
        for partition in 0..5 {
            progress.receive(message("a", partition, 0));
        }
        // Three slots free: batches of two, two and one partitions.
        let sizes: Vec<usize> = (0..3)
            .rev()
            .map(|taken| {
                progress
                    .next_batch(10, usize::MAX, taken + 1)
                    .unwrap()
                    .partitions
                    .len()
            })
            .collect();
        assert_eq!(sizes, [2, 2, 1]);
        assert!(progress.next_batch(10, usize::MAX, 1).is_none());
    }
}
