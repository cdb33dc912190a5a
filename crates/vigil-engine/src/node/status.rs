//! What a NodeHealthCheck decision reports: the phase and its reason, the check's conditions,
//! the status and the notices that only the whole decision can tell (allowed or blocked, paused
//! or resumed, Nodes without a decision); and the status of a decision refused outright.

use super::input::NhcInput;
use super::judge::rule_text;
use crate::backoff;
use crate::decision::Outputs;
use crate::domains::{Budgets, FAILURE_DOMAINS_HEALTHY};
use crate::features::{self, Found};
use crate::partial::remediation_phase;
use crate::plan::count;
use crate::plan::{Notice, NoticeKind, Plan};
use crate::target::Target;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use vigil_api::NodeHealthCheck;
use vigil_api::conditions::{ConditionStatus, DesiredCondition, get_condition, set_condition};
use vigil_api::node_health_check::{NodeHealthCheckStatus, UnhealthyNode};
use vigil_api::reason::Reason;
use vigil_api::shared::{BackedOffPool, ChosenRemediation, RemediationRecord};
use vigil_api::well_known::{DISABLED, REMEDIATION_ALLOWED, REMEDIATION_POSTPONED};

/// Phase while a step's template is missing or invalid.
const PHASE_DISABLED: &str = "Disabled";

/// Phase while pause requests are present.
pub(super) const PHASE_PAUSED: &str = "Paused";

