//! Judging one Machine (the rules of upstream's `needsRemediation`): its verdict at `now` and the
//! instant that verdict can next change. Nothing here writes or counts.

use crate::lookup::Lookup;
use crate::plan::Earliest;
use jiff::{SignedDuration, Timestamp};
use vigil_api::conditions::ConditionStatus;
use vigil_api::conditions::{self};
use vigil_api::duration::format_go_duration;
use vigil_api::reason::Reason;
use vigil_api::validate::{ConditionRule, DomainKey, FailureDomainPolicy, MhcPolicy};
use vigil_api::views::NodeView;
use vigil_api::views::{ClusterView, MachineView};
use vigil_api::well_known::*;

/// The verdict on one target at `now`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Needs remediation.
    Unhealthy {
        /// `HealthCheckSucceeded` reason.
        reason: Reason,
        /// Why, for a person.
        message: String,
        /// The condition rule that made it unhealthy, an index into `MhcPolicy::rules` (the
        /// first in that order among those past their timeout); `None` for a verdict no rule
        /// makes (deleted Node, `nodeStartupTimeout`, failure, annotation).
        rule: Option<usize>,
        /// When the failure began: the matching condition's `lastTransitionTime`, or when the
        /// startup clock started; `None` when the failure carries no time (the remediate
        /// annotation, a terminal failure, a deleted Node). Orders the pacing queue.
        since: Option<Timestamp>,
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
pub(super) fn deadline_passed(since: Timestamp, timeout: SignedDuration, now: Timestamp) -> Result<(), Timestamp> {
    let deadline = since.checked_add(timeout).unwrap_or(Timestamp::MAX);
    if deadline < now {
        Ok(())
    } else {
        Err(deadline.checked_add(SignedDuration::from_nanos(1)).unwrap_or(Timestamp::MAX))
    }
}

/// A condition as [`match_rules`] reads it: status, transition time, reason.
pub(super) type ConditionSeen<'c> = (&'c str, Option<Timestamp>, &'c str);

/// What the rules say about a list of conditions.
pub(super) enum RuleMatch<'r, 'c> {
    /// This rule has held past its timeout, since `since`, with the condition's reason.
    Holds {
        /// The rule's index in the list matched.
        index: usize,
        /// The rule.
        rule: &'r ConditionRule,
        /// The condition's `lastTransitionTime`.
        since: Timestamp,
        /// The condition's reason (empty when it has none).
        why: &'c str,
    },
    /// A rule will hold at this instant.
    From(Timestamp),
}

/// Checks a list of conditions against the rules: the first rule (in spec order) held past its
/// timeout, or the earliest instant one will be, or neither. A condition matches a rule by type,
/// status and, when the rule lists `reasons`, its reason; a matching condition without a
/// transition time cannot be timed and is reported as unreadable (`Err`).
///
/// A rule that holds comes with the condition's reason, which the message carries as
/// upstream's does.
pub(super) fn match_rules<'r, 'c>(
    rules: &'r [ConditionRule],
    find: impl Fn(&str) -> Option<ConditionSeen<'c>>,
    now: Timestamp,
) -> Result<Option<RuleMatch<'r, 'c>>, String> {
    let mut pending = Earliest::default();
    for (i, rule) in rules.iter().enumerate() {
        let Some((status, since, why)) = find(&rule.type_) else { continue };
        if !rule.matches(&rule.type_, status, Some(why).filter(|w| !w.is_empty())) {
            continue;
        }
        let Some(since) = since else {
            return Err(format!("condition {} has no lastTransitionTime", rule.type_));
        };
        match deadline_passed(since, rule.timeout, now) {
            Ok(()) => return Ok(Some(RuleMatch::Holds { index: i, rule, since, why })),
            Err(at) => pending.offer(at),
        }
    }
    Ok(pending.0.map(RuleMatch::From))
}

/// Rule 2 of the spec, in its order: remediate annotation, failure, control plane not
/// initialized, infrastructure not ready, Machine conditions, then the Node. A Machine that
/// cannot be read gets no verdict before any of these (rule 7).
pub fn evaluate(
    machine: &MachineView,
    cluster: &ClusterView,
    policy: &MhcPolicy,
    nodes: &dyn Lookup<NodeView>,
    now: Timestamp,
) -> Verdict {
    let node = machine.node_name.as_deref().and_then(|n| nodes.lookup(n));
    evaluate_with_node(machine, node, cluster, policy, now)
}

/// [`evaluate`] with the Machine's Node already looked up (`None`: no `nodeRef`, or its Node is
/// not in the cluster). A decision looks every Node up first, in one tight pass: the look-ups
/// are memory-bound, and the processor overlaps more of them when nothing else runs between.
///
/// The rules in their order: what stops a verdict or decides it at once ([`before_conditions`]),
/// the Machine's own conditions, then its Node: deleted, never joined, or its conditions.
pub(super) fn evaluate_with_node(
    machine: &MachineView,
    node: Option<&NodeView>,
    cluster: &ClusterView,
    policy: &MhcPolicy,
    now: Timestamp,
) -> Verdict {
    if let Some(verdict) = before_conditions(machine, node.is_some(), cluster) {
        return verdict;
    }
    let mut pending = Earliest::default();
    if let Some(verdict) = machine_conditions(machine, policy, now, &mut pending) {
        return verdict;
    }
    match (machine.node_name.as_deref(), node) {
        (Some(name), None) => Verdict::Unhealthy {
            reason: Reason::NodeDeleted,
            message: format!("Health check failed: Node {name} has been deleted"),
            rule: None,
            since: None,
        },
        (None, _) => node_startup(machine, cluster, policy, now, pending),
        (Some(name), Some(node)) => node_conditions(name, node, policy, now, pending),
    }
}

/// What decides before any condition is read: an unreadable Machine gets no verdict at all (its
/// form, and so where its conditions go, may be unknown); the remediate annotation and a terminal
/// failure make it unhealthy; a cluster not initialized or not ready leaves it unjudged.
fn before_conditions(machine: &MachineView, has_node: bool, cluster: &ClusterView) -> Option<Verdict> {
    if !machine.problems.is_empty() {
        return Some(Verdict::NotEvaluated {
            why: format!("Machine cannot be read: {}", machine.problems.join("; ")),
            counts_healthy: false,
        });
    }
    if machine.meta.annotations.contains_key(REMEDIATE_MACHINE_ANNOTATION) {
        return Some(Verdict::Unhealthy {
            reason: Reason::HasRemediateAnnotation,
            message: format!(
                "Health check failed: marked for remediation via the {REMEDIATE_MACHINE_ANNOTATION} annotation"
            ),
            rule: None,
            since: None,
        });
    }
    if let Some(failure) = &machine.failure {
        return Some(Verdict::Unhealthy {
            reason: Reason::MachineHasFailure,
            message: format!("Health check failed: Machine has failed: {failure}"),
            rule: None,
            since: None,
        });
    }
    if !cluster.control_plane_initialized && !machine.is_control_plane() {
        return Some(Verdict::NotEvaluated {
            why: "the cluster's control plane is not initialized yet".into(),
            counts_healthy: has_node,
        });
    }
    if !cluster.infrastructure_ready {
        return Some(Verdict::NotEvaluated {
            why: "the cluster's infrastructure is not ready yet".into(),
            counts_healthy: has_node,
        });
    }
    None
}

/// The Machine's own conditions (`unhealthyMachineConditions`): a verdict when one held past its
/// timeout or cannot be timed; else the instant one will is offered to `pending`.
fn machine_conditions(
    machine: &MachineView,
    policy: &MhcPolicy,
    now: Timestamp,
    pending: &mut Earliest,
) -> Option<Verdict> {
    let found = match_rules(
        &policy.machine_conditions,
        |t| {
            conditions::find(&machine.conditions, t)
                .map(|c| (&*c.status, c.last_transition_time, c.reason.as_deref().unwrap_or("")))
        },
        now,
    );
    match found {
        Err(why) => Some(Verdict::NotEvaluated { why: format!("Machine {why}"), counts_healthy: false }),
        Ok(Some(RuleMatch::Holds { index: i, rule, since, why })) => Some(Verdict::Unhealthy {
            reason: Reason::UnhealthyMachine,
            message: format!(
                "Health check failed: Condition {} on Machine {} is reporting status {}{} for more than {}",
                rule.type_,
                machine.meta.name,
                rule.status,
                with_reason(why),
                format_go_duration(rule.timeout)
            ),
            rule: Some(i),
            since: Some(since),
        }),
        Ok(Some(RuleMatch::From(at))) => {
            pending.offer(at);
            None
        }
        Ok(None) => None,
    }
}

/// A Machine without a Node: unhealthy once `nodeStartupTimeout` has passed since the latest of
/// its creation, the control plane's initialization, the infrastructure's readiness and its own
/// `InfrastructureReady` (as upstream); pending until then.
fn node_startup(
    machine: &MachineView,
    cluster: &ClusterView,
    policy: &MhcPolicy,
    now: Timestamp,
    mut pending: Earliest,
) -> Verdict {
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
    let since =
        [machine.meta.created, cluster.control_plane_initialized_at, cluster.infrastructure_ready_at, machine_infra]
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
            message: format!("Health check failed: Node failed to report startup in {}", format_go_duration(timeout)),
            rule: None,
            since: Some(since),
        },
        Err(at) => {
            pending.offer(at);
            Verdict::Pending { until: pending.0.unwrap_or(at) }
        }
    }
}

