//! Turning claimed rows into Kafka records and handing them to the producer.

use std::time::{Duration, Instant};

use futures::channel::oneshot::Canceled;
use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Message, OwnedHeaders};
use rdkafka::producer::future_producer::OwnedDeliveryResult;
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use tracing::Instrument;
use txoutbox_core::trace;

use super::partitioner::Partitioner;
use super::store::ClaimedRow;
use crate::wire::cloudevents::CloudEvents;
use crate::wire::encode::{HeaderNames, WireRow, record_headers, value_naming_type};

/// What became of one row of a batch.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Outcome {
    /// The broker acknowledged it (`acks=all`).
    Delivered,
    /// Not sent: an earlier row of its key failed in this batch, or is in
    /// flight and failed, late, or sent through a producer since rebuilt.
    /// Claimed again later.
    Held,
    /// Not sent: its partition is unavailable (leader down). Held back in the
    /// database for `hold` (`next_attempt_at`), not counted as an attempt.
    Deferred {
        /// Why, for `last_error`.
        reason: String,
        /// How long.
        hold: Duration,
    },
    /// Sent, its report late: settled on its own when it comes (see `flight`).
    Straggling,
    /// Refused for a reason tied to this message (too large, invalid):
    /// counts as a failed attempt.
    Rejected(String),
    /// Refused for its topic as a whole (unknown topic, not authorized): no
    /// fault of this record, never counted. The topic is held (see
    /// `held_topics`) and the row claimed again once it is accepted.
    TopicRefused(String),
    /// Not delivered for a reason that is not the message's fault (broker or
    /// partition leader unreachable, timeout, producer fenced): retried,
    /// never counted as an attempt.
    Unavailable(String),
}

/// The idempotent producer, rebuilt from its configuration after a fatal error.
pub(crate) struct Publisher {
    config: ClientConfig,
    /// The names of the event's headers on every record.
    header_names: HeaderNames,
    /// CloudEvents binary mode, if on.
    cloudevents: Option<CloudEvents>,
    producer: FutureProducer,
    /// Counts rebuilds: rows sent through an earlier producer hold their
    /// keys until they settle (see `Flight::held_keys`).
    generation: u64,
}

impl Publisher {
    pub(crate) fn new(
        config: ClientConfig,
        header_names: HeaderNames,
        cloudevents: Option<CloudEvents>,
    ) -> Result<Self, KafkaError> {
        let producer = config.create()?;
        Ok(Self {
            config,
            header_names,
            cloudevents,
            producer,
            generation: 0,
        })
    }

    /// The partitioner librdkafka uses for keyed records with this configuration.
    pub(crate) fn partitioner(&self) -> Option<Partitioner> {
        Partitioner::from_setting(self.config.get("partitioner"))
    }

    pub(crate) fn producer(&self) -> &FutureProducer {
        &self.producer
    }

    /// Which producer is current: a new number after every rebuild.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// A fatal error leaves librdkafka's idempotent producer unusable (e.g. a
    /// sequence gap it cannot resolve); the cure is a new producer, whose
    /// fresh producer id restarts the sequence. Returns the error if it rebuilt.
    pub(crate) fn rebuild_if_fatal(&mut self) -> Result<Option<String>, KafkaError> {
        let Some((code, reason)) = self.producer.client().fatal_error() else {
            return Ok(None);
        };
        self.producer = self.config.create()?;
        self.generation += 1;
        Ok(Some(format!("{code:?}: {reason}")))
    }

