//! What a decision reports: the check's new status and conditions (with a notice when one flips),
//! the conditions to write on each Machine, and the feature reports (stale signals, overlap,
//! back-off, failure domains).

use super::budget::{check_paused, remediation_budget};
use super::input::MhcInput;
use super::judge::stale_node_condition;
use crate::backoff::{self, Ledger};
use crate::decision::Outputs;
use crate::domains::{Budgets, FAILURE_DOMAINS_HEALTHY};
use crate::lookup::Lookup;
use crate::pacing::Pacer;
use crate::peers::{NAMED_MACHINES, Owners, SELECTED_BY_ANOTHER_CHECK};
use crate::plan::{Action, Notice, NoticeKind, ObjectRef, Plan};
use crate::target::{CheckRef, Target};
use jiff::Timestamp;
use std::collections::BTreeMap;
use vigil_api::MachineHealthCheck;
use vigil_api::conditions::ConditionStatus;
use vigil_api::conditions::{self, DesiredCondition, ObservedCondition, get_condition, set_condition};
use vigil_api::failure_domains::FailureDomainStatus;
use vigil_api::machine_health_check::MachineHealthCheckStatus;
use vigil_api::reason::Reason;
use vigil_api::shared::{BackedOffPool, QueuedTarget, RemediationRecord};
use vigil_api::validate::MhcPolicy;
use vigil_api::views::MachineView;
use vigil_api::views::NodeView;
use vigil_api::well_known::*;

pub(super) fn machine_ref(m: &MachineView) -> ObjectRef {
    ObjectRef {
        api_version: m.meta.api_version.clone(),
        kind: "Machine".into(),
        namespace: m.meta.namespace.clone(),
        name: m.meta.name.clone(),
    }
}

/// The status a MachineHealthCheck decision builds as it goes (each check condition compared
/// with the previous status), with the decision's [`Outputs`].
pub(super) struct Builder<'a> {
    pub(super) status: MachineHealthCheckStatus,
    pub(super) previous: Option<&'a MachineHealthCheckStatus>,
    pub(super) out: Outputs,
    pub(super) now: Timestamp,
    pub(super) generation: Option<i64>,
}

impl<'a> Builder<'a> {
    /// A decision's builder, its status seeded from the previous one. Everything but the target
    /// list is small; the list is rebuilt by the decision, so it is not copied. Of the feature
    /// block, what Vigil remembers is carried over: the back-off's memory (history, backed-off
    /// pools) and its own clocks (flapping episodes, the expressions' clock and unknowns). A
    /// decision that returns before the features are reported (paused, no Nodes to read, as at
    /// every start until the workload cluster is listed) observed nothing, so it must forget
    /// neither the starts that count against a pool's limit nor since when a rule has held; a
    /// full decision reports the block anew.
    pub(super) fn for_decision(check: &'a MachineHealthCheck, now: Timestamp) -> Self {
        let previous = check.status.as_ref();
        let seeded = previous
            .map(|p| MachineHealthCheckStatus {
                targets: Vec::new(),
                conditions: p.conditions.clone(),
                features: vigil_api::shared::FeatureStatus {
                    remediation_history: p.features.remediation_history.clone(),
                    backed_off_pools: p.features.backed_off_pools.clone(),
                    flapping: p.features.flapping.clone(),
                    expression_matches: p.features.expression_matches.clone(),
                    unevaluated_expressions: p.features.unevaluated_expressions.clone(),
                    ..Default::default()
                },
                ..*p
            })
            .unwrap_or_default();
        Self::starting_from(check, seeded, now)
    }

    /// A builder whose status starts as `status` and says which generation it reflects.
    fn starting_from(check: &'a MachineHealthCheck, status: MachineHealthCheckStatus, now: Timestamp) -> Self {
        let mut b = Builder {
            status,
            previous: check.status.as_ref(),
            out: Outputs::default(),
            now,
            generation: check.metadata.generation,
        };
        b.status.observed_generation = check.metadata.generation;
        b
    }
}

impl Builder<'_> {
    pub(super) fn notice(
        &mut self,
        kind: NoticeKind,
        target: Option<Target>,
        reason: Reason,
        message: impl Into<String>,
    ) {
        self.out.tell(Notice { kind, target, reason, message: message.into() });
    }

    /// Sets a check condition, with a notice when its status flips.
    pub(super) fn condition(
        &mut self,
        desired: DesiredCondition,
        on_true: Option<NoticeKind>,
        on_false: Option<NoticeKind>,
    ) {
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

    /// The plan: the status built and everything decided.
    pub(super) fn finish(self) -> Plan<MachineHealthCheckStatus> {
        self.out.plan(self.status)
    }
}

/// Conditions to write on one Machine: only the ones that differ from what it carries.
pub(super) struct MachineWrites<'m> {
    pub(super) machine: &'m MachineView,
    pub(super) conditions: Vec<(DesiredCondition, Timestamp)>,
}

