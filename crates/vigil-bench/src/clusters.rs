//! `--clusters N`: a management cluster of N in-memory workload clusters, each with its own API
//! server, made by Cluster API's own controllers (vigil-testenv's `capi` harness), one
//! MachineHealthCheck per cluster as users write them; a share of the clusters lose one worker
//! each, and the measured controller's detection, memory, CPU, connections and cold start are
//! reported.

use anyhow::{Context as _, Result, ensure};
use futures::StreamExt as _;
use jiff::Timestamp;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};
use vigil_testenv::TestEnv;
use vigil_testenv::capi::{CapiManagers, DEPLOYMENT_NAME_LABEL, WorkloadCluster, set_node_ready, workload_client};

use crate::{Contender, Controller, procstat};

/// Namespace of the shard Leases with `--replicas`.
const LEASE_NS: &str = "vigil-system";
/// `vigil run --lease-name` with `--replicas` (shard Leases are `<name>-shard-<i>`).
const LEASE_NAME: &str = "vigil";
/// Limit for the replicas to hold every shard, each at most its fair share.
const BALANCE_LIMIT: Duration = Duration::from_secs(120);

/// Namespace of every cluster.
const NS: &str = "default";
/// Clusters created at once (the API server and the provider are the bottleneck).
const CREATE_AT_ONCE: usize = 16;
/// Limit for one cluster to come up; one that does not is left out of the run and counted.
const UP_LIMIT: Duration = Duration::from_secs(15 * 60);
/// Share of the clusters, in percent, that must come up for the run to go on.
const UP_REQUIRED_PERCENT: usize = 95;
/// Limit for every check to report its Machines once the controller started.
const COLD_LIMIT: Duration = Duration::from_secs(20 * 60);
/// Idle window in which CPU and connections are measured.
const IDLE: Duration = Duration::from_secs(20);

/// What `--clusters` runs.
pub struct ClustersPlan {
    /// Workload clusters.
    pub clusters: usize,
    /// Workers per cluster.
    pub workers: u32,
    /// Share of the clusters that lose one worker, in percent.
    pub failed_percent: f64,
    /// The checks' Ready timeout.
    pub timeout_secs: u64,
    /// `vigil run` processes sharing the checks (1: one process without leader election).
    pub replicas: usize,
    /// `vigil run --shards` when `replicas` > 1.
    pub shards: u32,
    /// `--controller-log`: keep each controller's log here (suffixed `-<i>` per replica, `.capi`
    /// for Cluster API's) instead of in the run's temporary directory.
    pub log: Option<std::path::PathBuf>,
}

fn check_manifest(contender: &Contender, c: &WorkloadCluster, timeout_secs: u64) -> Value {
    let selector = json!({"matchLabels": {DEPLOYMENT_NAME_LABEL: c.deployment()}});
    let name = format!("{}-workers", c.name);
    match contender.checks() {
        crate::fleet::CheckApi::Vigil => json!({"apiVersion": "vigil.dev/v1alpha1", "kind": "MachineHealthCheck",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"clusterName": c.name, "selector": selector,
                     "unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": format!("{timeout_secs}s")},
                                             {"type": "Ready", "status": "Unknown", "timeout": format!("{timeout_secs}s")}]}}),
        crate::fleet::CheckApi::Capi => json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineHealthCheck",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"clusterName": c.name, "selector": selector,
                     "checks": {"unhealthyNodeConditions": [{"type": "Ready", "status": "False", "timeoutSeconds": timeout_secs},
                                                            {"type": "Ready", "status": "Unknown", "timeoutSeconds": timeout_secs}]}}}),
    }
}

