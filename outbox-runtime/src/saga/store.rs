//! The saga steps' SQL on `saga_state`.

use serde_json::{Map, Value};
use sqlx::{PgConnection, Postgres, Transaction};
use txoutbox_core::OutboxRecord;
use uuid::Uuid;

use super::SagaStatus;
use crate::consumer::HandlerError;

/// A saga row as a step finds it.
pub(super) struct Loaded {
    pub status: SagaStatus,
    pub state: Value,
    pub version: i64,
    pub compensations: Vec<OutboxRecord>,
}

/// Loads and locks one saga's row.
pub(super) async fn load(
    conn: &mut PgConnection,
    saga_type: &str,
    saga_id: &str,
) -> Result<Option<Loaded>, HandlerError> {
    let row: Option<(String, Value, i64, Value)> = sqlx::query_as(
        "SELECT status, state, version, compensations FROM saga_state
         WHERE saga_type = $1 AND saga_id = $2
         FOR UPDATE",
    )
    .bind(saga_type)
    .bind(saga_id)
    .fetch_optional(conn)
    .await?;
    let Some((status, state, version, compensations)) = row else {
        return Ok(None);
    };
    let status = SagaStatus::parse(&status).ok_or_else(|| {
        HandlerError::new(format!(
            "saga {saga_type} `{saga_id}` has an unknown status `{status}`"
        ))
    })?;
    let compensations = json_to_records(&compensations).map_err(|error| {
        HandlerError::new(format!(
            "the stored compensations of saga {saga_type} `{saga_id}` cannot be read: {error}"
        ))
    })?;
    Ok(Some(Loaded {
        status,
        state,
        version,
        compensations,
    }))
}

/// What a step writes.
pub(super) struct Write<'a> {
    pub saga_type: &'a str,
    pub saga_id: &'a str,
    pub status: SagaStatus,
    pub state: Value,
    pub compensations: Value,
    pub message_type: &'a str,
    pub event_id: Uuid,
}

type Query<'q> = sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>;

impl Write<'_> {
    /// Binds the write as `$1` to `$7`: saga type and id, status, state,
    /// compensations, message type and event id (both statements below
    /// number them so).
    fn bind<'q>(&'q self, query: Query<'q>) -> Query<'q> {
        query
            .bind(self.saga_type)
            .bind(self.saga_id)
            .bind(self.status.as_str())
            .bind(&self.state)
            .bind(&self.compensations)
            .bind(self.message_type)
            .bind(self.event_id)
    }
}

/// Creates the saga's row (version 1). False if a concurrent step created it
/// first (this one waited for that step's commit).
pub(super) async fn insert(
    tx: &mut Transaction<'static, Postgres>,
    write: &Write<'_>,
) -> Result<bool, HandlerError> {
    let query = sqlx::query(
        "INSERT INTO saga_state
             (saga_type, saga_id, status, state, compensations, version,
              last_message_type, last_event_id, finished_at)
         VALUES ($1, $2, $3, $4, $5, 1, $6, $7, CASE WHEN $3 <> 'running' THEN now() END)
         ON CONFLICT (saga_type, saga_id) DO NOTHING",
    );
    let done = write
        .bind(query)
        .execute(&mut **tx)
        .await
        .map_err(|error| write_failed(write, error))?;
    Ok(done.rows_affected() == 1)
}

/// A failed write of a step's result: when the transaction could no longer
/// commit, the step's handler swallowed a database error (the write is the
/// first statement after it), and the error says so.
fn write_failed(write: &Write<'_>, error: sqlx::Error) -> HandlerError {
    match txoutbox_core::not_committable(&error) {
        Some(unusable) => HandlerError::new(format!(
            "the `{}` step of saga {} `{}` returned Ok, but {unusable}",
            write.message_type, write.saga_type, write.saga_id
        )),
        None => HandlerError::from(error),
    }
}

/// Writes a step's result over version `version` (the row is locked by
/// [`load`]; the version check guards against anything that bypassed it).
pub(super) async fn update(
    tx: &mut Transaction<'static, Postgres>,
    write: &Write<'_>,
    version: i64,
) -> Result<bool, HandlerError> {
    let query = sqlx::query(
        "UPDATE saga_state
         SET status = $3, state = $4, compensations = $5, version = version + 1,
             last_message_type = $6, last_event_id = $7, updated_at = now(),
             finished_at = CASE WHEN $3 <> 'running' THEN now() END
         WHERE saga_type = $1 AND saga_id = $2 AND version = $8",
    );
    let done = write
        .bind(query)
        .bind(version)
        .execute(&mut **tx)
        .await
        .map_err(|error| write_failed(write, error))?;
    Ok(done.rows_affected() == 1)
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
