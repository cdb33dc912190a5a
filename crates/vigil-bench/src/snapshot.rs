//! `vigil-bench --snapshot`: how long `vigil snapshot` takes on the fleet, how long `vigil
//! simulate` takes on that snapshot with an outage added, and how long `vigil check` takes —
//! each a separate process timed from outside, all requests counted from the audit log.

use crate::{audit, fleet};
use anyhow::{Context as _, Result, ensure};
use kube::CustomResourceExt as _;
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::time::Instant;
use vigil_api::{MachineHealthCheck, NodeHealthCheck};
use vigil_testenv::TestEnv;

/// What `--snapshot` prints.
#[derive(Serialize)]
pub struct SnapshotSummary {
    nodes: usize,
    machines: usize,
    checks: usize,
    /// The format `vigil snapshot` wrote and `vigil simulate` read (`json`).
    snapshot_format: &'static str,
    /// `vigil snapshot` wall time, peak resident memory and output size.
    snapshot_ms: f64,
    snapshot_peak_mib: f64,
    snapshot_bytes: usize,
    /// Requests `vigil snapshot` and `vigil check` made, by verb (audit log).
    requests: BTreeMap<String, usize>,
    /// Nodes set `Ready=Unknown` at 5m in the simulated outage.
    failed: usize,
    /// `vigil simulate` wall time and peak resident memory on the snapshot with the outage (1h,
    /// JSON output).
    simulate_ms: f64,
    simulate_peak_mib: f64,
    /// Events of the simulation by kind.
    simulate_events: BTreeMap<String, usize>,
    /// `vigil check` wall time, peak resident memory and exit code.
    check_ms: f64,
    check_peak_mib: f64,
    check_exit: Option<i32>,
}

/// One command's output, wall time (ms) and peak resident memory (MiB).
struct Run {
    out: std::process::Output,
    ms: f64,
    peak_mib: f64,
}

