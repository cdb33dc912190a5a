//! MachineHealthCheck rules (Cluster API semantics; the seeds' proposal and book page, and
//! upstream's `needsRemediation`). Deliberate differences from upstream, each tested:
//! one existing remediation object never stops the others; a missing template still marks the
//! Machine unhealthy and says why; healthy Machines under a template get `HealthCheckSucceeded=True`;
//! timers are kept while the short-circuit blocks; a percentage is never an error; and the next
//! wake-up is the exact instant a verdict can change (no 1 s padding, no rate limit).

use crate::backoff::{self, Gate, Ledger};
use crate::domains::{Budgets, FAILURE_DOMAINS_HEALTHY, Tally};
use crate::holders::{Holders, Waits};
use crate::lookup::Lookup;
use crate::peers::{MhcPeers, NAMED_MACHINES, SELECTED_BY_ANOTHER_CHECK};
use crate::plan::{Action, Earliest, Notice, NoticeKind, ObjectRef, Plan};
pub use crate::target::is_target;
use crate::target::{CheckRef, LOCAL_CLUSTER, Target, made_for};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use vigil_api::MachineHealthCheck;
use vigil_api::conditions::ConditionStatus;
use vigil_api::conditions::{self, DesiredCondition, ObservedCondition, get_condition, set_condition};
use vigil_api::duration::format_go_duration;
use vigil_api::machine_health_check::MachineHealthCheckStatus;
use vigil_api::reason::Reason;
use vigil_api::threshold::Rounding;
use vigil_api::validate::{ConditionRule, DomainKey, FailureDomainPolicy, MhcPolicy, MhcShortCircuit};
use vigil_api::views::{ClusterView, MachineView, RemediationView, TemplateView};
use vigil_api::well_known::*;

/// Where the Nodes of the check's cluster are read from.
#[derive(Clone, Copy)]
pub enum NodeSource<'a> {
    /// The cluster answered: its Nodes by name.
    Reachable(&'a dyn Lookup<Node>),
    /// The cluster could not be reached (why, for the operator); no verdict is made.
    Unreachable(&'a str),
}

/// Everything a MachineHealthCheck decision looks at.
pub struct MhcInput<'a> {
    /// The check (metadata, current status).
    pub check: &'a MachineHealthCheck,
    /// Its validated spec.
    pub policy: &'a MhcPolicy,
    /// The Cluster named by `clusterName`, if found.
    pub cluster: Option<&'a ClusterView>,
    /// Machines in the check's namespace; the engine applies the selector. Sorted by name is
    /// fastest (the engine then only checks the order instead of sorting).
    pub machines: &'a [&'a MachineView],
    /// The Nodes of the workload cluster.
    pub nodes: NodeSource<'a>,
    /// The remediation template, when the policy names one and it was found.
    pub template: Option<&'a TemplateView>,
    /// Remediation objects of the template's remediation kind in the check's namespace, by name.
    pub remediations: &'a dyn Lookup<RemediationView>,
}

/// The verdict on one target at `now`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Needs remediation.
    Unhealthy {
        /// `HealthCheckSucceeded` reason.
        reason: Reason,
        /// Why, for a person.
        message: String,
    },
    /// A condition matches but its timeout has not passed; the verdict can change at `until`.
    Pending {
        /// First instant at which the timeout has passed.
        until: Timestamp,
    },
    /// Evaluated and healthy (it has a Node and nothing matches).
    Healthy,
    /// Not evaluated (cluster not ready, startup timeout disabled, unreadable fields); counts as
    /// healthy only when `counts_healthy`.
    NotEvaluated {
        /// Why.
        why: String,
        /// Whether it counts towards `currentHealthy` (upstream counts a Machine with a Node).
        counts_healthy: bool,
    },
}

/// The first instant at which `since + timeout` is strictly before it: the rule is
/// "unhealthy when `lastTransitionTime + timeout` is before now", as upstream.
fn deadline_passed(since: Timestamp, timeout: SignedDuration, now: Timestamp) -> Result<(), Timestamp> {
    let deadline = since.checked_add(timeout).unwrap_or(Timestamp::MAX);
    if deadline < now {
        Ok(())
    } else {
        Err(deadline.checked_add(SignedDuration::from_nanos(1)).unwrap_or(Timestamp::MAX))
    }
}

/// A condition as [`match_rules`] reads it: status, transition time, reason.
type Observed<'c> = (&'c str, Option<Timestamp>, &'c str);
/// A rule that holds (no instant) or will hold at an instant, with the condition's reason.
type RuleMatch<'r, 'c> = (&'r ConditionRule, Option<Timestamp>, &'c str);

/// Checks a list of conditions against the rules: the first rule held past its timeout, or the
/// earliest instant one will be (`Err`), or neither. A matching condition without a transition
/// time cannot be timed and is reported as unreadable.
///
/// A rule that holds comes with the condition's reason (empty when it has none), which the
/// message carries as upstream's does.
fn match_rules<'r, 'c>(
    rules: &'r [ConditionRule],
    find: impl Fn(&str) -> Option<Observed<'c>>,
    now: Timestamp,
) -> Result<Option<RuleMatch<'r, 'c>>, String> {
    let mut pending = Earliest::default();
    for rule in rules {
        let Some((status, since, why)) = find(&rule.type_) else { continue };
        if status != rule.status {
            continue;
        }
        let Some(since) = since else {
            return Err(format!("condition {} has no lastTransitionTime", rule.type_));
        };
        match deadline_passed(since, rule.timeout, now) {
            Ok(()) => return Ok(Some((rule, None, why))),
            Err(at) => pending.offer(at),
        }
    }
    Ok(pending.0.map(|at| (&rules[0], Some(at), "")).filter(|_| !rules.is_empty()))
}

