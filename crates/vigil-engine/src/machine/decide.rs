//! The MachineHealthCheck decision, in its phases: pause, targets, safety (Cluster and Nodes
//! readable), verdicts, short-circuit, writes per target, reports.

use super::budget::{check_paused, remediation_budget};
use super::input::{MhcInput, NodeSource};
use super::judge::{Verdict, counts_healthy, evaluate_with_node, machine_domain};
use super::remediate::{Overlap, Started, remediate};
use super::status::{Builder, MachineWrites, backoff_status, report_domains, selected_elsewhere, stale_targets};
use crate::backoff::Ledger;
use crate::domains::Tally;
use crate::holders::{Holders, Waits};
use crate::peers::MhcPeers;
use crate::plan::{Action, Earliest, NoticeKind, ObjectRef, Plan};
use crate::target::is_target;
use crate::target::{CheckRef, LOCAL_CLUSTER, made_for};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use std::collections::BTreeMap;
use vigil_api::conditions::ConditionStatus;
use vigil_api::conditions::{self, DesiredCondition};
use vigil_api::machine_health_check::MachineHealthCheckStatus;
use vigil_api::reason::Reason;
use vigil_api::threshold::Rounding;
use vigil_api::views::MachineView;
use vigil_api::well_known::*;

/// Decides what a MachineHealthCheck should do now when it is the only check: [`decide_among`]
/// with nobody else holding anything.
pub fn decide(input: &MhcInput<'_>, now: Timestamp) -> Plan<MachineHealthCheckStatus> {
    decide_among(input, &Holders::none(), LOCAL_CLUSTER, now)
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
