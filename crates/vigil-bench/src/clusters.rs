//! `--clusters N`: a management cluster of N in-memory workload clusters, each with its own API
//! server, made by Cluster API's own controllers (vigil-testenv's `capi` harness), one
//! MachineHealthCheck per cluster as users write them; a share of the clusters lose one worker
//! each, and the measured controller's detection, memory, CPU, connections and cold start are
//! reported.

use anyhow::{Context as _, Result, ensure};
use futures::StreamExt as _;
use jiff::Timestamp;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};
use vigil_testenv::TestEnv;
use vigil_testenv::capi::{CapiManagers, DEPLOYMENT_NAME_LABEL, WorkloadCluster, set_node_ready, workload_client};

use crate::{Contender, Controller, procstat};

/// Namespace of every cluster.
const NS: &str = "default";
/// Clusters created at once (the API server and the provider are the bottleneck).
const CREATE_AT_ONCE: usize = 16;
/// Limit for all clusters to come up.
const UP_LIMIT: Duration = Duration::from_secs(30 * 60);
/// Limit for every check to report its Machines once the controller started.
const COLD_LIMIT: Duration = Duration::from_secs(20 * 60);
/// Idle window in which CPU and connections are measured.
const IDLE: Duration = Duration::from_secs(20);

/// What `--clusters` runs.
pub struct Plan {
    /// Workload clusters.
    pub clusters: usize,
    /// Workers per cluster.
    pub workers: u32,
    /// Share of the clusters that lose one worker, in percent.
    pub failed_percent: f64,
    /// The checks' Ready timeout.
    pub timeout_secs: u64,
}

fn check_manifest(contender: &Contender, c: &WorkloadCluster, timeout_secs: u64) -> Value {
    let selector = json!({"matchLabels": {DEPLOYMENT_NAME_LABEL: c.deployment()}});
    let name = format!("{}-workers", c.name);
    match contender.checks() {
        crate::fleet::Checks::Vigil => json!({"apiVersion": "vigil.dev/v1alpha1", "kind": "MachineHealthCheck",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"clusterName": c.name, "selector": selector,
                     "unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": format!("{timeout_secs}s")},
                                             {"type": "Ready", "status": "Unknown", "timeout": format!("{timeout_secs}s")}]}}),
        crate::fleet::Checks::Capi => json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineHealthCheck",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"clusterName": c.name, "selector": selector,
                     "checks": {"unhealthyNodeConditions": [{"type": "Ready", "status": "False", "timeoutSeconds": timeout_secs},
                                                            {"type": "Ready", "status": "Unknown", "timeoutSeconds": timeout_secs}]}}}),
    }
}

fn checks_name(contender: &Contender) -> &'static str {
    match contender.checks() {
        crate::fleet::Checks::Vigil => "vigil",
        crate::fleet::Checks::Capi => "capi",
    }
}