/// Rule 2 of the spec, in its order: remediate annotation, failure, control plane not
/// initialized, infrastructure not ready, Machine conditions, then the Node. A Machine that
/// cannot be read gets no verdict before any of these (rule 7).
pub fn evaluate(
    machine: &MachineView,
    cluster: &ClusterView,
    policy: &MhcPolicy,
    nodes: &dyn Lookup<Node>,
    now: Timestamp,
) -> Verdict {
    let node = machine.node_name.as_deref().and_then(|n| nodes.lookup(n));
    evaluate_with_node(machine, node, cluster, policy, now)
}

/// [`evaluate`] with the Machine's Node already looked up (`None`: no `nodeRef`, or its Node is
/// not in the cluster). A decision looks every Node up first, in one tight pass: the look-ups
/// are memory-bound, and the processor overlaps more of them when nothing else runs between.
fn evaluate_with_node(
    machine: &MachineView,
    node: Option<&Node>,
    cluster: &ClusterView,
    policy: &MhcPolicy,
    now: Timestamp,
) -> Verdict {
    // A Machine that cannot be read gets no verdict at all, not even from the annotation or a
    // failure: its form (and so where its conditions go) may be unknown.
    if !machine.problems.is_empty() {
        return Verdict::NotEvaluated {
            why: format!("Machine cannot be read: {}", machine.problems.join("; ")),
            counts_healthy: false,
        };
    }
    if machine.meta.annotations.contains_key(REMEDIATE_MACHINE_ANNOTATION) {
        return Verdict::Unhealthy {
            reason: Reason::HasRemediateAnnotation,
            message: format!(
                "Health check failed: marked for remediation via the {REMEDIATE_MACHINE_ANNOTATION} annotation"
            ),
        };
    }
    if let Some(failure) = &machine.failure {
        return Verdict::Unhealthy {
            reason: Reason::MachineHasFailure,
            message: format!("Health check failed: Machine has failed: {failure}"),
        };
    }
    let has_node = node.is_some();
    if !cluster.control_plane_initialized && !machine.is_control_plane() {
        return Verdict::NotEvaluated {
            why: "the cluster's control plane is not initialized yet".into(),
            counts_healthy: has_node,
        };
    }
    if !cluster.infrastructure_ready {
        return Verdict::NotEvaluated {
            why: "the cluster's infrastructure is not ready yet".into(),
            counts_healthy: has_node,
        };
    }

    let mut pending = Earliest::default();
    let machine_match = match_rules(
        &policy.machine_conditions,
        |t| {
            conditions::find(&machine.conditions, t)
                .map(|c| (c.status.as_str(), c.last_transition_time, c.reason.as_deref().unwrap_or("")))
        },
        now,
    );
    match machine_match {
        Err(why) => return Verdict::NotEvaluated { why: format!("Machine {why}"), counts_healthy: false },
        Ok(Some((rule, None, why))) => {
            return Verdict::Unhealthy {
                reason: Reason::UnhealthyMachine,
                message: format!(
                    "Health check failed: Condition {} on Machine {} is reporting status {}{} for more than {}",
                    rule.type_,
                    machine.meta.name,
                    rule.status,
                    with_reason(why),
                    format_go_duration(rule.timeout)
                ),
            };
        }
        Ok(Some((_, Some(at), _))) => pending.offer(at),
        Ok(None) => {}
    }

    match (machine.node_name.as_deref(), node) {
        (Some(name), None) => Verdict::Unhealthy {
            reason: Reason::NodeDeleted,
            message: format!("Health check failed: Node {name} has been deleted"),
        },
        (None, _) => {
            let Some(timeout) = policy.node_startup_timeout else {
                return match pending.0 {
                    Some(until) => Verdict::Pending { until },
                    None => Verdict::NotEvaluated {
                        why: "no Node yet and nodeStartupTimeout is disabled".into(),
                        counts_healthy: false,
                    },
                };
            };
            let machine_infra = conditions::find(&machine.conditions, INFRASTRUCTURE_READY)
                .filter(|c| c.status == ConditionStatus::True)
                .and_then(|c| c.last_transition_time);
            let since = [
                machine.meta.created,
                cluster.control_plane_initialized_at,
                cluster.infrastructure_ready_at,
                machine_infra,
            ]
            .into_iter()
            .flatten()
            .max();
            let Some(since) = since else {
                return Verdict::NotEvaluated {
                    why: "Machine has no creation time to time its startup from".into(),
                    counts_healthy: false,
                };
            };
            match deadline_passed(since, timeout, now) {
                Ok(()) => Verdict::Unhealthy {
                    reason: Reason::NodeStartupTimeout,
                    message: format!(
                        "Health check failed: Node failed to report startup in {}",
                        format_go_duration(timeout)
                    ),
                },
                Err(at) => {
                    pending.offer(at);
                    Verdict::Pending { until: pending.0.unwrap_or(at) }
                }
            }
        }
        (Some(name), Some(node)) => {
            let node_conditions = node.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or(&[]);
            // The stale-signal guard: a stale condition is as if absent.
            let guarded = policy.node_conditions.iter().any(|r| r.max_age.is_some());
            let trusted = |c: &&k8s_openapi::api::core::v1::NodeCondition| {
                !guarded
                    || !matches!(
                        crate::stale::freshness(c, &policy.node_conditions, now),
                        crate::stale::Freshness::Stale(_)
                    )
            };
            let node_match = match_rules(
                &policy.node_conditions,
                |t| {
                    node_conditions.iter().find(|c| c.type_ == t).filter(trusted).map(|c| {
                        (
                            c.status.as_str(),
                            c.last_transition_time.as_ref().map(|t| t.0),
                            c.reason.as_deref().unwrap_or(""),
                        )
                    })
                },
                now,
            );
            match node_match {
                Err(why) => Verdict::NotEvaluated { why: format!("Node {name} {why}"), counts_healthy: false },
                Ok(Some((rule, None, why))) => Verdict::Unhealthy {
                    reason: Reason::UnhealthyNode,
                    message: format!(
                        "Health check failed: Condition {} on Node {name} is reporting status {}{} for more than {}",
                        rule.type_,
                        rule.status,
                        with_reason(why),
                        format_go_duration(rule.timeout)
                    ),
                },
                Ok(Some((_, Some(at), _))) => {
                    pending.offer(at);
                    Verdict::Pending { until: pending.0.unwrap_or(at) }
                }
                Ok(None) => match pending.0 {
                    Some(until) => Verdict::Pending { until },
                    None => Verdict::Healthy,
                },
            }
        }
    }
}