    /// Replaces the producer by a fresh one (new connections, metadata and
    /// producer id). Called after whole batches failed: nothing of ours is in
    /// flight then, and a restarted broker may have forgotten our producer id.
    pub(crate) fn rebuild(&mut self) -> Result<(), KafkaError> {
        self.producer = self.config.create()?;
        self.generation += 1;
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

    /// Hands one row to the producer and returns its delivery report to be.
    /// While librdkafka's queue is full it waits (its own thread drains it),
    /// until `deadline`.
    pub(crate) async fn send(
        &self,
        row: &ClaimedRow,
        deadline: Instant,
    ) -> Result<DeliveryFuture, Outcome> {
        // A row recorded inside a trace is published inside it: the publish
        // span is a child of the span that recorded the event, and the header
        // carries the publish span's context (with the `opentelemetry`
        // feature and a layer installed; otherwise the row's own). Untraced
        // rows get no span: the relay does not start a trace per row.
        let span = match row.traceparent.as_deref() {
            Some(_) => tracing::info_span!(
                "outbox.publish",
                otel.kind = "producer",
                event_id = %row.event_id,
                event_type = %row.event_type,
                topic = %row.topic,
            ),
            None => tracing::Span::none(),
        };
        trace::follow_traceparent(&span, row.traceparent.as_deref());
        let traceparent = trace::span_traceparent(&span).or_else(|| row.traceparent.clone());
        let value = value_naming_type(&row.payload, &row.event_type);
        let mut record = FutureRecord::to(&row.topic)
            .key(row.partition_key.as_str())
            .payload(value.as_ref())
            .headers(headers(
                row,
                traceparent.as_deref(),
                &self.header_names,
                self.cloudevents.as_ref(),
            ));
        async {
            loop {
                match self.producer.send_result(record) {
                    Ok(delivery) => return Ok(delivery),
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                        if Instant::now() < deadline =>
                    {
                        record = back;
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    Err((error, _)) => return Err(classify(&error)),
                }
            }
        }
        .instrument(span)
        .await
    }
}

/// A delivery report as an outcome, with the partition it names (`None`
/// when librdkafka had not partitioned the record, or dropped the report).
pub(crate) fn report_outcome(
    report: Result<OwnedDeliveryResult, Canceled>,
) -> (Outcome, Option<i32>) {
    match report {
        Ok(Ok(delivery)) => (Outcome::Delivered, Some(delivery.partition)),
        Ok(Err((error, message))) => {
            let partition = Some(message.partition()).filter(|p| *p >= 0);
            (classify(&error), partition)
        }
        Err(Canceled) => (
            Outcome::Unavailable("producer dropped the delivery report".into()),
            None,
        ),
    }
}

fn headers(
    row: &ClaimedRow,
    traceparent: Option<&str>,
    names: &HeaderNames,
    cloudevents: Option<&CloudEvents>,
) -> OwnedHeaders {
    record_headers(
        &WireRow {
            event_id: &row.event_id.to_string(),
            event_type: &row.event_type,
            aggregate_type: &row.aggregate_type,
            aggregate_id: &row.aggregate_id,
            traceparent,
            user_headers: row.headers.as_deref(),
            topic: &row.topic,
            partition_key: &row.partition_key,
            created_at: Some(row.created_at),
        },
        names,
        cloudevents,
    )
}

/// What a failure says about the record: refused for itself (counted),
/// refused for its topic (held, never counted), or not delivered for a
/// reason outside it (retried, never counted).
fn classify(error: &KafkaError) -> Outcome {
    use RDKafkaErrorCode as C;
    let text = error.to_string();
    match error.rdkafka_error_code() {
        Some(code) if refuses_topic(code) => Outcome::TopicRefused(text),
        Some(
            C::MessageSizeTooLarge
            | C::InvalidMessageSize
            | C::InvalidMessage
            | C::InvalidRecord
            | C::UnknownPartition
            | C::InvalidTopic,
        ) => Outcome::Rejected(text),
        _ => Outcome::Unavailable(text),
    }
}

/// Errors the broker (or librdkafka, from the broker's metadata) gives every
/// record of a topic alike: the topic does not exist (and is not created),
/// or this client may not write to it. An operator fixes the topic, not the
/// records. `InvalidTopic` (a name Kafka can never accept) is not among
/// them: no change on the broker makes such a record deliverable.
pub(crate) fn refuses_topic(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        C::UnknownTopic | C::UnknownTopicOrPartition | C::TopicAuthorizationFailed
    )
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

    #[test]
    fn topic_wide_refusals_are_the_topics_not_the_records() {
        for code in [
            RDKafkaErrorCode::UnknownTopic,
            RDKafkaErrorCode::UnknownTopicOrPartition,
            RDKafkaErrorCode::TopicAuthorizationFailed,
        ] {
            let error = KafkaError::MessageProduction(code);
            assert!(
                matches!(classify(&error), Outcome::TopicRefused(_)),
                "{code:?}"
            );
        }
        let invalid = KafkaError::MessageProduction(RDKafkaErrorCode::InvalidTopic);
        assert!(matches!(classify(&invalid), Outcome::Rejected(_)));
    }
}
