//! The JSON summary a run prints (fields documented in the README's performance section).

use serde::{Deserialize, Serialize};

/// One benchmark run.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Summary {
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
    /// Every Node heartbeats once per this many seconds.
    pub heartbeat_secs: f64,
    /// Length of the steady phase.
    pub steady_secs: f64,
    /// The failures are spread over this many seconds.
    pub wave_secs: f64,
    /// The checks' condition timeout.
    pub timeout_secs: u64,
    /// Share of the targets that fail.
    pub failed_percent: f64,
    /// `vigil run --workers`.
    pub workers: usize,
    /// Cargo profile the controller was built with.
    pub profile: String,
}

#[cfg(test)]
mod tests {
    use super::*;

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
