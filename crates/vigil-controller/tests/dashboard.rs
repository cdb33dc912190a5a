//! The chart's Grafana dashboard (deploy/helm/vigil/dashboards/vigil.json) and Prometheus rule
//! files (rules/vigil.recording.yaml, alerts/vigil.rules.yaml): every PromQL expression in them
//! parses with Prometheus' own parser, and every metric they name is one a live `vigil run`
//! serves, so a renamed metric breaks the build, not the dashboard. Also how the chart renders
//! the dashboard (a ConfigMap for Grafana's sidecar, off by default).
//!
//! The parser is bench/promql-check (github.com/prometheus/prometheus), from
//! `VIGIL_PROMQL_CHECK` or scripts/promql-check.sh (built from its Go module, cached); helm from
//! `VIGIL_HELM` or scripts/helm.sh.

mod deploy;
mod support;

use anyhow::{Context, Result, ensure};
use deploy::{chart_dir, kind_of, render, repo_root, run_bounded};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;
use support::*;
use vigil_controller::Options;
use vigil_controller::leader::LeaderOptions;
use vigil_testenv::wait_for;

/// Metrics the rules read that another exporter serves, and which one.
const EXTERNAL: &[(&str, &str)] =
    &[("kube_pod_container_status_ready", "kube-state-metrics: pod readiness, for the VigilNotReady alert")];

/// Time limit of scripts/promql-check.sh (a cold Go build of Prometheus' parser).
const BUILD_LIMIT: Duration = Duration::from_secs(20 * 60);

fn dashboard_file() -> PathBuf {
    chart_dir().join("dashboards").join("vigil.json")
}

/// The chart's files holding PromQL: the dashboard and both rule files.
fn promql_files() -> Vec<PathBuf> {
    vec![
        dashboard_file(),
        chart_dir().join("rules").join("vigil.recording.yaml"),
        chart_dir().join("alerts").join("vigil.rules.yaml"),
    ]
}

/// The promql-check binary: `VIGIL_PROMQL_CHECK`, else the one scripts/promql-check.sh builds.
async fn promql_check_bin() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("VIGIL_PROMQL_CHECK") {
        return Ok(PathBuf::from(path));
    }
    let script = repo_root().join("scripts").join("promql-check.sh");
    let (ok, out, err) =
        run_bounded(&mut tokio::process::Command::new(&script), BUILD_LIMIT, "scripts/promql-check.sh").await?;
    ensure!(ok, "scripts/promql-check.sh failed:\n{err}");
    Ok(PathBuf::from(out.trim()))
}

/// What promql-check reports: each expression with where it is and the metrics it selects, and
/// the names the recording rules define.
#[derive(serde::Deserialize, Debug)]
struct Report {
    expressions: Vec<Expression>,
    metrics: BTreeMap<String, Vec<String>>,
    recorded: Vec<String>,
}

#[derive(serde::Deserialize, Debug)]
struct Expression {
    file: String,
    #[serde(rename = "where")]
    at: String,
}

/// Runs promql-check on the chart's files; its failure (a parse error, with file and panel or
/// rule) fails the test with its own words.
async fn parse_chart_promql() -> Result<Report> {
    let bin = promql_check_bin().await?;
    let files = promql_files();
    let (ok, out, err) =
        run_bounded(tokio::process::Command::new(&bin).args(&files), Duration::from_secs(60), "promql-check").await?;
    ensure!(ok, "promql-check refused the chart's PromQL:\n{err}");
    serde_json::from_str(&out).with_context(|| format!("promql-check printed no report:\n{out}"))
}

/// The series names a `/metrics` text exports: each family its `# TYPE` lines declare, under
/// the names its samples take (counter: `_total`; histogram: `_bucket`, `_sum`, `_count`;
/// summary: the name, `_sum`, `_count`), and each sample's name. (prometheus-client leaves a
/// labelled family out until it has a series; Vigil serves its error and restart counters at 0
/// from the start, so only what the scenario really does decides what is served.)
fn exported_series(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else { continue };
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" | "gaugehistogram" => &["_bucket", "_sum", "_count"],
                "summary" => &["", "_sum", "_count"],
                "info" => &["_info"],
                _ => &[""],
            };
            names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        } else if !line.starts_with('#') && !line.is_empty() {
            names.extend(line.split(['{', ' ']).next().map(str::to_string));
        }
    }
    names
}

