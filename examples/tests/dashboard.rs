//! The Grafana dashboard (`docs/grafana/outbox-dashboard.json`) cannot rot:
//! every query parses as PromQL and queries only metrics the runtime defines
//! (its name constants) and the docs document, each used as its kind allows;
//! the constants, their source and the docs' tables agree; and the dashboard
//! shows what an operator needs. That the metrics are also emitted under
//! these names and types is checked against the exporter's real output in
//! `example_e2e.rs`.

mod support;

use std::collections::BTreeSet;

use support::dashboard::{
    DASHBOARD, Kind, Use, constants_in_source, documented, documented_metric, framework_constants,
    panel_exprs, queried, workspace_file,
};

#[test]
fn the_runtime_constants_and_the_docs_tables_agree() {
    let constants: BTreeSet<String> = framework_constants()
        .into_iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(
        constants,
        constants_in_source(),
        "a metric-name constant of the runtime is missing from the test's list"
    );
    let documented: BTreeSet<String> = documented().into_keys().collect();
    assert_eq!(
        constants, documented,
        "docs/relay.md and docs/consumer.md must document exactly the runtime's metrics"
    );
}

#[test]
fn every_dashboard_query_uses_a_documented_framework_metric_as_its_kind_allows() {
    let documented = documented();
    let constants = framework_constants();
    let queried = queried();
    assert!(!queried.is_empty());
    for (series, uses) in &queried {
        let (metric, kind) = documented_metric(series, &documented).unwrap_or_else(|| {
            panic!("the dashboard queries {series}, which no metric table in docs/ documents")
        });
        assert!(
            constants.contains(metric),
            "{metric} is documented but not a constant of the runtime"
        );
        let histogram_part = series != metric;
        for usage in uses {
            let fits = match (kind, usage) {
                (_, Use::Labels) => true,
                // A counter only means something as a rate or an increase.
                (Kind::Counter, Use::Rate) => true,
                (Kind::Counter, _) => false,
                (Kind::Gauge, Use::Instant | Use::OverTime) => true,
                (Kind::Gauge, Use::Rate) => false,
                // A histogram is queried through its series, as counters.
                (Kind::Histogram, Use::Rate) => histogram_part,
                (Kind::Histogram, _) => false,
            };
            assert!(
                fits,
                "{series} ({kind:?}) is used as {usage:?} in the dashboard"
            );
        }
    }
}

#[test]
fn the_dashboard_shows_what_an_operator_needs() {
    use txoutbox_runtime::consumer::telemetry as consumer;
    use txoutbox_runtime::relay::telemetry as relay;

    let documented = documented();
    let shown: BTreeSet<&str> = queried()
        .keys()
        .filter_map(|series| documented_metric(series, &documented).map(|(name, _)| name))
        .collect();
    for needed in [
        relay::BACKLOG,
        relay::OLDEST_UNPUBLISHED_AGE,
        relay::PUBLISHED,
        relay::BATCH_DURATION,
        relay::PARKED,
        relay::UNAVAILABLE_PARTITIONS,
        relay::BROKER_FAILING,
        relay::HELD_TOPICS,
        consumer::LAG,
        consumer::HANDLED,
        consumer::DEAD_LETTERED,
        consumer::INBOX_PARKED,
        consumer::INBOX_PARKED_ROWS,
        consumer::INBOX_BACKLOG,
        consumer::INBOX_UNCLAIMED_KEYS,
        txoutbox_runtime::lifecycle::TASKS_FAILED,
    ] {
        assert!(
            shown.contains(needed),
            "the dashboard does not show {needed}"
        );
    }
    // Batch latency is shown as quantiles of the histogram's buckets.
    assert!(
        panel_exprs(&dashboard())
            .iter()
            .any(|expr| expr.contains("histogram_quantile(0.99")
                && expr.contains(&format!("{}_bucket", relay::BATCH_DURATION))),
        "no p99 batch latency panel"
    );
}

#[test]
fn the_dashboard_is_an_importable_grafana_dashboard() {
    let dashboard = dashboard();
    assert!(dashboard["title"].is_string() && dashboard["uid"].is_string());
    assert!(dashboard["schemaVersion"].as_u64().unwrap() >= 36);
    let variables: BTreeSet<&str> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert!(variables.contains("datasource") && variables.contains("job"));
    let mut ids = BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        let title = panel["title"].as_str().unwrap();
        assert!(
            ids.insert(panel["id"].as_u64().unwrap()),
            "duplicate panel id ({title})"
        );
        let grid = &panel["gridPos"];
        assert!(
            grid["x"].as_u64().unwrap() + grid["w"].as_u64().unwrap() <= 24,
            "{title} is wider than the dashboard"
        );
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title} has no query");
        let ref_ids: BTreeSet<&str> = targets
            .iter()
            .map(|t| t["refId"].as_str().unwrap())
            .collect();
        assert_eq!(ref_ids.len(), targets.len(), "{title}: duplicate refId");
        for target in targets {
            let expr = target["expr"].as_str().unwrap();
            assert!(
                expr.contains("job=~\"$job\""),
                "{title}: `{expr}` ignores $job"
            );
        }
    }
}

fn dashboard() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(workspace_file(DASHBOARD)).unwrap()).unwrap()
}