/// Open sockets of a process (`/proc/<pid>/fd` entries that are sockets).
fn sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| e.ok().and_then(|e| std::fs::read_link(e.path()).ok()))
                .filter(|l| l.to_string_lossy().starts_with("socket:"))
                .count()
        })
        .unwrap_or(0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn round(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

/// One run for one controller on a fresh management cluster; returns its JSON summary.
pub async fn run(plan: &Plan, contender: &Contender, dir: &Path) -> Result<Value> {
    let t0 = Instant::now();
    eprintln!("vigil-bench: starting etcd + kube-apiserver and Cluster API's controllers");
    let env = TestEnv::start().await?;
    env.install_upstream_crds().await?;
    env.install_crds(&[
        serde_json::to_value(<vigil_api::MachineHealthCheck as kube::CustomResourceExt>::crd())?,
        serde_json::to_value(<vigil_api::NodeHealthCheck as kube::CustomResourceExt>::crd())?,
    ])
    .await?;
    let capi = CapiManagers::start(&env).await?;
    let clusters: Vec<WorkloadCluster> =
        (0..plan.clusters).map(|i| WorkloadCluster::new(NS, &format!("w{i:04}"), plan.workers)).collect();
    eprintln!("vigil-bench: creating {} workload clusters of {} workers", plan.clusters, plan.workers);
    let t1 = Instant::now();
    let (env_ref, capi_ref) = (&env, &capi);
    let created: Vec<Result<()>> = futures::stream::iter(clusters.iter())
        .map(|c| async move {
            capi_ref.create_cluster(env_ref, c).await?;
            capi_ref.wait_cluster(env_ref, c, UP_LIMIT).await
        })
        .buffer_unordered(CREATE_AT_ONCE)
        .collect()
        .await;
    for r in created {
        r?;
    }
    let setup_s = t1.elapsed().as_secs_f64();
    eprintln!("vigil-bench: {} clusters up in {setup_s:.0} s", plan.clusters);
    for c in &clusters {
        env.apply(check_manifest(contender, c, plan.timeout_secs)).await?;
    }

    let kubeconfig = dir.join(format!("kubeconfig-{}", checks_name(contender)));
    std::fs::write(&kubeconfig, env.kubeconfig_yaml())?;
    let log = dir.join(format!("controller-{}.log", checks_name(contender)));
    let mut controller = Controller::spawn(contender, &kubeconfig, log)?;
    let pid = controller.pid;
    let started = Instant::now();
    let cpu_start = procstat::cpu_seconds(pid)?;
    let (group, version) = match contender.checks() {
        crate::fleet::Checks::Vigil => ("vigil.dev", "v1alpha1"),
        crate::fleet::Checks::Capi => ("cluster.x-k8s.io", "v1beta2"),
    };
    let api_version = format!("{group}/{version}");
    let want = i64::from(plan.workers);
    loop {
        controller.check_running()?;
        let checks = env.list_json(&api_version, "MachineHealthCheck", Some(NS), "").await?;
        let ready = checks
            .iter()
            .filter(|c| {
                c.pointer("/status/expectedMachines").and_then(Value::as_i64) == Some(want)
                    && c.pointer("/status/currentHealthy").and_then(Value::as_i64) == Some(want)
            })
            .count();
        if ready == plan.clusters {
            break;
        }
        ensure!(
            started.elapsed() < COLD_LIMIT,
            "cold start: {ready} of {} checks ready after {COLD_LIMIT:?}",
            plan.clusters
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let cold_start_s = started.elapsed().as_secs_f64();
    let cpu_cold = procstat::cpu_seconds(pid)? - cpu_start;
    eprintln!("vigil-bench: cold start {cold_start_s:.1} s; idle {IDLE:?}");

    let idle_from = procstat::cpu_seconds(pid)?;
    tokio::time::sleep(IDLE).await;
    let cpu_idle_per_min = (procstat::cpu_seconds(pid)? - idle_from) * 60.0 / IDLE.as_secs_f64();
    let open_sockets = sockets(pid);

    // The wave: one worker in each of the first `failed` clusters goes Ready=False. Victims and
    // clients are found first, so the failures are written together.
    let failed = ((plan.clusters as f64) * plan.failed_percent / 100.0).ceil().max(1.0) as usize;
    let mut targets = Vec::new();
    for c in clusters.iter().take(failed) {
        let machines = vigil_testenv::capi::deployment_machines(&env, NS, &c.deployment()).await?;
        let (machine, node) = machines
            .into_iter()
            .find_map(|(m, n)| n.map(|n| (m, n)))
            .with_context(|| format!("cluster {} has no worker with a Node", c.name))?;
        targets.push((machine, node, workload_client(&env, NS, &c.name).await?));
    }
    let wave_cpu = procstat::cpu_seconds(pid)?;
    let mut victims: BTreeMap<String, Timestamp> = BTreeMap::new();
    for (machine, node, client) in &targets {
        // lastTransitionTime has second precision: the timeout runs from the second written.
        let at = Timestamp::from_second(Timestamp::now().as_second())?;
        set_node_ready(client, node, "False").await?;
        victims.insert(machine.clone(), at + jiff::SignedDuration::from_secs(plan.timeout_secs as i64));
    }
    let written = Timestamp::now();
    let first_expiry = victims.values().min().copied().unwrap_or(written);
    let mut latencies: Vec<f64> = Vec::new();
    let wave_deadline = Instant::now() + Duration::from_secs(plan.timeout_secs + 300);
    while !victims.is_empty() {
        controller.check_running()?;
        ensure!(Instant::now() < wave_deadline, "{} Machines never marked: {:?}", victims.len(), victims.keys());
        // Read before the list: a mark first shown by this list was written at most one poll
        // (50 ms plus the previous list) before this instant, or during this list.
        let now = Timestamp::now();
        let machines = env.list_json("cluster.x-k8s.io/v1beta2", "Machine", Some(NS), "").await?;
        for m in &machines {
            let Some(name) = m.pointer("/metadata/name").and_then(Value::as_str) else { continue };
            let marked = m
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .is_some_and(|cs| cs.iter().any(|c| c["type"] == "HealthCheckSucceeded" && c["status"] == "False"));
            if marked && let Some(expiry) = victims.remove(name) {
                latencies.push(now.duration_since(expiry).as_secs_f64() * 1000.0);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let wave_cpu = procstat::cpu_seconds(pid)? - wave_cpu;
    latencies.sort_by(f64::total_cmp);
    let peak_rss_mib = procstat::status_kib(pid, "VmHWM")? as f64 / 1024.0;
    let managers_rss_mib =
        |p: Option<u32>| p.and_then(|p| procstat::status_kib(p, "VmRSS").ok()).map(|k| round(k as f64 / 1024.0));
    let apiserver_rss_mib =
        env.apiserver_pid().and_then(|p| procstat::status_kib(p, "VmRSS").ok()).map(|k| round(k as f64 / 1024.0));
    controller.stop().await?;
    let summary = json!({
        "controller": contender.name(),
        "clusters": plan.clusters, "workers_per_cluster": plan.workers, "failed_clusters": failed,
        "timeout_s": plan.timeout_secs,
        "wave_written_before_first_expiry_s": round(first_expiry.duration_since(written).as_secs_f64()),
        "setup_s": round(setup_s), "total_s": round(t0.elapsed().as_secs_f64()),
        "cold_start_s": round(cold_start_s),
        "detection_ms": {"p50": round(percentile(&latencies, 50.0)), "p99": round(percentile(&latencies, 99.0)),
                         "max": round(latencies.last().copied().unwrap_or(f64::NAN)), "samples": latencies.len()},
        "peak_rss_mib": round(peak_rss_mib),
        "cpu_s": {"cold_start": round(cpu_cold), "idle_per_min": round(cpu_idle_per_min), "wave": round(wave_cpu)},
        "open_sockets_idle": open_sockets,
        "others_rss_mib": {"capi_core": managers_rss_mib(capi.core_pid()), "capi_infra": managers_rss_mib(capi.infra_pid()),
                           "kube_apiserver": apiserver_rss_mib},
    });
    // At once on stderr too: a later run that fails or is stopped does not lose this one.
    eprintln!("vigil-bench: {summary}");
    Ok(summary)
}
