//! The NodeHealthCheck decision, in its phases: own objects, judge, budget, templates, busy
//! control planes, remediate, status.

use super::basics::{PHASE_DISABLED, PHASE_PAUSED, count, notice, rule_text};
use super::budget::budget;
use super::input::NhcInput;
use super::judge::{Scan, domain_label, judge_nodes};
use super::objects::{own_objects, owned_by_check};
use super::remediate::{Pass, busy_control_planes, remediate};
use super::templates::{Templates, template_state};
use crate::backoff::{self, Ledger};
use crate::domains::FAILURE_DOMAINS_HEALTHY;
use crate::holders::{Holders, Waits};
use crate::partial::remediation_phase;
use crate::plan::{Notice, NoticeKind, Plan};
use crate::target::CheckRef;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use vigil_api::NodeHealthCheck;
use vigil_api::conditions::ConditionStatus;
use vigil_api::conditions::{DesiredCondition, get_condition, set_condition};
use vigil_api::node_health_check::{NodeHealthCheckStatus, UnhealthyNode};
use vigil_api::reason::Reason;
use vigil_api::threshold::Rounding;
use vigil_api::well_known::{DISABLED, REMEDIATION_ALLOWED};

/// Decides what a NodeHealthCheck should do now when it is the only check: [`decide_among`]
/// with nobody else holding anything.
pub fn decide(input: &NhcInput<'_>, now: Timestamp) -> Plan<NodeHealthCheckStatus> {
    decide_among(input, &Holders::none(), now)
}