fn is_sample_of(line: &str, name: &str, check: &str) -> bool {
    line.starts_with(&format!("{name}{{")) && line.contains(&format!("check=\"{check}\""))
}

/// Every PromQL expression of the dashboard and both rule files parses (Prometheus' parser;
/// the rule files as promtool checks them), the tool read every dashboard query, and every
/// metric they select is served by a live controller (leader election on, a MachineHealthCheck
/// and a NodeHealthCheck each remediating one target), is a recording rule's output, or comes
/// from a named other exporter. The per-check metrics the dashboard reads have samples for
/// both checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_and_rules_name_only_metrics_a_live_vigil_run_serves() -> Result<()> {
    let report = parse_chart_promql().await?;
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(dashboard_file())?)?;
    let queries = dashboard_targets(&dashboard).len();
    let read =
        report.expressions.iter().filter(|e| e.file.ends_with("vigil.json") && e.at.starts_with("panel")).count();
    assert_eq!(read, queries, "promql-check must read every dashboard query");

    let env = env().await?;
    cluster(&env, false).await?;
    self_hosted(&env).await?;
    node(&env, "n1", json!({})).await?;
    machine(&env, "m1", Some("n1"), json!({})).await?;
    mhc(&env, "workers", json!({})).await?;
    workers(&env, 2).await?;
    env.apply(snr_template("reboot", MEDIK8S, false)).await?;
    nhc(&env, "workers", json!({"remediationTemplate": reboot_ref("reboot"), "maxUnhealthy": 2})).await?;
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let leader = LeaderOptions {
        lease_name: "vigil".into(),
        namespace: NS.into(),
        identity: "dashboard-test".into(),
        lease_duration: Duration::from_secs(4),
        renew_deadline: Duration::from_secs(3),
        retry_period: Duration::from_secs(1),
    };
    let options = Options { workers: 2, metrics_addr: Some(metrics), leader: Some(leader), ..Default::default() };
    let controller = Controller::start_with(env.client(), options);
    wait_machine_condition(&env, "m1", "HealthCheckSucceeded", "True", "HealthCheckSucceeded").await?;
    set_ready(&env, "n1", "False", &secs_ago(60)).await?;
    set_ready(&env, "w1", "False", &secs_ago(60)).await?;
    let (mhc_ref, nhc_ref) = ("MachineHealthCheck/default/workers", "NodeHealthCheck/workers");
    // Both remediations under way, as the gauges report them, and counted once written.
    let remediating =
        |text: &str, check: &str| text.lines().any(|l| l == format!("vigil_check_remediating{{check=\"{check}\"}} 1"));
    let counted = |text: &str, outcome: &str| {
        text.lines()
            .any(|l| l.starts_with("vigil_remediations_total{") && l.contains(&format!("outcome=\"{outcome}\"")))
    };
    let waited = wait_for("both checks reporting one target remediating, both requests counted", WAIT, || async {
        let text = scrape(metrics).await.unwrap_or_default();
        let done = remediating(&text, mhc_ref)
            && remediating(&text, nhc_ref)
            && counted(&text, "marked")
            && counted(&text, "created");
        Ok(done.then_some(text))
    })
    .await;
    let text = match waited {
        Ok(text) => text,
        Err(e) => {
            let now = scrape(metrics).await.unwrap_or_default();
            let gauges: Vec<&str> =
                now.lines().filter(|l| l.starts_with("vigil_check_") || l.starts_with("vigil_remediations")).collect();
            let m1 = get(&env, "cluster.x-k8s.io/v1beta2", "Machine", Some(NS), "m1").await?;
            let status = check_status(&env, "NodeHealthCheck", "workers").await?;
            anyhow::bail!("{e:#}\n{}\nm1: {m1:?}\nNodeHealthCheck status: {status}", gauges.join("\n"));
        }
    };
    controller.stop().await;
    env.stop().await?;

    let exported = exported_series(&text);
    let recorded: BTreeSet<&str> = report.recorded.iter().map(String::as_str).collect();
    let external: BTreeSet<&str> = EXTERNAL.iter().map(|(n, _)| *n).collect();
    let mut missing = Vec::new();
    for (name, places) in &report.metrics {
        if !(exported.contains(name) || recorded.contains(name.as_str()) || external.contains(name.as_str())) {
            missing.push(format!("{name}, used by:\n    {}", places.join("\n    ")));
        }
    }
    assert!(missing.is_empty(), "metrics `vigil run` does not serve:\n  {}\n/metrics:\n{text}", missing.join("\n  "));
    for name in report.metrics.keys().filter(|n| n.starts_with("vigil_check_")) {
        for check in [mhc_ref, nhc_ref] {
            assert!(text.lines().any(|l| is_sample_of(l, name, check)), "no {name} sample for {check}:\n{text}");
        }
    }
    for sample in ["vigil_leader 1", "vigil_leader_elections_total 1"] {
        assert!(text.lines().any(|l| l == sample), "{sample} missing:\n{text}");
    }
    let detected = text.lines().find_map(|l| l.strip_prefix("vigil_detection_seconds_count ")).context("no count")?;
    assert!(detected.parse::<f64>()? >= 1.0, "a detection latency is recorded:\n{text}");
    Ok(())
}

