//! Turning claimed rows into Kafka records and delivering a batch at once.

use std::collections::HashSet;
use std::pin::Pin;
use std::time::{Duration, Instant};

use futures::future::{JoinAll, join_all};
use outbox_core::wire;
use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use tokio::time::Timeout;

use super::store::ClaimedRow;

/// What became of one row of a batch.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Outcome {
    /// The broker acknowledged it (`acks=all`).
    Delivered,
    /// Not sent: an earlier row of its key failed in this batch or is still
    /// in flight in the previous one. Claimed again later.
    Held,
    /// Refused for a reason tied to this message (too large, unknown topic,
    /// not authorized): counts as a failed attempt.
    Rejected(String),
    /// Not delivered for a reason that is not the message's fault (broker
    /// unreachable, timeout, producer fenced): retried without counting,
    /// unless other rows of the batch got through.
    Unavailable(String),
}

/// The idempotent producer, rebuilt from its configuration after a fatal error.
pub(crate) struct Publisher {
    config: ClientConfig,
    producer: FutureProducer,
    delivery_timeout: Duration,
}

impl Publisher {
    pub(crate) fn new(
        config: ClientConfig,
        delivery_timeout: Duration,
    ) -> Result<Self, KafkaError> {
        let producer = config.create()?;
        Ok(Self {
            config,
            producer,
            delivery_timeout,
        })
    }

    /// A fatal error leaves librdkafka's idempotent producer unusable (e.g. a
    /// sequence gap it cannot resolve); the cure is a new producer, whose
    /// fresh producer id restarts the sequence. Returns the error if it rebuilt.
    pub(crate) fn rebuild_if_fatal(&mut self) -> Result<Option<String>, KafkaError> {
        let Some((code, reason)) = self.producer.client().fatal_error() else {
            return Ok(None);
        };
        self.producer = self.config.create()?;
        Ok(Some(format!("{code:?}: {reason}")))
    }

    /// Replaces the producer by a fresh one (new connections, metadata and
    /// producer id). Called after whole batches failed: nothing of ours is in
    /// flight then, and a restarted broker may have forgotten our producer id.
    pub(crate) fn rebuild(&mut self) -> Result<(), KafkaError> {
        self.producer = self.config.create()?;
        Ok(())
    }

    /// Whether the broker answers a metadata request within `timeout`: how a
    /// relay that handed its lanes over during an outage learns that it can
    /// publish again.
    pub(crate) async fn reachable(&self, timeout: Duration) -> bool {
        let producer = self.producer.clone();
        tokio::task::spawn_blocking(move || {
            producer
                .client()
                .fetch_metadata(None, timeout)
                .is_ok_and(|metadata| !metadata.brokers().is_empty())
        })
        .await
        .unwrap_or(false)
    }

    /// Enqueues every row, in order, and returns at once: the deliveries
    /// proceed while the relay claims its next batch. Rows whose key is in
    /// `held_keys` (still in flight in the previous batch), or whose key had
    /// an earlier row fail to enqueue here, are held back for a later batch:
    /// a later event of a key never goes out while an earlier one may still fail.
    pub(crate) async fn enqueue(
        &self,
        rows: &[ClaimedRow],
        held_keys: &HashSet<String>,
    ) -> PendingBatch {
        let deadline = Instant::now() + self.delivery_timeout;
        let mut outcomes = vec![Outcome::Held; rows.len()];
        let mut failed_keys: HashSet<&str> = HashSet::new();
        let mut pending = Vec::with_capacity(rows.len());
        for (index, row) in rows.iter().enumerate() {
            let key = row.partition_key.as_str();
            if held_keys.contains(key) || failed_keys.contains(key) {
                continue;
            }
            let mut record = FutureRecord::to(&row.topic)
                .key(key)
                .payload(row.payload.as_str())
                .headers(headers(row));
            loop {
                match self.producer.send_result(record) {
                    Ok(delivery) => {
                        pending.push((index, delivery));
                        break;
                    }
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                        if Instant::now() < deadline =>
                    {
                        // librdkafka's queue is full: its own thread drains it.
                        record = back;
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    Err((error, _)) => {
                        outcomes[index] = classify(&error);
                        failed_keys.insert(key);
                        break;
                    }
                }
            }
        }
        let (indices, futures): (Vec<usize>, Vec<_>) = pending.into_iter().unzip();
        // librdkafka fails every message after message.timeout.ms; the margin
        // only guards against a lost report.
        let wait_at_most = self.delivery_timeout + Duration::from_secs(5);
        PendingBatch {
            outcomes,
            indices,
            reports: Some(Box::pin(tokio::time::timeout(
                wait_at_most,
                join_all(futures),
            ))),
        }
    }
}

type Reports = Pin<Box<Timeout<JoinAll<DeliveryFuture>>>>;

/// A batch handed to the producer, its delivery reports still to come.
pub(crate) struct PendingBatch {
    outcomes: Vec<Outcome>,
    indices: Vec<usize>,
    /// `None` once every report is in (and copied into `outcomes`).
    reports: Option<Reports>,
}

impl PendingBatch {
    /// `false` when every row was held back: nothing was sent or refused, so
    /// there is nothing to await or record.
    pub(crate) fn needs_settling(&self) -> bool {
        !self.indices.is_empty() || self.outcomes.iter().any(|o| *o != Outcome::Held)
    }

