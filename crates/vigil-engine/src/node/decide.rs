//! The NodeHealthCheck decision, in its phases: own objects, judge, budget, templates, busy
//! control planes, remediate, status.

use super::budget::budget;
use super::gates::Gates;
use super::input::NhcInput;
use super::judge::{Finding, Scan, flaps, judge_nodes};
use super::objects::own_objects;
use super::remediate::{Pass, Setting, busy_control_planes, pacing};
use super::status::{Outcome, allowance_notice, build_status};
use super::templates::template_state;
use crate::backoff::Ledger;
use crate::decision::{Choices, Context, Features, Outputs, Overlap};
use crate::domains::Budgets;
use crate::holders::Holders;
use crate::pacing::Pacer;
use crate::plan::Plan;
use crate::target::{CheckRef, Target};
use jiff::Timestamp;
use vigil_api::conditions::{ConditionStatus, DesiredCondition};
use vigil_api::node_health_check::{NodeHealthCheckStatus, UnhealthyNode};
use vigil_api::shared::FlappingTarget;
use vigil_api::threshold::Rounding;
use vigil_api::validate::NhcPolicy;
use vigil_api::well_known::REMEDIATION_POSTPONED;

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
    let (all, mut scan) = judge_nodes(input, &owned, now);
    let flapping = flaps(policy, prev, &mut scan.subjects, &scan.clock.next, now);
    let Scan { subjects, healthy_at, observed, healthy, taken, cp_names, stale, wake: scan_wake, tally, .. } = scan;
    let expressions = (scan.clock.next, scan.unknown);
    let budgets = tally.zip(policy.failure_domains.as_ref()).map(|(t, fd)| t.judge(fd, Rounding::Up));
    let mut out = Outputs::default();
    if let Some(t) = scan_wake.0 {
        out.wake_at(t);
    }
    let (allowed_condition, storm_start) = budget(policy, prev, observed, (healthy, &taken.by_signal), now, out.wake());
    let templates = template_state(input, prev);
    let prev_entries = previous_entries(prev);
    let cp_busy = busy_control_planes(&cp_names, input.remediations, &prev_entries);
    let allowed = allowed_condition.status == ConditionStatus::True;
    let (pacing, pacer) = pacing(input, &subjects, observed, &taken.names, now);
    let to_remediate = subjects
        .iter()
        .filter(|s| matches!(s.verdict, Some(Finding::Unhealthy(_) | Finding::Expression(_))))
        .filter_map(|s| s.node);
    let upgrade = crate::upgrade::cluster_upgrade(input.around.cluster_versions, to_remediate);
    let postponed = upgrade
        .as_ref()
        .map(|p| (DesiredCondition::true_(REMEDIATION_POSTPONED, p.reason.clone(), &p.message), p.cause().to_string()));
    let gates = Gates::new(input, check_name, upgrade, now);
    out.tell_all(allowance_notice(prev, &allowed_condition));
    let cx = Context { policy, now };
    let features = features_of(policy, prev, pacer, budgets.as_ref(), now);
    let overlap = Overlap::new(holders, CheckRef::of_nhc(check), &prev.conditions);
    let setting = Setting::new(input, prev, &templates, allowed);
    let mut pass = Pass::new((cx, out, features, overlap), setting, gates, cp_busy);

    let (entries, undecided) = pass.remediate(&subjects, &owned, &prev_entries, &all, &healthy_at, &pacing);
    let flapping = unflapped(flapping, &entries);
    let (mut out, features, overlap) = pass.finish();
    out.tell_all(crate::stale::notices(
        &format!("NodeHealthCheck/{check_name}"),
        &prev.features.stale_targets,
        &stale,
        |name| (Target::local_node(name), format!("Node {name}")),
        now,
    ));
    let (ledger, pacer, chosen) = features.finish();
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
        waiting: overlap.condition(),
        postponed,
        backoff: ledger.finish(out.wake()),
        chosen,
        pacing: pacer
            .report(&prev.features.queued, &prev.conditions, |name| (Target::local_node(name), format!("Node {name}"))),
        disruptions: taken.by_signal.status(),
        flapping,
        expressions,
    };
    let status = build_status(input, prev, outcome, budgets.as_ref(), now, &mut out);
    let mut plan = out.plan(status);
    plan.held_elsewhere = overlap.into_held_elsewhere();
    plan.short_circuited = !allowed;
    let mut plan = if policy.dry_run { crate::dry_run::nhc(plan, check.status.as_ref(), now) } else { plan };
    plan.remediating = plan.status.unhealthy_nodes.iter().filter(|n| !n.remediations.is_empty()).count();
    plan
}

/// The flapping record without the Nodes being remediated: a remediation's start clears the
/// episodes that led to it, so the recovered Node is not remediated again for the same flaps.
fn unflapped(mut record: Vec<FlappingTarget>, entries: &[UnhealthyNode]) -> Vec<FlappingTarget> {
    crate::flapping::clear(&mut record, |name| entries.iter().any(|e| e.name == name && !e.remediations.is_empty()));
    record
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

/// The decision's features: the back-off's ledger and the choices from the previous status, the
/// pacer and the failure-domain budgets.
fn features_of<'a>(
    policy: &'a NhcPolicy,
    prev: &'a NodeHealthCheckStatus,
    pacer: Pacer,
    budgets: Option<&'a Budgets>,
    now: Timestamp,
) -> Features<'a> {
    let ledger = Ledger::new(policy.backoff.as_ref(), policy.dry_run, &prev.features.remediation_history, now);
    let choices = policy.per_rule_remediation().then(|| Choices::new(&prev.features.chosen_remediations));
    Features::new(ledger, pacer, budgets, choices)
}