fn checks_name(contender: &Contender) -> &'static str {
    match contender.checks() {
        crate::fleet::CheckApi::Vigil => "vigil",
        crate::fleet::CheckApi::Capi => "capi",
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
pub async fn run(plan: &ClustersPlan, contender: &Contender, dir: &Path) -> Result<Value> {
    let t0 = Instant::now();
    let (env, capi, clusters, not_up, setup_s) = set_up(plan, contender).await?;
    let mut fleet = Replicas::spawn(plan, contender, &env, dir).await?;
    let ColdStart { started, cold_start_s, shards_held, ready_in_holders_s, cpu_cold, rss_start } =
        cold_start(plan, contender, &env, &mut fleet, &clusters).await?;
    let Idle { cpu_idle_per_min, rss_steady, open_sockets } = idle(&fleet).await?;

    // The wave: one worker in each of the first `failed` clusters goes Ready=False.
    let failed = failed_count(plan, clusters.len());
    let wave_from = fleet.cpu()?;
    let (latencies, first_expiry_s) =
        wave(plan, &env, &mut fleet, &clusters.iter().take(failed).collect::<Vec<_>>()).await?;
    let wave_cpu = sub(&fleet.cpu()?, &wave_from);
    // Until the kill: start-up, idle and the wave (the kernel's high-water mark).
    let peak_rss = fleet.peak_rss(started)?;
    let (failover, rss_after_failover) = if plan.replicas > 1 {
        // The survivors' high-water marks start again at the kill.
        for c in &fleet.members[1..] {
            procstat::reset_peak(c.pid)?;
        }
        let killed = Instant::now();
        let failover = failover(plan, &env, &mut fleet, &clusters[failed..], failed, &shards_held).await?;
        let after: Vec<Option<f64>> =
            std::iter::once(None).chain(fleet.peak_rss(killed)?.into_iter().map(Some)).collect();
        (Some(failover), after)
    } else {
        (None, vec![None])
    };
    let managers_rss_mib =
        |p: Option<u32>| p.and_then(|p| procstat::status_kib(p, "VmRSS").ok()).map(|k| round(k as f64 / 1024.0));
    let apiserver_rss_mib =
        env.apiserver_pid().and_then(|p| procstat::status_kib(p, "VmRSS").ok()).map(|k| round(k as f64 / 1024.0));
    fleet.stop().await?;
    let per_replica: Vec<Value> = (0..plan.replicas)
        .map(|i| {
            json!({"identity": replica_identity(i),
                   "shards_held": shards_held.get(i).cloned().unwrap_or_default(),
                   "peak_rss_mib": round(peak_rss[i]),
                   "rss_mib": rss_json(rss_start[i], rss_steady[i], peak_rss[i], rss_after_failover[i]),
                   "cpu_s": {"cold_start": round(cpu_cold[i]), "idle_per_min": round(cpu_idle_per_min[i]), "wave": round(wave_cpu[i])},
                   "open_sockets_idle": open_sockets[i]})
        })
        .collect();
    let sum = |v: &[f64]| round(v.iter().sum());
    let summary = json!({
        "controller": contender.name(),
        "clusters": plan.clusters, "clusters_up": clusters.len(), "clusters_not_up": not_up,
        "workers_per_cluster": plan.workers, "failed_clusters": failed,
        "timeout_s": plan.timeout_secs,
        "replicas": plan.replicas, "shards": if plan.replicas > 1 { plan.shards } else { 1 },
        "wave_written_before_first_expiry_s": round(first_expiry_s),
        "setup_s": round(setup_s), "total_s": round(t0.elapsed().as_secs_f64()),
        "cold_start_s": round(cold_start_s),
        "ready_in_holders_s": round(ready_in_holders_s),
        "detection_ms": latency_json(&latencies),
        "peak_rss_mib": round(peak_rss.iter().copied().fold(0.0, f64::max)),
        "rss_mib": rss_json(max(&rss_start), max(&rss_steady), max(&peak_rss),
                            rss_after_failover.iter().flatten().copied().reduce(f64::max)),
        "cpu_s": {"cold_start": sum(&cpu_cold), "idle_per_min": sum(&cpu_idle_per_min), "wave": sum(&wave_cpu)},
        "open_sockets_idle": open_sockets.iter().sum::<usize>(),
        "per_replica": per_replica,
        "failover": failover,
        "others_rss_mib": {"capi_core": managers_rss_mib(capi.core_pid()), "capi_infra": managers_rss_mib(capi.infra_pid()),
                           "kube_apiserver": apiserver_rss_mib},
    });
    // At once on stderr too: a later run that fails or is stopped does not lose this one.
    eprintln!("vigil-bench: {summary}");
    eprint!("{}", rss_table(&summary));
    Ok(summary)
}

/// What the replicas did from their start until every check was ready (with replicas: the
/// shards balanced and each holder connected to its clusters), one entry per replica.
struct ColdStart {
    started: Instant,
    cold_start_s: f64,
    shards_held: Vec<Vec<u32>>,
    ready_in_holders_s: f64,
    cpu_cold: Vec<f64>,
    rss_start: Vec<f64>,
}

/// Waits for the cold start and reports it on stderr at once: a run that fails later keeps it.
async fn cold_start(
    plan: &ClustersPlan,
    contender: &Contender,
    env: &TestEnv,
    fleet: &mut Replicas,
    clusters: &[WorkloadCluster],
) -> Result<ColdStart> {
    let started = Instant::now();
    let cpu_start = fleet.cpu()?;
    wait_checks_ready(plan, contender, env, fleet, clusters.len()).await?;
    let cold_start_s = started.elapsed().as_secs_f64();
    let shards_held = if plan.replicas > 1 { fleet.wait_balanced(env, plan.shards).await? } else { Vec::new() };
    if plan.replicas > 1 {
        fleet.wait_listed(clusters, plan.shards, &shards_held).await?;
    }
    // With replicas: until every check was ready, the shards balanced and each holder connected.
    let ready_in_holders_s = started.elapsed().as_secs_f64();
    if plan.replicas > 1 {
        eprintln!("vigil-bench: every holder connected to its clusters {ready_in_holders_s:.1} s after the start");
    }
    let cpu_cold = sub(&fleet.cpu()?, &cpu_start);
    let rss_start = fleet.peak_rss(started)?;
    // At once: a run that fails later keeps its cold start.
    eprintln!(
        "vigil-bench: cold start {cold_start_s:.1} s, CPU {:.1} s, peak RSS {:.1} MiB; idle {IDLE:?}",
        cpu_cold.iter().sum::<f64>(),
        max(&rss_start)
    );
    Ok(ColdStart { started, cold_start_s, shards_held, ready_in_holders_s, cpu_cold, rss_start })
}

/// What the replicas cost while nothing fails, one entry per replica.
struct Idle {
    cpu_idle_per_min: Vec<f64>,
    rss_steady: Vec<f64>,
    open_sockets: Vec<usize>,
}

/// Measures the idle window ([`IDLE`]) and reports it on stderr.
async fn idle(fleet: &Replicas) -> Result<Idle> {
    let idle_from = fleet.cpu()?;
    let idle_at = Instant::now();
    tokio::time::sleep(IDLE).await;
    let cpu_idle_per_min: Vec<f64> =
        sub(&fleet.cpu()?, &idle_from).iter().map(|c| c * 60.0 / IDLE.as_secs_f64()).collect();
    let rss_steady: Vec<f64> = fleet.samples.iter().map(|s| s.peak_mib(idle_at, Instant::now())).collect();
    let open_sockets: Vec<usize> = fleet.members.iter().map(|c| sockets(c.pid)).collect();
    eprintln!(
        "vigil-bench: idle CPU {:.2} s per minute, {} open sockets",
        cpu_idle_per_min.iter().sum::<f64>(),
        open_sockets.iter().sum::<usize>()
    );
    Ok(Idle { cpu_idle_per_min, rss_steady, open_sockets })
}

/// The largest of `v` (0 when empty).
fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

/// One replica's resident memory by phase, MiB: the peak until the checks were ready (and, with
/// replicas, the shards balanced: a start-up shard grab shows here), the highest sample of the
/// idle window (what it holds once settled), the peak until the kill (start-up and wave
/// included: `peak_rss_mib`), and the peak from the kill to the end of the failover (`null` for
/// the killed replica and without replicas).
fn rss_json(start: f64, steady: f64, until_kill: f64, after_failover: Option<f64>) -> Value {
    json!({"peak_start": round(start), "steady": round(steady), "peak_until_kill": round(until_kill),
           "peak_after_failover": after_failover.map(round)})
}

/// The per-replica memory table printed after a run.
fn rss_table(summary: &Value) -> String {
    let mut out = format!(
        "vigil-bench: RSS MiB   {:<16} {:>10} {:>8} {:>15} {:>19}\n",
        "replica", "peak start", "steady", "peak until kill", "peak after failover"
    );
    let cell = |r: &Value, k: &str| r["rss_mib"][k].as_f64().map_or_else(|| "-".to_string(), |v| format!("{v:.1}"));
    for r in summary["per_replica"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "vigil-bench: RSS MiB   {:<16} {:>10} {:>8} {:>15} {:>19}\n",
            r["identity"].as_str().unwrap_or("?"),
            cell(r, "peak_start"),
            cell(r, "steady"),
            cell(r, "peak_until_kill"),
            cell(r, "peak_after_failover")
        ));
    }
    out
}

