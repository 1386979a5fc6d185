//! Unit tests of [`Flight`].

use std::time::{Duration, Instant};

use tracing::Span;

use super::Flight;
use crate::relay::batch::Enqueued;
use crate::relay::keys::TopicKeys;
use crate::relay::publish::Outcome;
use crate::relay::store::ClaimedRow;

fn row(id: i64, key: &str) -> ClaimedRow {
    ClaimedRow {
        id,
        event_id: uuid::Uuid::nil(),
        aggregate_type: "Order".into(),
        aggregate_id: key.into(),
        event_type: "OrderCreated".into(),
        payload: "{}".into(),
        topic: "t".into(),
        partition_key: key.into(),
        traceparent: None,
        attempts: 0,
        headers: None,
        created_at: chrono::DateTime::UNIX_EPOCH,
    }
}

fn enqueued(rows: Vec<ClaimedRow>, outcomes: Vec<Option<Outcome>>, generation: u64) -> Enqueued {
    Enqueued {
        predicted: vec![None; rows.len()],
        rows,
        outcomes,
        sent: Vec::new(),
        started: Instant::now(),
        span: Span::none(),
        generation,
    }
}

fn sorted(keys: TopicKeys) -> Vec<String> {
    keys.pairs().into_iter().map(|(_, key)| key).collect()
}

#[test]
fn keys_in_flight_are_held_only_where_order_could_break() {
    let mut flight = Flight::default();
    // Awaiting its report on the current producer: not held. Delivered:
    // not held. Failed, or not sent: held.
    flight.add(
        enqueued(
            vec![
                row(1, "pending"),
                row(2, "delivered"),
                row(3, "failed"),
                row(4, "held"),
            ],
            vec![
                None,
                Some(Outcome::Delivered),
                Some(Outcome::Unavailable("timed out".into())),
                Some(Outcome::Held),
            ],
            0,
        ),
        Duration::from_secs(30),
    );
    assert_eq!(sorted(flight.held_keys(0)), ["failed", "held"]);
    // Per topic: the key's rows of another topic are another sequence.
    assert!(flight.held_keys(0).contains("t", "failed"));
    assert!(!flight.held_keys(0).contains("other", "failed"));
    // After a rebuild, a row still awaiting its report from the old
    // producer holds its key; a delivered one does not.
    assert_eq!(sorted(flight.held_keys(1)), ["failed", "held", "pending"]);
    // Every key in flight, for the rows of unavailable partitions.
    assert_eq!(flight.keys().pairs().len(), 4);
}