/// The stale-signal guard on a Node (see [`crate::stale`]): its first matching condition set
/// aside as stale, and the earliest instant a guarded fresh one turns stale (for the plan's
/// wake-up). [`evaluate`] reads such a condition as absent.
pub fn stale_node_condition(
    node: &Node,
    policy: &MhcPolicy,
    now: Timestamp,
) -> (Option<crate::stale::Stale>, Option<Timestamp>) {
    let mut stale = None;
    let mut fresh_until = Earliest::default();
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or(&[]);
    for c in conditions {
        match crate::stale::freshness(c, &policy.node_conditions, now) {
            crate::stale::Freshness::Stale(s) => {
                stale.get_or_insert(s);
            }
            crate::stale::Freshness::FreshUntil(t) => fresh_until.offer(t),
            crate::stale::Freshness::Unguarded => {}
        }
    }
    (stale, fresh_until.0)
}

/// ` with reason R` for a condition that has a reason, as upstream's messages say it.
fn with_reason(why: &str) -> String {
    if why.is_empty() { String::new() } else { format!(" with reason {why}") }
}

/// Whether remediation is allowed with `unhealthy` of `total` targets not healthy, and how many
/// more remediations the budget leaves (rule 3: `unhealthyRange` wins; a percentage rounds down).
pub fn remediation_budget(
    short_circuit: MhcShortCircuit,
    total: usize,
    unhealthy: usize,
) -> (bool, u64, (&'static str, String)) {
    let unhealthy = unhealthy as u64;
    match short_circuit {
        MhcShortCircuit::Range(range) => {
            let allowed = range.contains(unhealthy);
            let left = if allowed { u64::from(range.max) - unhealthy } else { 0 };
            // upstream's wording, for a count below the range as for one above it
            (allowed, left, ("does not fall within the range", format!("unhealthyRange: {range}")))
        }
        MhcShortCircuit::MaxUnhealthy(max) => {
            let limit = max.scaled(total, Rounding::Down);
            let allowed = unhealthy <= limit;
            (allowed, limit.saturating_sub(unhealthy), ("exceeds maxUnhealthy", format!("maxUnhealthy: {max}")))
        }
    }
}

fn check_paused(input: &MhcInput<'_>) -> bool {
    input.check.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(PAUSED_ANNOTATION))
        || input.cluster.is_some_and(|c| c.paused)
}

fn machine_ref(m: &MachineView) -> ObjectRef {
    ObjectRef {
        api_version: m.meta.api_version.clone(),
        kind: "Machine".into(),
        namespace: m.meta.namespace.clone(),
        name: m.meta.name.clone(),
    }
}

struct Builder<'a> {
    status: MachineHealthCheckStatus,
    previous: Option<&'a MachineHealthCheckStatus>,
    actions: Vec<Action>,
    notices: Vec<Notice>,
    now: Timestamp,
    generation: Option<i64>,
}

impl Builder<'_> {
    fn notice(&mut self, kind: NoticeKind, target: Option<String>, reason: Reason, message: impl Into<String>) {
        self.notices.push(Notice { kind, target, reason, message: message.into() });
    }

    /// Sets a check condition, with a notice when its status flips.
    fn condition(&mut self, desired: DesiredCondition, on_true: Option<NoticeKind>, on_false: Option<NoticeKind>) {
        let before = self
            .previous
            .and_then(|p| get_condition(&p.conditions, &desired.type_))
            .map(|c| (c.status.clone(), c.reason.clone()));
        let changed = match &before {
            Some((status, reason)) => {
                *status != desired.status || (desired.status == ConditionStatus::False && *reason != desired.reason)
            }
            None => desired.status == ConditionStatus::True || desired.type_ == REMEDIATION_ALLOWED,
        };
        let kind = if desired.status == ConditionStatus::True { on_true } else { on_false };
        // A first-time RemediationAllowed=True is the normal state, not news.
        let first_allowed =
            before.is_none() && desired.status == ConditionStatus::True && desired.type_ == REMEDIATION_ALLOWED;
        if changed
            && !first_allowed
            && let Some(kind) = kind
        {
            self.notice(kind, None, desired.reason.clone(), desired.message.clone());
        }
        set_condition(&mut self.status.conditions, &desired, self.now, self.generation);
    }

    fn finish(self, next_wake: Option<Timestamp>) -> Plan<MachineHealthCheckStatus> {
        Plan {
            status: self.status,
            actions: self.actions,
            notices: self.notices,
            next_wake,
            held_elsewhere: Vec::new(),
            short_circuited: false,
        }
    }
}