/// The Node's conditions (`unhealthyConditions`), a stale one (the stale-signal guard) read as
/// absent: unhealthy past a timeout, pending until the first one would be, else healthy.
fn node_conditions(name: &str, node: &NodeView, policy: &MhcPolicy, now: Timestamp, mut pending: Earliest) -> Verdict {
    let node_conditions = &node.conditions[..];
    let guarded = policy.node_conditions.iter().any(|r| r.max_age.is_some());
    let trusted = |c: &&vigil_api::views::NodeConditionView| {
        !guarded
            || !matches!(crate::stale::freshness(c, &policy.node_conditions, now), crate::stale::Freshness::Stale(_))
    };
    let found = match_rules(
        &policy.node_conditions,
        |t| {
            node_conditions
                .iter()
                .find(|c| *c.type_ == *t)
                .filter(trusted)
                .map(|c| (&*c.status, c.last_transition_time, c.reason.as_deref().unwrap_or("")))
        },
        now,
    );
    match found {
        Err(why) => Verdict::NotEvaluated { why: format!("Node {name} {why}"), counts_healthy: false },
        Ok(Some(RuleMatch::Holds { index: i, rule, since, why })) => Verdict::Unhealthy {
            reason: Reason::UnhealthyNode,
            message: format!(
                "Health check failed: Condition {} on Node {name} is reporting status {}{} for more than {}",
                rule.type_,
                rule.status,
                with_reason(why),
                format_go_duration(rule.timeout)
            ),
            rule: Some(policy.machine_conditions.len() + i),
            since: Some(since),
        },
        Ok(Some(RuleMatch::From(at))) => {
            pending.offer(at);
            Verdict::Pending { until: pending.0.unwrap_or(at) }
        }
        Ok(None) => match pending.0 {
            Some(until) => Verdict::Pending { until },
            None => Verdict::Healthy,
        },
    }
}

