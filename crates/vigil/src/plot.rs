//! `vigil simulate --plot out.svg`: one chart per check — healthy, unhealthy and remediating
//! counts over time, the short-circuit threshold as a line, remediation requests marked,
//! short-circuit periods shaded, and one lane per target when there are few.

use plotters::prelude::*;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use vigil_api::{GROUP, MachineHealthCheck, NodeHealthCheck, validate};
use vigil_engine::target::LOCAL_CLUSTER;
use vigil_simulator::Report;
use vigil_simulator::store::Key;

/// Targets shown as lanes only up to this many (beyond, lanes would be unreadable).
const MAX_LANES: usize = 12;
const WIDTH: u32 = 1100;
const CHART_HEIGHT: u32 = 320;
const LANE_HEIGHT: u32 = 22;
const LEFT: u32 = 130;

const HEALTHY: RGBColor = RGBColor(46, 139, 87);
const UNHEALTHY: RGBColor = RGBColor(200, 40, 40);
const REMEDIATING: RGBColor = RGBColor(230, 140, 0);
const THRESHOLD: RGBColor = RGBColor(60, 60, 60);
const BLOCKED: RGBColor = RGBColor(255, 205, 205);

/// A target's state in its lane.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    Healthy,
    Unhealthy,
    Remediating,
    Gone,
}

/// What one chart shows.
struct Series {
    label: String,
    /// (minute, healthy, total) at each status change.
    counts: Vec<(f64, i64, i64)>,
    /// (minute, most unhealthy targets the short-circuit allows) at each status change.
    threshold: Vec<(f64, f64)>,
    /// (from, to) minutes during which remediation was blocked.
    blocked: Vec<(f64, f64)>,
    /// Minutes of each remediation request.
    requests: Vec<f64>,
    /// Per target: (minute, state) changes.
    lanes: BTreeMap<String, Vec<(f64, State)>>,
}

fn minutes(t: f64) -> f64 {
    t / 60.0
}

fn check_object<'r>(report: &'r Report, label: &str) -> Option<&'r Value> {
    let (kind, rest) = label.split_once('/')?;
    let (namespace, name) = rest.split_once('/').unwrap_or(("", rest));
    report.store.get(&Key {
        cluster: LOCAL_CLUSTER.into(),
        group: GROUP.into(),
        kind: kind.into(),
        namespace: namespace.into(),
        name: name.into(),
    })
}

/// The most unhealthy targets of `total` the check's short-circuit allows (the engine's rule,
/// asked for each count), or `None` when it allows none or the check is invalid.
fn max_unhealthy(check: Option<&Value>, total: i64) -> Option<f64> {
    let check = check?;
    let total = usize::try_from(total).ok()?;
    let allowed: Box<dyn Fn(usize) -> bool> = match check["kind"].as_str()? {
        "MachineHealthCheck" => {
            let mhc: MachineHealthCheck = serde_json::from_value(check.clone()).ok()?;
            let sc = validate::machine_health_check(&mhc).ok()?.short_circuit;
            Box::new(move |u| vigil_engine::machine::remediation_budget(sc, total, u).0)
        }
        _ => {
            let nhc: NodeHealthCheck = serde_json::from_value(check.clone()).ok()?;
            let t = validate::node_health_check(&nhc).ok()?.threshold;
            Box::new(move |u| vigil_engine::node::threshold_met(t, total, total - u))
        }
    };
    (0..=total).rev().find(|u| allowed(*u)).map(|u| u as f64)
}