/// What the phases found, for the status.
pub(super) struct Outcome<'a> {
    /// The new `unhealthyNodes`.
    pub(super) entries: Vec<UnhealthyNode>,
    /// Nodes without a decision, with the rule whose condition cannot be timed.
    pub(super) undecided: Vec<(&'a str, usize)>,
    /// Selected Nodes with a stale matching condition.
    pub(super) stale: Vec<(String, crate::stale::Stale)>,
    pub(super) observed: usize,
    pub(super) healthy: usize,
    /// When the storm cool-down started, while it lasts.
    pub(super) storm_start: Option<Timestamp>,
    pub(super) allowed_condition: DesiredCondition,
    /// Why the check is disabled (a step's template), if it is.
    pub(super) disabled: Option<(Reason, String)>,
    pub(super) disabled_condition: DesiredCondition,
    /// `WaitingForOtherCheck`, when it is to be set.
    pub(super) waiting: Option<DesiredCondition>,
    /// `RemediationPostponed=True` while the whole cluster waits (an upgrade), with the part of
    /// its message that names the cause.
    pub(super) postponed: Option<(DesiredCondition, String)>,
    /// The back-off's new history and backed-off pools.
    pub(super) backoff: (Vec<RemediationRecord>, Vec<BackedOffPool>),
    /// With remediation per condition: each listed Node's chosen remediation.
    pub(super) chosen: Vec<ChosenRemediation>,
    /// The pacing queue, its condition and notices.
    pub(super) pacing: crate::pacing::PacingReport,
    /// With `voluntaryDisruptions: Count`: the Nodes each signal took out of the budget.
    pub(super) disruptions: Vec<vigil_api::shared::DisruptionCount>,
    /// With `spec.flapping`: the Nodes' episodes.
    pub(super) flapping: Vec<vigil_api::shared::FlappingTarget>,
    /// With `spec.unhealthyExpressions`: the new clock, and the Nodes an expression could not
    /// be evaluated for (name, expression, why).
    pub(super) expressions: (Vec<vigil_api::shared::ExpressionMatch>, Vec<(&'a str, usize, String)>),
}

/// `RemediationAllowed` / `RemediationBlocked` when the condition's status or reason changed (a
/// first-time allowed is the normal state, not news).
pub(super) fn allowance_notice(prev: &NodeHealthCheckStatus, allowed_condition: &DesiredCondition) -> Option<Notice> {
    let allowed = allowed_condition.status == ConditionStatus::True;
    let prev_allowed = get_condition(&prev.conditions, REMEDIATION_ALLOWED);
    let new_state = (allowed_condition.status.as_str(), allowed_condition.reason.as_str());
    let prev_state = prev_allowed.map(|c| (c.status.as_str(), c.reason.as_str()));
    (prev_state != Some(new_state) && (prev_state.is_some() || !allowed)).then(|| Notice {
        kind: if allowed { NoticeKind::RemediationAllowed } else { NoticeKind::RemediationBlocked },
        target: None,
        reason: allowed_condition.reason.clone(),
        message: allowed_condition.message.clone(),
    })
}

/// The phase and its reason: Disabled (a template) over Paused (requests) over Remediating /
/// Enabled.
fn phase(input: &NhcInput<'_>, outcome: &Outcome<'_>) -> (&'static str, String) {
    if let Some((_, message)) = &outcome.disabled {
        (PHASE_DISABLED, message.clone())
    } else if !input.policy.pause_requests.is_empty() {
        (PHASE_PAUSED, format!("Remediation paused by request: {}", input.policy.pause_requests.join("; ")))
    } else {
        remediation_phase(outcome.entries.iter().filter(|e| !e.remediations.is_empty()).count())
    }
}

/// The check's conditions: `Disabled`, `RemediationAllowed`, `WaitingForOtherCheck`,
/// `RemediationBackoff`, `FailureDomainsHealthy`, `RemediationQueued`.
fn conditions(
    input: &NhcInput<'_>,
    prev: &NodeHealthCheckStatus,
    outcome: &Outcome<'_>,
    domains: Option<&crate::domains::DomainReport>,
    now: Timestamp,
    out: &mut Outputs,
) -> Vec<Condition> {
    let generation = input.check.metadata.generation;
    let mut conditions: Vec<Condition> = prev.conditions.clone();
    set_condition(&mut conditions, &outcome.disabled_condition, now, generation);
    set_condition(&mut conditions, &outcome.allowed_condition, now, generation);
    if let Some(waiting) = &outcome.waiting {
        set_condition(&mut conditions, waiting, now, generation);
    }
    out.tell_all(postponement(&mut conditions, &outcome.postponed, now, generation));
    let (history, pools) = &outcome.backoff;
    let (backoff_condition, backoff_notices) = backoff::report(
        &prev.features.backed_off_pools,
        &prev.conditions,
        pools,
        history,
        input.policy.backoff.as_ref(),
    );
    if let Some(c) = backoff_condition {
        set_condition(&mut conditions, &c, now, generation);
    }
    out.tell_all(backoff_notices);
    match domains {
        Some(report) => set_condition(&mut conditions, &report.condition, now, generation),
        None => conditions.retain(|c| c.type_ != FAILURE_DOMAINS_HEALTHY),
    }
    outcome.pacing.condition.apply(&mut conditions, now, generation);
    conditions
}

/// `RemediationPostponed`: `True` (with the signal) while the whole cluster waits, `False` once
/// it waited and no longer does (absent before the first wait); told when it turns, or its reason
/// or cause changes (an upgrade to another version, a Node's machine config instead of the
/// ClusterVersion), not when only the ClusterVersion's progress message moves.
fn postponement(
    conditions: &mut Vec<Condition>,
    postponed: &Option<(DesiredCondition, String)>,
    now: Timestamp,
    generation: Option<i64>,
) -> Option<Notice> {
    let before = get_condition(conditions, REMEDIATION_POSTPONED)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()));
    let was = before.as_ref().is_some_and(|(s, _, _)| s == "True");
    let (desired, notice) = match postponed {
        Some((p, cause)) => {
            let news =
                before.as_ref().is_none_or(|(s, r, m)| s != "True" || *r != p.reason || !m.starts_with(cause.as_str()));
            let notice = news.then(|| Notice {
                kind: NoticeKind::RemediationPostponed,
                target: None,
                reason: p.reason.clone(),
                message: p.message.clone(),
            });
            (p.clone(), notice)
        }
        None if before.is_some() => {
            let resumed = "Nothing postpones new remediations any more";
            let notice = was.then(|| Notice {
                kind: NoticeKind::RemediationResumed,
                target: None,
                reason: Reason::NotPostponed,
                message: resumed.to_string(),
            });
            (DesiredCondition::false_(REMEDIATION_POSTPONED, Reason::NotPostponed, resumed), notice)
        }
        None => return None,
    };
    set_condition(conditions, &desired, now, generation);
    notice
}

/// `Paused` when pause requests appear, `Resumed` when the last one goes.
fn pause_notice(paused: bool, prev_paused: bool, phase: &str, reason: &str) -> Option<Notice> {
    if paused && phase == PHASE_PAUSED && !prev_paused {
        Some(Notice { kind: NoticeKind::Paused, target: None, reason: Reason::Paused, message: reason.to_string() })
    } else if !paused && prev_paused {
        Some(Notice {
            kind: NoticeKind::Resumed,
            target: None,
            reason: Reason::Resumed,
            message: "No pause request is left; remediation may start again".into(),
        })
    } else {
        None
    }
}

