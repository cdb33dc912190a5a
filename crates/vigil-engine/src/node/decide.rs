//! The NodeHealthCheck decision, in its phases: own objects, judge, budget, templates, busy
//! control planes, remediate, status.

use super::budget::budget;
use super::gates::Gates;
use super::input::NhcInput;
use super::judge::{Finding, Scan, domain_label, judge_nodes};
use super::objects::{own_objects, owned_by_check};
use super::remediate::{Pacing, Pass, busy_control_planes, pacing, remediate};
use super::status::{Outcome, PHASE_PAUSED, allowance_notice, build_status};
use super::templates::{Templates, template_state};
use crate::backoff::Ledger;
use crate::domains::Budgets;
use crate::holders::{Holders, Waits};
use crate::pacing::Pacer;
use crate::plan::Plan;
use crate::target::{CheckRef, Target};
use jiff::Timestamp;
use vigil_api::conditions::{ConditionStatus, DesiredCondition, get_condition};
use vigil_api::node_health_check::{NodeHealthCheckStatus, UnhealthyNode};
use vigil_api::threshold::Rounding;
use vigil_api::well_known::{REMEDIATION_ALLOWED, REMEDIATION_POSTPONED};

/// Decides what a NodeHealthCheck should do now when it is the only check: [`decide_among`]
/// with nobody else holding anything.
pub fn decide(input: &NhcInput<'_>, now: Timestamp) -> Plan<NodeHealthCheckStatus> {
    decide_among(input, &Holders::none(), now)
}

/// Decides what a NodeHealthCheck should do now, among other checks: a Node that `holders` says
/// another check holds is not started (see [`crate::holders`]). Pure (no I/O, no clock),
/// deterministic, and linear in Nodes plus remediation objects apart from sorting them by name.
///
/// The phases: the check's own objects; judge every Node (pass 1); the budget (threshold, storm
/// cool-down, failure domains, rounded up as medik8s); the templates; pacing (`maxInFlight`);
/// remediate every subject in name order, or in pacing-queue order when paced (pass 2); the
/// status and its notices; dry-run last.
pub fn decide_among(input: &NhcInput<'_>, holders: &Holders, now: Timestamp) -> Plan<NodeHealthCheckStatus> {
    let (policy, check) = (input.policy, input.check);
    let check_name = check.metadata.name.as_deref().unwrap_or("");
    let check_uid = check.metadata.uid.as_deref().filter(|u| !u.is_empty());
    let default_status = NodeHealthCheckStatus::default();
    let prev = check.status.as_ref().unwrap_or(&default_status);

    let owned = own_objects(input, check_name, check_uid);
    let (all, scan) = judge_nodes(input, &owned, now);
    let Scan { subjects, healthy_at, observed, healthy, cp_names, stale, wake: scan_wake, tally, .. } = scan;
    let budgets = tally.zip(policy.failure_domains.as_ref()).map(|(t, fd)| t.judge(fd, Rounding::Up));
    let mut wake = scan_wake;
    let (allowed_condition, storm_start) = budget(policy, prev, observed, healthy, now, &mut wake);
    let templates = template_state(input, prev);
    let prev_entries = previous_entries(prev);
    let cp_busy = busy_control_planes(&cp_names, input.remediations, &prev_entries);
    let allowed = allowed_condition.status == ConditionStatus::True;
    let mut pacing: Pacing = pacing(input, &subjects, observed, now);
    let to_remediate =
        subjects.iter().filter(|s| matches!(s.verdict, Some(Finding::Unhealthy(_)))).filter_map(|s| s.node);
    let upgrade = crate::upgrade::cluster_upgrade(input.around.cluster_versions, to_remediate);
    let postponed =
        upgrade.as_ref().map(|p| DesiredCondition::true_(REMEDIATION_POSTPONED, p.reason.clone(), &p.message));
    let gates = Gates::new(input, check_name, upgrade, now);
    let mut pass =
        new_pass(input, holders, prev, &templates, &allowed_condition, cp_busy, budgets.as_ref(), gates, now);
    pass.wake = wake;
    pass.pacer = std::mem::replace(&mut pacing.pacer, Pacer::off());
    pass.notices.extend(allowance_notice(prev, &allowed_condition));

    let (entries, undecided) = remediate(&mut pass, &subjects, &owned, &prev_entries, &all, &healthy_at, &pacing);
    // Every other Lease this check holds is released: no Node of its needs it any more.
    let mut keep = std::mem::take(&mut pass.keep_leases);
    keep.sort_unstable();
    let releases = pass.gates.releases(&|node| keep.binary_search(&node).is_ok());
    pass.actions.extend(releases);
    pass.notices.extend(crate::stale::notices(
        &format!("NodeHealthCheck/{check_name}"),
        &prev.features.stale_targets,
        &stale,
        |name| (Target::local_node(name), format!("Node {name}")),
        now,
    ));
    let outcome = Outcome {
        entries,
        undecided,
        stale,
        observed,
        healthy,
        storm_start,
        allowed_condition,
        disabled: templates.disabled,
        disabled_condition: templates.disabled_condition,
        waiting: pass.waits.condition(),
        postponed,
        backoff: pass.ledger.finish(&mut pass.wake),
        chosen: pass.chosen.take().map(|(_, c)| c).unwrap_or_default(),
        pacing: std::mem::replace(&mut pass.pacer, Pacer::off()).report(
            &prev.features.queued,
            &prev.conditions,
            |name| (Target::local_node(name), format!("Node {name}")),
        ),
    };
    let status = build_status(input, prev, outcome, budgets.as_ref(), now, &mut pass.notices);
    let plan = Plan {
        status,
        actions: pass.actions,
        notices: pass.notices,
        next_wake: pass.wake.0,
        held_elsewhere: pass.waits.held_elsewhere,
        short_circuited: !allowed,
        remediating: 0,
    };
    let mut plan = if policy.dry_run { crate::dry_run::nhc(plan, check.status.as_ref(), now) } else { plan };
    plan.remediating = plan.status.unhealthy_nodes.iter().filter(|n| !n.remediations.is_empty()).count();
    plan
}