/// Element-wise `a - b` (CPU seconds per replica between two readings).
fn sub(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(a, b)| a - b).collect()
}

fn latency_json(sorted: &[f64]) -> Value {
    json!({"p50": round(percentile(sorted, 50.0)), "p99": round(percentile(sorted, 99.0)),
           "max": round(sorted.last().copied().unwrap_or(f64::NAN)), "samples": sorted.len()})
}

/// Clusters whose worker fails in the wave: `--failed-percent` of those that came up, at least one.
fn failed_count(plan: &ClustersPlan, up: usize) -> usize {
    ((up as f64) * plan.failed_percent / 100.0).ceil().max(1.0) as usize
}

/// Splits the clusters by whether they came up: a cluster Cluster API's in-memory provider left
/// half-made is left out (named, with why) rather than ending a run of many; fails when fewer
/// than [`UP_REQUIRED_PERCENT`] came up.
fn keep_up(clusters: Vec<WorkloadCluster>, results: Vec<Result<()>>) -> Result<(Vec<WorkloadCluster>, Vec<String>)> {
    let total = clusters.len();
    let mut up = Vec::new();
    let mut not_up = Vec::new();
    for (c, r) in clusters.into_iter().zip(results) {
        match r {
            Ok(()) => up.push(c),
            Err(e) => {
                eprintln!("vigil-bench: cluster {}/{} left out: {e:#}", c.namespace, c.name);
                not_up.push(c.name);
            }
        }
    }
    ensure!(
        up.len() * 100 >= total * UP_REQUIRED_PERCENT,
        "only {} of {total} clusters came up (at least {UP_REQUIRED_PERCENT}% must): not up {not_up:?}",
        up.len()
    );
    Ok((up, not_up))
}

