//! Text and JSON output helpers.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::error::CliError;

/// Prints `value` as pretty JSON on stdout.
pub(crate) fn json<T: Serialize>(value: &T) -> Result<(), CliError> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| CliError::Failed(format!("cannot render JSON: {e}")))?;
    println!("{text}");
    Ok(())
}

/// Renders rows as left-aligned columns separated by two spaces.
pub(crate) fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}  ", width = widths[c]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `2026-11-30T09:00:00Z`.
pub(crate) fn time(time: DateTime<Utc>) -> String {
    time.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// An age in whole seconds, e.g. `5m 3s`.
pub(crate) fn age(seconds: f64) -> String {
    humantime::format_duration(Duration::from_secs(seconds.max(0.0) as u64)).to_string()
}

/// A byte count with a binary unit, e.g. `4.1 MiB`.
pub(crate) fn bytes(n: i64) -> String {
    let mut value = n as f64;
    for unit in ["B", "KiB", "MiB", "GiB", "TiB"] {
        if value < 1024.0 || unit == "TiB" {
            return if unit == "B" {
                format!("{n} B")
            } else {
                format!("{value:.1} {unit}")
            };
        }
        value /= 1024.0;
    }
    unreachable!("the loop returns at the last unit")
}

/// An error message cut to its first line and at most `max` characters.
pub(crate) fn short(text: Option<&str>, max: usize) -> String {
    let text = text.unwrap_or("").lines().next().unwrap_or("");
    if text.chars().count() > max {
        format!("{}…", text.chars().take(max).collect::<String>())
    } else {
        text.to_owned()
    }
}

/// `1 row`, `2 rows`.
pub(crate) fn plural(n: impl Into<i64>, noun: &str) -> String {
    let n = n.into();
    if n == 1 {
        format!("{n} {noun}")
    } else {
        format!("{n} {noun}s")
    }
}