/// The new status, with the notices only it can tell. No status field remembers undecided
/// Nodes: they are told about when the status moves (a Node turning undecided always moves it
/// when it was healthy or listed before).
pub(super) fn build_status(
    input: &NhcInput<'_>,
    prev: &NodeHealthCheckStatus,
    mut outcome: Outcome<'_>,
    budgets: Option<&Budgets>,
    now: Timestamp,
    out: &mut Outputs,
) -> NodeHealthCheckStatus {
    let generation = input.check.metadata.generation;
    let (phase, reason) = phase(input, &outcome);
    let paused = !input.policy.pause_requests.is_empty();
    let prev_paused = prev.phase.as_deref() == Some(PHASE_PAUSED);
    let mut domains_report = budgets.map(|b| b.report(&prev.features.failure_domains));
    let conditions = conditions(input, prev, &outcome, domains_report.as_ref(), now, out);
    out.tell_all(pause_notice(paused, prev_paused, phase, &reason));
    let failure_domains = domains_report.as_mut().map_or_else(Vec::new, |r| std::mem::take(&mut r.status));
    out.tell_all(std::mem::take(&mut outcome.pacing.notices));
    let queue = (std::mem::take(&mut outcome.pacing.queued), outcome.pacing.count);
    let features = features::status(Found {
        backoff: outcome.backoff,
        failure_domains,
        stale: &outcome.stale,
        chosen: outcome.chosen,
        queue,
        disruptions: std::mem::take(&mut outcome.disruptions),
        flapping: std::mem::take(&mut outcome.flapping),
        expressions: (
            std::mem::take(&mut outcome.expressions.0),
            crate::expressions::unevaluated(
                &input.policy.expressions,
                &prev.features.unevaluated_expressions,
                &outcome.expressions.1,
                ("Node", &Target::local_node),
                out,
            ),
        ),
    });
    let mut status = NodeHealthCheckStatus {
        observed_nodes: count(outcome.observed),
        healthy_nodes: count(outcome.healthy),
        unhealthy_nodes: outcome.entries,
        phase: Some(phase.to_string()),
        reason: Some(reason),
        conditions,
        last_update_time: prev.last_update_time.clone(),
        storm_recovery_start_time: outcome.storm_start.map(Time),
        observed_generation: generation,
        features,
    };
    if let Some(report) = domains_report {
        out.tell_all(report.notices);
    }
    if status != *prev {
        status.last_update_time = Some(Time(now));
        for (name, rule) in outcome.undecided {
            let what = input.policy.conditions.get(rule).map(rule_text).unwrap_or_default();
            out.tell(Notice::about_node(
                NoticeKind::NoDecision,
                name,
                Reason::MissingLastTransitionTime,
                format!(
                    "Node {name} has condition {what} without lastTransitionTime: cannot tell how long it has held, so no decision is made for this node"
                ),
            ));
        }
    }
    status
}

/// The plan while the sources a decision reads cannot be trusted (a watch failed): nothing is
/// decided and nothing written but `RemediationAllowed=False` with `reason` and why, and a
/// `NoDecision` notice when that is new. The phase, `Disabled` and the counts stay as the last
/// decision left them: being unable to read is not a change of the check (an alert on
/// `Disabled` must not fire because Vigil restarted or lost a watch).
pub fn wait(check: &NodeHealthCheck, reason: Reason, message: &str, now: Timestamp) -> Plan<NodeHealthCheckStatus> {
    let prev = check.status.clone().unwrap_or_default();
    let mut status = prev.clone();
    let waiting = DesiredCondition::false_(REMEDIATION_ALLOWED, reason.clone(), message);
    let is_new = get_condition(&prev.conditions, REMEDIATION_ALLOWED)
        .is_none_or(|c| c.status != ConditionStatus::False || c.reason != reason || c.message != message);
    set_condition(&mut status.conditions, &waiting, now, check.metadata.generation);
    if status != prev {
        status.last_update_time = Some(Time(now));
    }
    let notices = is_new
        .then(|| Notice { kind: NoticeKind::NoDecision, target: None, reason, message: message.to_string() })
        .into_iter()
        .collect();
    Plan { notices, ..Plan::unchanged(status) }
}

/// The plan when no decision can be made at all (the spec is invalid, the medik8s operator runs):
/// nothing is written but the status, which says why — phase `Disabled` with `reason`, condition
/// `Disabled=True` — and a `NoDecision` notice when that reason is new. Counts are left as last
/// observed; remediation objects already made are left alone.
pub fn refuse(check: &NodeHealthCheck, reason: Reason, message: &str, now: Timestamp) -> Plan<NodeHealthCheckStatus> {
    let prev = check.status.clone().unwrap_or_default();
    let generation = check.metadata.generation;
    let mut status = prev.clone();
    let disabled = DesiredCondition::true_(DISABLED, reason.clone(), message);
    let is_new = get_condition(&prev.conditions, DISABLED)
        .is_none_or(|c| c.status != ConditionStatus::True || c.reason != reason || c.message != message);
    set_condition(&mut status.conditions, &disabled, now, generation);
    status.phase = Some(PHASE_DISABLED.to_string());
    status.reason = Some(message.to_string());
    status.observed_generation = generation;
    let mut notices = Vec::new();
    if status != prev {
        status.last_update_time = Some(Time(now));
    }
    if is_new {
        notices.push(Notice {
            kind: NoticeKind::NoDecision,
            target: None,
            reason: reason.clone(),
            message: message.to_string(),
        });
    }
    Plan { notices, ..Plan::unchanged(status) }
}
