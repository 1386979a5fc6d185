//! What the dashboard queries, what the docs document and what the runtime
//! defines, read from the repository's files.
#![allow(dead_code)] // each test binary uses part of it

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use promql_parser::parser::{self, Expr};
use txoutbox_runtime::consumer::telemetry as consumer;
use txoutbox_runtime::lifecycle::TASKS_FAILED;
use txoutbox_runtime::relay::telemetry as relay;

/// The Grafana dashboard shipped with the repository.
pub(crate) const DASHBOARD: &str = "docs/grafana/outbox-dashboard.json";

/// A file of the workspace.
pub(crate) fn workspace_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the examples crate lives in the workspace")
        .join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(workspace_file(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A metric's kind, as the docs' tables name it and the exporter's `# TYPE`
/// lines say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn parse(text: &str) -> Option<Self> {
        match text.trim() {
            "counter" => Some(Self::Counter),
            "gauge" => Some(Self::Gauge),
            "histogram" => Some(Self::Histogram),
            _ => None,
        }
    }
}

/// Every metric name the runtime defines as a constant, imported (so the
/// list cannot name a constant that does not exist).
pub(crate) fn framework_constants() -> BTreeSet<&'static str> {
    [
        relay::BACKLOG,
        relay::OLDEST_UNPUBLISHED_AGE,
        relay::PUBLISHED,
        relay::PARKED,
        relay::ERRORS,
        relay::CLAIMS,
        relay::BATCH_SIZE,
        relay::BATCH_DURATION,
        relay::LANES_OWNED,
        relay::UNAVAILABLE_PARTITIONS,
        relay::HELD_BACK,
        relay::HELD_TOPICS,
        relay::TOPIC_REFUSALS,
        relay::STRAGGLING,
        relay::MEMBERS_EVICTED,
        relay::BROKER_FAILING,
        relay::SCHEDULED_MOVED,
        relay::SCHEDULED_PENDING,
        consumer::CONSUMED,
        consumer::HANDLED,
        consumer::DUPLICATES,
        consumer::HANDLER_ERRORS,
        consumer::DEAD_LETTERED,
        consumer::DEAD_LETTERS_PARKED,
        consumer::HANDLER_TIMEOUTS,
        consumer::PARTITIONS_BACKING_OFF,
        consumer::BATCHES_IN_FLIGHT,
        consumer::UNKNOWN_SKIPPED,
        consumer::DB_ERRORS,
        consumer::INBOX_STORED,
        consumer::INBOX_PARKED,
        consumer::INBOX_STORE_WAITS,
        consumer::INBOX_BACKLOG,
        consumer::LAG,
        consumer::INBOX_PARKED_ROWS,
        consumer::INBOX_UNCLAIMED_KEYS,
        consumer::OFFSET_GAPS,
        TASKS_FAILED,
    ]
    .into_iter()
    .collect()
}

/// The values of every `pub const NAME: &str = "outbox_..."` in the
/// runtime's metric-name modules, read from the source: catches a constant
/// added there but missing from [`framework_constants`].
pub(crate) fn constants_in_source() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for path in [
        "outbox-runtime/src/relay/telemetry.rs",
        "outbox-runtime/src/consumer/telemetry.rs",
        "outbox-runtime/src/lifecycle/mod.rs",
    ] {
        for line in read(path).lines() {
            let line = line.trim();
            if line.starts_with("pub const ")
                && line.contains(": &str = \"outbox_")
                && let Some(value) = line.split('"').nth(1)
            {
                names.insert(value.to_owned());
            }
        }
    }
    names
}

/// The rows of the metric tables in `docs/relay.md` and `docs/consumer.md`:
/// name (without its `{labels}`) and kind.
pub(crate) fn documented() -> BTreeMap<String, Kind> {
    let mut documented = BTreeMap::new();
    for path in ["docs/relay.md", "docs/consumer.md"] {
        for line in read(path).lines() {
            let Some(row) = line.strip_prefix("| `outbox_") else {
                continue;
            };
            let cells: Vec<&str> = row.split(" | ").collect();
            let name = format!("outbox_{}", cells[0].trim_end_matches('`'));
            let name = name.split('{').next().unwrap().to_owned();
            let kind = Kind::parse(cells[1])
                .unwrap_or_else(|| panic!("{path}: no kind for {name} in `{line}`"));
            assert!(
                documented.insert(name.clone(), kind).is_none(),
                "{name} documented twice"
            );
        }
    }
    documented
}