/// The controller's `/metrics` text.
async fn scrape(addr: std::net::SocketAddr) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await?;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await??;
    Ok(String::from_utf8_lossy(&out).split("\r\n\r\n").nth(1).unwrap_or("").to_string())
}

/// Every panel of a dashboard, rows' nested panels included.
fn all_panels(dashboard: &Value) -> Vec<&Value> {
    fn walk<'a>(panels: &'a Value, out: &mut Vec<&'a Value>) {
        for p in panels.as_array().into_iter().flatten() {
            out.push(p);
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// Every query target of a dashboard's panels.
fn dashboard_targets(dashboard: &Value) -> Vec<&Value> {
    all_panels(dashboard).into_iter().flat_map(|p| p["targets"].as_array().into_iter().flatten()).collect()
}

/// The dashboard as Grafana's sidecar loads it: its data source is a variable (so it works on
/// any Prometheus), every panel and query uses it, the `check` variable filters every per-check
/// query, the panels the issue names are there, ids are unique and no two panels overlap.
#[test]
fn dashboard_reads_a_datasource_variable_and_shows_what_the_issue_names() -> Result<()> {
    let d: Value = serde_json::from_str(&std::fs::read_to_string(dashboard_file())?)?;
    let vars = d.pointer("/templating/list").and_then(Value::as_array).context("templating.list")?;
    let var = |name: &str| vars.iter().find(|v| v["name"] == name);
    let ds = var("datasource").context("no datasource variable")?;
    assert_eq!((&ds["type"], &ds["query"]), (&json!("datasource"), &json!("prometheus")));
    assert!(var("check").is_some_and(|v| v["type"] == "query" && v["multi"] == true), "a multi-value check variable");
    let uses_variable = |v: &Value| v == &json!({"type": "prometheus", "uid": "${datasource}"});
    let panels = all_panels(&d);
    let mut ids = BTreeSet::new();
    for p in &panels {
        let title = p["title"].as_str().unwrap_or("");
        assert!(ids.insert(p["id"].as_i64().context("a panel without id")?), "panel id {} twice", p["id"]);
        if p["type"] == "row" {
            continue;
        }
        assert!(uses_variable(&p["datasource"]), "{title}: datasource {}", p["datasource"]);
        let targets = p["targets"].as_array().filter(|t| !t.is_empty()).context(format!("{title}: no query"))?;
        for t in targets {
            assert!(uses_variable(&t["datasource"]), "{title}: a query's datasource {}", t["datasource"]);
            let expr = t["expr"].as_str().unwrap_or("");
            if expr.contains("vigil_check_") || expr.contains("vigil:check_") {
                assert!(expr.contains("check=~\"$check\""), "{title}: a per-check query without $check: {expr}");
            }
        }
    }
    let titles: Vec<&str> = panels.iter().filter_map(|p| p["title"].as_str()).collect();
    for title in [
        "Checks now",
        "Targets",
        "Healthy",
        "Unhealthy",
        "Remediating",
        "Short-circuited",
        "Queued",
        "Remediations started (per hour)",
        "Remediations failed (per hour)",
        "Detection latency",
        "Detection latency p50 / p99",
        "API server reachable",
        "Sources synced",
        "Leader",
        "Leaders",
        "Lease errors (per minute)",
    ] {
        assert!(titles.contains(&title), "no panel {title:?}: {titles:?}");
    }
    let heatmap = panels.iter().find(|p| p["type"] == "heatmap").context("no heatmap")?;
    assert!(heatmap["targets"][0]["expr"].as_str().is_some_and(|e| e.contains("detection_seconds_bucket")));
    let quantiles = panels.iter().find(|p| p["title"] == "Detection latency p50 / p99").context("quantiles")?;
    let exprs: Vec<&str> =
        quantiles["targets"].as_array().into_iter().flatten().filter_map(|t| t["expr"].as_str()).collect();
    assert!(exprs.iter().any(|e| e.contains("p50")) && exprs.iter().any(|e| e.contains("p99")), "{exprs:?}");
    assert_no_overlap(&panels)
}

/// No two panels share a grid cell (Grafana would push one down, out of its row).
fn assert_no_overlap(panels: &[&Value]) -> Result<()> {
    let mut taken: BTreeMap<(i64, i64), &str> = BTreeMap::new();
    for p in panels {
        let g = &p["gridPos"];
        let [x, y, w, h] = ["x", "y", "w", "h"].map(|k| g[k].as_i64().unwrap_or(-1));
        let title = p["title"].as_str().unwrap_or("");
        ensure!(x >= 0 && y >= 0 && w > 0 && h > 0 && x + w <= 24, "{title}: bad gridPos {g}");
        for cx in x..x + w {
            for cy in y..y + h {
                if let Some(other) = taken.insert((cx, cy), title) {
                    anyhow::bail!("panels {other:?} and {title:?} overlap at ({cx}, {cy})");
                }
            }
        }
    }
    Ok(())
}

/// The dashboard ConfigMap is off by default; enabled, it carries the sidecar's label, the
/// dashboard file byte for byte, and goes where `dashboard.namespace` says.
#[tokio::test]
async fn dashboard_configmap_only_when_enabled_with_the_sidecar_label() -> Result<()> {
    let configmaps =
        |docs: &[Value]| -> Vec<Value> { docs.iter().filter(|d| kind_of(d) == "ConfigMap").cloned().collect() };
    assert!(configmaps(&render(&[]).await?).is_empty(), "no dashboard by default");
    let docs = render(&["dashboard.enabled=true"]).await?;
    let [cm] =
        configmaps(&docs).try_into().map_err(|v: Vec<Value>| anyhow::anyhow!("one ConfigMap, got {}", v.len()))?;
    assert_eq!(cm.pointer("/metadata/labels/grafana_dashboard"), Some(&json!("1")));
    assert_eq!(cm.pointer("/metadata/namespace"), Some(&json!(deploy::NAMESPACE)));
    let file = std::fs::read_to_string(dashboard_file())?;
    assert_eq!(cm.pointer("/data/vigil.json").and_then(Value::as_str), Some(file.trim_end()), "the file, unchanged");

    let docs = render(&[
        "dashboard.enabled=true",
        "dashboard.namespace=monitoring",
        "dashboard.labels.grafana_dashboard=vigil",
        "dashboard.annotations.grafana_folder=Vigil",
    ])
    .await?;
    let cm = configmaps(&docs).pop().context("the ConfigMap")?;
    assert_eq!(cm.pointer("/metadata/namespace"), Some(&json!("monitoring")));
    assert_eq!(cm.pointer("/metadata/labels/grafana_dashboard"), Some(&json!("vigil")));
    assert_eq!(cm.pointer("/metadata/annotations/grafana_folder"), Some(&json!("Vigil")));
    Ok(())
}
