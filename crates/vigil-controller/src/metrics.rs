//! Prometheus metrics: how much Vigil decides and writes, and how long it takes.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use vigil_api::conditions::ConditionStatus;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabel {
    source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterLabel {
    cluster: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckLabel {
    check: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RemediationLabel {
    check_kind: String,
    kind: String,
    outcome: String,
}

/// A check's counts as its status reports them, for the per-check gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Gauges {
    /// Targets selected.
    pub targets: i64,
    /// Healthy targets.
    pub healthy: i64,
    /// Unhealthy targets.
    pub unhealthy: i64,
    /// Targets whose remediation is under way ([`vigil_engine::Plan::remediating`]).
    pub remediating: i64,
    /// How many more may be remediated now (MachineHealthCheck), or 1/0 (NodeHealthCheck).
    pub remediations_allowed: i64,
    /// Whether the short-circuit (too many unhealthy, too few healthy, storm cool-down) holds.
    pub short_circuited: bool,
    /// Targets a check in dry-run would remediate now.
    pub would_remediate: i64,
    /// Pools `spec.backoff` holds back now.
    pub backoff_pools: i64,
    /// Failure domains where no new remediation starts (`status.failureDomains[].paused`).
    pub failure_domains_paused: i64,
    /// Targets with a matching Node condition set aside as stale (`maxConditionAge`).
    pub stale_conditions: i64,
    /// Targets waiting for a remediation slot (`spec.maxInFlight`, `status.queuedCount`).
    pub queued: i64,
}

impl Gauges {
    /// A decided job's counts, of either kind.
    pub fn of_job(job: &vigil_index::gather::Job) -> Self {
        use vigil_index::gather::CheckStatus;
        match &job.plan.status {
            CheckStatus::Machine(s) => Gauges::of_mhc(s, job.plan.short_circuited, job.plan.remediating),
            CheckStatus::Node(s) => Gauges::of_nhc(s, job.plan.short_circuited, job.plan.remediating),
        }
    }

    /// A MachineHealthCheck's counts; `short_circuited` and `remediating` are the plan's
    /// ([`vigil_engine::Plan::short_circuited`], [`vigil_engine::Plan::remediating`]), not read
    /// back out of a reason.
    pub fn of_mhc(s: &vigil_api::MachineHealthCheckStatus, short_circuited: bool, remediating: usize) -> Self {
        let targets = i64::from(s.expected_machines);
        let healthy = i64::from(s.current_healthy);
        Gauges {
            targets,
            healthy,
            unhealthy: (targets - healthy).max(0),
            remediating: i64::try_from(remediating).unwrap_or(i64::MAX),
            remediations_allowed: i64::from(s.remediations_allowed),
            short_circuited,
            would_remediate: s.features.would_remediate.len() as i64,
            backoff_pools: s.features.backed_off_pools.len() as i64,
            failure_domains_paused: paused_domains(&s.features.failure_domains),
            stale_conditions: i64::from(s.features.stale_target_count),
            queued: i64::from(s.features.queued_count),
        }
    }

    /// A NodeHealthCheck's counts; `short_circuited` and `remediating` are the plan's, as for
    /// [`Gauges::of_mhc`].
    pub fn of_nhc(s: &vigil_api::NodeHealthCheckStatus, short_circuited: bool, remediating: usize) -> Self {
        let blocked = s
            .conditions
            .iter()
            .any(|c| c.type_ == vigil_api::well_known::REMEDIATION_ALLOWED && c.status == ConditionStatus::False);
        Gauges {
            targets: i64::from(s.observed_nodes),
            healthy: i64::from(s.healthy_nodes),
            unhealthy: s.unhealthy_nodes.len() as i64,
            remediating: i64::try_from(remediating).unwrap_or(i64::MAX),
            remediations_allowed: i64::from(!blocked),
            short_circuited,
            would_remediate: s.features.would_remediate.len() as i64,
            backoff_pools: s.features.backed_off_pools.len() as i64,
            failure_domains_paused: paused_domains(&s.features.failure_domains),
            stale_conditions: i64::from(s.features.stale_target_count),
            queued: i64::from(s.features.queued_count),
        }
    }
}

/// Paused failure domains of a status list (every paused domain is listed, up to the list's cap).
fn paused_domains(list: &[vigil_api::failure_domains::FailureDomainStatus]) -> i64 {
    list.iter().filter(|d| d.paused).count() as i64
}

/// Every metric, registered once.
pub struct Metrics {
    registry: Registry,
    decisions: Counter,
    decide_seconds: Histogram,
    apply_seconds: Histogram,
    writes: Family<KindLabel, Counter>,
    write_errors: Family<KindLabel, Counter>,
    watch_events: Counter,
    source_synced: Family<SourceLabel, Gauge>,
    workload_connected: Family<ClusterLabel, Gauge>,
    cached_machines: Gauge,
    events_waiting: Gauge,
    watch_restarts: Family<SourceLabel, Counter>,
    api_reachable: Gauge,
    unreadable: Counter,
    remediations_decided: Counter,
    remediations_unconfirmed: Counter,
    remediations: Family<RemediationLabel, Counter>,
    leader: Gauge,
    elections: Counter,
    lease_errors: Counter,
    detection: Histogram,
    check_targets: Family<CheckLabel, Gauge>,
    check_healthy: Family<CheckLabel, Gauge>,
    check_unhealthy: Family<CheckLabel, Gauge>,
    check_remediating: Family<CheckLabel, Gauge>,
    check_allowed: Family<CheckLabel, Gauge>,
    check_short_circuited: Family<CheckLabel, Gauge>,
    check_would_remediate: Family<CheckLabel, Gauge>,
    check_backoff_pools: Family<CheckLabel, Gauge>,
    check_failure_domains_paused: Family<CheckLabel, Gauge>,
    check_stale_conditions: Family<CheckLabel, Gauge>,
    check_queued: Family<CheckLabel, Gauge>,
}

impl Default for Metrics {
    // Long on purpose: a flat list of metric registrations, one name, help text and handle
    // each, read top to bottom as the catalogue of what `/metrics` serves; splitting it would
    // only scatter that list.
    fn default() -> Self {
        let mut registry = Registry::with_prefix("vigil");
        let decisions = Counter::default();
        let decide_seconds = Histogram::new(exponential_buckets(1e-5, 4.0, 10));
        let apply_seconds = Histogram::new(exponential_buckets(1e-3, 2.0, 14));
        let writes = Family::<KindLabel, Counter>::default();
        let write_errors = Family::<KindLabel, Counter>::default();
        let watch_events = Counter::default();
        // Served at 0 from the start, so the first error of each category shows in rate().
        for category in crate::writes::WriteError::CATEGORIES {
            let _ = write_errors.get_or_create(&KindLabel { kind: category.into() });
        }
        registry.register("decisions", "Health-check decisions made", decisions.clone());
        registry.register("decide_seconds", "Time to gather state and decide one check", decide_seconds.clone());
        registry.register("apply_seconds", "Time to apply one plan's writes", apply_seconds.clone());
        registry.register("writes", "Writes to the API server, by kind", writes.clone());
        registry.register("write_errors", "Failed writes, by category", write_errors.clone());
        registry.register("watch_events", "Watch events received", watch_events.clone());
        let source_synced = Family::<SourceLabel, Gauge>::default();
        let workload_connected = Family::<ClusterLabel, Gauge>::default();
        let cached_machines = Gauge::default();
        let events_waiting = Gauge::default();
        registry.register(
            "events_waiting",
            "Events waiting for their turn on the event lane (a wave's events are sent after its remediations)",
            events_waiting.clone(),
        );
        let watch_restarts = Family::<SourceLabel, Counter>::default();
        let api_reachable = Gauge::default();
        let unreadable = Counter::default();
        let remediations_decided = Counter::default();
        let remediations_unconfirmed = Counter::default();
        let remediations = Family::<RemediationLabel, Counter>::default();
        registry.register(
            "source_synced",
            "1 while a watched source is listed and live (decisions trust it), 0 otherwise",
            source_synced.clone(),
        );
        registry.register(
            "workload_cluster_connected",
            "1 for each workload cluster this replica keeps a connection to (its shards' only, with --shards)",
            workload_connected.clone(),
        );
        registry.register(
            "cached_machines",
            "Machines in this replica's cache (its shards' only, and others' referencing a local Node, with --shards)",
            cached_machines.clone(),
        );
        registry.register(
            "watch_restarts",
            "Watches started again with a new list after an error or lost contact",
            watch_restarts.clone(),
        );
        registry.register(
            "api_reachable",
            "1 while the API server answers the controller's probe",
            api_reachable.clone(),
        );
        registry.register(
            "unreadable_fields",
            "Object fields no rule can read (read as unknown, never as unhealthy)",
            unreadable.clone(),
        );
        registry.register(
            "remediations_decided",
            "Remediating writes decided from the caches and checked by a fresh read",
            remediations_decided.clone(),
        );
        registry.register(
            "remediations_unconfirmed",
            "Remediating writes not sent: a fresh read of the target no longer asked for them, or failed",
            remediations_unconfirmed.clone(),
        );
        registry.register(
            "remediations",
            "Remediation requests by check kind, remediation kind and outcome (created, marked, failed)",
            remediations.clone(),
        );
        let detection = Histogram::new(exponential_buckets(0.005, 2.0, 16));
        registry.register(
            "detection_seconds",
            "Time from an unhealthy condition's timeout running out to the remediating write acknowledged",
            detection.clone(),
        );
        let check_targets = Family::<CheckLabel, Gauge>::default();
        let check_healthy = Family::<CheckLabel, Gauge>::default();
        let check_unhealthy = Family::<CheckLabel, Gauge>::default();
        let check_remediating = Family::<CheckLabel, Gauge>::default();
        let check_allowed = Family::<CheckLabel, Gauge>::default();
        let check_short_circuited = Family::<CheckLabel, Gauge>::default();
        let check_would_remediate = Family::<CheckLabel, Gauge>::default();
        let check_backoff_pools = Family::<CheckLabel, Gauge>::default();
        let check_failure_domains_paused = Family::<CheckLabel, Gauge>::default();
        let check_stale_conditions = Family::<CheckLabel, Gauge>::default();
        let check_queued = Family::<CheckLabel, Gauge>::default();
        registry.register("check_targets", "Targets a check selects", check_targets.clone());
        registry.register("check_healthy", "Healthy targets of a check", check_healthy.clone());
        registry.register("check_unhealthy", "Unhealthy targets of a check", check_unhealthy.clone());
        registry.register(
            "check_remediating",
            "Targets of a check whose remediation is under way (MachineHealthCheck: OwnerRemediated=False or a remediation object made for it; NodeHealthCheck: unhealthy Nodes listed with remediation objects)",
            check_remediating.clone(),
        );
        registry.register(
            "check_remediations_allowed",
            "How many more targets a MachineHealthCheck may remediate now; 1/0 for a NodeHealthCheck",
            check_allowed.clone(),
        );
        registry.register(
            "check_short_circuited",
            "1 while a check's short-circuit (maxUnhealthy, unhealthyRange, minHealthy, storm cool-down) stops remediation",
            check_short_circuited.clone(),
        );
        registry.register(
            "check_would_remediate",
            "Targets a check in dry-run would remediate now (its status.wouldRemediate); 0 outside dry-run",
            check_would_remediate.clone(),
        );
        registry.register(
            "check_backoff_pools",
            "Pools whose remediation a check's spec.backoff holds back now (its status.backedOffPools)",
            check_backoff_pools.clone(),
        );
        registry.register(
            "check_failure_domains_paused",
            "Failure domains of a check over their own budget, where no new remediation starts (spec.failureDomains); 0 without it",
            check_failure_domains_paused.clone(),
        );
        registry.register(
            "check_stale_conditions",
            "Targets of a check whose matching Node condition is set aside as stale: its reporter has not heartbeated within the rule's maxConditionAge (status.staleTargetCount)",
            check_stale_conditions.clone(),
        );
        registry.register(
            "check_queued",
            "Unhealthy targets of a check waiting for a remediation slot: spec.maxInFlight remediations are in flight (status.queuedCount); 0 without it",
            check_queued.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica leads (decides and writes), 0 while it stands by",
            leader.clone(),
        );
        let elections = Counter::default();
        let lease_errors = Counter::default();
        registry.register("leader_elections", "Times this replica won the Lease and began to lead", elections.clone());
        registry.register(
            "lease_errors",
            "Lease requests (acquire, renew, look) that failed or timed out; a leader that cannot renew stops writing at its renew deadline",
            lease_errors.clone(),
        );
        Metrics {
            elections,
            lease_errors,
            check_remediating,
            detection,
            check_targets,
            check_healthy,
            check_unhealthy,
            check_allowed,
            check_short_circuited,
            check_would_remediate,
            check_backoff_pools,
            check_failure_domains_paused,
            check_stale_conditions,
            check_queued,
            leader,
            registry,
            decisions,
            decide_seconds,
            apply_seconds,
            writes,
            write_errors,
            watch_events,
            source_synced,
            workload_connected,
            cached_machines,
            events_waiting,
            watch_restarts,
            api_reachable,
            unreadable,
            remediations_decided,
            remediations_unconfirmed,
            remediations,
        }
    }
}

impl Metrics {
    /// Counts a decision and its duration.
    pub fn decided(&self, seconds: f64) {
        self.decisions.inc();
        self.decide_seconds.observe(seconds);
    }

    /// Records how long a plan's writes took.
    pub fn apply_seconds(&self, seconds: f64) {
        self.apply_seconds.observe(seconds);
    }

    /// Counts a write.
    pub fn writes(&self, kind: &str) {
        self.writes.get_or_create(&KindLabel { kind: kind.into() }).inc();
    }

    /// Counts a failed write.
    pub fn write_error(&self, category: &str) {
        self.write_errors.get_or_create(&KindLabel { kind: category.into() }).inc();
    }

    /// Counts a watch event.
    pub fn watch_event(&self) {
        self.watch_events.inc();
    }

    /// Records whether a source is live; its restart counter is served (at 0) from then on, so
    /// its first restart shows in rate().
    pub fn source_synced(&self, source: &str, synced: bool) {
        let label = SourceLabel { source: source.into() };
        self.source_synced.get_or_create(&label).set(i64::from(synced));
        let _ = self.watch_restarts.get_or_create(&label);
    }

    /// Drops a source that is no longer watched (a workload cluster let go).
    pub fn forget_source(&self, source: &str) {
        let label = SourceLabel { source: source.into() };
        self.source_synced.remove(&label);
        self.watch_restarts.remove(&label);
    }

    /// Records whether this replica keeps a connection to workload cluster `cluster`.
    pub fn workload_connected(&self, cluster: &str, connected: bool) {
        let label = ClusterLabel { cluster: cluster.into() };
        if connected {
            self.workload_connected.get_or_create(&label).set(1);
        } else {
            self.workload_connected.remove(&label);
        }
    }

    /// Counts an event entering (`1`) or leaving (`-1`) the event lane's queue.
    pub fn events_waiting(&self, delta: i64) {
        self.events_waiting.inc_by(delta);
    }

    /// Records how many Machines the cache holds.
    pub fn cached_machines(&self, count: usize) {
        self.cached_machines.set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// Counts a watch started again.
    pub fn watch_restart(&self, source: &str) {
        self.watch_restarts.get_or_create(&SourceLabel { source: source.into() }).inc();
    }

    /// Records whether the API server answers.
    pub fn api_reachable(&self, reachable: bool) {
        self.api_reachable.set(i64::from(reachable));
    }

    /// Counts a field no rule can read.
    pub fn unreadable_object(&self) {
        self.unreadable.inc();
    }

    /// Counts remediating writes decided, and how many of them a fresh read confirmed.
    pub fn confirmations(&self, decided: usize, confirmed: usize) {
        self.remediations_decided.inc_by(decided as u64);
        self.remediations_unconfirmed.inc_by(decided.saturating_sub(confirmed) as u64);
    }

    /// Counts a remediation request's outcome.
    pub fn remediation(&self, check: &vigil_engine::target::CheckRef, kind: &str, outcome: &str) {
        let check_kind = match check {
            vigil_engine::target::CheckRef::Machine { .. } => "MachineHealthCheck",
            vigil_engine::target::CheckRef::Node { .. } => "NodeHealthCheck",
        };
        self.remediations
            .get_or_create(&RemediationLabel {
                check_kind: check_kind.into(),
                kind: kind.into(),
                outcome: outcome.into(),
            })
            .inc();
    }

    /// Records a detection latency.
    pub fn detected(&self, seconds: f64) {
        self.detection.observe(seconds.max(0.0));
    }

    /// Records a check's counts.
    pub fn check(&self, check: &vigil_engine::target::CheckRef, g: &Gauges) {
        let l = CheckLabel { check: check.to_string() };
        self.check_targets.get_or_create(&l).set(g.targets);
        self.check_healthy.get_or_create(&l).set(g.healthy);
        self.check_unhealthy.get_or_create(&l).set(g.unhealthy);
        self.check_remediating.get_or_create(&l).set(g.remediating);
        self.check_allowed.get_or_create(&l).set(g.remediations_allowed);
        self.check_short_circuited.get_or_create(&l).set(i64::from(g.short_circuited));
        self.check_would_remediate.get_or_create(&l).set(g.would_remediate);
        self.check_backoff_pools.get_or_create(&l).set(g.backoff_pools);
        self.check_failure_domains_paused.get_or_create(&l).set(g.failure_domains_paused);
        self.check_stale_conditions.get_or_create(&l).set(g.stale_conditions);
        self.check_queued.get_or_create(&l).set(g.queued);
    }

    /// Drops a deleted check's gauges.
    pub fn forget_check(&self, check: &vigil_engine::target::CheckRef) {
        let l = CheckLabel { check: check.to_string() };
        for f in [
            &self.check_targets,
            &self.check_healthy,
            &self.check_unhealthy,
            &self.check_remediating,
            &self.check_allowed,
            &self.check_short_circuited,
            &self.check_would_remediate,
            &self.check_backoff_pools,
            &self.check_failure_domains_paused,
            &self.check_stale_conditions,
            &self.check_queued,
        ] {
            f.remove(&l);
        }
    }

    /// Records whether this replica leads.
    pub fn leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// Counts an election this replica won.
    pub fn elected(&self) {
        self.elections.inc();
    }

    /// Counts a Lease request that failed or timed out.
    pub fn lease_error(&self) {
        self.lease_errors.inc();
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vigil_engine::target::CheckRef;

    fn has(text: &str, line: &str) -> bool {
        text.lines().any(|l| l == line)
    }

    #[test]
    fn per_check_gauges_are_served_and_dropped_with_the_check() {
        let m = Metrics::default();
        let infra = CheckRef::Node { name: "infra".into() };
        let g =
            Gauges { targets: 5, healthy: 2, unhealthy: 3, remediating: 1, short_circuited: true, ..Gauges::default() };
        m.check(&infra, &g);
        let text = m.render();
        for line in [
            "vigil_check_targets{check=\"NodeHealthCheck/infra\"} 5",
            "vigil_check_healthy{check=\"NodeHealthCheck/infra\"} 2",
            "vigil_check_unhealthy{check=\"NodeHealthCheck/infra\"} 3",
            "vigil_check_remediating{check=\"NodeHealthCheck/infra\"} 1",
            "vigil_check_short_circuited{check=\"NodeHealthCheck/infra\"} 1",
        ] {
            assert!(has(&text, line), "{line} missing:\n{text}");
        }
        m.forget_check(&infra);
        assert!(!m.render().contains("NodeHealthCheck/infra"), "{}", m.render());
    }

    #[test]
    fn gauges_take_the_plans_remediating_count() {
        let nhc = vigil_api::NodeHealthCheckStatus { observed_nodes: 4, healthy_nodes: 2, ..Default::default() };
        assert_eq!(Gauges::of_nhc(&nhc, false, 2).remediating, 2);
        let mhc =
            vigil_api::MachineHealthCheckStatus { expected_machines: 4, current_healthy: 3, ..Default::default() };
        let g = Gauges::of_mhc(&mhc, true, 1);
        assert_eq!((g.targets, g.healthy, g.unhealthy, g.remediating, g.short_circuited), (4, 3, 1, 1, true));
    }

    /// Counters that would appear only with their first event are served at 0 before it.
    #[test]
    fn error_and_restart_counters_are_served_at_zero_before_their_first_event() {
        let m = Metrics::default();
        m.source_synced("Nodes", false);
        let text = m.render();
        assert!(has(&text, "vigil_watch_restarts_total{source=\"Nodes\"} 0"), "{text}");
        for category in crate::writes::WriteError::CATEGORIES {
            assert!(has(&text, &format!("vigil_write_errors_total{{kind=\"{category}\"}} 0")), "{text}");
        }
        m.write_error("timeout");
        assert!(has(&m.render(), "vigil_write_errors_total{kind=\"timeout\"} 1"));
    }

    #[test]
    fn elections_and_lease_errors_are_counted() {
        let m = Metrics::default();
        m.elected();
        m.elected();
        m.lease_error();
        m.leader(true);
        let text = m.render();
        assert!(has(&text, "vigil_leader_elections_total 2"), "{text}");
        assert!(has(&text, "vigil_lease_errors_total 1"), "{text}");
        assert!(has(&text, "vigil_leader 1"), "{text}");
    }

    /// The detection histogram: a latency lands in its bucket; a negative one (the write
    /// acknowledged before the deadline by the controller's clock, which a skewed clock can
    /// show) counts as 0 rather than corrupting the sum.
    #[test]
    fn detection_latencies_fill_the_histogram() {
        let m = Metrics::default();
        m.detected(0.3);
        m.detected(-2.0);
        let text = m.render();
        assert!(has(&text, "vigil_detection_seconds_count 2"), "{text}");
        assert!(has(&text, "vigil_detection_seconds_sum 0.3"), "{text}");
        assert!(has(&text, "vigil_detection_seconds_bucket{le=\"0.005\"} 1"), "{text}");
        assert!(has(&text, "vigil_detection_seconds_bucket{le=\"0.32\"} 2"), "{text}");
    }
}