/// Conditions to write on one Machine: only the ones that differ from what it carries.
struct MachineWrites<'m> {
    machine: &'m MachineView,
    conditions: Vec<(DesiredCondition, Timestamp)>,
}

impl<'m> MachineWrites<'m> {
    fn new(machine: &'m MachineView) -> Self {
        Self { machine, conditions: Vec::new() }
    }

    fn current(&self, type_: &str) -> Option<&'m ObservedCondition> {
        conditions::find(&self.machine.conditions, type_)
    }

    /// Queues `desired` unless the Machine already says so; returns whether it was queued.
    fn set(&mut self, desired: DesiredCondition, now: Timestamp) -> bool {
        self.set_ref(&desired, now)
    }

    /// Like `set`, cloning `desired` only when it has to be written (the hot path of a healthy
    /// fleet writes nothing).
    fn set_ref(&mut self, desired: &DesiredCondition, now: Timestamp) -> bool {
        let current = self.current(&desired.type_);
        if desired.is_satisfied_by(current) {
            return false;
        }
        let at = desired.transition_time(current, now);
        self.conditions.push((desired.clone(), at));
        true
    }

    fn into_action(self) -> Option<Action> {
        (!self.conditions.is_empty()).then(|| Action::SetMachineConditions {
            machine: machine_ref(self.machine),
            version: self.machine.version,
            conditions: self.conditions,
        })
    }
}

/// The remediation object for `machine` from `template`, or why it cannot be built.
pub fn remediation_object(policy: &MhcPolicy, template: &TemplateView, machine: &MachineView) -> Result<Value, String> {
    let Some(template_ref) = &policy.remediation_template else {
        return Err("the check has no remediation template".into());
    };
    let Some(body) = &template.template else {
        return Err(format!("{template_ref} has no spec.template"));
    };
    let mut labels = serde_json::Map::new();
    labels.insert(CLUSTER_NAME_LABEL.into(), json!(policy.cluster_name));
    let mut owner = json!({
        "apiVersion": machine.meta.api_version,
        "kind": "Machine",
        "name": machine.meta.name,
    });
    if let Some(uid) = &machine.meta.uid {
        owner["uid"] = json!(uid);
    }
    let mut object = json!({
        "apiVersion": template_ref.api_version,
        "kind": template_ref.remediation_kind(),
        "metadata": {
            "name": machine.meta.name,
            "namespace": machine.meta.namespace,
            "labels": labels,
            "ownerReferences": [owner],
        },
    });
    if let Some(spec) = body.get("spec") {
        object["spec"] = spec.clone();
    }
    Ok(object)
}

/// Decides what a MachineHealthCheck should do now when it is the only check: [`decide_among`]
/// with nobody else holding anything.
pub fn decide(input: &MhcInput<'_>, now: Timestamp) -> Plan<MachineHealthCheckStatus> {
    decide_among(input, &Holders::none(), LOCAL_CLUSTER, now)
}

/// What other checks hold, as one MachineHealthCheck decision sees it.
struct Overlap<'h> {
    holders: &'h Holders,
    /// Where the check's Nodes live (the cluster key of its targets).
    node_cluster: &'h str,
    waits: Waits,
}

impl Overlap<'_> {
    /// Whether another check holds the Machine's target; if so, records the wait (with a skip
    /// notice when it is news).
    fn held_elsewhere(&mut self, b: &mut Builder<'_>, machine: &MachineView, key: &str) -> bool {
        let target = Target::of_machine(self.node_cluster, machine);
        let holders = self.holders;
        match holders.other_than(&target, self.waits.me()) {
            Some(holder) => {
                if let Some(n) = self.waits.wait(key, &target, holder) {
                    b.notices.push(n);
                }
                true
            }
            None => false,
        }
    }
}

/// Decides what a MachineHealthCheck should do now, among other checks: a Machine whose Node
/// (in `node_cluster`: [`crate::holders::LOCAL_CLUSTER`] for a self-hosted cluster, else the
/// workload cluster's `namespace/clusterName`) another check holds is not remediated (see
/// [`crate::holders`]).
pub fn decide_among(
    input: &MhcInput<'_>,
    holders: &Holders,
    node_cluster: &str,
    now: Timestamp,
) -> Plan<MachineHealthCheckStatus> {
    decide_among_peers(input, holders, &MhcPeers::none(), node_cluster, now)
}

