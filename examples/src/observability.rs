//! What an operator scrapes and probes on both example services:
//!
//! - `GET /metrics`: the framework's metrics (and anything else recorded
//!   through the `metrics` facade) in the Prometheus text format, rendered by
//!   `metrics-exporter-prometheus`;
//! - `GET /health/live`: 200 while the relay and every consumer task run, 503
//!   naming the task once one has ended (restart the process);
//! - `GET /health/ready`: 200 while the database answers and the outbox is
//!   within the configured thresholds, 503 naming the database error or each
//!   exceeded threshold (send no traffic). The thresholds are those of
//!   `outbox status --max-*`, checked by the same code
//!   ([`Thresholds::check`]).

use std::sync::OnceLock;
use std::time::Duration;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use serde::Serialize;
use serde_json::json;
use sqlx::Pool;
use txoutbox_runtime::ops::status::{self, Breach, Thresholds};
use txoutbox_runtime::relay::telemetry;
use txoutbox_runtime::service::ServiceStatus;

use crate::database::ExampleDatabase;

/// Bucket bounds (seconds) of `outbox_relay_batch_duration_seconds`: from a
/// quick local batch to the relay's default delivery timeout (30 s).
pub const BATCH_DURATION_BUCKETS: [f64; 14] = [
    0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Bucket bounds (rows) of `outbox_relay_batch_size`, up to the largest
/// sensible `batch_size`.
pub const BATCH_SIZE_BUCKETS: [f64; 10] = [
    1.0, 5.0, 10.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0,
];

/// The process's Prometheus exporter: installed as the global `metrics`
/// recorder on first use, then shared by every service of the process.
///
/// The relay's histograms get buckets ([`BATCH_DURATION_BUCKETS`],
/// [`BATCH_SIZE_BUCKETS`]) so that they are exported as Prometheus
/// histograms (`_bucket`, `_sum`, `_count`), which aggregate across
/// instances, rather than as summaries. Counters keep their names (they
/// already end in `_total`). A thread runs the exporter's upkeep every 5 s.
///
/// If the process already has another recorder (a test's), that one keeps
/// recording and `/metrics` shows nothing; this is logged.
pub fn prometheus() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full(telemetry::BATCH_DURATION.to_owned()),
                    &BATCH_DURATION_BUCKETS,
                )
                .and_then(|builder| {
                    builder.set_buckets_for_metric(
                        Matcher::Full(telemetry::BATCH_SIZE.to_owned()),
                        &BATCH_SIZE_BUCKETS,
                    )
                })
                .expect("the bucket lists are not empty")
                .build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!(
                    "another metrics recorder is installed in this process: /metrics stays empty"
                );
            }
            let upkeep = handle.clone();
            std::thread::Builder::new()
                .name("metrics-upkeep".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(Duration::from_secs(5));
                        upkeep.run_upkeep();
                    }
                })
                .expect("spawn the metrics upkeep thread");
            handle
        })
        .clone()
}

/// How a service's background tasks are doing, for `/health/live`: the
/// [`ServiceStatus`] of its relay and consumers.
#[derive(Debug, Clone, Default)]
pub struct Liveness {
    status: Option<ServiceStatus>,
}

/// One watched task, as `/health/live` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TaskState {
    /// `relay` or `consumer <group>`.
    pub task: String,
    /// Whether it still runs.
    pub running: bool,
    /// How it ended, if it has (`failed: <reason>` or `stopped on request`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
}

impl Liveness {
    /// Nothing watched (always live).
    pub fn new() -> Self {
        Self::default()
    }

    /// Watches the tasks of a service.
    pub fn of(status: ServiceStatus) -> Self {
        Self {
            status: Some(status),
        }
    }

    /// Every watched task with its state.
    pub fn tasks(&self) -> Vec<TaskState> {
        let Some(status) = &self.status else {
            return Vec::new();
        };
        status
            .tasks()
            .into_iter()
            .map(|task| TaskState {
                task: task.name,
                running: task.stopped.is_none(),
                stopped: task.stopped.map(|s| s.to_string()),
            })
            .collect()
    }

    /// Whether every watched task still runs.
    pub fn is_live(&self) -> bool {
        self.status.as_ref().is_none_or(ServiceStatus::is_live)
    }
}