/// Decides what a NodeHealthCheck should do now, among other checks: a Node that `holders` says
/// another check holds is not started (see [`crate::holders`]). Pure (no I/O, no clock),
/// deterministic, and linear in Nodes plus remediation objects apart from sorting them by name.
pub fn decide_among(input: &NhcInput<'_>, holders: &Holders, now: Timestamp) -> Plan<NodeHealthCheckStatus> {
    let policy = input.policy;
    let check = input.check;
    let check_name = check.metadata.name.as_deref().unwrap_or("");
    let check_uid = check.metadata.uid.as_deref().filter(|u| !u.is_empty());
    let generation = check.metadata.generation;
    let default_status = NodeHealthCheckStatus::default();
    let prev = check.status.as_ref().unwrap_or(&default_status);

    // Judge: every Node against the rules.
    let owned = own_objects(input, check_name, check_uid);
    let (all, scan) = judge_nodes(input, &owned, now);
    let Scan { subjects, healthy_at, observed, healthy, cp_names, stale, wake: scan_wake, tally, .. } = scan;
    // Budget: the threshold, the storm cool-down, the failure domains (rounded up as medik8s).
    let budgets = tally.zip(policy.failure_domains.as_ref()).map(|(t, fd)| t.judge(fd, Rounding::Up));
    let mut wake = scan_wake;
    let (allowed_condition, storm_start) = budget(policy, prev, observed, healthy, now, &mut wake);
    let prev_allowed = get_condition(&prev.conditions, REMEDIATION_ALLOWED);
    let allowed = allowed_condition.status == ConditionStatus::True;
    let Templates { usable: templates, disabled, disabled_condition, disabled_changed } = template_state(input, prev);

    let paused = !policy.pause_requests.is_empty();
    let prev_paused = prev.phase.as_deref() == Some(PHASE_PAUSED);
    // The previous entries by name, walked alongside the subjects (Vigil writes them sorted).
    let mut prev_entries: Vec<&UnhealthyNode> = prev.unhealthy_nodes.iter().collect();
    if !prev_entries.windows(2).all(|w| w[0].name < w[1].name) {
        prev_entries.sort_by(|a, b| a.name.cmp(&b.name));
        prev_entries.dedup_by(|a, b| a.name == b.name);
    }
    let cp_busy = busy_control_planes(&cp_names, input.remediations, &prev_entries);

    let mut pass = Pass {
        policy,
        now,
        check_name,
        check_uid,
        templates,
        allowed,
        paused,
        newly_open: prev_allowed.is_none_or(|c| c.status != ConditionStatus::True) || prev_paused,
        disabled_changed,
        cp_busy,
        cp_taken: false,
        foreign: input.remediations.iter().copied().filter(|r| !owned_by_check(r, check_name, check_uid)).collect(),
        actions: Vec::new(),
        notices: Vec::new(),
        wake,
        holders,
        waits: Waits::new(CheckRef::of_nhc(check), &prev.conditions),
        ledger: Ledger::new(policy.backoff.as_ref(), policy.dry_run, &prev.remediation_history, now),
        would_before: &prev.would_remediate,
        domains: budgets.as_ref().zip(domain_label(policy)),
    };

    // Global notices first.
    let new_state = (allowed_condition.status.as_str(), allowed_condition.reason.as_str());
    let prev_state = prev_allowed.map(|c| (c.status.as_str(), c.reason.as_str()));
    if prev_state != Some(new_state) && (prev_state.is_some() || !allowed) {
        let kind = if allowed { NoticeKind::RemediationAllowed } else { NoticeKind::RemediationBlocked };
        pass.notices.push(Notice {
            kind,
            target: None,
            reason: allowed_condition.reason.clone(),
            message: allowed_condition.message.clone(),
        });
    }

    // Remediate (pass 2): every subject in name order.
    let (entries, undecided) = remediate(&mut pass, &subjects, &owned, &prev_entries, &all, &healthy_at);
    // The stale-signal guard: tell about Nodes whose stale condition is newly listed.
    pass.notices.extend(crate::stale::notices(
        &format!("NodeHealthCheck/{check_name}"),
        &prev.stale_targets,
        &stale,
        |name| (name.to_string(), format!("Node {name}")),
        now,
    ));

    // Phase, conditions, status.
    let remediating = entries.iter().filter(|e| !e.remediations.is_empty()).count();
    let (phase, reason) = if let Some((_, message)) = &disabled {
        (PHASE_DISABLED, message.clone())
    } else if paused {
        (PHASE_PAUSED, format!("Remediation paused by request: {}", policy.pause_requests.join("; ")))
    } else {
        remediation_phase(remediating)
    };
    let mut conditions: Vec<Condition> = prev.conditions.clone();
    set_condition(&mut conditions, &disabled_condition, now, generation);
    set_condition(&mut conditions, &allowed_condition, now, generation);
    if let Some(waiting) = pass.waits.condition() {
        set_condition(&mut conditions, &waiting, now, generation);
    }
    let (history, pools) = pass.ledger.finish(&mut pass.wake);
    let (backoff_condition, backoff_notices) =
        backoff::report(&prev.backed_off_pools, &prev.conditions, &pools, &history, policy.backoff.as_ref());
    if let Some(c) = backoff_condition {
        set_condition(&mut conditions, &c, now, generation);
    }
    pass.notices.extend(backoff_notices);
    let domains_report = budgets.as_ref().map(|b| b.report(&prev.failure_domains));
    match &domains_report {
        Some(report) => set_condition(&mut conditions, &report.condition, now, generation),
        None => conditions.retain(|c| c.type_ != FAILURE_DOMAINS_HEALTHY),
    }

    if paused && phase == PHASE_PAUSED && !prev_paused {
        pass.notices.push(Notice {
            kind: NoticeKind::Paused,
            target: None,
            reason: Reason::Paused,
            message: reason.clone(),
        });
    } else if !paused && prev_paused {
        pass.notices.push(Notice {
            kind: NoticeKind::Resumed,
            target: None,
            reason: Reason::Resumed,
            message: "No pause request is left; remediation may start again".into(),
        });
    }

    let mut status = NodeHealthCheckStatus {
        observed_nodes: count(observed),
        healthy_nodes: count(healthy),
        unhealthy_nodes: entries,
        phase: Some(phase.to_string()),
        reason: Some(reason),
        conditions,
        last_update_time: prev.last_update_time.clone(),
        storm_recovery_start_time: storm_start.map(Time),
        observed_generation: generation,
        would_remediate: Vec::new(),
        remediation_history: history,
        backed_off_pools: pools,
        failure_domains: Vec::new(),
        stale_target_count: count(stale.len()),
        stale_targets: crate::stale::listed(&stale),
    };
    if let Some(report) = domains_report {
        status.failure_domains = report.status;
        pass.notices.extend(report.notices);
    }
    if status != *prev {
        status.last_update_time = Some(Time(now));
        // No status field remembers undecided Nodes: tell about them when the status moves
        // (a Node turning undecided always moves it when it was healthy or listed before).
        for (name, rule) in undecided {
            let what = policy.conditions.get(rule).map(rule_text).unwrap_or_default();
            pass.notices.push(notice(
                NoticeKind::NoDecision,
                name,
                Reason::MissingLastTransitionTime,
                format!(
                    "Node {name} has condition {what} without lastTransitionTime: cannot tell how long it has held, so no decision is made for this node"
                ),
            ));
        }
    }

    let plan = Plan {
        status,
        actions: pass.actions,
        notices: pass.notices,
        next_wake: pass.wake.0,
        held_elsewhere: pass.waits.held_elsewhere,
        short_circuited: !allowed,
    };
    if policy.dry_run { crate::dry_run::nhc(plan, check.status.as_ref(), now) } else { plan }
}

/// The plan when no decision can be made at all (the spec is invalid, the caches are not synced):
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
    Plan { status, actions: Vec::new(), notices, next_wake: None, held_elsewhere: Vec::new(), short_circuited: false }
}