/// [`decide_among`] with the other MachineHealthChecks that may select the same Machines
/// (`peers`, see [`crate::peers`]): a Machine whose conditions another check owns is evaluated
/// and counted, but this check writes nothing on it and does not remediate it, and says so with
/// the condition [`SELECTED_BY_ANOTHER_CHECK`].
pub fn decide_among_peers(
    input: &MhcInput<'_>,
    holders: &Holders,
    peers: &MhcPeers<'_>,
    node_cluster: &str,
    now: Timestamp,
) -> Plan<MachineHealthCheckStatus> {
    let previous = input.check.status.as_ref();
    // Everything but the target list is small; the list is rebuilt below, so it is not copied.
    let mut b = Builder {
        status: previous
            .map(|p| MachineHealthCheckStatus {
                targets: Vec::new(),
                conditions: p.conditions.clone(),
                would_remediate: Vec::new(),
                remediation_history: p.remediation_history.clone(),
                backed_off_pools: p.backed_off_pools.clone(),
                failure_domains: p.failure_domains.clone(),
                stale_targets: p.stale_targets.clone(),
                ..*p
            })
            .unwrap_or_default(),
        previous,
        actions: Vec::new(),
        notices: Vec::new(),
        now,
        generation: input.check.metadata.generation,
    };
    b.status.observed_generation = input.check.metadata.generation;

    // Rule 1: a paused Cluster or check does nothing else.
    if check_paused(input) {
        let why = if input.cluster.is_some_and(|c| c.paused) {
            "the Cluster is paused (spec.paused)"
        } else {
            "the check has the cluster.x-k8s.io/paused annotation"
        };
        b.condition(
            DesiredCondition::true_(PAUSED, Reason::Paused, format!("Remediation is paused: {why}")),
            Some(NoticeKind::Paused),
            None,
        );
        return b.finish(None);
    }
    b.condition(DesiredCondition::false_(PAUSED, Reason::NotPaused, ""), None, Some(NoticeKind::Resumed));

    let namespace = input.check.metadata.namespace.as_deref().unwrap_or("default");
    let mut targets: Vec<&MachineView> = input
        .machines
        .iter()
        .copied()
        .filter(|m| m.meta.namespace == namespace && is_target(input.policy, m))
        .collect();
    if !targets.is_sorted_by(|a, c| a.meta.name <= c.meta.name) {
        targets.sort_unstable_by(|a, c| a.meta.name.cmp(&c.meta.name));
    }
    b.status.targets = targets.iter().map(|m| m.meta.name.clone()).collect();
    b.status.expected_machines = i32::try_from(targets.len()).unwrap_or(i32::MAX);

    // Safety first: without the Cluster or the workload cluster's Nodes, decide nothing.
    let blocked_reason = match (input.cluster, input.nodes) {
        (None, _) => Some((
            Reason::ClusterNotFound,
            format!(
                "Cluster {}/{} was not found; no Machine is evaluated",
                input.check.metadata.namespace.as_deref().unwrap_or(""),
                input.policy.cluster_name
            ),
        )),
        (_, NodeSource::Unreachable(why)) => Some((
            Reason::WorkloadClusterUnreachable,
            format!(
                "The workload cluster cannot be reached ({why}); no Machine is evaluated, and no Node is taken for deleted"
            ),
        )),
        _ => None,
    };
    let (Some(cluster), NodeSource::Reachable(nodes), None) = (input.cluster, input.nodes, &blocked_reason) else {
        let (why, message) = blocked_reason.unwrap_or((Reason::ClusterNotFound, String::new()));
        b.status.remediations_allowed = 0;
        b.condition(DesiredCondition::false_(REMEDIATION_ALLOWED, why, message), None, Some(NoticeKind::NoDecision));
        return b.finish(None);
    };

    // Rule 2: verdicts.
    let mut wake = Earliest::default();
    let target_nodes: Vec<Option<&Node>> =
        targets.iter().map(|m| m.node_name.as_deref().and_then(|n| nodes.lookup(n))).collect();
    let verdicts: Vec<Verdict> = targets
        .iter()
        .zip(&target_nodes)
        .map(|(m, node)| evaluate_with_node(m, *node, cluster, input.policy, now))
        .collect();
    let mut healthy = 0usize;
    for (machine, verdict) in targets.iter().zip(&verdicts) {
        if let Verdict::Pending { until } = verdict {
            wake.offer(*until);
        }
        healthy += usize::from(counts_healthy(machine, verdict));
    }
    b.status.current_healthy = i32::try_from(healthy).unwrap_or(i32::MAX);
    // Failure domains: judged on the same counts as the short-circuit, rounded down as it.
    let domain_of: Vec<Option<&str>> = match &input.policy.failure_domains {
        Some(fd) => targets.iter().map(|m| machine_domain(fd, m, nodes)).collect(),
        None => Vec::new(),
    };
    let budgets = input.policy.failure_domains.as_ref().map(|fd| {
        let mut tally = Tally::default();
        for ((machine, verdict), domain) in targets.iter().zip(&verdicts).zip(&domain_of) {
            tally.add(*domain, counts_healthy(machine, verdict));
        }
        tally.judge(fd, Rounding::Down)
    });
    let me = CheckRef::of_mhc(input.check);
    stale_targets(&mut b, input, &targets, nodes, peers, &me, &mut wake);

    // Rule 3: the short-circuit.
    let unhealthy_count = targets.len() - healthy;
    let (allowed, left, (limit, limit_value)) =
        remediation_budget(input.policy.short_circuit, targets.len(), unhealthy_count);
    b.status.remediations_allowed = i32::try_from(left).unwrap_or(i32::MAX);
    if allowed {
        b.condition(
            DesiredCondition::true_(REMEDIATION_ALLOWED, Reason::RemediationAllowed, ""),
            Some(NoticeKind::RemediationAllowed),
            None,
        );
    } else {
        b.condition(
            DesiredCondition::false_(
                REMEDIATION_ALLOWED,
                Reason::TooManyUnhealthy,
                format!(
                    "Remediation is not allowed, the number of not started or unhealthy machines {limit} (total: {}, unhealthy: {unhealthy_count}, {limit_value})",
                    targets.len()
                ),
            ),
            None,
            Some(NoticeKind::RemediationBlocked),
        );
    }

    // Rules 4 and 5: writes per target.
    let mut overlap = Overlap {
        holders,
        node_cluster,
        waits: Waits::new(CheckRef::of_mhc(input.check), previous.map_or(&[][..], |p| p.conditions.as_slice())),
    };
    let template_ref = input.policy.remediation_template.as_ref();
    let healthy_condition = DesiredCondition::true_(HEALTH_CHECK_SUCCEEDED, Reason::HealthCheckSucceeded, "");
    let history = previous.map_or(&[][..], |p| p.remediation_history.as_slice());
    let mut ledger = Ledger::new(input.policy.backoff.as_ref(), input.policy.dry_run, history, now);
    let mut owned_elsewhere: BTreeMap<&CheckRef, Vec<String>> = BTreeMap::new();
    // Which healthy targets already say `HealthCheckSucceeded=True` as it would be written (the
    // common case: nothing to do), read in one tight pass for the same reason as the Nodes.
    let already_healthy: Vec<bool> = targets
        .iter()
        .zip(&verdicts)
        .map(|(m, v)| {
            matches!(v, Verdict::Healthy)
                && healthy_condition.is_satisfied_by(conditions::find(&m.conditions, HEALTH_CHECK_SUCCEEDED))
        })
        .collect();
    for (i, (machine, verdict)) in targets.iter().zip(&verdicts).enumerate() {
        let key = || machine.meta.key();
        // A paused failure domain starts nothing new, exactly as the check-wide short-circuit.
        let domain_open = budgets.as_ref().is_none_or(|bs| !bs.is_paused(domain_of.get(i).copied().flatten()));
        if let Some(owner) = peers.owner_other_than(&me, machine) {
            owned_elsewhere.entry(owner).or_default().push(key());
            continue;
        }
        let mut writes = MachineWrites::new(machine);
        match verdict {
            Verdict::Unhealthy { reason: why, message } => {
                let was_unhealthy =
                    writes.current(HEALTH_CHECK_SUCCEEDED).is_some_and(|c| c.status == ConditionStatus::False);
                writes.set(DesiredCondition::false_(HEALTH_CHECK_SUCCEEDED, why.clone(), message.clone()), now);
                if !was_unhealthy {
                    b.notice(NoticeKind::Unhealthy, Some(key()), why.clone(), message.clone());
                }
                if allowed && domain_open {
                    let mut started = Started { overlap: &mut overlap, ledger: &mut ledger };
                    remediate(&mut b, &mut started, &mut writes, input, template_ref, machine, &key(), now);
                }
            }
            Verdict::Healthy => {
                if !machine.meta.deleting && !already_healthy[i] {
                    let was_unhealthy =
                        writes.current(HEALTH_CHECK_SUCCEEDED).is_some_and(|c| c.status == ConditionStatus::False);
                    writes.set_ref(&healthy_condition, now);
                    if was_unhealthy {
                        let key = key();
                        b.notice(
                            NoticeKind::Healthy,
                            Some(key.clone()),
                            Reason::HealthCheckSucceeded,
                            format!("Machine {key} is healthy again"),
                        );
                    }
                }
                if template_ref.is_some()
                    && let Some(object) = input.remediations.lookup(&machine.meta.name)
                    && made_for(object, machine)
                    && !object.meta.deleting
                {
                    b.actions.push(Action::DeleteRemediation {
                        object: ObjectRef {
                            api_version: object.meta.api_version.clone(),
                            kind: object.meta.kind.clone(),
                            namespace: object.meta.namespace.clone(),
                            name: object.meta.name.clone(),
                        },
                        target: key(),
                    });
                }
            }
            Verdict::Pending { .. } | Verdict::NotEvaluated { .. } => {}
        }
        if let Some(action) = writes.into_action() {
            b.actions.push(action);
        }
    }
    if let Some(waiting) = overlap.waits.condition() {
        b.condition(waiting, None, None);
    }
    selected_elsewhere(&mut b, &owned_elsewhere);
    backoff_status(&mut b, ledger, input.policy, &mut wake);
    report_domains(&mut b, budgets.as_ref());
    let mut plan = b.finish(wake.0);
    plan.held_elsewhere = overlap.waits.held_elsewhere;
    plan.short_circuited = !allowed;
    if input.policy.dry_run {
        plan = crate::dry_run::mhc(plan, previous, namespace, now);
    }
    plan
}

