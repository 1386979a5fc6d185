//! Offsets: which to store after a batch, and the gaps a partition's
//! offsets show (see [`m::OFFSET_GAPS`]).

use std::collections::HashMap;

use super::telemetry as m;

/// The offset expected next in each partition, to notice gaps (see
/// [`m::OFFSET_GAPS`]). Forgotten at every rebalance: a partition assigned
/// again starts wherever its group committed.
#[derive(Default)]
pub(super) struct Positions {
    generation: u64,
    next: HashMap<(String, i32), i64>,
    /// Per partition, the first missing offset of the gap already read again.
    refetched: HashMap<(String, i32), i64>,
}

/// What [`Positions::observe`] found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Seen {
    InOrder,
    /// Offsets were skipped; read the partition again from `expected`.
    GapToRefetch {
        expected: i64,
    },
    /// Offsets were skipped and stay skipped (already read again, or
    /// re-fetching is off).
    GapAccepted,
}

impl Positions {
    pub(super) fn follow(&mut self, generation: u64) {
        if generation != self.generation {
            self.generation = generation;
            self.next.clear();
            self.refetched.clear();
        }
    }

    /// Notes the offset of a message received from `partition` (topic,
    /// partition number).
    pub(super) fn observe(
        &mut self,
        group: &str,
        partition: &(String, i32),
        offset: i64,
        refetch: bool,
    ) -> Seen {
        let expected = self.next.get(partition).copied();
        let seen = match expected {
            Some(expected) if offset > expected => {
                record_gap(group, partition, expected, offset);
                if refetch && self.refetched.get(partition) != Some(&expected) {
                    // Read again from `expected` (the caller seeks and rewinds).
                    self.refetched.insert(partition.clone(), expected);
                    return Seen::GapToRefetch { expected };
                }
                self.refetched.remove(partition);
                Seen::GapAccepted
            }
            Some(expected) if offset == expected => {
                if self.refetched.remove(partition).is_some() {
                    tracing::warn!(
                        group,
                        topic = %partition.0,
                        partition = partition.1,
                        offset,
                        "the re-read found the offsets the broker had skipped"
                    );
                }
                Seen::InOrder
            }
            _ => Seen::InOrder,
        };
        self.rewind(partition, offset + 1);
        seen
    }

    /// Sets the offset expected next (also after a seek back to `expected`).
    pub(super) fn rewind(&mut self, partition: &(String, i32), expected: i64) {
        match self.next.get_mut(partition) {
            Some(next) => *next = expected,
            None => {
                self.next.insert(partition.clone(), expected);
            }
        }
    }
}

/// Counts a gap and logs it at debug level (target `…::consumer::offsets`).
fn record_gap(group: &str, partition: &(String, i32), expected: i64, offset: i64) {
    metrics::counter!(
        m::OFFSET_GAPS,
        "group" => group.to_owned(),
        "topic" => partition.0.clone(),
        "partition" => partition.1.to_string()
    )
    .increment(1);
    tracing::debug!(
        target: "txoutbox_runtime::consumer::offsets",
        group,
        topic = %partition.0,
        partition = partition.1,
        expected,
        offset,
        "offset gap: the broker served offset {offset} after {}",
        expected - 1
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_gaps_are_noticed_per_partition_and_forgotten_at_a_rebalance() {
        let key = ("a".to_owned(), 0);
        let mut positions = Positions::default();
        positions.follow(0);
        let seen: Vec<Seen> = [
            ("a", 0, 10),
            ("a", 0, 11),
            ("a", 1, 3),
            ("a", 0, 14),
            ("a", 1, 4),
        ]
        .iter()
        .map(|&(t, p, o)| positions.observe("g", &(t.to_owned(), p), o, false))
        .collect();
        use Seen::*;
        assert_eq!(seen, [InOrder, InOrder, InOrder, GapAccepted, InOrder]);
        // A redelivery (offset below the expected one) is not a gap.
        assert_eq!(positions.observe("g", &key, 12, false), InOrder);
        assert_eq!(positions.observe("g", &key, 13, false), InOrder);
        // After a rebalance the partition may resume anywhere.
        positions.follow(1);
        assert_eq!(positions.observe("g", &key, 40, false), InOrder);
        assert_eq!(positions.observe("g", &key, 42, false), GapAccepted);
    }

    #[test]
    fn a_gap_is_read_again_once_then_accepted() {
        let key = ("a".to_owned(), 0);
        let mut positions = Positions::default();
        assert_eq!(positions.observe("g", &key, 5, true), Seen::InOrder);
        // 6 and 7 skipped: read again from 6.
        assert_eq!(
            positions.observe("g", &key, 8, true),
            Seen::GapToRefetch { expected: 6 }
        );
        positions.rewind(&key, 6);
        // The re-read brings them (the broker was late): in order, the gap closed.
        for offset in 6..=8 {
            assert_eq!(positions.observe("g", &key, offset, true), Seen::InOrder);
        }
        // A real gap (a transaction marker at 9): re-read once, then accepted.
        assert_eq!(
            positions.observe("g", &key, 10, true),
            Seen::GapToRefetch { expected: 9 }
        );
        positions.rewind(&key, 9);
        assert_eq!(positions.observe("g", &key, 10, true), Seen::GapAccepted);
        assert_eq!(positions.observe("g", &key, 11, true), Seen::InOrder);
        // The next gap is read again as well.
        assert_eq!(
            positions.observe("g", &key, 13, true),
            Seen::GapToRefetch { expected: 12 }
        );
    }
}