/// A fresh management cluster with Cluster API's controllers, the workload clusters up and one
/// check per cluster that came up; returns the clusters that did not and the setup time too.
async fn set_up(
    plan: &ClustersPlan,
    contender: &Contender,
) -> Result<(TestEnv, CapiManagers, Vec<WorkloadCluster>, Vec<String>, f64)> {
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
    // Unordered, so one slow cluster does not hold back the next ones; put back in order after.
    let mut created: Vec<(usize, Result<()>)> = futures::stream::iter(clusters.iter().enumerate())
        .map(|(i, c)| async move {
            let up = async {
                capi_ref.create_cluster(env_ref, c).await?;
                capi_ref.wait_cluster(env_ref, c, UP_LIMIT).await
            };
            (i, up.await)
        })
        .buffer_unordered(CREATE_AT_ONCE)
        .collect()
        .await;
    created.sort_by_key(|(i, _)| *i);
    let created = created.into_iter().map(|(_, r)| r).collect();
    let (clusters, not_up) = keep_up(clusters, created)?;
    let setup_s = t1.elapsed().as_secs_f64();
    eprintln!("vigil-bench: {} clusters up in {setup_s:.0} s ({} not up)", clusters.len(), not_up.len());
    for c in &clusters {
        env.apply(check_manifest(contender, c, plan.timeout_secs)).await?;
    }
    Ok((env, capi, clusters, not_up, setup_s))
}

/// The Pod name (and Lease identity) of replica `i`.
fn replica_identity(i: usize) -> String {
    format!("vigil-bench-{i}")
}

/// The measured controller processes: one, or `--replicas` `vigil run --shards` processes.
struct Replicas {
    members: Vec<Controller>,
    /// Each member's resident memory every 100 ms (the idle window's figure), same order.
    samples: Vec<procstat::RssSamples>,
    /// Each member's metrics address (replicas only), same order.
    metrics: Vec<std::net::SocketAddr>,
    /// The contender's own MachineHealthCheck resource, the one its status is read from.
    checks: crate::fleet::CheckApi,
}