/// Whether a target counts towards `currentHealthy` (upstream: evaluated healthy, or not
/// evaluated with a Node; a deleting Machine never).
fn counts_healthy(machine: &MachineView, verdict: &Verdict) -> bool {
    !machine.meta.deleting && matches!(verdict, Verdict::Healthy | Verdict::NotEvaluated { counts_healthy: true, .. })
}

/// A Machine's failure domain: its own `spec.failureDomain`, or the label of its Node. A Machine
/// without a Node (or whose Node is gone) has no Node label, so it is in no domain and only the
/// check-wide budget applies to it; Machine labels are not a fallback (they name other things,
/// and mixing two sources would split one domain's count).
fn machine_domain<'a>(
    fd: &FailureDomainPolicy,
    machine: &'a MachineView,
    nodes: &'a dyn Lookup<Node>,
) -> Option<&'a str> {
    match &fd.key {
        DomainKey::MachineField => machine.failure_domain.as_deref(),
        DomainKey::NodeLabel(key) => machine
            .node_name
            .as_deref()
            .and_then(|n| nodes.lookup(n))
            .and_then(|node| node.metadata.labels.as_ref()?.get(key))
            .map(String::as_str),
    }
    .filter(|d| !d.is_empty())
}

/// `status.failureDomains`, the `FailureDomainsHealthy` condition and its notices; without
/// `spec.failureDomains`, neither list nor condition.
fn report_domains(b: &mut Builder<'_>, budgets: Option<&Budgets>) {
    let Some(budgets) = budgets else {
        b.status.failure_domains.clear();
        b.status.conditions.retain(|c| c.type_ != FAILURE_DOMAINS_HEALTHY);
        return;
    };
    let report = budgets.report(b.previous.map_or(&[][..], |p| p.failure_domains.as_slice()));
    set_condition(&mut b.status.conditions, &report.condition, b.now, b.generation);
    b.status.failure_domains = report.status;
    b.notices.extend(report.notices);
}

