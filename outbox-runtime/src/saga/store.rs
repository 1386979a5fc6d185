//! What a saga step reads and writes in `saga_state`, and the database
//! each saga runs on ([`SagaDatabase`]); the statements are each
//! database's own (`postgres.rs`, `mysql.rs`).

use futures::future::BoxFuture;
use serde_json::{Map, Value};
use sqlx::Transaction;
use txoutbox_core::OutboxRecord;
use uuid::Uuid;

use super::SagaStatus;
use crate::consumer::{ConsumerDatabase, HandlerError};

/// A saga row as a step finds it. Not a public API.
#[doc(hidden)]
#[derive(Debug)]
pub struct Loaded {
    pub(super) status: SagaStatus,
    pub(super) state: Value,
    pub(super) version: i64,
    pub(super) compensations: Vec<OutboxRecord>,
}

/// What a step writes. Not a public API.
#[doc(hidden)]
#[derive(Debug)]
pub struct Write<'a> {
    pub(super) saga_type: &'a str,
    pub(super) saga_id: &'a str,
    pub(super) status: SagaStatus,
    pub(super) state: Value,
    pub(super) compensations: Value,
    pub(super) message_type: &'a str,
    pub(super) event_id: Uuid,
}

/// A database sagas keep their state in: [`Postgres`](sqlx::Postgres), or
/// `sqlx::MySql` with the feature `mysql` (MariaDB >= 10.6, MySQL
/// migration 0006). A saga runs on the database of the consumer it is
/// registered with; `#[saga]` reads it from the handlers' contexts
/// (`SagaContext<'_, MySql>`). Sealed, like [`ConsumerDatabase`].
pub trait SagaDatabase: ConsumerDatabase {
    /// Loads and locks one saga's row.
    #[doc(hidden)]
    fn load<'a>(
        tx: &'a mut Transaction<'static, Self>,
        saga_type: &'a str,
        saga_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Loaded>, HandlerError>>;

    /// Creates the saga's row (version 1). False if a concurrent step
    /// created it first (this one waited for that step's commit).
    #[doc(hidden)]
    fn insert<'a>(
        tx: &'a mut Transaction<'static, Self>,
        write: &'a Write<'a>,
    ) -> BoxFuture<'a, Result<bool, HandlerError>>;

    /// Writes a step's result over version `version` (the row is locked by
    /// [`load`](Self::load); the version check guards against anything that
    /// bypassed it).
    #[doc(hidden)]
    fn update<'a>(
        tx: &'a mut Transaction<'static, Self>,
        write: &'a Write<'a>,
        version: i64,
    ) -> BoxFuture<'a, Result<bool, HandlerError>>;

    /// Deletes a scheduled message that is not due yet.
    #[doc(hidden)]
    fn cancel_scheduled<'a>(
        tx: &'a mut Transaction<'static, Self>,
        event_id: Uuid,
    ) -> BoxFuture<'a, Result<bool, sqlx::Error>>;

    /// The open-saga gauges' figures of `sagas`: (name, open, seconds since
    /// the least recently changed open one moved).
    #[doc(hidden)]
    fn open_sagas<'a>(
        pool: &'a sqlx::Pool<Self>,
        sagas: &'a [&'static str],
    ) -> BoxFuture<'a, sqlx::Result<Vec<(String, i64, f64)>>>;
}

/// A stored status read back.
pub(super) fn status(
    saga_type: &str,
    saga_id: &str,
    status: &str,
) -> Result<SagaStatus, HandlerError> {
    SagaStatus::parse(status).ok_or_else(|| {
        HandlerError::new(format!(
            "saga {saga_type} `{saga_id}` has an unknown status `{status}`"
        ))
    })
}

/// Stored compensations read back.
pub(super) fn compensations(
    saga_type: &str,
    saga_id: &str,
    value: &Value,
) -> Result<Vec<OutboxRecord>, HandlerError> {
    json_to_records(value).map_err(|error| {
        HandlerError::new(format!(
            "the stored compensations of saga {saga_type} `{saga_id}` cannot be read: {error}"
        ))
    })
}

/// A failed write of a step's result whose transaction could no longer
/// commit (`unusable`): the step's handler swallowed a database error (the
/// write is the first statement after it), and the error says so.
pub(super) fn unusable_write(write: &Write<'_>, unusable: &txoutbox_core::Error) -> HandlerError {
    HandlerError::new(format!(
        "the `{}` step of saga {} `{}` returned Ok, but {unusable}",
        write.message_type, write.saga_type, write.saga_id
    ))
}