fn series(report: &Report) -> Vec<Series> {
    let mut out = Vec::new();
    for label in report.final_statuses.keys() {
        let is_mhc = label.starts_with("MachineHealthCheck/");
        let (healthy_key, total_key) =
            if is_mhc { ("currentHealthy", "expectedMachines") } else { ("healthyNodes", "observedNodes") };
        let check = check_object(report, label);
        let mut counts = Vec::new();
        let mut threshold = Vec::new();
        let mut lane_names: BTreeSet<String> = BTreeSet::new();
        // When each Machine first became a target (a replacement joins part-way through).
        let mut first_seen: BTreeMap<String, f64> = BTreeMap::new();
        for (t, _, status) in report.history.iter().filter(|(_, l, _)| l == label) {
            let total = status.get(total_key).and_then(Value::as_i64).unwrap_or(0);
            counts.push((minutes(*t), status.get(healthy_key).and_then(Value::as_i64).unwrap_or(0), total));
            if let Some(max) = max_unhealthy(check, total) {
                threshold.push((minutes(*t), max));
            }
            if is_mhc {
                let namespace = label.split('/').nth(1).unwrap_or("");
                for name in status.get("targets").and_then(Value::as_array).into_iter().flatten() {
                    let target = format!("{namespace}/{}", name.as_str().unwrap_or(""));
                    first_seen.entry(target.clone()).or_insert(minutes(*t));
                    lane_names.insert(target);
                }
            }
        }
        let mut blocked = Vec::new();
        let mut blocked_since: Option<f64> = None;
        let mut requests = Vec::new();
        let mut lanes: BTreeMap<String, Vec<(f64, State)>> = BTreeMap::new();
        for e in &report.events {
            let t = minutes(e.t);
            let mine = e.check.as_deref() == Some(label.as_str());
            match (mine, e.event.as_str()) {
                (true, "RemediationRestricted") => {
                    blocked_since.get_or_insert(t);
                }
                (true, "RemediationAllowed") => {
                    if let Some(from) = blocked_since.take() {
                        blocked.push((from, t));
                    }
                }
                _ => {}
            }
            let Some(target) = &e.target else { continue };
            let state = match (mine, e.event.as_str()) {
                (true, "MachineMarkedUnhealthy" | "DetectedUnhealthy") => State::Unhealthy,
                (true, "RemediationRequested" | "RemediationCreated") => {
                    requests.push(t);
                    State::Remediating
                }
                (true, "MachineHealthy" | "NodeHealthy") => State::Healthy,
                (false, "MachineReplaced") if lane_names.contains(target) => State::Gone,
                _ => continue,
            };
            if mine {
                lane_names.insert(target.clone());
            }
            lanes.entry(target.clone()).or_default().push((t, state));
        }
        if let Some(from) = blocked_since {
            blocked.push((from, minutes(report.end_t)));
        }
        let lanes = lane_names
            .into_iter()
            .map(|n| {
                let mut changes = lanes.remove(&n).unwrap_or_default();
                if let Some(t) = first_seen.get(&n).copied().filter(|t| *t > 0.0) {
                    changes.splice(0..0, [(0.0, State::Gone), (t, State::Healthy)]);
                }
                (n, changes)
            })
            .collect();
        out.push(Series { label: label.clone(), counts, threshold, blocked, requests, lanes });
    }
    out
}

/// Steps `(minute, value)` points into a staircase that holds each value until the next, up to `end`.
fn staircase(points: &[(f64, f64)], end: f64) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    for (i, (t, v)) in points.iter().enumerate() {
        if i > 0 {
            out.push((*t, points[i - 1].1));
        }
        out.push((*t, *v));
    }
    if let Some((_, v)) = points.last() {
        out.push((end, *v));
    }
    out
}

/// Remediating targets over time, from the lanes.
fn remediating(lanes: &BTreeMap<String, Vec<(f64, State)>>) -> Vec<(f64, f64)> {
    let mut changes: Vec<(f64, &str, State)> =
        lanes.iter().flat_map(|(n, ch)| ch.iter().map(move |(t, s)| (*t, n.as_str(), *s))).collect();
    changes.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut current: BTreeMap<&str, State> = BTreeMap::new();
    let mut out = vec![(0.0, 0.0)];
    for (t, name, state) in changes {
        current.insert(name, state);
        let n = current.values().filter(|s| **s == State::Remediating).count() as f64;
        out.push((t, n));
    }
    out
}

fn lane_colour(state: State) -> Option<RGBColor> {
    match state {
        State::Healthy => Some(HEALTHY),
        State::Unhealthy => Some(UNHEALTHY),
        State::Remediating => Some(REMEDIATING),
        State::Gone => None,
    }
}