/// When `/health/ready` answers 503.
#[derive(Debug, Clone)]
pub struct Readiness {
    /// Limits on the service's outbox and inbox, as `outbox status --max-*`.
    pub thresholds: Thresholds,
    /// The longest the probe waits for the database before it reports it
    /// unreachable.
    pub timeout: Duration,
}

impl Default for Readiness {
    /// At most 10,000 unpublished events, none older than 60 s; the other
    /// thresholds off; 2 s for the database to answer.
    fn default() -> Self {
        Self {
            thresholds: Thresholds {
                max_backlog: Some(10_000),
                max_age: Some(Duration::from_secs(60)),
                ..Thresholds::default()
            },
            timeout: Duration::from_secs(2),
        }
    }
}

/// A readiness setting of the environment that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("{variable}={value:?}: {reason}")]
pub struct ReadinessConfigError {
    variable: &'static str,
    value: String,
    reason: String,
}

impl Readiness {
    /// The defaults, overridden by `READY_MAX_BACKLOG`, `READY_MAX_AGE`,
    /// `READY_MAX_PARKED`, `READY_MAX_INBOX_BACKLOG`, `READY_MAX_INBOX_AGE`
    /// (counts, or durations such as `30s` / `5m`; `off` disables one) and
    /// `READY_TIMEOUT` (a duration).
    pub fn from_env() -> Result<Self, ReadinessConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// [`from_env`](Self::from_env) with another source of variables.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ReadinessConfigError> {
        let mut ready = Self::default();
        let t = &mut ready.thresholds;
        override_count(&lookup, "READY_MAX_BACKLOG", &mut t.max_backlog)?;
        override_duration(&lookup, "READY_MAX_AGE", &mut t.max_age)?;
        override_count(&lookup, "READY_MAX_PARKED", &mut t.max_parked)?;
        override_count(&lookup, "READY_MAX_INBOX_BACKLOG", &mut t.max_inbox_backlog)?;
        override_duration(&lookup, "READY_MAX_INBOX_AGE", &mut t.max_inbox_age)?;
        let mut timeout = Some(ready.timeout);
        override_duration(&lookup, "READY_TIMEOUT", &mut timeout)?;
        ready.timeout = timeout.unwrap_or(ready.timeout);
        Ok(ready)
    }
}

fn override_count(
    lookup: &impl Fn(&str) -> Option<String>,
    variable: &'static str,
    limit: &mut Option<i64>,
) -> Result<(), ReadinessConfigError> {
    override_with(lookup, variable, limit, |text| {
        text.parse::<i64>()
            .ok()
            .filter(|n| *n >= 0)
            .ok_or_else(|| "expected a count (0 or more) or `off`".to_owned())
    })
}

fn override_duration(
    lookup: &impl Fn(&str) -> Option<String>,
    variable: &'static str,
    limit: &mut Option<Duration>,
) -> Result<(), ReadinessConfigError> {
    override_with(lookup, variable, limit, |text| {
        humantime::parse_duration(text)
            .map_err(|e| format!("expected a duration such as `30s` or `5m`, or `off` ({e})"))
    })
}

fn override_with<T>(
    lookup: &impl Fn(&str) -> Option<String>,
    variable: &'static str,
    limit: &mut Option<T>,
    parse: impl Fn(&str) -> Result<T, String>,
) -> Result<(), ReadinessConfigError> {
    let Some(value) = lookup(variable) else {
        return Ok(());
    };
    let text = value.trim();
    if text.is_empty() {
        return Ok(());
    }
    if text.eq_ignore_ascii_case("off") {
        *limit = None;
        return Ok(());
    }
    *limit = Some(parse(text).map_err(|reason| ReadinessConfigError {
        variable,
        value: value.clone(),
        reason,
    })?);
    Ok(())
}

/// What `/metrics` and `/health/*` need.
struct Probes<DB: sqlx::Database> {
    pool: Pool<DB>,
    liveness: Liveness,
    readiness: Readiness,
    metrics: PrometheusHandle,
}

// Not derived: that would ask `DB: Clone` of the database's marker type.
impl<DB: sqlx::Database> Clone for Probes<DB> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            liveness: self.liveness.clone(),
            readiness: self.readiness.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

