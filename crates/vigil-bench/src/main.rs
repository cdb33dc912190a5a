//! `vigil-bench`: Vigil's scale benchmark. A real kube-apiserver + etcd, a fleet of Nodes and
//! Cluster API Machines under many health checks, a simulated kubelet (heartbeats, then a
//! failure wave), and `vigil run` as a separate process measured from outside: detection
//! latency through a watch, CPU and memory from /proc, requests from the API server's audit log.
//! Prints one JSON summary (see docs/benchmarks.md).

mod audit;
mod clusters;
mod fleet;
mod kubelet;
mod observe;
mod procstat;
mod snapshot;
mod summary;

use anyhow::{Context as _, Result, bail, ensure};
use clap::Parser;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node;
use kube::CustomResourceExt as _;
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::{ApiResource, GroupVersionKind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use summary::{
    Checks, Comparison, Config, Cpu, Heartbeats, Latency, Ratios, Rss, Setup, Summary, Verbs, WaveWrites, Writes,
};
use vigil_api::{MachineHealthCheck, NodeHealthCheck};
use vigil_testenv::TestEnv;

/// Command line.
#[derive(Parser, Debug)]
#[command(name = "vigil-bench", about = "Scale benchmark of `vigil run` against a real API server; prints JSON")]
struct Args {
    /// Quick run for the test suite: 500 Nodes, 5 s heartbeats, 10 s steady phase, 3 s wave, 3 s timeouts.
    #[arg(long, conflicts_with = "nodes")]
    short: bool,
    /// Nodes (and as many Machines) in the fleet.
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    /// Share of the targets that fail in the wave, in percent (0 < K ≤ 30: the checks'
    /// short-circuit thresholds stop remediation above 40%).
    #[arg(long, default_value_t = 5.0)]
    failed_percent: f64,
    /// Every Node heartbeats once per this many seconds [default: 60; --short: 5].
    #[arg(long)]
    heartbeat_secs: Option<f64>,
    /// Length of the steady phase in seconds [default: the heartbeat period; --short: 10].
    #[arg(long)]
    steady_secs: Option<f64>,
    /// The failures are spread over this many seconds [default: 10; --short: 3].
    #[arg(long)]
    wave_secs: Option<f64>,
    /// How long the wave waits for every remediation, from its first failure, in seconds
    /// [default: the timeout + 60]. A target not remediated by then counts as not detected.
    #[arg(long)]
    wave_limit_secs: Option<u64>,
    /// The checks' Ready=Unknown/False timeout in seconds [default: 5; --short: 3].
    #[arg(long)]
    timeout_secs: Option<u64>,
    /// `vigil run --workers` (its default is 16).
    #[arg(long, default_value_t = 16)]
    workers: usize,
    /// Which checks cover the fleet: `mixed` (60% of the targets under MachineHealthChecks,
    /// 40% under NodeHealthChecks), `mhc` (all under MachineHealthChecks) or `nhc` (all under
    /// NodeHealthChecks)
    /// [default: mixed; with --against capi: mhc; with --against medik8s: nhc].
    #[arg(long, value_enum)]
    fleet: Option<fleet::Fleet>,
    /// Give each of Vigil's health checks (both kinds) two CEL expression rules beside its
    /// conditions, evaluated for every target at every decision; they never hold, so the
    /// remediations stay the same.
    #[arg(long)]
    expressions: bool,
    /// Run Vigil, then another controller on a fresh API server with the same fleet, and print
    /// both summaries and their ratios: `capi` is Cluster API's MachineHealthCheck controller,
    /// `medik8s` medik8s' NodeHealthCheck operator.
    #[arg(long, value_enum, conflicts_with = "snapshot")]
    against: Option<Against>,
    /// Cluster API's MachineHealthCheck controller binary [default: built by scripts/capi-mhc.sh].
    #[arg(long)]
    capi_mhc: Option<PathBuf>,
    /// The directory holding medik8s' NodeHealthCheck operator (`nhc-manager`) [default:
    /// `VIGIL_MEDIK8S_NHC_DIR`, else built by scripts/medik8s-nhc.sh].
    #[arg(long)]
    medik8s_nhc: Option<PathBuf>,
    /// The `vigil` binary [default: built with this benchmark's profile, next to it].
    #[arg(long)]
    vigil: Option<PathBuf>,
    /// Also write the JSON summary to this file.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Write one line per failed target (check, target, expiry, latency in ms) to this file.
    #[arg(long)]
    samples: Option<PathBuf>,
    /// Also fail this many targets (none of the wave's) during the cold start, 1 s after the
    /// controller starts, so their timeouts run out while its first verdicts are still being
    /// written; their detection is reported apart (`cold_wave`). 0: off.
    #[arg(long, default_value_t = 0)]
    cold_wave: usize,
    /// With --against floor: the floor also writes `HealthCheckSucceeded=True` on every healthy
    /// Machine at its start (as Vigil and Cluster API do) and its cold start ends when they are
    /// written, so the comparison tells those writes from the rest of Vigil's cold start.
    #[arg(long)]
    floor_verdicts: bool,
    /// Keep the controller's log here (`RUST_LOG` is passed through).
    #[arg(long)]
    controller_log: Option<PathBuf>,
    /// Instead of one self-hosted fleet: this many in-memory workload clusters made by Cluster
    /// API's own controllers (scripts/capi-managers.sh), each with its own API server and one
    /// MachineHealthCheck; one worker fails in --failed-percent of them (rounded up).
    #[arg(long, conflicts_with_all = ["nodes", "short", "snapshot", "fleet"])]
    clusters: Option<usize>,
    /// Workers per workload cluster with --clusters.
    #[arg(long, default_value_t = 3, requires = "clusters")]
    workers_per_cluster: u32,
    /// With --clusters: run this many `vigil run --shards` replicas sharing the checks through
    /// shard Leases (default election durations), report each one's memory and CPU, then
    /// `kill -9` the first mid-failure and report how long its shards took to move.
    #[arg(long, default_value_t = 1, requires = "clusters", conflicts_with = "against")]
    replicas: usize,
    /// `vigil run --shards` with --replicas [default: 4 per replica].
    #[arg(long, requires = "replicas")]
    shards: Option<u32>,
    /// Instead of running the controller: time `vigil snapshot` of the fleet, `vigil simulate`
    /// of that snapshot with --failed-percent of the Nodes going Unknown at 5m, and `vigil check`.
    #[arg(long)]
    snapshot: bool,
    /// With --snapshot: keep the snapshot (`snapshot.json`), the scenario with the outage
    /// (`outage.json`) and the outputs of `vigil simulate` and `vigil check` (`simulate.json`,
    /// `check.json`) in this directory, to profile or compare the tools offline afterwards.
    #[arg(long, requires = "snapshot")]
    keep: Option<PathBuf>,
}

/// The controller `--against` compares Vigil with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Against {
    /// Cluster API's MachineHealthCheck reconciler and cluster cache (bench/capi-mhc).
    Capi,
    /// medik8s' NodeHealthCheck operator as published (bench/medik8s-nhc).
    Medik8s,
    /// The floor: the least a correct MachineHealthCheck controller does (`vigil-floor`, built
    /// with this benchmark), so Vigil's distance from the machine's limit shows.
    Floor,
}