/// The stale-signal guard's report: the targets this check writes whose Node has a matching
/// condition set aside as stale (count, first names, a notice when one is newly listed), and the
/// instants guarded fresh conditions turn stale.
fn stale_targets(
    b: &mut Builder<'_>,
    input: &MhcInput<'_>,
    targets: &[&MachineView],
    nodes: &dyn Lookup<Node>,
    peers: &MhcPeers<'_>,
    me: &CheckRef,
    wake: &mut Earliest,
) {
    if !input.policy.node_conditions.iter().any(|r| r.max_age.is_some()) {
        b.status.stale_target_count = 0;
        return;
    }
    let mut stale = Vec::new();
    for machine in targets {
        let Some(node) = machine.node_name.as_deref().and_then(|n| nodes.lookup(n)) else { continue };
        if peers.owner_other_than(me, machine).is_some() {
            continue; // the owning check reports it
        }
        let (s, fresh_until) = stale_node_condition(node, input.policy, b.now);
        if let Some(t) = fresh_until {
            wake.offer(t);
        }
        if let Some(s) = s {
            stale.push((machine.meta.name.clone(), s));
        }
    }
    let namespace = input.check.metadata.namespace.as_deref().unwrap_or("default");
    let check = format!("MachineHealthCheck/{namespace}/{}", input.check.metadata.name.as_deref().unwrap_or(""));
    let previous = b.previous.map_or(&[][..], |p| p.stale_targets.as_slice());
    let notices = crate::stale::notices(
        &check,
        previous,
        &stale,
        |name| {
            let key = format!("{namespace}/{name}");
            let what = format!("the Node of Machine {key}");
            (key, what)
        },
        b.now,
    );
    b.notices.extend(notices);
    b.status.stale_target_count = i32::try_from(stale.len()).unwrap_or(i32::MAX);
    b.status.stale_targets = crate::stale::listed(&stale);
}

/// The condition [`SELECTED_BY_ANOTHER_CHECK`]: True naming each owner and its Machines (sorted,
/// at most [`NAMED_MACHINES`] named per owner), False once it has been present, absent on a check
/// that never overlapped. A notice when the message changes (new overlap, or a different one).
fn selected_elsewhere(b: &mut Builder<'_>, owned_elsewhere: &BTreeMap<&CheckRef, Vec<String>>) {
    let before = b.previous.and_then(|p| get_condition(&p.conditions, SELECTED_BY_ANOTHER_CHECK));
    if owned_elsewhere.is_empty() {
        if before.is_some() {
            b.condition(
                DesiredCondition::false_(
                    SELECTED_BY_ANOTHER_CHECK,
                    Reason::NoOverlap,
                    "No Machine of this check is selected by an older MachineHealthCheck",
                ),
                None,
                None,
            );
        }
        return;
    }
    let phrases: Vec<String> = owned_elsewhere
        .iter()
        .map(|(owner, machines)| {
            let mut named = machines[..machines.len().min(NAMED_MACHINES)].join(", ");
            if machines.len() > NAMED_MACHINES {
                named.push_str(&format!(" and {} more", machines.len() - NAMED_MACHINES));
            }
            let noun = if machines.len() == 1 { "Machine" } else { "Machines" };
            format!(
                "{owner} writes the health-check conditions of and remediates {noun} {named}, which this check also selects; this check counts them but writes nothing on them"
            )
        })
        .collect();
    let desired =
        DesiredCondition::true_(SELECTED_BY_ANOTHER_CHECK, Reason::OverlappingMachineHealthChecks, phrases.join("; "));
    if before.is_none_or(|c| c.status != ConditionStatus::True || c.message != desired.message) {
        b.notice(
            NoticeKind::MachinesSelectedByAnotherCheck,
            None,
            Reason::OverlappingMachineHealthChecks,
            desired.message.clone(),
        );
    }
    b.condition(desired, None, None);
}

/// The history, backed-off pools, `RemediationBackoff` condition and notices of `spec.backoff`.
fn backoff_status(b: &mut Builder<'_>, ledger: Ledger<'_>, policy: &MhcPolicy, wake: &mut Earliest) {
    let (history, pools) = ledger.finish(wake);
    let (previous_pools, previous_conditions) =
        b.previous.map_or((&[][..], &[][..]), |p| (p.backed_off_pools.as_slice(), p.conditions.as_slice()));
    let (condition, notices) =
        backoff::report(previous_pools, previous_conditions, &pools, &history, policy.backoff.as_ref());
    b.status.remediation_history = history;
    b.status.backed_off_pools = pools;
    if let Some(condition) = condition {
        b.condition(condition, None, None);
    }
    b.notices.extend(notices);
}

