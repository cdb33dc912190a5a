//! The JSON summary a run prints (fields documented in docs/benchmarks.md).

use serde::{Deserialize, Serialize};

/// One benchmark run.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    /// The controller measured: `vigil`, `cluster-api v1.14.2 MachineHealthCheck` or
    /// `medik8s node-healthcheck-operator v0.12.0`.
    pub controller: String,
    /// Nodes in the fleet.
    pub nodes: usize,
    /// Cluster API Machines in the fleet (one per Node).
    pub machines: usize,
    /// Targets made to fail in the wave.
    pub failed: usize,
    /// Failed targets whose remediation write was seen before the deadline.
    pub detected: usize,
    /// Health checks by kind.
    pub checks: Checks,
    /// Timeout expiry → remediation write visible through a watch, over the detected targets.
    pub detect_ms: Latency,
    /// Controller CPU seconds (user + system) per phase.
    pub cpu_s: Cpu,
    /// Controller resident memory in MiB.
    pub rss_mib: Rss,
    /// Every request the controller made, by verb, over the whole run.
    pub requests: Verbs,
    /// Every request by "phase verb resource[/subresource]" (phases: cold_start, settle,
    /// steady, wave), to see where the requests go.
    pub requests_by_phase: std::collections::BTreeMap<String, u64>,
    /// The controller's writes per phase.
    pub writes: Writes,
    /// Start of `vigil run` → every check's first status written and every Machine's first
    /// verdict visible.
    pub cold_start_ms: f64,
    /// Failures whose timeouts ran out during the cold start (`--cold-wave`), reported apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_wave: Option<ColdWave>,
    /// The simulated kubelets' heartbeats.
    pub heartbeats: Heartbeats,
    /// Set-up times (not the controller's).
    pub setup_ms: Setup,
    /// What was run.
    pub config: Config,
}

/// Check counts.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Checks {
    /// MachineHealthChecks.
    pub machine: usize,
    /// NodeHealthChecks.
    pub node: usize,
}

/// A failure wave during the cold start: is a remediation delayed by the first verdicts?
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ColdWave {
    /// Targets made to fail 1 s after the controller started.
    pub failed: usize,
    /// Of those, remediated before the run ended.
    pub detected: usize,
    /// Timeout expiry → remediation write visible through a watch.
    pub detect_ms: Latency,
}

/// Latency percentiles (nearest rank), in milliseconds.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Latency {
    /// Fastest (negative would mean a remediation before the timeout expired).
    pub min: f64,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Slowest.
    pub max: f64,
}

impl Latency {
    /// Percentiles of `samples` (all zero when there are none).
    pub fn of(mut samples: Vec<f64>) -> Latency {
        if samples.is_empty() {
            return Latency::default();
        }
        samples.sort_by(f64::total_cmp);
        let rank = |p: f64| samples[((p / 100.0 * samples.len() as f64).ceil() as usize).clamp(1, samples.len()) - 1];
        Latency { min: samples[0], p50: rank(50.0), p99: rank(99.0), max: samples[samples.len() - 1] }
    }
}

/// CPU seconds per phase.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Cpu {
    /// From start to cold start complete.
    pub cold_start: f64,
    /// The steady phase: heartbeats only.
    pub steady: f64,
    /// The failure wave, until every remediation was seen (plus a short settle).
    pub wave: f64,
}

/// Resident memory in MiB.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Rss {
    /// The kernel's high-water mark over the whole run (VmHWM).
    pub peak: f64,
    /// Highest sample in the steady phase.
    pub steady: f64,
    /// Highest sample in the wave.
    pub wave: f64,
}

/// Request counts by verb.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Verbs {
    /// get.
    pub get: u64,
    /// list.
    pub list: u64,
    /// watch.
    pub watch: u64,
    /// patch.
    pub patch: u64,
    /// create.
    pub create: u64,
    /// update.
    pub update: u64,
    /// delete (and deletecollection).
    pub delete: u64,
}

impl Verbs {
    /// Counts one request.
    pub fn add(&mut self, verb: &str) {
        match verb {
            "get" => self.get += 1,
            "list" => self.list += 1,
            "watch" => self.watch += 1,
            "patch" => self.patch += 1,
            "create" => self.create += 1,
            "update" => self.update += 1,
            "delete" | "deletecollection" => self.delete += 1,
            _ => {}
        }
    }
}

/// Writes by phase.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Writes {
    /// Until cold start completed (verdicts on every Machine, every check's status).
    pub cold_start: u64,
    /// Heartbeats only: must be 0.
    pub steady: u64,
    /// During the failure wave, by what was written.
    pub wave: WaveWrites,
    /// Remediation writes (Machine conditions, remediation objects) per failed target.
    pub per_remediation: f64,
}