impl Against {
    /// The fleet the comparison runs on: the contender's kind of check only.
    fn fleet(self) -> fleet::Fleet {
        match self {
            Against::Capi | Against::Floor => fleet::Fleet::Mhc,
            Against::Medik8s => fleet::Fleet::Nhc,
        }
    }

    /// The flag value.
    fn as_str(self) -> &'static str {
        match self {
            Against::Capi => "capi",
            Against::Medik8s => "medik8s",
            Against::Floor => "floor",
        }
    }
}

/// The run's parameters once defaults are applied and checked.
struct Plan {
    nodes: usize,
    fleet: fleet::Fleet,
    failed_percent: f64,
    heartbeat: Duration,
    steady: Duration,
    wave: Duration,
    timeout_secs: u64,
    /// Vigil's health checks carry expression rules (`--expressions`).
    expressions: bool,
    /// How long the wave waits for every remediation.
    wave_limit: Duration,
    workers: usize,
}

impl Args {
    /// The many-cluster run's plan (`None` without --clusters), every value checked.
    fn clusters_plan(&self, plan: &Plan) -> Result<Option<clusters::ClustersPlan>> {
        let Some(n) = self.clusters else { return Ok(None) };
        ensure!(
            self.against != Some(Against::Medik8s),
            "--clusters runs MachineHealthChecks in workload clusters: --against medik8s has none to compare"
        );
        ensure!((1..=2000).contains(&n), "--clusters must be in 1..=2000, got {n}");
        ensure!(
            (1..=20).contains(&self.workers_per_cluster),
            "--workers-per-cluster must be in 1..=20, got {}",
            self.workers_per_cluster
        );
        ensure!((1..=16).contains(&self.replicas), "--replicas must be in 1..=16, got {}", self.replicas);
        let shards = self.shards.unwrap_or(4 * self.replicas as u32);
        ensure!(
            self.replicas == 1 || (2..=1024).contains(&shards),
            "--shards must be in 2..=1024 with --replicas {}, got {shards}",
            self.replicas
        );
        Ok(Some(clusters::ClustersPlan {
            clusters: n,
            workers: self.workers_per_cluster,
            failed_percent: self.failed_percent,
            timeout_secs: plan.timeout_secs,
            replicas: self.replicas,
            shards,
            log: self.controller_log.clone(),
        }))
    }

    fn plan(&self) -> Result<Plan> {
        let short = self.short;
        let secs = |v: Option<f64>, normal: f64, quick: f64, flag: &str| -> Result<Duration> {
            let v = v.unwrap_or(if short { quick } else { normal });
            ensure!(v.is_finite() && v > 0.0 && v <= 3600.0, "--{flag} must be in (0, 3600] seconds, got {v}");
            Ok(Duration::from_secs_f64(v))
        };
        let heartbeat = secs(self.heartbeat_secs, 60.0, 5.0, "heartbeat-secs")?;
        let plan = Plan {
            nodes: if short { 500 } else { self.nodes },
            fleet: self.fleet.unwrap_or(self.against.map_or(fleet::Fleet::Mixed, Against::fleet)),
            failed_percent: self.failed_percent,
            heartbeat,
            steady: secs(self.steady_secs, heartbeat.as_secs_f64(), 10.0, "steady-secs")?,
            wave: secs(self.wave_secs, 10.0, 3.0, "wave-secs")?,
            timeout_secs: self.timeout_secs.unwrap_or(if short { 3 } else { 5 }),
            wave_limit: Duration::ZERO,
            workers: self.workers,
            expressions: self.expressions,
        };
        let mut plan = plan;
        let wave_limit = self.wave_limit_secs.unwrap_or(plan.timeout_secs + 60);
        ensure!(
            (plan.timeout_secs..=7200).contains(&wave_limit),
            "--wave-limit-secs must be in {}..=7200 (at least the timeout), got {wave_limit}",
            plan.timeout_secs
        );
        plan.wave_limit = Duration::from_secs(wave_limit);
        ensure!((100..=100_000).contains(&plan.nodes), "--nodes must be in 100..=100000, got {}", plan.nodes);
        ensure!(
            plan.failed_percent > 0.0 && plan.failed_percent <= 30.0,
            "--failed-percent must be in (0, 30], got {}",
            plan.failed_percent
        );
        ensure!(
            (1..=3600).contains(&plan.timeout_secs),
            "--timeout-secs must be in 1..=3600, got {}",
            plan.timeout_secs
        );
        ensure!((1..=64).contains(&plan.workers), "--workers must be in 1..=64, got {}", plan.workers);
        ensure!(
            !self.floor_verdicts || matches!(self.against, Some(Against::Floor)),
            "--floor-verdicts changes what the floor writes: it needs --against floor, got --against {}",
            self.against.map_or("(none)", Against::as_str)
        );
        ensure!(
            !(plan.expressions && self.against.is_some()),
            "--expressions measures Vigil's own cost of CEL rules: no other contender has them, so it cannot be run --against one"
        );
        if let Some(against) = self.against {
            ensure!(
                plan.fleet == against.fleet(),
                "--against {} compares {} only: --fleet must be {}, got {}",
                against.as_str(),
                if against == Against::Medik8s { "NodeHealthChecks" } else { "MachineHealthChecks" },
                against.fleet().as_str(),
                plan.fleet.as_str()
            );
        }
        Ok(plan)
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let plan = args.plan()?;
    let vigil = match &args.vigil {
        Some(path) => path.clone(),
        None => build_vigil()?,
    };
    ensure!(vigil.is_file(), "the vigil binary {} does not exist (--vigil)", vigil.display());
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let ours = Contender::Vigil { bin: vigil.clone(), workers: plan.workers };
    let json = if let Some(cplan) = args.clusters_plan(&plan)? {
        let dir = tempfile::Builder::new().prefix("vigil-bench-clusters-").tempdir()?;
        let vigil = runtime.block_on(clusters::run(&cplan, &ours, dir.path()))?;
        let out = match args.against {
            Some(Against::Capi) => {
                let theirs = Contender::Capi { bin: capi_mhc(&args)? };
                let capi = runtime.block_on(clusters::run(&cplan, &theirs, dir.path()))?;
                serde_json::json!({"vigil": vigil, "capi": capi})
            }
            Some(Against::Medik8s) => bail!("--clusters with --against medik8s is refused by the plan"),
            Some(Against::Floor) => bail!("--clusters with --against floor is refused by the plan"),
            None => serde_json::json!({"vigil": vigil}),
        };
        serde_json::to_string_pretty(&out)?
    } else if args.snapshot {
        serde_json::to_string_pretty(&runtime.block_on(snapshot::run(
            plan.nodes,
            plan.failed_percent,
            &vigil,
            args.keep.as_deref(),
        ))?)?
    } else if let Some(against) = args.against {
        let theirs = match against {
            Against::Capi => Contender::Capi { bin: capi_mhc(&args)? },
            Against::Medik8s => Contender::Medik8s { dir: runtime.block_on(medik8s_nhc(&args))? },
            Against::Floor => Contender::Floor {
                bin: floor_bin(&vigil)?,
                timeout_secs: plan.timeout_secs,
                verdicts: args.floor_verdicts,
            },
        };
        let vigil = runtime.block_on(run(&plan, &ours, &args))?;
        let summary = runtime.block_on(run(&plan, &theirs, &args))?;
        let comparison = match against {
            Against::Capi => Comparison {
                ratios: Ratios::of(&vigil, &summary, "capi"),
                vigil,
                capi: Some(summary),
                medik8s: None,
                floor: None,
            },
            Against::Medik8s => Comparison {
                ratios: Ratios::of(&vigil, &summary, "medik8s"),
                vigil,
                capi: None,
                medik8s: Some(summary),
                floor: None,
            },
            Against::Floor => Comparison {
                ratios: Ratios::over_floor(&vigil, &summary),
                vigil,
                capi: None,
                medik8s: None,
                floor: Some(summary),
            },
        };
        serde_json::to_string_pretty(&comparison)?
    } else {
        serde_json::to_string_pretty(&runtime.block_on(run(&plan, &ours, &args))?)?
    };
    println!("{json}");
    if let Some(out) = &args.out {
        std::fs::write(out, format!("{json}\n")).with_context(|| format!("cannot write {}", out.display()))?;
    }
    Ok(())
}

/// The profile this benchmark was built with; the controller is built the same way.
fn profile() -> &'static str {
    if cfg!(debug_assertions) { "debug" } else { "release" }
}

