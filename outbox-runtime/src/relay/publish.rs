//! Turning claimed rows into Kafka records and delivering a batch at once.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use futures::future::join_all;
use outbox_core::wire;
use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

use super::store::ClaimedRow;

/// What became of one row of a batch.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Outcome {
    /// The broker acknowledged it (`acks=all`).
    Delivered,
    /// Not sent because an earlier row of its key failed in this batch.
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

    /// Enqueues every row (in order), then awaits all delivery reports.
    pub(crate) async fn publish(&self, rows: &[ClaimedRow]) -> Vec<Outcome> {
        let deadline = Instant::now() + self.delivery_timeout;
        let mut outcomes = vec![Outcome::Held; rows.len()];
        let mut failed_keys: HashSet<&str> = HashSet::new();
        let mut pending = Vec::with_capacity(rows.len());
        for (index, row) in rows.iter().enumerate() {
            // A later event of a key whose earlier event failed must not
            // overtake it: hold it back for the next batch.
            if failed_keys.contains(row.partition_key.as_str()) {
                continue;
            }
            let mut record = FutureRecord::to(&row.topic)
                .key(row.partition_key.as_str())
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
                        failed_keys.insert(row.partition_key.as_str());
                        break;
                    }
                }
            }
        }
        let (indices, futures): (Vec<usize>, Vec<_>) = pending.into_iter().unzip();
        // librdkafka fails every message after message.timeout.ms; the margin
        // only guards against a lost report.
        let reports = tokio::time::timeout(
            self.delivery_timeout + Duration::from_secs(5),
            join_all(futures),
        )
        .await;
        match reports {
            Ok(reports) => {
                for (index, report) in indices.into_iter().zip(reports) {
                    outcomes[index] = match report {
                        Ok(Ok(_delivery)) => Outcome::Delivered,
                        Ok(Err((error, _message))) => classify(&error),
                        Err(_canceled) => {
                            Outcome::Unavailable("producer dropped the delivery report".into())
                        }
                    };
                }
            }
            Err(_elapsed) => {
                for index in indices {
                    outcomes[index] = Outcome::Unavailable("no delivery report in time".into());
                }
            }
        }
        outcomes
    }
}

fn headers(row: &ClaimedRow) -> OwnedHeaders {
    let event_id = row.event_id.to_string();
    let mut headers = OwnedHeaders::new_with_capacity(6)
        .insert(Header {
            key: wire::HEADER_EVENT_ID,
            value: Some(event_id.as_str()),
        })
        .insert(Header {
            key: wire::HEADER_EVENT_TYPE,
            value: Some(row.event_type.as_str()),
        })
        .insert(Header {
            key: wire::HEADER_AGGREGATE_TYPE,
            value: Some(row.aggregate_type.as_str()),
        })
        .insert(Header {
            key: wire::HEADER_AGGREGATE_ID,
            value: Some(row.aggregate_id.as_str()),
        })
        .insert(Header {
            key: wire::HEADER_CONTENT_TYPE,
            value: Some(wire::CONTENT_TYPE_JSON),
        });
    if let Some(traceparent) = &row.traceparent {
        headers = headers.insert(Header {
            key: wire::HEADER_TRACEPARENT,
            value: Some(traceparent.as_str()),
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