impl<'m> MachineWrites<'m> {
    pub(super) fn new(machine: &'m MachineView) -> Self {
        Self { machine, conditions: Vec::new() }
    }

    pub(super) fn current(&self, type_: &str) -> Option<&'m ObservedCondition> {
        conditions::find(&self.machine.conditions, type_)
    }

    /// Whether these writes ask the Machine's owner to remediate it (`OwnerRemediated=False`).
    pub(super) fn asks_owner(&self) -> bool {
        self.conditions.iter().any(|(c, _)| c.type_ == OWNER_REMEDIATED && c.status == ConditionStatus::False)
    }

    /// Queues `desired` unless the Machine already says so; returns whether it was queued.
    pub(super) fn set(&mut self, desired: DesiredCondition, now: Timestamp) -> bool {
        self.set_ref(&desired, now)
    }

    /// Like `set`, cloning `desired` only when it has to be written (the hot path of a healthy
    /// fleet writes nothing).
    pub(super) fn set_ref(&mut self, desired: &DesiredCondition, now: Timestamp) -> bool {
        let current = self.current(&desired.type_);
        if desired.is_satisfied_by(current) {
            return false;
        }
        let at = desired.transition_time(current, now);
        self.conditions.push((desired.clone(), at));
        true
    }

    pub(super) fn into_action(self) -> Option<Action> {
        (!self.conditions.is_empty()).then(|| Action::SetMachineConditions {
            machine: machine_ref(self.machine),
            version: self.machine.version,
            conditions: self.conditions,
        })
    }
}

/// The `FailureDomainsHealthy` condition and its notices; returns `status.failureDomains`.
/// Without `spec.failureDomains`, neither list nor condition.
pub(super) fn report_domains(b: &mut Builder<'_>, budgets: Option<&Budgets>) -> Vec<FailureDomainStatus> {
    let Some(budgets) = budgets else {
        b.status.conditions.retain(|c| c.type_ != FAILURE_DOMAINS_HEALTHY);
        return Vec::new();
    };
    let report = budgets.report(b.previous.map_or(&[][..], |p| p.features.failure_domains.as_slice()));
    set_condition(&mut b.status.conditions, &report.condition, b.now, b.generation);
    b.out.tell_all(report.notices);
    report.status
}

/// The stale-signal guard's report: the targets this check writes whose Node has a matching
/// condition set aside as stale (returned; a notice when one is newly listed), and the instants
/// guarded fresh conditions turn stale.
pub(super) fn stale_targets(
    b: &mut Builder<'_>,
    input: &MhcInput<'_>,
    targets: &[&MachineView],
    nodes: &dyn Lookup<NodeView>,
    owners: Owners<'_, '_>,
) -> Vec<(String, crate::stale::Stale)> {
    if !input.policy.node_conditions.iter().any(|r| r.max_age.is_some()) {
        return Vec::new();
    }
    let mut stale = Vec::new();
    for machine in targets {
        let Some(node) = machine.node_name.as_deref().and_then(|n| nodes.lookup(n)) else { continue };
        if owners.other_than_me(machine).is_some() {
            continue; // the owning check reports it
        }
        let (s, fresh_until) = stale_node_condition(node, input.policy, b.now);
        if let Some(t) = fresh_until {
            b.out.wake_at(t);
        }
        if let Some(s) = s {
            stale.push((machine.meta.name.clone(), s));
        }
    }
    let namespace = input.check.metadata.namespace.as_deref().unwrap_or("default");
    let check = format!("MachineHealthCheck/{namespace}/{}", input.check.metadata.name.as_deref().unwrap_or(""));
    let previous = b.previous.map_or(&[][..], |p| p.features.stale_targets.as_slice());
    let notices = crate::stale::notices(
        &check,
        previous,
        &stale,
        |name| {
            let what = format!("the Node of Machine {namespace}/{name}");
            (Target::Machine { namespace: namespace.to_string(), name: name.to_string() }, what)
        },
        b.now,
    );
    b.out.tell_all(notices);
    stale
}