/// Outbox records as stored in `saga_state.compensations`.
pub(crate) fn records_to_json(records: &[OutboxRecord]) -> Value {
    Value::Array(
        records
            .iter()
            .map(|r| {
                let mut object = Map::new();
                object.insert("event_id".into(), Value::String(r.event_id.to_string()));
                object.insert("aggregate_type".into(), r.aggregate_type.clone().into());
                object.insert("aggregate_id".into(), r.aggregate_id.clone().into());
                object.insert("event_type".into(), r.event_type.clone().into());
                object.insert("topic".into(), r.topic.clone().into());
                object.insert("partition_key".into(), r.partition_key.clone().into());
                object.insert(
                    "traceparent".into(),
                    r.traceparent.clone().map_or(Value::Null, Value::String),
                );
                object.insert("payload".into(), r.payload.clone());
                if !r.headers.is_empty() {
                    // Pairs, not an object: the order is kept.
                    object.insert(
                        "headers".into(),
                        Value::Array(
                            r.headers
                                .iter()
                                .map(|(n, v)| Value::from(vec![n.as_str(), v.as_str()]))
                                .collect(),
                        ),
                    );
                }
                Value::Object(object)
            })
            .collect(),
    )
}

/// The inverse of [`records_to_json`].
pub(crate) fn json_to_records(value: &Value) -> Result<Vec<OutboxRecord>, String> {
    let Value::Array(items) = value else {
        return Err("not a JSON array".into());
    };
    items
        .iter()
        .map(|item| {
            let text = |name: &str| -> Result<String, String> {
                item.get(name)
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .ok_or_else(|| format!("a compensation has no text `{name}`"))
            };
            Ok(OutboxRecord {
                event_id: text("event_id")?
                    .parse()
                    .map_err(|e| format!("a compensation's event_id: {e}"))?,
                aggregate_type: text("aggregate_type")?,
                aggregate_id: text("aggregate_id")?,
                event_type: text("event_type")?,
                topic: text("topic")?,
                partition_key: text("partition_key")?,
                traceparent: item
                    .get("traceparent")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                payload: item
                    .get("payload")
                    .cloned()
                    .ok_or("a compensation has no `payload`")?,
                headers: match item.get("headers") {
                    None | Some(Value::Null) => Vec::new(),
                    Some(Value::Array(pairs)) => pairs
                        .iter()
                        .map(|pair| match pair.as_array().map(Vec::as_slice) {
                            Some([Value::String(n), Value::String(v)]) => {
                                Ok((n.clone(), v.clone()))
                            }
                            _ => Err("a compensation's header is not a [name, value] pair"),
                        })
                        .collect::<Result<_, _>>()?,
                    Some(_) => return Err("a compensation's `headers` is not an array".into()),
                },
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compensations_round_trip() {
        let record = OutboxRecord {
            event_id: Uuid::from_u128(7),
            aggregate_type: "Order".into(),
            aggregate_id: "o-1".into(),
            event_type: "ReleaseStock".into(),
            payload: serde_json::json!({"event_id": Uuid::from_u128(7), "qty": 2}),
            topic: "inventory.commands".into(),
            partition_key: "o-1".into(),
            traceparent: None,
            headers: Vec::new(),
        };
        let json = records_to_json(std::slice::from_ref(&record));
        assert_eq!(json_to_records(&json).unwrap(), vec![record.clone()]);
        let with_headers = OutboxRecord {
            headers: vec![("tenant".into(), "acme".into()), ("a".into(), "1".into())],
            ..record
        };
        let json = records_to_json(std::slice::from_ref(&with_headers));
        assert_eq!(json_to_records(&json).unwrap(), vec![with_headers]);
        assert!(json_to_records(&serde_json::json!([{
            "event_id": Uuid::nil(), "aggregate_type": "a", "aggregate_id": "b", "event_type": "c",
            "topic": "d", "partition_key": "e", "payload": {}, "headers": [["only-a-name"]]
        }]))
        .is_err());
        assert!(json_to_records(&serde_json::json!({})).is_err());
        assert!(json_to_records(&serde_json::json!([{"event_id": "x"}])).is_err());
    }
}
