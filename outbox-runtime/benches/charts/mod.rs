//! SVG charts of the benches (plotters, SVG backend), embedded in
//! BENCHMARKS.md. Written to `target/bench-charts/` of the workspace, or to
//! `BENCH_CHARTS_DIR`: a run that should replace the committed charts sets it
//! to the workspace's `docs/benchmarks/`, so a local run never changes
//! tracked files by accident.
#![allow(dead_code)] // each bench draws some of the charts

use std::path::{Path, PathBuf};
use std::time::Duration;

use plotters::prelude::*;

/// Where the charts go.
pub(crate) fn dir() -> PathBuf {
    let dir = std::env::var_os("BENCH_CHARTS_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench-charts"),
        PathBuf::from,
    );
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    dir
}

/// `git describe --always --dirty` of the measured tree, for the charts'
/// captions ("unknown commit" outside a git checkout).
pub(crate) fn commit() -> String {
    txoutbox_testkit::measured_commit()
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(140, 86, 75),
];

const WIDTH: u32 = 1000;
const HEIGHT: u32 = 420;

/// The value at quantile `q` of sorted `values` (nearest rank).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Two panels of the same latency distributions: on the left the share of
/// events per 0.5 ms bin up to the largest p99, on the right the latency at
/// each percentile up to 99.9 % on a "nines" axis (the tail). Each series'
/// label carries its p50 and p99.
pub(crate) fn latency(
    file: &str,
    title: &str,
    caption: &str,
    series: &[(&str, &[Duration])],
) -> PathBuf {
    let path = dir().join(file);
    draw_latency(&path, title, caption, series);
    path
}