/// `/metrics`, `/health/live` and `/health/ready` of a service whose
/// framework tables live in `pool` (a `PgPool` or a `MySqlPool`).
pub fn router<DB: ExampleDatabase>(
    pool: Pool<DB>,
    liveness: Liveness,
    readiness: Readiness,
    metrics: PrometheusHandle,
) -> Router {
    Router::new()
        .route("/metrics", get(scrape::<DB>))
        .route("/health/live", get(live::<DB>))
        .route("/health/ready", get(ready::<DB>))
        .with_state(Probes {
            pool,
            liveness,
            readiness,
            metrics,
        })
}

async fn scrape<DB: ExampleDatabase>(State(probes): State<Probes<DB>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        probes.metrics.render(),
    )
        .into_response()
}

async fn live<DB: ExampleDatabase>(State(probes): State<Probes<DB>>) -> Response {
    let tasks = probes.liveness.tasks();
    let live = tasks.iter().all(|task| task.running);
    let status = if live {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = json!({ "status": if live { "live" } else { "dead" }, "tasks": tasks });
    (status, Json(body)).into_response()
}

/// The body of `/health/ready`.
#[derive(Debug, Serialize)]
struct ReadyBody {
    status: &'static str,
    /// Set when the database did not answer (or the status query failed).
    #[serde(skip_serializing_if = "Option::is_none")]
    database: Option<String>,
    breaches: Vec<Breach>,
    #[serde(skip_serializing_if = "Option::is_none")]
    outbox_pending: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    outbox_oldest_pending_age_secs: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    inbox_pending: Option<i64>,
}

async fn ready<DB: ExampleDatabase>(State(probes): State<Probes<DB>>) -> Response {
    let Readiness {
        thresholds,
        timeout,
    } = probes.readiness;
    let mut body = ReadyBody {
        status: "not ready",
        database: None,
        breaches: Vec::new(),
        outbox_pending: None,
        outbox_oldest_pending_age_secs: None,
        inbox_pending: None,
    };
    match tokio::time::timeout(timeout, status::collect(DB::ops_database(&probes.pool), 0)).await {
        Err(_elapsed) => {
            body.database = Some(format!(
                "unreachable: no answer within {}",
                humantime::format_duration(timeout)
            ));
        }
        Ok(Err(error)) => body.database = Some(format!("unreachable: {error}")),
        Ok(Ok(status)) => {
            body.breaches = thresholds.check(&status);
            body.outbox_pending = Some(status.outbox.pending);
            body.outbox_oldest_pending_age_secs = status.outbox.oldest_pending_age_secs;
            body.inbox_pending = Some(status.inbox.pending);
            if body.breaches.is_empty() {
                body.status = "ready";
            }
        }
    }
    let code = if body.status == "ready" {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_reads_the_environment() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(key, _)| *key == name)
                    .map(|(_, value)| (*value).to_owned())
            }
        };
        let default = Readiness::from_lookup(vars(&[])).unwrap();
        assert_eq!(default.thresholds.max_backlog, Some(10_000));
        assert_eq!(default.thresholds.max_age, Some(Duration::from_secs(60)));
        assert_eq!(default.thresholds.max_parked, None);

        let set = Readiness::from_lookup(vars(&[
            ("READY_MAX_BACKLOG", "off"),
            ("READY_MAX_AGE", "5m"),
            ("READY_MAX_PARKED", "0"),
            ("READY_MAX_INBOX_AGE", "90s"),
            ("READY_TIMEOUT", "500ms"),
        ]))
        .unwrap();
        assert_eq!(set.thresholds.max_backlog, None);
        assert_eq!(set.thresholds.max_age, Some(Duration::from_secs(300)));
        assert_eq!(set.thresholds.max_parked, Some(0));
        assert_eq!(set.thresholds.max_inbox_age, Some(Duration::from_secs(90)));
        assert_eq!(set.timeout, Duration::from_millis(500));

        let error = Readiness::from_lookup(vars(&[("READY_MAX_BACKLOG", "-3")])).unwrap_err();
        assert!(
            error.to_string().starts_with("READY_MAX_BACKLOG=\"-3\""),
            "{error}"
        );
        let error = Readiness::from_lookup(vars(&[("READY_MAX_AGE", "soon")])).unwrap_err();
        assert!(error.to_string().contains("duration"), "{error}");
    }
}