/// What the wave's writes were.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct WaveWrites {
    /// To the targets: Machine condition patches, remediation objects.
    pub target: u64,
    /// Health-check status patches.
    pub status: u64,
    /// Events.
    pub event: u64,
    /// Anything else.
    pub other: u64,
}

/// Heartbeat load.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Heartbeats {
    /// Sent and accepted.
    pub sent: u64,
    /// Refused or failed.
    pub errors: u64,
    /// Mean rate over the run.
    pub per_second: f64,
}

/// Set-up durations.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Setup {
    /// etcd + kube-apiserver start and CRD installation.
    pub apiserver: f64,
    /// Creating the Nodes, Machines, Cluster and checks.
    pub fleet: f64,
}

/// The run's parameters.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Config {
    /// `mixed` (MachineHealthChecks and NodeHealthChecks), `mhc` (MachineHealthChecks only) or
    /// `nhc` (NodeHealthChecks only).
    pub fleet: String,
    /// Every Node heartbeats once per this many seconds.
    pub heartbeat_secs: f64,
    /// Length of the steady phase.
    pub steady_secs: f64,
    /// The failures are spread over this many seconds.
    pub wave_secs: f64,
    /// The checks' condition timeout.
    pub timeout_secs: u64,
    /// How long the wave waited at most for every remediation (`--wave-limit-secs`).
    #[serde(default)]
    pub wave_limit_secs: u64,
    /// Share of the targets that fail.
    pub failed_percent: f64,
    /// Vigil's health checks (both kinds) carried CEL expression rules (`--expressions`).
    #[serde(default)]
    pub expressions: bool,
    /// The floor also wrote the healthy verdicts at its start (`--floor-verdicts`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub floor_verdicts: bool,
    /// The controller's concurrency: `vigil run --workers`, Cluster API's
    /// `--machinehealthcheck-concurrency`, or medik8s' reconciler concurrency (1, as shipped).
    pub workers: usize,
    /// Cargo profile the controller was built with.
    pub profile: String,
}

/// `--against capi|medik8s`: both runs on the same fleet, one after the other, and how they
/// compare.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Comparison {
    /// Vigil's run.
    pub vigil: Summary,
    /// Cluster API's MachineHealthCheck controller's run (`--against capi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capi: Option<Summary>,
    /// medik8s' NodeHealthCheck operator's run (`--against medik8s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub medik8s: Option<Summary>,
    /// The floor contender's run (`--against floor`); the ratios are then vigil / floor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor: Option<Summary>,
    /// theirs / vigil per headline figure.
    pub ratios: Ratios,
}

/// theirs / vigil for each headline figure. Every figure is a cost (lower is better), so a ratio
/// above 1 means Vigil needed less; `null` where Vigil's figure is 0 (no ratio exists).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Ratios {
    /// How to read the ratios.
    pub meaning: String,
    /// Detection latency, median.
    pub detect_p50: Option<f64>,
    /// Detection latency, 99th percentile.
    pub detect_p99: Option<f64>,
    /// Detection latency, slowest.
    pub detect_max: Option<f64>,
    /// CPU seconds to cold start.
    pub cpu_cold_start: Option<f64>,
    /// CPU seconds in the steady phase.
    pub cpu_steady: Option<f64>,
    /// CPU seconds in the wave.
    pub cpu_wave: Option<f64>,
    /// Peak resident memory.
    pub rss_peak: Option<f64>,
    /// Highest resident memory in the steady phase.
    pub rss_steady: Option<f64>,
    /// Time to cold start.
    pub cold_start_ms: Option<f64>,
    /// Every request over the run.
    pub requests: Option<f64>,
    /// Writes during cold start.
    pub writes_cold_start: Option<f64>,
    /// Writes in the wave (targets, status, events, other).
    pub writes_wave: Option<f64>,
}

impl Verbs {
    /// Every request, whatever the verb.
    pub fn total(&self) -> u64 {
        self.get + self.list + self.watch + self.patch + self.create + self.update + self.delete
    }
}

impl WaveWrites {
    /// Every write in the wave.
    pub fn total(&self) -> u64 {
        self.target + self.status + self.event + self.other
    }
}

/// `theirs / vigil` to three decimals; `None` when Vigil's figure is not positive.
fn ratio(theirs: f64, vigil: f64) -> Option<f64> {
    (vigil > 0.0 && theirs.is_finite()).then(|| (theirs / vigil * 1000.0).round() / 1000.0)
}