/// Builds `vigil` with this benchmark's profile when run through cargo (`cargo run -p
/// vigil-bench` builds only this package), and returns the binary next to this one.
fn build_vigil() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find this executable")?;
    let vigil = exe.with_file_name("vigil");
    if let Some(cargo) = std::env::var_os("CARGO") {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut cmd = std::process::Command::new(cargo);
        cmd.current_dir(&root).args(["build", "--locked", "-p", "vigil"]);
        if profile() == "release" {
            cmd.arg("--release");
        }
        eprintln!("vigil-bench: building vigil ({})", profile());
        let status = cmd.status().context("cannot run cargo build -p vigil")?;
        ensure!(status.success(), "cargo build -p vigil failed ({status})");
    }
    Ok(vigil)
}

/// The pinned Cluster API version of bench/capi-mhc (go.mod) and scripts/capi-mhc.sh.
const CAPI_VERSION: &str = "v1.14.2";
/// How long cold start may take before the run fails.
const COLD_START_LIMIT_SECS: u64 = 1200;
/// Cluster API's default `--machinehealthcheck-concurrency`, passed explicitly.
const CAPI_MHC_CONCURRENCY: usize = 50;

/// Cluster API's MachineHealthCheck controller: `--capi-mhc`, or built (once, cached) by
/// scripts/capi-mhc.sh before anything is measured.
fn capi_mhc(args: &Args) -> Result<PathBuf> {
    if let Some(path) = &args.capi_mhc {
        ensure!(path.is_file(), "the capi-mhc binary {} does not exist (--capi-mhc)", path.display());
        return Ok(path.clone());
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/capi-mhc.sh");
    eprintln!("vigil-bench: building Cluster API {CAPI_VERSION}'s MachineHealthCheck controller (cached)");
    let out = std::process::Command::new(&script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {}", script.display()))?;
    ensure!(out.status.success(), "{} failed ({})", script.display(), out.status);
    let path = PathBuf::from(String::from_utf8(out.stdout)?.trim());
    ensure!(path.is_file(), "{} printed {}, which is not a file", script.display(), path.display());
    Ok(path)
}

/// The version of medik8s' NodeHealthCheck operator (bench/medik8s-nhc/go.mod).
const MEDIK8S_VERSION: &str = vigil_testenv::medik8s::NHC_VERSION;
/// The NodeHealthCheck operator's reconciler concurrency: controller-runtime's default (it sets
/// no `MaxConcurrentReconciles`).
const MEDIK8S_CONCURRENCY: usize = 1;

/// medik8s' NodeHealthCheck operator: `--medik8s-nhc`, else `VIGIL_MEDIK8S_NHC_DIR`, else built
/// (once, cached) by scripts/medik8s-nhc.sh before anything is measured.
async fn medik8s_nhc(args: &Args) -> Result<PathBuf> {
    if let Some(dir) = &args.medik8s_nhc {
        ensure!(dir.join("nhc-manager").is_file(), "{} holds no nhc-manager (--medik8s-nhc)", dir.display());
        return Ok(dir.clone());
    }
    eprintln!("vigil-bench: building medik8s' NodeHealthCheck operator {MEDIK8S_VERSION} (cached)");
    vigil_testenv::medik8s::nhc_operator_dir().await
}

/// Writes `vigil-floor` keeps in flight at once: a connection bound, not a rate limit.
const FLOOR_IN_FLIGHT: usize = 64;

/// `vigil-floor`, built with this benchmark next to it (or next to `--vigil`'s binary).
fn floor_bin(vigil: &Path) -> Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find this executable")?;
    let candidates = [exe.with_file_name("vigil-floor"), vigil.with_file_name("vigil-floor")];
    candidates.into_iter().find(|p| p.is_file()).context("vigil-floor is not built: cargo build -p vigil-bench")
}

/// The controller a run measures.
enum Contender {
    /// `vigil run` with `workers`.
    Vigil { bin: PathBuf, workers: usize },
    /// Cluster API's MachineHealthCheck reconciler with its cluster cache (bench/capi-mhc).
    Capi { bin: PathBuf },
    /// medik8s' NodeHealthCheck operator, as vigil-testenv's medik8s module runs it (its
    /// directory, `nhc-manager`).
    Medik8s { dir: PathBuf },
    /// `vigil-floor` with the fleet's timeout.
    Floor { bin: PathBuf, timeout_secs: u64, verdicts: bool },
}

impl Contender {
    /// Its name in the summary and in errors.
    fn name(&self) -> String {
        match self {
            Contender::Vigil { .. } => "vigil".into(),
            Contender::Capi { .. } => format!("cluster-api {CAPI_VERSION} MachineHealthCheck"),
            Contender::Medik8s { .. } => format!("medik8s node-healthcheck-operator {MEDIK8S_VERSION}"),
            Contender::Floor { .. } => "floor".into(),
        }
    }

    /// Whose MachineHealthChecks the fleet carries for it (medik8s' runs have none: Vigil's
    /// resource, never created).
    fn checks(&self) -> fleet::CheckApi {
        match self {
            Contender::Vigil { .. } | Contender::Medik8s { .. } | Contender::Floor { .. } => fleet::CheckApi::Vigil,
            Contender::Capi { .. } => fleet::CheckApi::Capi,
        }
    }

    /// Whose NodeHealthChecks the fleet carries for it (Cluster API's runs have none).
    fn node_checks(&self) -> fleet::NodeChecks {
        match self {
            Contender::Vigil { .. } | Contender::Capi { .. } | Contender::Floor { .. } => fleet::NodeChecks::Vigil,
            Contender::Medik8s { .. } => fleet::NodeChecks::Medik8s,
        }
    }

    /// [`Contender::node_checks`], with expression rules when the plan asks for them and the
    /// contender is Vigil (no other contender has them).
    fn node_checks_for(&self, plan: &Plan) -> fleet::NodeChecks {
        match self {
            Contender::Vigil { .. } if plan.expressions => fleet::NodeChecks::VigilWithExpressions,
            _ => self.node_checks(),
        }
    }

    /// How many checks it works on at once.
    fn concurrency(&self) -> usize {
        match self {
            Contender::Vigil { workers, .. } => *workers,
            Contender::Capi { .. } => CAPI_MHC_CONCURRENCY,
            Contender::Medik8s { .. } => MEDIK8S_CONCURRENCY,
            Contender::Floor { .. } => FLOOR_IN_FLIGHT,
        }
    }

    /// `path` for Vigil, `path.capi` for Cluster API, `path.medik8s` for medik8s
    /// (`--controller-log`, `--samples`).
    fn file(&self, path: Option<&Path>) -> Option<PathBuf> {
        let path = path?;
        let suffix = match self {
            Contender::Vigil { .. } => return Some(path.to_path_buf()),
            Contender::Capi { .. } => ".capi",
            Contender::Medik8s { .. } => ".medik8s",
            Contender::Floor { .. } => ".floor",
        };
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        Some(PathBuf::from(name))
    }

    fn command(&self, kubeconfig: &Path) -> tokio::process::Command {
        match self {
            Contender::Vigil { bin, workers } => {
                let mut cmd = tokio::process::Command::new(bin);
                cmd.arg("run").arg("--kubeconfig").arg(kubeconfig).arg("--workers").arg(workers.to_string());
                // One replica, as the upstream controllers are measured: a Lease renewal every 2 s
                // would be the only steady-state write, and it measures nothing about health checking.
                cmd.arg("--leader-elect=false");
                cmd
            }
            Contender::Capi { bin } => {
                let mut cmd = tokio::process::Command::new(bin);
                cmd.arg("--kubeconfig").arg(kubeconfig);
                cmd.arg(format!("--machinehealthcheck-concurrency={CAPI_MHC_CONCURRENCY}"));
                cmd
            }
            // Spawned from its vigil_testenv::medik8s::NhcSetup (see `Controller::start`).
            Contender::Medik8s { dir } => tokio::process::Command::new(dir.join("nhc-manager")),
            Contender::Floor { bin, timeout_secs, verdicts } => {
                let mut cmd = tokio::process::Command::new(bin);
                cmd.arg("--kubeconfig").arg(kubeconfig).arg("--timeout-secs").arg(timeout_secs.to_string());
                cmd.arg("--in-flight").arg(FLOOR_IN_FLIGHT.to_string());
                if *verdicts {
                    cmd.arg("--healthy-verdicts");
                }
                cmd
            }
        }
    }
}

/// Waits until the controller's requests have stopped: at least 3 s, then until its audit log
/// (only the controller's requests are audited) has not grown for 2 s, at most 60 s.
async fn settle(audit_log: &Path) {
    const QUIET: Duration = Duration::from_secs(2);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let limit = Instant::now() + Duration::from_secs(60);
    let size = || std::fs::metadata(audit_log).map(|m| m.len()).unwrap_or(0);
    let (mut last, mut since) = (size(), Instant::now());
    while Instant::now() < limit && since.elapsed() < QUIET {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = size();
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
}

/// A phase boundary on both clocks: `Instant` for samples, wall time for the audit log.
#[derive(Clone, Copy)]
struct Mark {
    at: Instant,
    wall: Timestamp,
    cpu: f64,
}

fn mark(pid: u32) -> Result<Mark> {
    Ok(Mark { at: Instant::now(), wall: Timestamp::now(), cpu: procstat::cpu_seconds(pid)? })
}

/// The measured controller as a child process, killed if the benchmark fails.
struct Controller {
    child: tokio::process::Child,
    pid: u32,
    log: PathBuf,
    name: String,
    /// medik8s' operator's run (its host lock, kubeconfig and webhook certificate), kept while
    /// it runs.
    _medik8s: Option<vigil_testenv::medik8s::NhcSetup>,
}

impl Controller {
    fn spawn(contender: &Contender, kubeconfig: &Path, log: PathBuf) -> Result<Controller> {
        Controller::spawn_command(contender.command(kubeconfig), contender.name(), log)
    }

    /// As [`Controller::spawn`]; medik8s' operator is started as vigil-testenv's medik8s module
    /// starts it (flags, environment, webhook certificate, the host lock on its fixed port),
    /// with the audited identity of `env`.
    async fn start(contender: &Contender, env: &TestEnv, kubeconfig: &Path, log: PathBuf) -> Result<Controller> {
        let Contender::Medik8s { dir } = contender else {
            return Controller::spawn(contender, kubeconfig, log);
        };
        let setup = vigil_testenv::medik8s::NhcSetup::prepare_in(dir, &env.audited_kubeconfig_yaml()).await?;
        let mut controller = Controller::spawn_command(setup.command()?, contender.name(), log)?;
        controller._medik8s = Some(setup);
        Ok(controller)
    }

    /// Starts `command` as the measured controller `name`, its stderr in `log`.
    fn spawn_command(mut command: tokio::process::Command, name: String, log: PathBuf) -> Result<Controller> {
        let stderr = std::fs::File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
        let child = command
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {name}"))?;
        let pid = child.id().with_context(|| format!("{name} exited at once"))?;
        Ok(Controller { child, pid, log, name, _medik8s: None })
    }

    /// Fails when the controller has exited, with the end of its log.
    fn check_running(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            bail!(
                "{} exited ({status}); last lines of its log:\n{}",
                self.name,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        Ok(())
    }

    /// SIGKILL, as a crashed or evicted replica goes: nothing is released.
    async fn kill(mut self) -> Result<()> {
        self.child.start_kill()?;
        self.child.wait().await?;
        Ok(())
    }

    /// SIGTERM, then up to 10 s for a clean exit (SIGKILL after).
    async fn stop(mut self) -> Result<()> {
        if let Some(pid) = rustix::process::Pid::from_raw(self.pid as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await.is_err() {
            self.child.start_kill()?;
            self.child.wait().await?;
        }
        Ok(())
    }
}

async fn run(plan: &Plan, contender: &Contender, args: &Args) -> Result<Summary> {
    let stage = set_up(plan, contender).await?;
    let measured = measure(&stage, plan, contender, args).await?;
    report(&stage, &measured, plan, contender, args).await
}

/// The API server and the fleet of one run, ready for the controller.
struct Stage {
    env: TestEnv,
    groups: Vec<fleet::Group>,
    /// The group of each target, by index.
    group_of: Vec<usize>,
    /// The instant every condition of the fleet has been true since (the kubelets report it).
    since: String,
    apiserver_ms: f64,
    fleet_ms: f64,
}

impl Stage {
    /// The object target `i`'s check acts on: its Machine or its Node.
    fn key(&self, i: usize) -> String {
        match self.groups[self.group_of[i]].kind {
            fleet::Kind::Machine => fleet::machine_name(i),
            fleet::Kind::Node => fleet::node_name(i),
        }
    }
}

/// Starts the API server with every run's CRDs, then creates the fleet and its checks.
async fn set_up(plan: &Plan, contender: &Contender) -> Result<Stage> {
    let n = plan.nodes;
    let t0 = Instant::now();
    eprintln!("vigil-bench: starting etcd + kube-apiserver");
    let env = TestEnv::start().await?;
    env.install_upstream_crds().await?;
    // Every run gets the same CRDs: Vigil's, Cluster API's MachineHealthCheck and medik8s'
    // NodeHealthCheck.
    fleet::install_capi_mhc_crd(&env).await?;
    env.install_crds(&[
        serde_json::to_value(MachineHealthCheck::crd())?,
        serde_json::to_value(NodeHealthCheck::crd())?,
        vigil_testenv::medik8s::nhc_crd()?,
    ])
    .await?;
    let apiserver_ms = t0.elapsed().as_secs_f64() * 1000.0;

    let groups = fleet::layout(n, plan.fleet);
    eprintln!("vigil-bench: creating {n} Nodes, {n} Machines and {} checks for {}", groups.len(), contender.name());
    let t1 = Instant::now();
    // One instant for the fleet and the kubelets: if the heartbeats carried another
    // `lastTransitionTime`, the first heartbeat of each Node would be a real condition change.
    let since = fleet::time(Timestamp::now() - SignedDuration::from_hours(24));
    let node_checks = contender.node_checks_for(plan);
    fleet::create(&env, n, &groups, plan.timeout_secs, contender.checks(), node_checks, &since).await?;
    let fleet_ms = t1.elapsed().as_secs_f64() * 1000.0;
    let group_of = fleet::group_of(&groups, n);
    Ok(Stage { env, groups, group_of, since, apiserver_ms, fleet_ms })
}

/// The phase boundaries of one run.
struct Marks {
    start: Mark,
    cold: Mark,
    steady_start: Mark,
    steady_end: Mark,
    wave_end: Mark,
}

impl Marks {
    fn cold_start_ms(&self) -> f64 {
        (self.cold.at - self.start.at).as_secs_f64() * 1000.0
    }

    fn cpu(&self) -> Cpu {
        Cpu {
            cold_start: self.cold.cpu - self.start.cpu,
            steady: self.steady_end.cpu - self.steady_start.cpu,
            wave: self.wave_end.cpu - self.steady_end.cpu,
        }
    }
}

/// What a run saw of the controller while it ran, before the audit log is read.
struct Measured {
    marks: Marks,
    kubelets: std::sync::Arc<kubelet::Kubelets>,
    observer: observe::Observer,
    /// The wave's failures.
    failures: Vec<kubelet::Failure>,
    /// The failures during the cold start (`--cold-wave`).
    cold_failures: Vec<kubelet::Failure>,
    rss: procstat::RssSamples,
    peak_kib: u64,
    /// How long the kubelets heartbeat.
    beat_secs: f64,
    /// The controller's kubeconfig (and by default its log), kept for the whole run.
    _dir: tempfile::TempDir,
}

impl Measured {
    fn rss_mib(&self) -> Rss {
        let m = &self.marks;
        let steady = self.rss.peak_mib(m.steady_start.at, m.steady_end.at);
        let wave = self.rss.peak_mib(m.steady_end.at, m.wave_end.at);
        // The kernel's high-water mark trails a sample of VmRSS by its per-thread counters' lag
        // (a few hundred KiB seen under mimalloc); the peak is at least every sample.
        Rss { peak: (self.peak_kib as f64 / 1024.0).max(steady).max(wave), steady, wave }
    }

    fn heartbeats(&self) -> Heartbeats {
        let sent = || self.kubelets.sent.load(std::sync::atomic::Ordering::Relaxed);
        Heartbeats {
            sent: sent(),
            errors: self.kubelets.errors.load(std::sync::atomic::Ordering::Relaxed),
            per_second: sent() as f64 / self.beat_secs,
        }
    }
}

/// Starts the kubelets, the watches and the controller; then its cold start, a steady phase
/// and the failure wave, each between two marks; then stops them all.
async fn measure(stage: &Stage, plan: &Plan, contender: &Contender, args: &Args) -> Result<Measured> {
    let (env, n) = (&stage.env, plan.nodes);
    let nodes: Api<Node> = Api::all(env.client());
    let kubelets = kubelet::Kubelets::new(nodes, n, stage.since.clone());
    let beats_started = Instant::now();
    let beats = kubelets.spawn_heartbeats(plan.heartbeat);
    let observer = observe::Observer::default();
    let watches = observer.spawn(env.client());

    let dir = tempfile::Builder::new().prefix("vigil-bench-").tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, env.audited_kubeconfig_yaml())?;

    eprintln!("vigil-bench: starting {}", contender.name());
    let log = contender.file(args.controller_log.as_deref()).unwrap_or_else(|| dir.path().join("controller.log"));
    let mut controller = Controller::start(contender, env, &kubeconfig, log).await?;
    let pid = controller.pid;
    let start = mark(pid)?;
    let rss = procstat::RssSamples::default();
    let sampler = rss.spawn(pid);
    let wave_plan = kubelet::wave_plan(n, plan.failed_percent, plan.wave);
    let cold_failing = (args.cold_wave > 0).then(|| {
        let cold_plan = kubelet::cold_wave_plan(n, args.cold_wave, &wave_plan, Duration::from_secs(1));
        let kubelets = kubelets.clone();
        tokio::spawn(async move { kubelets.fail(cold_plan, Instant::now()).await })
    });

    wait_cold_start(&mut controller, contender, stage, &observer).await?;
    let cold = mark(pid)?;
    let cold_start_ms = (cold.at - start.at).as_secs_f64() * 1000.0;
    eprintln!("vigil-bench: cold start {cold_start_ms:.0} ms; steady phase {:?}", plan.steady);

    tokio::time::sleep(Duration::from_secs(2)).await;
    let steady_start = mark(pid)?;
    tokio::time::sleep(plan.steady).await;
    controller.check_running()?;
    let steady_end = mark(pid)?;

    let cold_failures = match cold_failing {
        Some(task) => task.await??,
        None => Vec::new(),
    };
    eprintln!("vigil-bench: failing {} targets over {:?}", wave_plan.len(), plan.wave);
    let failures = kubelets.fail(wave_plan, Instant::now()).await?;
    wait_wave(&mut controller, stage, &observer, &failures, plan.wave_limit).await?;
    // Settle: writes that trail the last remediation (status, events sent after the
    // remediations on Vigil's event lane) belong to the wave.
    settle(&env.audit_log_path().context("the test env has no directory")?).await;
    let wave_end = mark(pid)?;
    let peak_kib = procstat::status_kib(pid, "VmHWM")?;

    beats.abort();
    for w in watches {
        w.abort();
    }
    sampler.abort();
    controller.stop().await?;
    let beat_secs = beats_started.elapsed().as_secs_f64();
    let marks = Marks { start, cold, steady_start, steady_end, wave_end };
    Ok(Measured { marks, kubelets, observer, failures, cold_failures, rss, peak_kib, beat_secs, _dir: dir })
}

/// Waits for the cold start: every check's first status, every selected Machine's first verdict.
async fn wait_cold_start(
    controller: &mut Controller,
    contender: &Contender,
    stage: &Stage,
    observer: &observe::Observer,
) -> Result<()> {
    let groups = &stage.groups;
    let mhc_targets: usize = groups.iter().filter(|g| g.kind == fleet::Kind::Machine).map(fleet::Group::size).sum();
    let checks = CheckApis::new(stage.env.client(), contender.checks(), contender.node_checks());
    // Cluster API's controller took 581 s at 10 000 Machines (its client rate limit and 1-minute
    // reconcile timeout make the first passes of the large checks fail): room for that.
    let cold_deadline = Instant::now() + Duration::from_secs(COLD_START_LIMIT_SECS);
    loop {
        controller.check_running()?;
        let verdicts = observer.lock().verdicts.len();
        // The floor writes no status (and healthy verdicts only when asked): its cold start ends
        // when it says it is synced.
        let ready = match contender {
            Contender::Floor { .. } => std::fs::read_to_string(&controller.log)?.contains("vigil-floor: synced"),
            _ => verdicts == mhc_targets && checks.all_evaluated(groups).await?,
        };
        if ready {
            return Ok(());
        }
        ensure!(
            Instant::now() < cold_deadline,
            "cold start did not complete within {COLD_START_LIMIT_SECS} s ({verdicts} of {mhc_targets} Machines have a verdict)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until every target of the wave is seen remediated, or `limit` has passed.
async fn wait_wave(
    controller: &mut Controller,
    stage: &Stage,
    observer: &observe::Observer,
    failures: &[kubelet::Failure],
    limit: Duration,
) -> Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        controller.check_running()?;
        // Only the wave's own targets (the cold wave's are remediated already).
        let seen = {
            let seen = observer.lock();
            failures.iter().filter(|f| seen.remediated.contains_key(&stage.key(f.index))).count()
        };
        if seen >= failures.len() || Instant::now() > deadline {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How long after its timeout ran out each of `failures` was seen remediated, in ms, and the
/// `--samples` line of each (check, target, expiry, latency); a failure not seen has neither.
fn detections(
    stage: &Stage,
    seen: &observe::Seen,
    failures: &[kubelet::Failure],
    timeout_secs: u64,
) -> (Vec<f64>, String) {
    let mut samples = Vec::new();
    let mut lines = String::new();
    for f in failures {
        let key = stage.key(f.index);
        if let Some(at) = seen.remediated.get(&key) {
            let expiry = f.since + SignedDuration::from_secs(timeout_secs as i64);
            let ms = at.duration_since(expiry).as_secs_f64() * 1000.0;
            samples.push(ms);
            lines.push_str(&format!("{} {key} {expiry} {ms:.1}\n", stage.groups[stage.group_of[f.index]].name));
        }
    }
    (samples, lines)
}

/// The controller's requests in the audit log, by phase of the run.
#[derive(Default)]
struct Requests {
    verbs: Verbs,
    /// `phase verb resource` → count.
    by_phase: std::collections::BTreeMap<String, u64>,
    cold_start_writes: u64,
    steady_writes: u64,
    wave: WaveWrites,
}

impl Requests {
    fn count(requests: &[audit::Request], marks: &Marks) -> Requests {
        let (cold, steady_start, steady_end, wave_end) =
            (marks.cold.wall, marks.steady_start.wall, marks.steady_end.wall, marks.wave_end.wall);
        let mut out = Requests::default();
        for r in requests {
            out.verbs.add(&r.verb);
            let phase = if r.at < cold {
                "cold_start"
            } else if r.at < steady_start {
                "settle"
            } else if r.at < steady_end {
                "steady"
            } else {
                "wave"
            };
            let resource = match (r.resource.as_str(), r.subresource.as_str()) {
                ("", _) => "(discovery)".to_string(),
                (res, "") => res.to_string(),
                (res, sub) => format!("{res}/{sub}"),
            };
            *out.by_phase.entry(format!("{phase} {} {resource}", r.verb)).or_default() += 1;
            if !r.is_write() {
                continue;
            }
            if r.at < cold {
                out.cold_start_writes += 1;
            } else if (steady_start..steady_end).contains(&r.at) {
                out.steady_writes += 1;
            } else if (steady_end..=wave_end).contains(&r.at) {
                match (r.resource.as_str(), r.subresource.as_str()) {
                    ("machines", _) | ("selfnoderemediations", _) => out.wave.target += 1,
                    ("machinehealthchecks" | "nodehealthchecks", "status") => out.wave.status += 1,
                    ("events", _) => out.wave.event += 1,
                    _ => out.wave.other += 1,
                }
            }
        }
        out
    }
}

/// The run's parameters, as the summary reports them.
fn config(plan: &Plan, contender: &Contender) -> Config {
    Config {
        fleet: plan.fleet.as_str().to_string(),
        heartbeat_secs: plan.heartbeat.as_secs_f64(),
        steady_secs: plan.steady.as_secs_f64(),
        wave_secs: plan.wave.as_secs_f64(),
        timeout_secs: plan.timeout_secs,
        wave_limit_secs: plan.wave_limit.as_secs(),
        failed_percent: plan.failed_percent,
        expressions: contender.node_checks_for(plan) == fleet::NodeChecks::VigilWithExpressions,
        floor_verdicts: matches!(contender, Contender::Floor { verdicts: true, .. }),
        workers: contender.concurrency(),
        profile: profile().to_string(),
    }
}

/// The run's summary: detection from the watches (and `--samples`), requests from the audit log.
async fn report(
    stage: &Stage,
    measured: &Measured,
    plan: &Plan,
    contender: &Contender,
    args: &Args,
) -> Result<Summary> {
    let (n, groups, failures) = (plan.nodes, &stage.groups, &measured.failures);
    let (samples, lines) = detections(stage, &measured.observer.lock(), failures, plan.timeout_secs);
    if let Some(path) = contender.file(args.samples.as_deref()) {
        std::fs::write(&path, lines).with_context(|| format!("cannot write {}", path.display()))?;
    }
    let detected = samples.len();
    let cold_failures = &measured.cold_failures;
    let cold_wave = (!cold_failures.is_empty()).then(|| {
        let (latencies, _) = detections(stage, &measured.observer.lock(), cold_failures, plan.timeout_secs);
        summary::ColdWave { failed: cold_failures.len(), detected: latencies.len(), detect_ms: Latency::of(latencies) }
    });

    // The audit log is written as requests complete: give it a moment after the stop.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let log = stage.env.audit_log_path().context("the test env has no directory")?;
    let requests = Requests::count(&audit::read(&log)?, &measured.marks);
    let failed = failures.len();
    Ok(Summary {
        controller: contender.name(),
        nodes: n,
        machines: n,
        failed,
        detected,
        checks: Checks {
            machine: groups.iter().filter(|g| g.kind == fleet::Kind::Machine).count(),
            node: groups.iter().filter(|g| g.kind == fleet::Kind::Node).count(),
        },
        detect_ms: Latency::of(samples),
        cpu_s: measured.marks.cpu(),
        rss_mib: measured.rss_mib(),
        requests: requests.verbs,
        requests_by_phase: requests.by_phase,
        writes: Writes {
            cold_start: requests.cold_start_writes,
            steady: requests.steady_writes,
            per_remediation: if failed == 0 { 0.0 } else { requests.wave.target as f64 / failed as f64 },
            wave: requests.wave,
        },
        cold_start_ms: measured.marks.cold_start_ms(),
        cold_wave,
        heartbeats: measured.heartbeats(),
        setup_ms: Setup { apiserver: stage.apiserver_ms, fleet: stage.fleet_ms },
        config: config(plan, contender),
    })
}

/// The health checks of a run, read back to see when cold start is complete.
struct CheckApis {
    vigil_mhcs: Api<MachineHealthCheck>,
    /// Cluster API's MachineHealthChecks, when the run is Cluster API's.
    capi_mhcs: Option<Api<DynamicObject>>,
    nhcs: Api<NodeHealthCheck>,
    /// medik8s' NodeHealthChecks, when the run is medik8s'.
    medik8s_nhcs: Option<Api<DynamicObject>>,
}

impl CheckApis {
    fn new(client: kube::Client, checks: fleet::CheckApi, node_checks: fleet::NodeChecks) -> CheckApis {
        let capi = ApiResource::from_gvk(&GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "MachineHealthCheck"));
        let medik8s =
            ApiResource::from_gvk(&GroupVersionKind::gvk("remediation.medik8s.io", "v1alpha1", "NodeHealthCheck"));
        CheckApis {
            vigil_mhcs: Api::namespaced(client.clone(), fleet::NS),
            capi_mhcs: (checks == fleet::CheckApi::Capi)
                .then(|| Api::namespaced_with(client.clone(), fleet::NS, &capi)),
            nhcs: Api::all(client.clone()),
            medik8s_nhcs: (node_checks == fleet::NodeChecks::Medik8s).then(|| Api::all_with(client, &medik8s)),
        }
    }

    /// Whether every check has written a status that accounts for all its targets
    /// (`status.expectedMachines` of both kinds of MachineHealthCheck).
    async fn all_evaluated(&self, groups: &[fleet::Group]) -> Result<bool> {
        let size = |name: &str| groups.iter().find(|g| g.name == name).map(fleet::Group::size);
        let mut expected: Vec<(String, Option<usize>)> = Vec::new();
        if let Some(capi) = &self.capi_mhcs {
            for c in capi.list(&ListParams::default()).await? {
                let count = c.data.pointer("/status/expectedMachines").and_then(serde_json::Value::as_u64);
                expected.push((c.metadata.name.unwrap_or_default(), count.map(|c| c as usize)));
            }
        } else {
            for c in self.vigil_mhcs.list(&ListParams::default()).await? {
                let count = c.status.as_ref().map(|s| s.expected_machines as usize);
                expected.push((c.metadata.name.unwrap_or_default(), count));
            }
        }
        if let Some(medik8s) = &self.medik8s_nhcs {
            // `status.observedNodes` of medik8s' checks: written on each reconcile of an
            // enabled check.
            for c in medik8s.list(&ListParams::default()).await? {
                let observed = c.data.pointer("/status/observedNodes").and_then(serde_json::Value::as_u64);
                expected.push((c.metadata.name.unwrap_or_default(), observed.map(|c| c as usize)));
            }
        } else {
            for c in self.nhcs.list(&ListParams::default()).await? {
                let observed = c.status.as_ref().map(|s| s.observed_nodes as usize);
                expected.push((c.metadata.name.unwrap_or_default(), observed));
            }
        }
        Ok(expected.iter().all(|(name, count)| *count == size(name)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_of(args: &[&str]) -> Result<Plan> {
        let args = Args::try_parse_from(std::iter::once("vigil-bench").chain(args.iter().copied()))?;
        args.plan()
    }

    #[test]
    fn bad_values_are_refused_naming_the_flag_and_the_value() {
        for (args, message) in [
            (&["--nodes", "10"][..], "--nodes must be in 100..=100000, got 10"),
            (&["--failed-percent", "45"][..], "--failed-percent must be in (0, 30], got 45"),
            (&["--failed-percent", "0"][..], "--failed-percent must be in (0, 30], got 0"),
            (&["--heartbeat-secs", "0"][..], "--heartbeat-secs must be in (0, 3600] seconds, got 0"),
            (&["--wave-secs=-1"][..], "--wave-secs must be in (0, 3600] seconds, got -1"),
            (&["--timeout-secs", "0"][..], "--timeout-secs must be in 1..=3600, got 0"),
            (&["--workers", "0"][..], "--workers must be in 1..=64, got 0"),
            (&["--wave-limit-secs", "2"][..], "--wave-limit-secs must be in 5..=7200 (at least the timeout), got 2"),
        ] {
            let err = plan_of(args).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains(message), "{args:?}: {err}");
        }
        assert!(plan_of(&["--short", "--nodes", "1000"]).is_err(), "--short fixes the size");
        let short = plan_of(&["--short"]).expect("valid");
        assert_eq!((short.nodes, short.timeout_secs, short.steady), (500, 3, Duration::from_secs(10)));
        let err = plan_of(&["--against", "capi", "--fleet", "mixed"]).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("--fleet must be mhc, got mixed"), "{err}");
        assert_eq!(plan_of(&["--against", "capi"]).expect("valid").fleet, fleet::Fleet::Mhc);
        let err = plan_of(&["--against", "medik8s", "--fleet", "mhc"]).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            err.contains("--against medik8s compares NodeHealthChecks only: --fleet must be nhc, got mhc"),
            "{err}"
        );
        assert_eq!(plan_of(&["--against", "medik8s"]).expect("valid").fleet, fleet::Fleet::Nhc);
        assert!(plan_of(&["--against", "medik8s", "--snapshot"]).is_err());
        assert_eq!(plan_of(&[]).expect("valid").fleet, fleet::Fleet::Mixed, "the default fleet stays mixed");
        assert!(plan_of(&["--against", "capi", "--snapshot"]).is_err());
        for against in [&["--against", "capi"][..], &[]] {
            let args: Vec<&str> = against.iter().copied().chain(["--floor-verdicts"]).collect();
            let err = plan_of(&args).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains("--floor-verdicts changes what the floor writes: it needs --against floor"), "{err}");
        }
        assert!(plan_of(&["--against", "floor", "--floor-verdicts"]).is_ok());
        let keep = Args::try_parse_from(["vigil-bench", "--keep", "/tmp/x"]).err().map(|e| e.to_string());
        assert!(keep.as_deref().is_some_and(|e| e.contains("--snapshot")), "--keep needs --snapshot: {keep:?}");
        let big = plan_of(&["--nodes", "10000"]).expect("valid");
        assert_eq!((big.nodes, big.heartbeat, big.steady), (10_000, Duration::from_secs(60), Duration::from_secs(60)));
    }

    fn clusters_of(args: &[&str]) -> Result<Option<clusters::ClustersPlan>> {
        let args = Args::try_parse_from(std::iter::once("vigil-bench").chain(args.iter().copied()))?;
        args.clusters_plan(&args.plan()?)
    }

    #[test]
    fn bad_cluster_values_are_refused_naming_the_flag_and_the_value() {
        for (args, message) in [
            (&["--clusters", "0"][..], "--clusters must be in 1..=2000, got 0"),
            (&["--clusters", "5000"][..], "--clusters must be in 1..=2000, got 5000"),
            (&["--clusters", "5", "--workers-per-cluster", "0"][..], "--workers-per-cluster must be in 1..=20, got 0"),
            (&["--clusters", "5", "--replicas", "0"][..], "--replicas must be in 1..=16, got 0"),
            (&["--clusters", "5", "--replicas", "17"][..], "--replicas must be in 1..=16, got 17"),
            (
                &["--clusters", "5", "--replicas", "3", "--shards", "1"][..],
                "--shards must be in 2..=1024 with --replicas 3, got 1",
            ),
            (
                &["--clusters", "5", "--replicas", "3", "--shards", "2000"][..],
                "--shards must be in 2..=1024 with --replicas 3, got 2000",
            ),
        ] {
            let err = clusters_of(args).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains(message), "{args:?}: {err}");
        }
        assert!(clusters_of(&["--shards", "4"]).is_err(), "--shards needs --replicas");
        let err = clusters_of(&["--clusters", "5", "--against", "medik8s"]).err().map(|e| e.to_string());
        assert!(err.unwrap_or_default().contains("--against medik8s has none to compare"));
        assert!(clusters_of(&[]).expect("valid").is_none(), "no --clusters, no many-cluster run");
        let three = clusters_of(&["--clusters", "200", "--replicas", "3"]).expect("valid").expect("a plan");
        assert_eq!((three.clusters, three.replicas, three.shards), (200, 3, 12), "4 shards per replica by default");
        let one = clusters_of(&["--clusters", "50"]).expect("valid").expect("a plan");
        assert_eq!((one.replicas, one.shards), (1, 4));
    }
}