/// What decides whether a remediation may start besides the short-circuit: other checks
/// holding the target, and the pool's back-off.
struct Started<'s, 'h, 'p> {
    overlap: &'s mut Overlap<'h>,
    ledger: &'s mut Ledger<'p>,
}

impl Started<'_, '_, '_> {
    /// Whether the back-off lets `machine` start now; records the start when it counts. A
    /// Machine already in the history (the same start asked for again), or one a check in
    /// dry-run already lists, is not counted twice.
    fn backoff_allows(&mut self, input: &MhcInput<'_>, machine: &MachineView) -> bool {
        let name = machine.meta.name.as_str();
        let listed = input.policy.dry_run
            && input.check.status.as_ref().is_some_and(|s| s.would_remediate.iter().any(|w| w.name == name));
        let pool = backoff::machine_pool(machine);
        match self.ledger.gate(&pool, name, listed || self.ledger.recorded(name)) {
            Gate::Wait => false,
            Gate::Repeat => true,
            Gate::Start => {
                self.ledger.record(&pool, name);
                true
            }
        }
    }
}

/// Requests remediation of one unhealthy Machine (rule 4).
#[allow(clippy::too_many_arguments)]
fn remediate(
    b: &mut Builder<'_>,
    started: &mut Started<'_, '_, '_>,
    writes: &mut MachineWrites<'_>,
    input: &MhcInput<'_>,
    template_ref: Option<&vigil_api::validate::TemplateRef>,
    machine: &MachineView,
    key: &str,
    now: Timestamp,
) {
    if machine.meta.deleting {
        return;
    }
    let Some(template_ref) = template_ref else {
        let needs_request = writes.current(OWNER_REMEDIATED).is_none_or(|c| c.status == ConditionStatus::True);
        if needs_request && started.overlap.held_elsewhere(b, machine, key) {
            return;
        }
        if needs_request && !started.backoff_allows(input, machine) {
            return;
        }
        if needs_request
            && writes.set(
                DesiredCondition::false_(OWNER_REMEDIATED, Reason::WaitingForRemediation, "Waiting for remediation"),
                now,
            )
        {
            b.notice(
                NoticeKind::RemediationRequested,
                Some(key.to_string()),
                Reason::WaitingForRemediation,
                format!("Asked the owner of Machine {key} to remediate it"),
            );
        }
        return;
    };
    let Some(template) = input.template else {
        let message = format!("Remediation template {template_ref} not found");
        if writes.set(
            DesiredCondition::false_(EXTERNALLY_REMEDIATED, Reason::RemediationTemplateNotFound, message.clone()),
            now,
        ) {
            b.notice(
                NoticeKind::RemediationSkipped,
                Some(key.to_string()),
                Reason::RemediationTemplateNotFound,
                message,
            );
        }
        return;
    };
    if input.remediations.lookup(&machine.meta.name).is_some() {
        // Already requested: leave it to the remediator, and go on with the other Machines.
        writes.set(
            DesiredCondition::false_(EXTERNALLY_REMEDIATED, Reason::WaitingForRemediation, "Waiting for remediation"),
            now,
        );
        return;
    }
    if started.overlap.held_elsewhere(b, machine, key) {
        return;
    }
    match remediation_object(input.policy, template, machine) {
        Ok(_) if !started.backoff_allows(input, machine) => {}
        Ok(object) => {
            writes.set(
                DesiredCondition::false_(
                    EXTERNALLY_REMEDIATED,
                    Reason::WaitingForRemediation,
                    "Waiting for remediation",
                ),
                now,
            );
            b.actions.push(Action::CreateRemediation { object, target: key.to_string() });
        }
        Err(why) => {
            let message = format!("Cannot create a remediation request: {why}");
            if writes.set(
                DesiredCondition::false_(
                    EXTERNALLY_REMEDIATED,
                    Reason::RemediationRequestCreationFailed,
                    message.clone(),
                ),
                now,
            ) {
                b.notice(
                    NoticeKind::RemediationSkipped,
                    Some(key.to_string()),
                    Reason::RemediationRequestCreationFailed,
                    message,
                );
            }
        }
    }
}

/// The plan when no decision can be made at all (the spec is invalid, the caches are not synced):
/// nothing is written but the check's status, which says why (`RemediationAllowed=False` with
/// `reason`), and a `NoDecision` notice when that reason is new. Counts are left as last observed.
pub fn refuse(
    check: &MachineHealthCheck,
    reason: Reason,
    message: &str,
    now: Timestamp,
) -> Plan<MachineHealthCheckStatus> {
    let previous = check.status.as_ref();
    let mut b = Builder {
        status: previous.cloned().unwrap_or_default(),
        previous,
        actions: Vec::new(),
        notices: Vec::new(),
        now,
        generation: check.metadata.generation,
    };
    b.status.observed_generation = check.metadata.generation;
    b.status.remediations_allowed = 0;
    b.condition(DesiredCondition::false_(REMEDIATION_ALLOWED, reason, message), None, Some(NoticeKind::NoDecision));
    b.finish(None)
}