    /// Returns when every delivery report is in. Cancel-safe: the reports
    /// stay in `self`, so a wait interrupted (by a commit signal) resumes.
    pub(crate) async fn delivered(&mut self) {
        let Some(reports) = self.reports.as_mut() else {
            return;
        };
        let reports = reports.as_mut().await;
        self.reports = None;
        match reports {
            Ok(reports) => {
                for (&index, report) in self.indices.iter().zip(reports) {
                    self.outcomes[index] = match report {
                        Ok(Ok(_delivery)) => Outcome::Delivered,
                        Ok(Err((error, _message))) => classify(&error),
                        Err(_canceled) => {
                            Outcome::Unavailable("producer dropped the delivery report".into())
                        }
                    };
                }
            }
            Err(_elapsed) => {
                for &index in &self.indices {
                    self.outcomes[index] =
                        Outcome::Unavailable("no delivery report in time".into());
                }
            }
        }
    }

    /// Awaits every delivery report; one outcome per row, in row order.
    pub(crate) async fn outcomes(mut self) -> Vec<Outcome> {
        self.delivered().await;
        self.outcomes
    }
}

fn headers(row: &ClaimedRow) -> OwnedHeaders {
    wire_headers(&WireRow {
        event_id: &row.event_id.to_string(),
        event_type: &row.event_type,
        aggregate_type: &row.aggregate_type,
        aggregate_id: &row.aggregate_id,
        traceparent: row.traceparent.as_deref(),
    })
}

/// What the wire-format headers of an outbox row are made of.
pub(crate) struct WireRow<'a> {
    pub(crate) event_id: &'a str,
    pub(crate) event_type: &'a str,
    pub(crate) aggregate_type: &'a str,
    pub(crate) aggregate_id: &'a str,
    pub(crate) traceparent: Option<&'a str>,
}

/// The headers `docs/wire-format.md` specifies for an outbox row. The one
/// place they are built: the relay and `outbox replay` send the same record.
pub(crate) fn wire_headers(row: &WireRow<'_>) -> OwnedHeaders {
    let mut headers = OwnedHeaders::new_with_capacity(7);
    for (key, value) in [
        (wire::HEADER_EVENT_ID, row.event_id),
        (wire::HEADER_EVENT_TYPE, row.event_type),
        (wire::HEADER_AGGREGATE_TYPE, row.aggregate_type),
        (wire::HEADER_AGGREGATE_ID, row.aggregate_id),
        (wire::HEADER_CONTENT_TYPE, wire::CONTENT_TYPE_JSON),
    ] {
        headers = headers.insert(Header {
            key,
            value: Some(value),
        });
    }
    if let Some(traceparent) = row.traceparent {
        headers = headers.insert(Header {
            key: wire::HEADER_TRACEPARENT,
            value: Some(traceparent),
        });
    }
    headers
}

/// Errors that will not go away by retrying the same message soon.
fn classify(error: &KafkaError) -> Outcome {
    use RDKafkaErrorCode as C;
    let text = error.to_string();
    match error.rdkafka_error_code() {
        Some(
            C::MessageSizeTooLarge
            | C::InvalidMessageSize
            | C::InvalidMessage
            | C::InvalidRecord
            | C::UnknownTopic
            | C::UnknownTopicOrPartition
            | C::UnknownPartition
            | C::InvalidTopic
            | C::TopicAuthorizationFailed,
        ) => Outcome::Rejected(text),
        _ => Outcome::Unavailable(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_faults_are_rejections_and_broker_faults_are_unavailability() {
        let too_large = KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge);
        assert!(matches!(classify(&too_large), Outcome::Rejected(_)));
        let timeout = KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut);
        assert!(matches!(classify(&timeout), Outcome::Unavailable(_)));
    }
}