/// The stale-signal guard on a Node (see [`crate::stale`]): its first matching condition set
/// aside as stale, and the earliest instant a guarded fresh one turns stale (for the plan's
/// wake-up). [`evaluate`] reads such a condition as absent.
pub fn stale_node_condition(
    node: &NodeView,
    policy: &MhcPolicy,
    now: Timestamp,
) -> (Option<crate::stale::Stale>, Option<Timestamp>) {
    let mut stale = None;
    let mut fresh_until = Earliest::default();
    let conditions = &node.conditions[..];
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
pub(super) fn with_reason(why: &str) -> String {
    if why.is_empty() { String::new() } else { format!(" with reason {why}") }
}

/// Whether a target counts towards `currentHealthy` (upstream: evaluated healthy, or not
/// evaluated with a Node; a deleting Machine never). Vigil differs where a remediator is still
/// `finishing` (its object, deleted, held by a finalizer): not healthy until the object is gone.
pub(super) fn counts_healthy(machine: &MachineView, verdict: &Verdict, finishing: bool) -> bool {
    !machine.meta.deleting
        && !finishing
        && matches!(verdict, Verdict::Healthy | Verdict::NotEvaluated { counts_healthy: true, .. })
}

/// A Machine's failure domain: its own `spec.failureDomain`, or the label of its Node. A Machine
/// without a Node (or whose Node is gone) has no Node label, so it is in no domain and only the
/// check-wide budget applies to it; Machine labels are not a fallback (they name other things,
/// and mixing two sources would split one domain's count).
pub(super) fn machine_domain<'a>(
    fd: &FailureDomainPolicy,
    machine: &'a MachineView,
    nodes: &'a dyn Lookup<NodeView>,
) -> Option<&'a str> {
    match &fd.key {
        DomainKey::MachineField => machine.failure_domain.as_deref(),
        DomainKey::NodeLabel(key) => {
            machine.node_name.as_deref().and_then(|n| nodes.lookup(n)).and_then(|node| node.labels.get(key))
        }
    }
    .filter(|d| !d.is_empty())
}