/// The previous entries by name, walked alongside the subjects (Vigil writes them sorted).
fn previous_entries(prev: &NodeHealthCheckStatus) -> Vec<&UnhealthyNode> {
    let mut entries: Vec<&UnhealthyNode> = prev.unhealthy_nodes.iter().collect();
    if !entries.windows(2).all(|w| w[0].name < w[1].name) {
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        entries.dedup_by(|a, b| a.name == b.name);
    }
    entries
}

/// The remediation pass's state for this decision.
#[allow(clippy::too_many_arguments)]
fn new_pass<'a>(
    input: &NhcInput<'a>,
    holders: &'a Holders,
    prev: &'a NodeHealthCheckStatus,
    templates: &Templates<'a>,
    allowed_condition: &DesiredCondition,
    cp_busy: Vec<&'a str>,
    budgets: Option<&'a Budgets>,
    gates: Gates<'a>,
    now: Timestamp,
) -> Pass<'a> {
    let (policy, check) = (input.policy, input.check);
    let check_name = check.metadata.name.as_deref().unwrap_or("");
    let check_uid = check.metadata.uid.as_deref().filter(|u| !u.is_empty());
    let prev_allowed = get_condition(&prev.conditions, REMEDIATION_ALLOWED);
    let prev_paused = prev.phase.as_deref() == Some(PHASE_PAUSED);
    Pass {
        policy,
        now,
        check_name,
        check_uid,
        templates: templates.usable.clone(),
        allowed: allowed_condition.status == ConditionStatus::True,
        paused: !policy.pause_requests.is_empty(),
        newly_open: prev_allowed.is_none_or(|c| c.status != ConditionStatus::True) || prev_paused,
        disabled_changed: templates.disabled_changed,
        cp_busy,
        cp_taken: false,
        foreign: input.remediations.iter().copied().filter(|r| !owned_by_check(r, check_name, check_uid)).collect(),
        actions: Vec::new(),
        notices: Vec::new(),
        wake: Default::default(),
        holders,
        waits: Waits::new(CheckRef::of_nhc(check), &prev.conditions),
        ledger: Ledger::new(policy.backoff.as_ref(), policy.dry_run, &prev.features.remediation_history, now),
        would_before: &prev.features.would_remediate,
        domains: budgets.zip(domain_label(policy)),
        chosen: policy.per_rule_remediation().then(|| (prev.features.chosen_remediations.as_slice(), Vec::new())),
        pacer: Pacer::off(),
        gates,
        wait: None,
        prev_wait: None,
        keep_leases: Vec::new(),
    }
}
