use serde_json::Value;
use uuid::Uuid;

use crate::{DomainEvent, Error, trace, wire};

/// Longest partition key the outbox accepts, in bytes of UTF-8: 1024.
///
/// The relay indexes the keys of rows waiting for a retry
/// (`ix_outbox_event_retrying`), and a PostgreSQL b-tree entry cannot exceed
/// about 2,700 bytes (a third of an 8 kB page); a key near that size could be
/// written but never retried. 1 KiB leaves ample room and is far beyond what
/// a key needs (an id, a UUID, a few ids joined). Recording an event with a
/// longer key fails with [`Error::PartitionKeyTooLong`]; nothing is written.
pub const MAX_PARTITION_KEY_BYTES: usize = 1024;

/// One event as stored in a row of `outbox_event` and as sent to Kafka.
///
/// Field names match the table's columns. `traceparent` is an extension column
/// carrying the W3C trace context current when the event was recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxRecord {
    /// Unique event id (`event_id uuid NOT NULL UNIQUE`).
    pub event_id: Uuid,
    /// Aggregate kind, e.g. `Order`.
    pub aggregate_type: String,
    /// Aggregate instance id, as text.
    pub aggregate_id: String,
    /// Event type name, e.g. `OrderCreated`.
    pub event_type: String,
    /// The event's JSON; always an object carrying `"event_id"` and, when
    /// built by [`OutboxRecord::from_event`], `"event_type"`.
    pub payload: Value,
    /// Destination topic.
    pub topic: String,
    /// Kafka record key.
    pub partition_key: String,
    /// W3C `traceparent` current when the event was recorded, if any.
    pub traceparent: Option<String>,
    /// Headers of the user's own, as (name, value): the event type's
    /// [`DomainEvent::HEADERS`], then those given when it was recorded
    /// ([`Events::with_headers`](crate::Events::with_headers)). Stored in
    /// the `headers` column (NULL when empty) and sent after the
    /// framework's headers.
    pub headers: Vec<(String, String)>,
}

impl OutboxRecord {
    /// Builds the record of `event`, serializing its payload and capturing the
    /// current trace context (see [`trace::current_traceparent`]).
    ///
    /// Fails if the event does not serialize to a JSON object, if its
    /// partition key is longer than [`MAX_PARTITION_KEY_BYTES`], or if its
    /// type's [`DomainEvent::HEADERS`] cannot be sent.
    pub fn from_event<E: DomainEvent>(event: &E) -> Result<Self, Error> {
        // The derive checks static headers at compile time; a hand-written
        // `DomainEvent` impl's are checked here.
        let record = Self::without_header_check(event)?;
        record.check_headers::<E>()?;
        Ok(record)
    }

    fn without_header_check<E: DomainEvent>(event: &E) -> Result<Self, Error> {
        let mut payload = serde_json::to_value(event).map_err(|source| Error::Serialize {
            event_type: E::EVENT_TYPE,
            source,
        })?;
        let Value::Object(map) = &mut payload else {
            return Err(Error::PayloadNotObject {
                event_type: E::EVENT_TYPE,
                found: json_kind(&payload),
            });
        };
        let partition_key = event.partition_key();
        check_partition_key(E::EVENT_TYPE, &partition_key)?;
        // Receivers written in any language dedup on payload["event_id"], so it is
        // always present, even if serde renamed or skipped the field.
        let event_id = event.event_id();
        map.entry(wire::PAYLOAD_EVENT_ID)
            .or_insert_with(|| Value::String(event_id.to_string()));
        // Readers of the value alone (the seed's consumer) tell the events of
        // one topic apart by payload["event_type"].
        match map.get(wire::PAYLOAD_EVENT_TYPE) {
            None => {
                map.insert(wire::PAYLOAD_EVENT_TYPE.into(), E::EVENT_TYPE.into());
            }
            Some(Value::String(name)) if name == E::EVENT_TYPE => {}
            Some(other) => {
                let mut found = other.to_string();
                if let Some((end, _)) = found.char_indices().nth(64) {
                    found.truncate(end);
                    found.push_str("...");
                }
                return Err(Error::ReservedPayloadField {
                    event_type: E::EVENT_TYPE,
                    field: wire::PAYLOAD_EVENT_TYPE,
                    found,
                });
            }
        }
        Ok(Self {
            event_id,
            aggregate_type: E::AGGREGATE_TYPE.to_owned(),
            aggregate_id: event.aggregate_id(),
            event_type: E::EVENT_TYPE.to_owned(),
            payload,
            topic: E::TOPIC.to_owned(),
            partition_key,
            traceparent: trace::current_traceparent(),
            headers: E::HEADERS
                .iter()
                .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
                .collect(),
        })
    }

    /// [`from_event`](Self::from_event) with `headers` after the event
    /// type's own, all checked together
    /// ([`wire::user_headers_problem`]): fails with
    /// [`Error::InvalidHeaders`] if they cannot be sent.
    pub fn from_event_with_headers<E: DomainEvent>(
        event: &E,
        headers: Vec<(String, String)>,
    ) -> Result<Self, Error> {
        let mut record = Self::without_header_check(event)?;
        record.headers.extend(headers);
        record.check_headers::<E>()?;
        Ok(record)
    }

    /// Refuses headers [`wire::user_headers_problem`] refuses (none is fine).
    fn check_headers<E: DomainEvent>(&self) -> Result<(), Error> {
        if self.headers.is_empty() {
            return Ok(());
        }
        if let Some(problem) = wire::user_headers_problem(
            self.headers
                .iter()
                .map(|(name, value)| (name.as_str(), value.as_str())),
        ) {
            return Err(Error::InvalidHeaders {
                event_type: E::EVENT_TYPE,
                problem,
            });
        }
        Ok(())
    }
}

/// Refuses a partition key longer than [`MAX_PARTITION_KEY_BYTES`].
fn check_partition_key(event_type: &'static str, key: &str) -> Result<(), Error> {
    if key.len() > MAX_PARTITION_KEY_BYTES {
        return Err(Error::PartitionKeyTooLong {
            event_type,
            len: key.len(),
            max: MAX_PARTITION_KEY_BYTES,
        });
    }
    Ok(())
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