/// How a query uses a series.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Use {
    /// The current value (`metric{...}`, aggregated or not).
    Instant,
    /// The per-second rate or increase of a counter: `rate`, `irate`,
    /// `increase` over a range.
    Rate,
    /// Another function over a range (`max_over_time`, ...).
    OverTime,
    /// Named by Grafana's `label_values(metric, label)` in a variable.
    Labels,
}

/// Every series name the dashboard queries (as exported: histograms with
/// their `_bucket` / `_sum` / `_count` suffix), with how it is used, from
/// every panel target and every query variable.
pub(crate) fn queried() -> BTreeMap<String, BTreeSet<Use>> {
    let dashboard: serde_json::Value =
        serde_json::from_str(&read(DASHBOARD)).expect("the dashboard is JSON");
    let mut queried: BTreeMap<String, BTreeSet<Use>> = BTreeMap::new();
    for expr in panel_exprs(&dashboard) {
        let parsed = parser::parse(&grafana_to_promql(&expr))
            .unwrap_or_else(|e| panic!("the dashboard's query `{expr}` is not PromQL: {e}"));
        selectors(&parsed, None, &mut |name, usage| {
            queried.entry(name).or_default().insert(usage);
        });
    }
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if variable["type"] != "query" {
            continue;
        }
        let query = variable["query"]["query"]
            .as_str()
            .or(variable["query"].as_str())
            .expect("a query variable has a query");
        let metric = query
            .strip_prefix("label_values(")
            .and_then(|rest| rest.split(',').next())
            .unwrap_or_else(|| {
                panic!("variable query `{query}` is not label_values(metric, label)")
            });
        queried
            .entry(metric.trim().to_owned())
            .or_default()
            .insert(Use::Labels);
    }
    queried
}

/// The `expr` of every target of every panel, rows' nested panels included.
pub(crate) fn panel_exprs(dashboard: &serde_json::Value) -> Vec<String> {
    fn walk(panels: &serde_json::Value, out: &mut Vec<String>) {
        for panel in panels.as_array().into_iter().flatten() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                out.push(
                    target["expr"]
                        .as_str()
                        .unwrap_or_else(|| panic!("a target without expr: {target}"))
                        .to_owned(),
                );
            }
            walk(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// Grafana's interval variables replaced by durations, so that the query
/// parses as PromQL (`$job` only appears inside label matcher strings).
fn grafana_to_promql(expr: &str) -> String {
    expr.replace("$__rate_interval", "5m")
        .replace("$__interval", "1m")
        .replace("$__range", "1h")
}

fn selectors(expr: &Expr, function: Option<&str>, found: &mut impl FnMut(String, Use)) {
    match expr {
        Expr::VectorSelector(selector) => {
            found(selector.name.clone().expect("a named metric"), Use::Instant)
        }
        Expr::MatrixSelector(matrix) => {
            let usage = match function {
                Some("rate" | "irate" | "increase") => Use::Rate,
                _ => Use::OverTime,
            };
            found(matrix.vs.name.clone().expect("a named metric"), usage)
        }
        Expr::Call(call) => {
            for arg in &call.args.args {
                selectors(arg, Some(call.func.name), found);
            }
        }
        Expr::Aggregate(aggregate) => {
            selectors(&aggregate.expr, None, found);
            if let Some(param) = &aggregate.param {
                selectors(param, None, found);
            }
        }
        Expr::Binary(binary) => {
            selectors(&binary.lhs, None, found);
            selectors(&binary.rhs, None, found);
        }
        Expr::Paren(paren) => selectors(&paren.expr, function, found),
        Expr::Unary(unary) => selectors(&unary.expr, function, found),
        Expr::Subquery(subquery) => selectors(&subquery.expr, function, found),
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => {}
    }
}

/// The documented metric an exported series belongs to, with its kind: the
/// name itself, or a histogram's `_bucket` / `_sum` / `_count` series.
pub(crate) fn documented_metric<'a>(
    series: &str,
    documented: &'a BTreeMap<String, Kind>,
) -> Option<(&'a str, Kind)> {
    if let Some((name, kind)) = documented.get_key_value(series) {
        return Some((name, *kind));
    }
    ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
        let base = series.strip_suffix(suffix)?;
        match documented.get_key_value(base) {
            Some((name, Kind::Histogram)) => Some((name.as_str(), Kind::Histogram)),
            _ => None,
        }
    })
}

/// `# TYPE name kind` lines of a Prometheus text exposition.
pub(crate) fn exposition_types(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.strip_prefix("# TYPE ")?.split_whitespace();
            Some((words.next()?.to_owned(), words.next()?.to_owned()))
        })
        .collect()
}