/// Renders the run as an SVG document.
pub fn svg(report: &Report) -> Result<String, String> {
    let all = series(report);
    let end = minutes(report.end_t).max(f64::EPSILON);
    let heights: Vec<u32> = all
        .iter()
        .map(|s| {
            let lanes = if s.lanes.len() <= MAX_LANES { s.lanes.len() as u32 } else { 0 };
            CHART_HEIGHT + if lanes > 0 { lanes * LANE_HEIGHT + 30 } else { 0 }
        })
        .collect();
    let height = heights.iter().sum::<u32>().max(60);
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        if all.is_empty() {
            root.draw(&Text::new("no health checks in this scenario", (20, 30), ("sans-serif", 16)))
                .map_err(|e| e.to_string())?;
        }
        let mut rest = root.clone();
        for (s, h) in all.iter().zip(heights) {
            let (area, below) = rest.split_vertically(h);
            rest = below;
            draw_check(&area, s, end).map_err(|e| format!("{}: {e}", s.label))?;
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(buf)
}

type DrawResult = Result<(), DrawingAreaErrorKind<<SVGBackend<'static> as DrawingBackend>::ErrorType>>;

/// A drawing area of the SVG document.
type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// One check's chart: the counts over time, then one lane per target when there are few.
fn draw_check(area: &Area<'_>, s: &Series, end: f64) -> DrawResult {
    let (top, bottom) = area.split_vertically(CHART_HEIGHT);
    draw_counts(&top, s, end)?;
    if s.lanes.is_empty() || s.lanes.len() > MAX_LANES {
        return Ok(());
    }
    draw_lanes(&bottom, s, end)
}

/// Healthy, unhealthy and remediating counts, the short-circuit threshold and periods, the
/// remediation requests, and their legend.
fn draw_counts(top: &Area<'_>, s: &Series, end: f64) -> DrawResult {
    let ymax = s.counts.iter().map(|c| c.2).max().unwrap_or(1).max(1) as f64 + 1.0;
    let mut chart = ChartBuilder::on(top)
        .caption(&s.label, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(LEFT - 10)
        .build_cartesian_2d(0f64..end, 0f64..ymax)?;
    chart
        .configure_mesh()
        .x_desc("time (minutes since the start)")
        .y_desc("targets")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_labels(ymax as usize + 1)
        .y_label_formatter(&|y| if y.fract().abs() < 1e-9 { format!("{y:.0}") } else { String::new() })
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    if !s.blocked.is_empty() {
        chart
            .draw_series(
                s.blocked.iter().map(|(a, b)| Rectangle::new([(*a, 0.0), (*b, ymax)], BLOCKED.mix(0.6).filled())),
            )?
            .label("short-circuited (remediation blocked)")
            .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 18, y + 5)], BLOCKED.filled()));
    }
    let healthy: Vec<(f64, f64)> = s.counts.iter().map(|(t, h, _)| (*t, *h as f64)).collect();
    let unhealthy: Vec<(f64, f64)> = s.counts.iter().map(|(t, h, total)| (*t, (total - h) as f64)).collect();
    for (points, colour, name) in [
        (healthy, HEALTHY, "healthy"),
        (unhealthy, UNHEALTHY, "unhealthy"),
        (remediating(&s.lanes), REMEDIATING, "remediating"),
    ] {
        chart
            .draw_series(LineSeries::new(staircase(&points, end), colour.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(2)));
    }
    if !s.threshold.is_empty() {
        chart
            .draw_series(LineSeries::new(staircase(&s.threshold, end), THRESHOLD.stroke_width(1)))?
            .label("most unhealthy the short-circuit allows")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], THRESHOLD.stroke_width(1)));
    }
    if !s.requests.is_empty() {
        chart
            .draw_series(s.requests.iter().map(|t| TriangleMarker::new((*t, 0.0), 7, REMEDIATING.filled())))?
            .label("remediation requested")
            .legend(|(x, y)| TriangleMarker::new((x + 9, y), 6, REMEDIATING.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// One lane per target, coloured by its state over time.
fn draw_lanes(bottom: &Area<'_>, s: &Series, end: f64) -> DrawResult {
    let n = s.lanes.len() as f64;
    let mut lanes = ChartBuilder::on(bottom)
        .margin_left(10)
        .margin_right(10)
        .x_label_area_size(20)
        .y_label_area_size(LEFT - 10)
        .build_cartesian_2d(0f64..end, 0f64..n)?;
    lanes
        .configure_mesh()
        .disable_mesh()
        .disable_y_axis()
        .x_label_style(("sans-serif", 11))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()?;
    for (i, (name, changes)) in s.lanes.iter().enumerate() {
        let y = n - i as f64 - 1.0;
        let mut state = State::Healthy;
        let mut from = 0.0;
        let mut segments = Vec::new();
        for (t, next) in changes.iter().copied().chain(std::iter::once((end, State::Gone))) {
            if t > from
                && let Some(colour) = lane_colour(state)
            {
                segments.push(Rectangle::new([(from, y + 0.15), (t, y + 0.85)], colour.mix(0.75).filled()));
            }
            state = next;
            from = t;
        }
        lanes.draw_series(segments)?;
        lanes.draw_series(std::iter::once(Text::new(
            name.clone(),
            (0.0, y + 0.5),
            ("sans-serif", 13).into_font().color(&BLACK).pos(text_anchor_right()),
        )))?;
    }
    Ok(())
}

fn text_anchor_right() -> plotters::style::text_anchor::Pos {
    use plotters::style::text_anchor::{HPos, Pos, VPos};
    Pos::new(HPos::Right, VPos::Center)
}