fn draw_latency(path: &Path, title: &str, caption: &str, series: &[(&str, &[Duration])]) {
    let series: Vec<(String, Vec<f64>)> = series
        .iter()
        .filter(|(_, values)| !values.is_empty())
        .map(|(label, values)| {
            let mut ms: Vec<f64> = values.iter().map(|d| d.as_secs_f64() * 1e3).collect();
            ms.sort_by(f64::total_cmp);
            let label = format!(
                "{label}: p50 {:.1} ms, p99 {:.1} ms",
                quantile(&ms, 0.50),
                quantile(&ms, 0.99)
            );
            (label, ms)
        })
        .collect();
    let root = SVGBackend::new(&path, (WIDTH, HEIGHT + 60)).into_drawing_area();
    root.fill(&WHITE).unwrap();
    let root = root.titled(title, ("sans-serif", 20)).unwrap();
    let (body, footer) = root.split_vertically(HEIGHT);
    footer
        .draw_text(
            caption,
            &("sans-serif", 13).into_text_style(&footer),
            (10, 5),
        )
        .unwrap();
    let panels = body.split_evenly((1, 2));

    // Left: histogram as lines, 0.5 ms bins.
    let bin = 0.5;
    let max_p99 = series
        .iter()
        .map(|(_, ms)| quantile(ms, 0.99))
        .fold(1.0, f64::max);
    let x_max = (max_p99 * 1.25 / bin).ceil() * bin;
    let bins = (x_max / bin) as usize;
    let shares: Vec<Vec<(f64, f64)>> = series
        .iter()
        .map(|(_, ms)| {
            let mut counts = vec![0usize; bins];
            for &v in ms {
                let index = (v / bin) as usize;
                if index < bins {
                    counts[index] += 1;
                }
            }
            counts
                .iter()
                .enumerate()
                .map(|(i, c)| ((i as f64 + 0.5) * bin, 100.0 * *c as f64 / ms.len() as f64))
                .collect()
        })
        .collect();
    let y_max = shares
        .iter()
        .flatten()
        .map(|(_, share)| *share)
        .fold(1.0, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(&panels[0])
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .unwrap();
    chart
        .configure_mesh()
        .x_desc("latency (ms)")
        .y_desc("events per 0.5 ms bin (%)")
        .draw()
        .unwrap();
    for (i, ((label, _), points)) in series.iter().zip(&shares).enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .unwrap()
            .label(label.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .draw()
        .unwrap();

    // Right: latency by percentile; x = -log10(1 - q), so 1 = 90 %, 2 = 99 %.
    let nines = |q: f64| -(1.0 - q).log10();
    let y_max = series
        .iter()
        .map(|(_, ms)| quantile(ms, 0.999))
        .fold(1.0, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(&panels[1])
        .margin(10)
        .margin_right(30)
        .x_label_area_size(35)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..3.0, 0.0..y_max)
        .unwrap();
    let percentile = |x: &f64| {
        let q = 100.0 * (1.0 - 10f64.powf(-x));
        format!("{}%", (q * 10.0).round() / 10.0)
    };
    chart
        .configure_mesh()
        .x_labels(4)
        .x_label_formatter(&percentile)
        .x_desc("percentile")
        .y_desc("latency (ms)")
        .draw()
        .unwrap();
    for (i, (_, ms)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let points = (0..=300).map(|step| {
            let x = step as f64 / 100.0;
            let q = 1.0 - 10f64.powf(-x);
            (nines(q), quantile(ms, q))
        });
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .unwrap();
    }
    root.present().unwrap();
}

/// Throughput over time: each series is `(seconds since its start, events
/// done so far)` samples, drawn as events per second over `window` (or an
/// eighth of the shortest series, if that is shorter). A series that runs
/// more than three times as long as all others is cut at 1.5 times the
/// next longest, its label saying how long it went on.
pub(crate) fn throughput(
    file: &str,
    title: &str,
    caption: &str,
    window: Duration,
    series: &[(String, Vec<(f64, f64)>)],
) -> PathBuf {
    let path = dir().join(file);
    draw_throughput(&path, title, caption, window, series);
    path
}

fn draw_throughput(
    path: &Path,
    title: &str,
    caption: &str,
    window: Duration,
    series: &[(String, Vec<(f64, f64)>)],
) {
    let mut ends: Vec<f64> = series
        .iter()
        .map(|(_, samples)| samples.last().map_or(0.0, |(t, _)| *t))
        .collect();
    let shortest = ends.iter().copied().fold(f64::INFINITY, f64::min);
    let window = window.as_secs_f64().min(shortest / 8.0).max(0.001);
    let rates: Vec<Vec<(f64, f64)>> = series
        .iter()
        .map(|(_, samples)| windowed_rate(samples, window))
        .collect();
    ends.sort_by(f64::total_cmp);
    let longest = ends.last().copied().unwrap_or(window);
    let next = ends.iter().rev().nth(1).copied().unwrap_or(longest);
    let x_max = if longest > 3.0 * next {
        1.5 * next
    } else {
        longest
    };
    let labels: Vec<String> = series
        .iter()
        .map(|(label, samples)| match samples.last() {
            Some((end, _)) if *end > x_max => format!("{label} (goes on to {end:.0} s)"),
            _ => label.clone(),
        })
        .collect();
    let y_max = rates
        .iter()
        .flatten()
        .map(|(_, rate)| *rate)
        .fold(1.0, f64::max)
        * 1.15;
    let root = SVGBackend::new(&path, (WIDTH, HEIGHT + 60)).into_drawing_area();
    root.fill(&WHITE).unwrap();
    let root = root.titled(title, ("sans-serif", 20)).unwrap();
    let (body, footer) = root.split_vertically(HEIGHT);
    footer
        .draw_text(
            caption,
            &("sans-serif", 13).into_text_style(&footer),
            (10, 5),
        )
        .unwrap();
    let mut chart = ChartBuilder::on(&body)
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .unwrap();
    chart
        .configure_mesh()
        .x_desc("seconds since the start")
        .y_desc(format!("events/s (over {} ms)", (window * 1e3).round()))
        .y_label_formatter(&|y| format!("{:.0}k", y / 1e3))
        .draw()
        .unwrap();
    for (i, (label, points)) in labels.iter().zip(rates).enumerate() {
        let color = COLORS[i % COLORS.len()];
        let points = points.into_iter().filter(|(t, _)| *t <= x_max);
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .unwrap()
            .label(label.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .draw()
        .unwrap();
    root.present().unwrap();
}

/// Events per second in consecutive windows of cumulative `(t, done)`
/// samples, each plotted at its window's middle.
fn windowed_rate(samples: &[(f64, f64)], window: f64) -> Vec<(f64, f64)> {
    let Some(&(end, _)) = samples.last() else {
        return Vec::new();
    };
    let done_at = |t: f64| {
        // The count at the last sample not after t.
        let index = samples.partition_point(|(at, _)| *at <= t);
        if index == 0 {
            0.0
        } else {
            samples[index - 1].1
        }
    };
    let mut points = Vec::new();
    let mut from = 0.0;
    while from < end {
        let to = (from + window).min(end);
        if to - from >= window / 2.0 {
            points.push((
                (from + to) / 2.0,
                (done_at(to) - done_at(from)) / (to - from),
            ));
        }
        from = to;
    }
    points
}