/// The condition [`SELECTED_BY_ANOTHER_CHECK`]: True naming each owner and its Machines (sorted,
/// at most [`NAMED_MACHINES`] named per owner), False once it has been present, absent on a check
/// that never overlapped. A notice when the message changes (new overlap, or a different one).
pub(super) fn selected_elsewhere(b: &mut Builder<'_>, owned_elsewhere: &BTreeMap<&CheckRef, Vec<String>>) {
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

/// The `RemediationBackoff` condition and notices of `spec.backoff`; returns the history and the
/// backed-off pools.
pub(super) fn backoff_status(
    b: &mut Builder<'_>,
    ledger: Ledger<'_>,
    policy: &MhcPolicy,
) -> (Vec<RemediationRecord>, Vec<BackedOffPool>) {
    let (history, pools) = ledger.finish(b.out.wake());
    let (previous_pools, previous_conditions) =
        b.previous.map_or((&[][..], &[][..]), |p| (p.features.backed_off_pools.as_slice(), p.conditions.as_slice()));
    let (condition, notices) =
        backoff::report(previous_pools, previous_conditions, &pools, &history, policy.backoff.as_ref());
    if let Some(condition) = condition {
        b.condition(condition, None, None);
    }
    b.out.tell_all(notices);
    (history, pools)
}

/// The pacing queue's report (`spec.maxInFlight`): the `RemediationQueued` condition and the
/// notices of Machines that joined or left the queue; returns `status.queued` and its count. A
/// decision that starts nothing (paused, no decision) passes an empty pacer: nothing waits.
pub(super) fn pacing_status(b: &mut Builder<'_>, input: &MhcInput<'_>, pacer: Pacer) -> (Vec<QueuedTarget>, i32) {
    let namespace = input.check.metadata.namespace.as_deref().unwrap_or("default");
    let (previous, previous_conditions) =
        b.previous.map_or((&[][..], &[][..]), |p| (p.features.queued.as_slice(), p.conditions.as_slice()));
    let report = pacer.report(previous, previous_conditions, |name| {
        let what = format!("Machine {namespace}/{name}");
        (Target::Machine { namespace: namespace.to_string(), name: name.to_string() }, what)
    });
    let paced = input.policy.max_in_flight.is_some();
    let condition = match report.condition {
        // An empty pacer (paused, no decision) of a paced check: nothing waits now.
        crate::pacing::Change::Remove if paced => match get_condition(previous_conditions, crate::pacing::CONDITION) {
            Some(_) => crate::pacing::Change::Set(DesiredCondition::false_(
                crate::pacing::CONDITION,
                Reason::NoRemediationQueued,
                "No target waits for a remediation slot: nothing starts while the check is paused or cannot decide",
            )),
            None => crate::pacing::Change::Keep,
        },
        other => other,
    };
    condition.apply(&mut b.status.conditions, b.now, b.generation);
    b.out.tell_all(report.notices);
    (report.queued, report.count)
}

/// The plan when no decision can be made at all (the spec is invalid, the caches are not synced):
/// nothing is written but the check's status, which says why (`RemediationAllowed=False` with
/// `reason`), and a `NoDecision` notice when that reason is new. Counts are left as last observed.
/// Rule 1: a paused Cluster or check does nothing else; returns whether it is paused, after
/// setting `Paused` (told when it flips).
pub(super) fn report_pause(b: &mut Builder<'_>, input: &MhcInput<'_>) -> bool {
    if !check_paused(input) {
        b.condition(DesiredCondition::false_(PAUSED, Reason::NotPaused, ""), None, Some(NoticeKind::Resumed));
        return false;
    }
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
    true
}

/// The plan when the Cluster or its Nodes cannot be read: `RemediationAllowed=False` saying why,
/// nothing remediated, no wake-up (a change to the Cluster or the connection decides again).
pub(super) fn report_no_decision(mut b: Builder<'_>, why: Reason, message: String) -> Plan<MachineHealthCheckStatus> {
    b.status.remediations_allowed = 0;
    b.condition(DesiredCondition::false_(REMEDIATION_ALLOWED, why, message), None, Some(NoticeKind::NoDecision));
    b.finish()
}

/// Rule 3, the short-circuit, as `remediationsAllowed` and `RemediationAllowed` (told when it
/// flips); returns whether remediation may start. `healthy`: the targets available (healthy and,
/// when they count, not taken down on purpose; `disrupted`: those that were).
pub(super) fn report_short_circuit(
    b: &mut Builder<'_>,
    policy: &MhcPolicy,
    total: usize,
    healthy: usize,
    disrupted: &crate::disruptions::Disrupted,
) -> bool {
    let unhealthy = total - healthy;
    let (allowed, left, (limit, limit_value)) = remediation_budget(policy.short_circuit, total, unhealthy);
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
                    "Remediation is not allowed, the number of not started or unhealthy machines {limit} (total: {total}, unhealthy: {unhealthy}, {limit_value}{})",
                    disrupted.phrase()
                ),
            ),
            None,
            Some(NoticeKind::RemediationBlocked),
        );
    }
    allowed
}

pub fn refuse(
    check: &MachineHealthCheck,
    reason: Reason,
    message: &str,
    now: Timestamp,
) -> Plan<MachineHealthCheckStatus> {
    let mut b = Builder::starting_from(check, check.status.clone().unwrap_or_default(), now);
    b.status.remediations_allowed = 0;
    b.condition(DesiredCondition::false_(REMEDIATION_ALLOWED, reason, message), None, Some(NoticeKind::NoDecision));
    b.finish()
}