impl Replicas {
    async fn spawn(plan: &ClustersPlan, contender: &Contender, env: &TestEnv, dir: &Path) -> Result<Replicas> {
        let kubeconfig = dir.join(format!("kubeconfig-{}", checks_name(contender)));
        std::fs::write(&kubeconfig, env.kubeconfig_yaml())?;
        let log = |i: usize| {
            let suffix = if plan.replicas > 1 { format!("-{i}") } else { String::new() };
            match contender.file(plan.log.as_deref()) {
                Some(path) => {
                    let mut name = path.into_os_string();
                    name.push(suffix);
                    std::path::PathBuf::from(name)
                }
                None => dir.join(format!("controller-{}{suffix}.log", checks_name(contender))),
            }
        };
        if plan.replicas <= 1 {
            return Ok(Replicas::sampled(
                vec![Controller::spawn(contender, &kubeconfig, log(0))?],
                Vec::new(),
                contender.checks(),
            ));
        }
        let Contender::Vigil { bin, workers } = contender else {
            anyhow::bail!("--replicas runs Vigil only");
        };
        env.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LEASE_NS}})).await?;
        let mut members = Vec::new();
        let mut metrics = Vec::new();
        for i in 0..plan.replicas {
            let mut cmd = tokio::process::Command::new(bin);
            // The default election durations (15 s lease, 10 s renew deadline, 2 s retry): the
            // failover figure is what a user of the defaults gets.
            cmd.arg("run").arg("--kubeconfig").arg(&kubeconfig).arg("--workers").arg(workers.to_string());
            cmd.args(["--lease-namespace", LEASE_NS, "--lease-name", LEASE_NAME]);
            cmd.arg("--shards").arg(plan.shards.to_string());
            // A free port, for readiness: which sources the replica has listed.
            let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
            cmd.arg("--metrics-addr").arg(addr.to_string());
            metrics.push(addr);
            cmd.env("POD_NAME", replica_identity(i));
            members.push(Controller::spawn_command(cmd, format!("{} replica {i}", contender.name()), log(i))?);
        }
        Ok(Replicas::sampled(members, metrics, contender.checks()))
    }

    /// `members` (with their metrics addresses, if any), their resident memory sampled from now
    /// on (until each exits).
    fn sampled(
        members: Vec<Controller>,
        metrics: Vec<std::net::SocketAddr>,
        checks: crate::fleet::CheckApi,
    ) -> Replicas {
        let samples: Vec<procstat::RssSamples> = members.iter().map(|_| procstat::RssSamples::default()).collect();
        for (c, s) in members.iter().zip(&samples) {
            // The task ends by itself when the process is gone.
            drop(s.spawn(c.pid));
        }
        Replicas { members, samples, metrics, checks }
    }

    /// Each member's resident-memory peak since `since`, MiB: its high-water mark (`VmHWM`, since
    /// start or the last reset) or the highest sample since `since` if higher (the kernel folds
    /// its per-thread RSS counters into the mark lazily, so a sample may exceed it slightly).
    fn peak_rss(&self, since: Instant) -> Result<Vec<f64>> {
        let now = Instant::now();
        self.members
            .iter()
            .zip(&self.samples)
            .map(|(c, s)| {
                let hwm = procstat::status_kib(c.pid, "VmHWM")? as f64 / 1024.0;
                Ok(hwm.max(s.peak_mib(since, now)))
            })
            .collect()
    }

    /// CPU seconds used so far by each member.
    fn cpu(&self) -> Result<Vec<f64>> {
        self.members.iter().map(|c| procstat::cpu_seconds(c.pid)).collect()
    }

    /// Fails when a member has exited.
    fn check_running(&mut self) -> Result<()> {
        self.members.iter_mut().try_for_each(Controller::check_running)
    }

    /// Waits until every shard Lease is held by a member, none holding more than its fair share;
    /// returns the shards each member holds.
    async fn wait_balanced(&mut self, env: &TestEnv, shards: u32) -> Result<Vec<Vec<u32>>> {
        let fair = (shards as usize).div_ceil(self.members.len());
        let limit = Instant::now() + BALANCE_LIMIT;
        loop {
            self.check_running()?;
            let held = holders(env, shards).await?;
            let per: Vec<Vec<u32>> = (0..self.members.len())
                .map(|i| (0..shards).filter(|s| held.get(s) == Some(&replica_identity(i))).collect())
                .collect();
            let all_held = per.iter().map(Vec::len).sum::<usize>() == shards as usize;
            if all_held && per.iter().all(|p| p.len() <= fair) {
                return Ok(per);
            }
            ensure!(Instant::now() < limit, "shards not balanced after {BALANCE_LIMIT:?}: {held:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until each member has listed the Nodes of every workload cluster of the shards it
    /// holds (`held`, from [`Replicas::wait_balanced`]): a check's status may have been written by
    /// a replica that held its shard during start-up and gave it back, and the current holder
    /// decides it only once connected.
    async fn wait_listed(&mut self, clusters: &[WorkloadCluster], shards: u32, held: &[Vec<u32>]) -> Result<()> {
        let limit = Instant::now() + BALANCE_LIMIT;
        for (i, addr) in self.metrics.clone().iter().enumerate() {
            let mine = held.get(i).cloned().unwrap_or_default();
            let wanted: Vec<String> = clusters
                .iter()
                .map(|c| vigil_engine::shard::machine_check_key(&c.namespace, &c.name))
                .filter(|key| mine.contains(&vigil_engine::shard::shard_of(key, shards)))
                .map(|key| format!("Nodes of workload cluster {key}"))
                .collect();
            loop {
                self.check_running()?;
                // Until its metrics answer, nothing counts as listed (the error is kept for the
                // timeout's message).
                let scraped = scrape(*addr).await.map(|text| synced_sources(&text));
                let missing = match &scraped {
                    Ok(synced) => wanted.iter().filter(|w| !synced.contains(*w)).count(),
                    Err(_) => wanted.len(),
                };
                if missing == 0 {
                    break;
                }
                ensure!(
                    Instant::now() < limit,
                    "{}: {missing} of its {} workload clusters not listed after {BALANCE_LIMIT:?}{}",
                    replica_identity(i),
                    wanted.len(),
                    scraped.err().map(|e| format!(" (metrics at {addr}: {e})")).unwrap_or_default()
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        Ok(())
    }

    async fn stop(self) -> Result<()> {
        for c in self.members {
            c.stop().await?;
        }
        Ok(())
    }
}

/// A replica's metrics text (plain HTTP/1.0: the bench needs no HTTP client for one page).
async fn scrape(addr: std::net::SocketAddr) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").await?;
    let mut text = String::new();
    stream.read_to_string(&mut text).await?;
    Ok(text.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default())
}

/// The sources a replica's metrics report listed and live (`vigil_source_synced{source=…} 1`).
fn synced_sources(metrics: &str) -> BTreeSet<String> {
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix("vigil_source_synced{source=\""))
        .filter_map(|rest| rest.split_once("\"} "))
        .filter(|(_, value)| value.trim() == "1")
        .map(|(source, _)| source.to_string())
        .collect()
}

/// Each shard's Lease holder (shards without a holder are absent).
async fn holders(env: &TestEnv, shards: u32) -> Result<BTreeMap<u32, String>> {
    let leases = env.list_json("coordination.k8s.io/v1", "Lease", Some(LEASE_NS), "").await?;
    let mut out = BTreeMap::new();
    for s in 0..shards {
        let name = format!("{LEASE_NAME}-shard-{s}");
        let holder = leases
            .iter()
            .find(|l| l.pointer("/metadata/name").and_then(Value::as_str) == Some(&name))
            .and_then(|l| l.pointer("/spec/holderIdentity").and_then(Value::as_str))
            .filter(|h| !h.is_empty());
        if let Some(h) = holder {
            out.insert(s, h.to_string());
        }
    }
    Ok(out)
}

/// Waits until every check reports all its Machines healthy.
async fn wait_checks_ready(
    plan: &ClustersPlan,
    contender: &Contender,
    env: &TestEnv,
    fleet: &mut Replicas,
    expected: usize,
) -> Result<()> {
    let started = Instant::now();
    let api_version = contender.checks().api_version();
    let want = i64::from(plan.workers);
    loop {
        fleet.check_running()?;
        let checks = env.list_json(api_version, "MachineHealthCheck", Some(NS), "").await?;
        let ready = checks
            .iter()
            .filter(|c| {
                c.pointer("/status/expectedMachines").and_then(Value::as_i64) == Some(want)
                    && c.pointer("/status/currentHealthy").and_then(Value::as_i64) == Some(want)
            })
            .count();
        if ready == expected {
            return Ok(());
        }
        ensure!(started.elapsed() < COLD_LIMIT, "cold start: {ready} of {expected} checks ready after {COLD_LIMIT:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Cluster API's Machine version the bench reads.
const MACHINE_API_VERSION: &str = "cluster.x-k8s.io/v1beta2";
/// Attempts at the one list of Machines before the wave, each bounded by the test client's
/// request limit (the API server of 1 000 clusters may not answer one in time).
const MACHINE_LIST_ATTEMPTS: usize = 5;

/// Every Machine of the clusters' namespace, listed again when the API server does not answer.
async fn list_machines(env: &TestEnv) -> Result<Vec<Value>> {
    let mut attempt = 1;
    loop {
        match env.list_json(MACHINE_API_VERSION, "Machine", Some(NS), "").await {
            Ok(machines) => return Ok(machines),
            Err(e) if attempt < MACHINE_LIST_ATTEMPTS => {
                eprintln!("vigil-bench: {e:#}; attempt {attempt} of {MACHINE_LIST_ATTEMPTS}");
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The Machines not being deleted that have a Node, by their MachineDeployment, in name order.
fn workers_with_nodes(machines: &[Value]) -> BTreeMap<String, Vec<(String, String)>> {
    let mut by_deployment: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for m in machines.iter().filter(|m| m.pointer("/metadata/deletionTimestamp").is_none()) {
        let text = |p: &str| m.pointer(p).and_then(Value::as_str).map(str::to_string);
        let deployment =
            m.pointer("/metadata/labels").and_then(|l| l.get(DEPLOYMENT_NAME_LABEL)).and_then(Value::as_str);
        if let (Some(deployment), Some(name), Some(node)) =
            (deployment, text("/metadata/name"), text("/status/nodeRef/name"))
        {
            by_deployment.entry(deployment.to_string()).or_default().push((name, node));
        }
    }
    for workers in by_deployment.values_mut() {
        workers.sort();
    }
    by_deployment
}

/// Fails one worker in each of `victims` at once and waits until each Machine is marked;
/// returns the detection latencies (ms after each timeout ran out, sorted) and how long before
/// the first expiry the failures were written.
async fn wave(
    plan: &ClustersPlan,
    env: &TestEnv,
    fleet: &mut Replicas,
    victims: &[&WorkloadCluster],
) -> Result<(Vec<f64>, f64)> {
    // Victims and clients are found first, so the failures are written together; one list of
    // the Machines for all victims (a list per victim is hundreds of lists of every Machine).
    let mut workers = workers_with_nodes(&list_machines(env).await?);
    let mut targets = Vec::new();
    for c in victims {
        let (machine, node) = workers
            .remove(&c.deployment())
            .and_then(|w| w.into_iter().next())
            .with_context(|| format!("cluster {} has no worker with a Node", c.name))?;
        targets.push((machine, node, workload_client(env, NS, &c.name).await?));
    }
    let mut expiries: BTreeMap<String, Timestamp> = BTreeMap::new();
    for (machine, node, client) in &targets {
        // The timeout runs from the lastTransitionTime written (second precision), which may be
        // a second later than the instant before the call.
        let at = set_node_ready(client, node, "False").await?;
        expiries.insert(machine.clone(), at + jiff::SignedDuration::from_secs(plan.timeout_secs as i64));
    }
    let written = Timestamp::now();
    let first_expiry = expiries.values().min().copied().unwrap_or(written);
    let mut latencies: Vec<f64> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(plan.timeout_secs + 300);
    let mut gone = 0;
    while !expiries.is_empty() {
        fleet.check_running()?;
        if Instant::now() >= deadline {
            explain_unmarked(env, fleet.checks, &targets, &expiries).await;
            anyhow::bail!("{} Machines never marked: {:?}", expiries.len(), expiries.keys());
        }
        // Read before the list: a mark first shown by this list was written at most one poll
        // (50 ms plus the previous list) before this instant, or during this list.
        let now = Timestamp::now();
        let machines = match env.list_json(MACHINE_API_VERSION, "Machine", Some(NS), "").await {
            Ok(machines) => machines,
            // A list the loaded API server did not answer in time is not a failure of the
            // controller: the next list sees the marks (the deadline above still holds).
            Err(e) => {
                eprintln!("vigil-bench: {e:#}; listing again");
                continue;
            }
        };
        for m in &machines {
            let Some(name) = m.pointer("/metadata/name").and_then(Value::as_str) else { continue };
            let marked = m
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .is_some_and(|cs| cs.iter().any(|c| c["type"] == "HealthCheckSucceeded" && c["status"] == "False"));
            if marked && let Some(expiry) = expiries.remove(name) {
                latencies.push(now.duration_since(expiry).as_secs_f64() * 1000.0);
            }
        }
        // Nothing but its MachineSet acting on the mark deletes a victim here: one gone from an
        // answered list was marked and replaced between two lists (when the loaded API server
        // answers slowly). It counts at this list, as a mark first seen here does.
        let listed: BTreeSet<&str> =
            machines.iter().filter_map(|m| m.pointer("/metadata/name").and_then(Value::as_str)).collect();
        let vanished: Vec<String> = expiries.keys().filter(|m| !listed.contains(m.as_str())).cloned().collect();
        for name in vanished {
            if let Some(expiry) = expiries.remove(&name) {
                latencies.push(now.duration_since(expiry).as_secs_f64() * 1000.0);
                gone += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if gone > 0 {
        eprintln!("vigil-bench: {gone} marked Machines were already replaced when first missed from a list");
    }
    latencies.sort_by(f64::total_cmp);
    Ok((latencies, first_expiry.duration_since(written).as_secs_f64()))
}

/// On stderr, for each victim never seen marked: its conditions, its Node's conditions as the
/// workload cluster says, and its check's status (without the target list), so a miss says
/// whose it was.
async fn explain_unmarked(
    env: &TestEnv,
    checks: crate::fleet::CheckApi,
    targets: &[(String, String, kube::Client)],
    unmarked: &BTreeMap<String, Timestamp>,
) {
    for (machine, node, client) in targets.iter().filter(|(m, _, _)| unmarked.contains_key(m)) {
        let read = env.get_json(MACHINE_API_VERSION, "Machine", Some(NS), machine).await;
        let conditions = |v: Option<&Value>| -> String {
            let list = v.and_then(|v| v.pointer("/status/conditions")).and_then(Value::as_array);
            let shown: Vec<String> = list
                .into_iter()
                .flatten()
                .map(|c| {
                    format!(
                        "{}={}({})",
                        c["type"].as_str().unwrap_or("?"),
                        c["status"].as_str().unwrap_or("?"),
                        c["reason"].as_str().unwrap_or("")
                    )
                })
                .collect();
            shown.join(" ")
        };
        let cluster = read
            .as_ref()
            .ok()
            .and_then(|m| m.as_ref())
            .and_then(|m| m.pointer("/spec/clusterName"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
        let ready = match nodes.get_opt(node).await {
            Ok(Some(n)) => serde_json::to_value(&n).map(|n| conditions(Some(&n))).unwrap_or_default(),
            Ok(None) => "gone".to_string(),
            Err(e) => format!("unread: {e}"),
        };
        // The contender's check of the cluster (see `check_manifest`).
        let name = format!("{cluster}-workers");
        let check = env.get_json(checks.api_version(), "MachineHealthCheck", Some(NS), &name).await.ok().flatten();
        let status = check.and_then(|c| c.get("status").cloned()).map(|s| {
            let mut s = s;
            if let Some(o) = s.as_object_mut() {
                o.remove("targets");
            }
            s.to_string()
        });
        match read {
            Ok(Some(m)) => eprintln!(
                "vigil-bench: unmarked {machine}: {}; Node {node}: {ready}; check status {}",
                conditions(Some(&m)),
                status.unwrap_or_default()
            ),
            Ok(None) => eprintln!("vigil-bench: unmarked {machine}: gone; Node {node}: {ready}"),
            Err(e) => eprintln!("vigil-bench: unmarked {machine}: unread ({e:#}); Node {node}: {ready}"),
        }
    }
}

/// `kill -9` of the first replica, with one worker failing at that instant in each cluster
/// (among `spare`, which the wave did not touch) whose check was in one of its shards (at most
/// as many as the wave failed): how long until every one of its shards has another holder, and
/// how late those failures are marked.
async fn failover(
    plan: &ClustersPlan,
    env: &TestEnv,
    fleet: &mut Replicas,
    spare: &[WorkloadCluster],
    failed: usize,
    shards_held: &[Vec<u32>],
) -> Result<Value> {
    let orphaned: Vec<u32> = shards_held.first().cloned().unwrap_or_default();
    let victims: Vec<&WorkloadCluster> = spare
        .iter()
        .filter(|c| {
            let key = vigil_engine::shard::machine_check_key(NS, &c.name);
            orphaned.contains(&vigil_engine::shard::shard_of(&key, plan.shards))
        })
        .take(failed)
        .collect();
    let dead = fleet.members.remove(0);
    fleet.samples.remove(0);
    let killed_at = Instant::now();
    dead.kill().await?;
    eprintln!(
        "vigil-bench: killed {} holding shards {orphaned:?}; {} clusters fail now",
        replica_identity(0),
        victims.len()
    );
    let env_ref = env;
    let watch_takeover = async move {
        let mut taken: BTreeMap<u32, f64> = BTreeMap::new();
        let limit = Instant::now() + BALANCE_LIMIT;
        while taken.len() < orphaned.len() {
            ensure!(Instant::now() < limit, "shards {orphaned:?} not taken over after {BALANCE_LIMIT:?}");
            let held = holders(env_ref, plan.shards).await?;
            for s in &orphaned {
                if held.get(s).is_some_and(|h| *h != replica_identity(0)) {
                    taken.entry(*s).or_insert_with(|| killed_at.elapsed().as_secs_f64());
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok::<_, anyhow::Error>(taken)
    };
    let (taken, marked) = futures::future::join(watch_takeover, wave(plan, env, fleet, &victims)).await;
    let (taken, (latencies, _)) = (taken?, marked?);
    let times: Vec<f64> = taken.values().copied().collect();
    Ok(json!({
        "killed": replica_identity(0), "shards_moved": taken.len(),
        "takeover_s": {"min": round(times.iter().copied().fold(f64::INFINITY, f64::min)),
                       "max": round(times.iter().copied().fold(0.0, f64::max))},
        "lease_duration_s": 15, "renew_deadline_s": 10, "retry_period_s": 2,
        "detection_ms": latency_json(&latencies),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Readiness reads the sources a replica reports listed, and only those at 1.
    #[test]
    fn synced_sources_are_the_ones_at_one() {
        let text = "# HELP vigil_source_synced 1 while a watched source is listed and live\n\
                    # TYPE vigil_source_synced gauge\n\
                    vigil_source_synced{source=\"Nodes of workload cluster default/c1\"} 1\n\
                    vigil_source_synced{source=\"Nodes of workload cluster default/c2\"} 0\n\
                    vigil_source_synced{source=\"Cluster API Machines\"} 1\n\
                    vigil_workload_cluster_connected{cluster=\"default/c2\"} 1\n";
        let synced = synced_sources(text);
        assert_eq!(
            synced.into_iter().collect::<Vec<_>>(),
            ["Cluster API Machines", "Nodes of workload cluster default/c1"],
            "a source at 0 is not listed; other metrics are not sources"
        );
    }

    /// A cluster that did not come up is left out and named; the run stops when too many did not.
    #[test]
    fn clusters_not_up_are_left_out_up_to_a_share() {
        let clusters = |n: usize| (0..n).map(|i| WorkloadCluster::new(NS, &format!("w{i:04}"), 3)).collect::<Vec<_>>();
        let results = |failed: &[usize], n: usize| {
            (0..n).map(|i| if failed.contains(&i) { Err(anyhow::anyhow!("timed out")) } else { Ok(()) }).collect()
        };
        let (up, not_up) = keep_up(clusters(40), results(&[3, 17], 40)).expect("2 of 40 is within the share");
        assert_eq!(up.len(), 38);
        assert!(up.iter().all(|c| c.name != "w0003" && c.name != "w0017"), "the clusters not up are not checked");
        assert_eq!(not_up, ["w0003", "w0017"]);
        let (up, not_up) = keep_up(clusters(20), results(&[], 20)).expect("all up");
        assert_eq!((up.len(), not_up.len()), (20, 0));
        let err = keep_up(clusters(40), results(&[1, 2, 3], 40)).expect_err("3 of 40 is more than 5%");
        assert!(err.to_string().contains("only 37 of 40 clusters came up"), "{err}");
    }

    /// The wave's victims come from one list: workers with a Node, by deployment, deleted ones
    /// and control-plane Machines (no deployment label) left out.
    #[test]
    fn workers_with_nodes_group_by_deployment() {
        let machine = |name: &str, deployment: Option<&str>, node: Option<&str>, deleting: bool| {
            let mut m = json!({"metadata": {"name": name, "labels": {}}, "status": {}});
            if let Some(d) = deployment {
                m["metadata"]["labels"][DEPLOYMENT_NAME_LABEL] = json!(d);
            }
            if let Some(n) = node {
                m["status"]["nodeRef"] = json!({"name": n});
            }
            if deleting {
                m["metadata"]["deletionTimestamp"] = json!("2026-11-28T00:00:00Z");
            }
            m
        };
        let machines = [
            machine("w0001-md-0-b", Some("w0001-md-0"), Some("node-b"), false),
            machine("w0001-md-0-a", Some("w0001-md-0"), Some("node-a"), false),
            machine("w0001-md-0-c", Some("w0001-md-0"), None, false),
            machine("w0001-md-0-d", Some("w0001-md-0"), Some("node-d"), true),
            machine("w0001-cp", None, Some("node-cp"), false),
            machine("w0002-md-0-a", Some("w0002-md-0"), None, false),
        ];
        let workers = workers_with_nodes(&machines);
        assert_eq!(
            workers.get("w0001-md-0").cloned().unwrap_or_default(),
            [("w0001-md-0-a".to_string(), "node-a".to_string()), ("w0001-md-0-b".to_string(), "node-b".to_string())]
        );
        assert!(!workers.contains_key("w0002-md-0"), "a deployment with no Node has no victim");
        assert_eq!(workers.len(), 1);
    }
}