/// Runs `vigil args`, timed from outside; its memory's high-water mark (`VmHWM`) is read every
/// 10 ms while it runs (it only grows, so the last reading is the peak but for what a final
/// 10 ms adds).
fn timed(vigil: &Path, args: &[&str]) -> Result<Run> {
    let t = Instant::now();
    let mut child = std::process::Command::new(vigil)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run vigil {args:?}"))?;
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let mut peak_kib = 0;
    let status = loop {
        if let Ok(kib) = crate::procstat::status_kib(child.id(), "VmHWM") {
            peak_kib = peak_kib.max(kib);
        }
        if let Some(status) = child.try_wait()? {
            break status;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    let out = std::process::Output {
        status,
        stdout: stdout.join().map_err(|_| anyhow::anyhow!("reading stdout panicked"))?,
        stderr: stderr.join().map_err(|_| anyhow::anyhow!("reading stderr panicked"))?,
    };
    Ok(Run { out, ms, peak_mib: peak_kib as f64 / 1024.0 })
}

/// Writes `bytes` to `dir/name` when a directory to keep things in was given.
fn kept(dir: Option<&Path>, name: &str, bytes: &[u8]) -> Result<()> {
    let Some(dir) = dir else { return Ok(()) };
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let path = dir.join(name);
    std::fs::write(&path, bytes).with_context(|| format!("cannot write {}", path.display()))
}

/// The outage added to the snapshot (JSON): every `1/failed_percent`-th Node goes Unknown at 5m,
/// seen in both clusters the snapshot holds it in (management for the NodeHealthChecks, the
/// workload cluster `bench/fleet` for the MachineHealthChecks; the fleet is self-hosted). The
/// scenario as compact JSON, and how many Nodes fail.
fn outage(snapshot: &str, n: usize, failed_percent: f64) -> Result<(String, usize)> {
    let mut scenario: Value = serde_json::from_str(snapshot).context("the snapshot is not JSON")?;
    let every = (100.0 / failed_percent).round().max(1.0) as usize;
    let failed: Vec<usize> = (0..n).step_by(every).collect();
    let mut timeline = Vec::with_capacity(2 * failed.len());
    for i in &failed {
        let change = serde_json::json!({"node": fleet::node_name(*i), "type": "Ready", "status": "Unknown", "reason": "ZoneDown"});
        timeline.push(serde_json::json!({"at": "5m", "setNodeCondition": change}));
        timeline.push(serde_json::json!({"at": "5m", "cluster": "bench/fleet", "setNodeCondition": change}));
    }
    let slot = scenario.get_mut("timeline").filter(|t| t.as_array().is_some_and(Vec::is_empty));
    let slot = slot.context("the snapshot has no empty timeline")?;
    *slot = Value::Array(timeline);
    Ok((serde_json::to_string(&scenario)? + "\n", failed.len()))
}

/// Creates the fleet of `n` Nodes, then measures the three commands; with `keep`, their inputs
/// and outputs are left in that directory.
pub async fn run(n: usize, failed_percent: f64, vigil: &Path, keep: Option<&Path>) -> Result<SnapshotSummary> {
    // A directory that cannot be made is said before the fleet's minutes of set-up, not after.
    if let Some(dir) = keep {
        std::fs::create_dir_all(dir).with_context(|| format!("--keep {}: cannot create it", dir.display()))?;
    }
    eprintln!("vigil-bench: starting etcd + kube-apiserver");
    let env = TestEnv::start().await?;
    env.install_upstream_crds().await?;
    env.install_crds(&[
        serde_json::to_value(MachineHealthCheck::crd())?,
        serde_json::to_value(NodeHealthCheck::crd())?,
    ])
    .await?;
    let groups = fleet::layout(n, fleet::Fleet::Mixed);
    eprintln!("vigil-bench: creating {n} Nodes, {n} Machines and {} checks", groups.len());
    let since = fleet::time(jiff::Timestamp::now() - jiff::SignedDuration::from_hours(24));
    fleet::create(&env, n, &groups, 300, fleet::CheckApi::Vigil, fleet::NodeChecks::Vigil, &since).await?;

    let dir = tempfile::Builder::new().prefix("vigil-bench-snapshot-").tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, env.audited_kubeconfig_yaml())?;
    let kc = kubeconfig.to_str().context("utf-8 path")?;

    eprintln!("vigil-bench: vigil snapshot");
    let snapshot = timed(vigil, &["snapshot", "--kubeconfig", kc, "--duration", "1h", "--output", "json"])?;
    let out = snapshot.out;
    ensure!(out.status.success(), "vigil snapshot failed: {}", String::from_utf8_lossy(&out.stderr));
    let json = String::from_utf8(out.stdout).context("snapshot is not UTF-8")?;
    kept(keep, "snapshot.json", json.as_bytes())?;

    let (outage, failed) = outage(&json, n, failed_percent)?;
    let file = dir.path().join("outage.json");
    std::fs::write(&file, &outage)?;
    kept(keep, "outage.json", outage.as_bytes())?;

    eprintln!("vigil-bench: vigil simulate");
    let simulate = timed(vigil, &["simulate", file.to_str().context("utf-8 path")?, "--output", "json"])?;
    let out = simulate.out;
    ensure!(out.status.success(), "vigil simulate failed: {}", String::from_utf8_lossy(&out.stderr));
    kept(keep, "simulate.json", &out.stdout)?;
    let mut simulate_events = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let event: Value = serde_json::from_str(line)?;
        *simulate_events.entry(event["event"].as_str().unwrap_or("").to_string()).or_insert(0) += 1;
    }

    eprintln!("vigil-bench: vigil check");
    let check = timed(vigil, &["check", "--kubeconfig", kc, "--output", "json"])?;
    let out = check.out;
    ensure!(out.status.code().is_some_and(|c| c != 1), "vigil check failed: {}", String::from_utf8_lossy(&out.stderr));
    kept(keep, "check.json", &out.stdout)?;

    let mut requests = BTreeMap::new();
    if let Some(log) = env.audit_log_path() {
        for r in audit::read(&log)? {
            *requests.entry(r.verb).or_insert(0) += 1;
        }
    }
    Ok(SnapshotSummary {
        nodes: n,
        machines: n,
        checks: groups.len(),
        snapshot_format: "json",
        snapshot_ms: snapshot.ms,
        snapshot_peak_mib: snapshot.peak_mib,
        snapshot_bytes: json.len(),
        requests,
        failed,
        simulate_ms: simulate.ms,
        simulate_peak_mib: simulate.peak_mib,
        simulate_events,
        check_ms: check.ms,
        check_peak_mib: check.peak_mib,
        check_exit: out.status.code(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_outage_sets_every_nth_node_unknown_in_both_clusters() {
        let snapshot = r#"{"name":"snapshot","duration":"1h","objects":[{"kind":"Node"}],"timeline":[]}"#;
        let (text, failed) = outage(snapshot, 10, 20.0).expect("outage");
        assert_eq!(failed, 2);
        let scenario: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(scenario["objects"], serde_json::json!([{"kind": "Node"}]), "the snapshot is kept");
        let change = |i: usize| serde_json::json!({"node": fleet::node_name(i), "type": "Ready", "status": "Unknown", "reason": "ZoneDown"});
        assert_eq!(
            scenario["timeline"],
            serde_json::json!([
                {"at": "5m", "setNodeCondition": change(0)},
                {"at": "5m", "cluster": "bench/fleet", "setNodeCondition": change(0)},
                {"at": "5m", "setNodeCondition": change(5)},
                {"at": "5m", "cluster": "bench/fleet", "setNodeCondition": change(5)},
            ])
        );
        assert!(outage(r#"{"timeline":[{"at":"1m"}]}"#, 10, 20.0).is_err(), "a timeline is not overwritten");
    }
}