impl Ratios {
    /// The ratios of two runs of the same fleet; `name` is the other controller's (`capi`).
    pub fn of(vigil: &Summary, theirs: &Summary, name: &str) -> Ratios {
        let r = |f: fn(&Summary) -> f64| ratio(f(theirs), f(vigil));
        Ratios {
            meaning: format!(
                "{name} / vigil; every figure is a cost, lower is better: above 1 means Vigil needed less"
            ),
            detect_p50: r(|s| s.detect_ms.p50),
            detect_p99: r(|s| s.detect_ms.p99),
            detect_max: r(|s| s.detect_ms.max),
            cpu_cold_start: r(|s| s.cpu_s.cold_start),
            cpu_steady: r(|s| s.cpu_s.steady),
            cpu_wave: r(|s| s.cpu_s.wave),
            rss_peak: r(|s| s.rss_mib.peak),
            rss_steady: r(|s| s.rss_mib.steady),
            cold_start_ms: r(|s| s.cold_start_ms),
            requests: r(|s| s.requests.total() as f64),
            writes_cold_start: r(|s| s.writes.cold_start as f64),
            writes_wave: r(|s| s.writes.wave.total() as f64),
        }
    }

    /// vigil / floor per figure: how far Vigil is from the least a controller must do (1 is
    /// the floor itself; the detection target is at most 1.5).
    pub fn over_floor(vigil: &Summary, floor: &Summary) -> Ratios {
        Ratios {
            meaning: "vigil / floor; every figure is a cost: 1 means Vigil does what the floor does, above 1 how \
                      many times more it needs"
                .into(),
            ..Ratios::of(floor, vigil, "vigil")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(scale: f64) -> Summary {
        let n = |x: f64| x * scale;
        Summary {
            controller: "test".into(),
            nodes: 100,
            machines: 100,
            failed: 5,
            detected: 5,
            checks: Checks { machine: 3, node: 0 },
            detect_ms: Latency { min: n(1.0), p50: n(10.0), p99: n(20.0), max: n(40.0) },
            cpu_s: Cpu { cold_start: n(2.0), steady: n(1.0), wave: n(0.5) },
            rss_mib: Rss { peak: n(100.0), steady: n(80.0), wave: n(90.0) },
            requests: Verbs { get: 1, list: 2, watch: 3, patch: 4, create: 0, update: 0, delete: 0 },
            requests_by_phase: Default::default(),
            writes: Writes {
                cold_start: n(100.0) as u64,
                steady: 0,
                wave: WaveWrites { target: 5, status: 1, event: 2, other: 0 },
                per_remediation: 1.0,
            },
            cold_start_ms: n(1500.0),
            cold_wave: None,
            heartbeats: Heartbeats { sent: 10, errors: 0, per_second: 1.0 },
            setup_ms: Setup { apiserver: 1.0, fleet: 1.0 },
            config: Config {
                fleet: "mhc".into(),
                heartbeat_secs: 60.0,
                steady_secs: 60.0,
                wave_secs: 10.0,
                timeout_secs: 5,
                wave_limit_secs: 65,
                failed_percent: 5.0,
                expressions: false,
                floor_verdicts: false,
                workers: 16,
                profile: "release".into(),
            },
        }
    }

    #[test]
    fn ratios_are_capi_over_vigil_and_absent_where_vigil_spent_nothing() {
        let vigil = summary(1.0);
        let mut capi = summary(3.0);
        capi.requests.get += 10;
        let r = Ratios::of(&vigil, &capi, "capi");
        assert!(r.meaning.starts_with("capi / vigil;"), "{}", r.meaning);
        assert_eq!((r.detect_p50, r.detect_p99, r.detect_max), (Some(3.0), Some(3.0), Some(3.0)));
        assert_eq!((r.cpu_cold_start, r.cpu_steady, r.cpu_wave), (Some(3.0), Some(3.0), Some(3.0)));
        assert_eq!((r.rss_peak, r.rss_steady, r.cold_start_ms), (Some(3.0), Some(3.0), Some(3.0)));
        assert_eq!(r.writes_cold_start, Some(3.0));
        assert_eq!(r.requests, Some(2.0), "20 requests against 10");
        assert_eq!(r.writes_wave, Some(1.0), "8 wave writes each");
        let mut idle = summary(1.0);
        idle.cpu_s.steady = 0.0;
        assert_eq!(Ratios::of(&idle, &capi, "capi").cpu_steady, None, "no ratio to zero");
        assert_eq!(ratio(2.0, 3.0), Some(0.667));
    }

    #[test]
    fn nearest_rank_percentiles() {
        let l = Latency::of((1..=100).rev().map(f64::from).collect());
        assert_eq!((l.min, l.p50, l.p99, l.max), (1.0, 50.0, 99.0, 100.0));
        let one = Latency::of(vec![7.0]);
        assert_eq!((one.min, one.p50, one.p99, one.max), (7.0, 7.0, 7.0, 7.0));
        assert_eq!(Latency::of(Vec::new()), Latency::default());
        let small = Latency::of(vec![3.0, 1.0, 2.0]);
        assert_eq!((small.p50, small.p99), (2.0, 3.0));
    }
}
