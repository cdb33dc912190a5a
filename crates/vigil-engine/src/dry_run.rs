//! Dry-run (shadow mode): a check decides exactly as it would (criteria, short-circuit, budget,
//! overlap, first escalation step) but its plan keeps no write to a target; what it would have
//! done is reported instead (`status.wouldRemediate`, `WouldRemediate` notices). Done in the
//! engine so the simulator and the controller shadow the same way.

use crate::plan::{Action, Notice, NoticeKind, Plan};
use crate::target::Target;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::Value;
use std::collections::BTreeMap;
use vigil_api::conditions::ConditionStatus;
use vigil_api::reason::Reason;
use vigil_api::shared::WouldRemediate;
use vigil_api::well_known::OWNER_REMEDIATED;
use vigil_api::{MachineHealthCheckStatus, NodeHealthCheckStatus};

/// Target notices a MachineHealthCheck derives from what its Machines carry: in dry-run nothing
/// is written to a Machine, so they would repeat on every decision; `WouldRemediate` (derived from
/// the status list) stands for them.
const MACHINE_DERIVED: [NoticeKind; 4] =
    [NoticeKind::Unhealthy, NoticeKind::Healthy, NoticeKind::RemediationRequested, NoticeKind::RemediationSkipped];

/// What each target would get, by target name, from the actions of a plan.
fn would(actions: &[Action]) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    for action in actions {
        match action {
            Action::SetMachineConditions { machine, conditions, .. } => {
                // External remediation shows as its CreateRemediation below.
                if conditions.iter().any(|(c, _)| c.type_ == OWNER_REMEDIATED && c.status == ConditionStatus::False) {
                    out.insert(machine.name.clone(), format!("{OWNER_REMEDIATED}=False"));
                }
            }
            Action::CreateRemediation { object, target, .. } => {
                let kind = object.get("kind").and_then(Value::as_str).unwrap_or("remediation object");
                out.insert(target.name().to_string(), format!("create {kind}"));
            }
            Action::DeleteRemediation { .. }
            | Action::AnnotateRemediation { .. }
            | Action::WriteLease(_)
            | Action::DeleteLease { .. } => {}
        }
    }
    out
}

/// The new list: each target keeps the `since` of the previous list, new ones start now.
fn merge(previous: &[WouldRemediate], now_list: BTreeMap<String, String>, now: Timestamp) -> Vec<WouldRemediate> {
    now_list
        .into_iter()
        .map(|(name, action)| {
            let since = previous.iter().find(|w| w.name == name).map_or(Time(now), |w| w.since.clone());
            WouldRemediate { name, action, since }
        })
        .collect()
}

/// `WouldRemediate` notices for the targets that entered the list; `key` gives a target's
/// notice key and how the message names it.
fn entered(
    previous: &[WouldRemediate],
    list: &[WouldRemediate],
    key: impl Fn(&str) -> (Target, String),
) -> Vec<Notice> {
    list.iter()
        .filter(|w| !previous.iter().any(|p| p.name == w.name))
        .map(|w| {
            let (target, what) = key(&w.name);
            Notice {
                kind: NoticeKind::WouldRemediate,
                target: Some(target),
                reason: Reason::WouldRemediate,
                message: format!("Dry run: {what} would be remediated now ({}); nothing was done", w.action),
            }
        })
        .collect()
}

/// Turns a MachineHealthCheck plan into its dry-run form: no action at all (no Machine is
/// marked, no object created or deleted), the would-be remediations in `status.wouldRemediate`.
pub(crate) fn mhc(
    mut plan: Plan<MachineHealthCheckStatus>,
    previous: Option<&MachineHealthCheckStatus>,
    namespace: &str,
    now: Timestamp,
) -> Plan<MachineHealthCheckStatus> {
    let prev: &[WouldRemediate] = previous.map_or(&[], |p| p.features.would_remediate.as_slice());
    let list = merge(prev, would(&plan.actions), now);
    plan.actions.clear();
    plan.notices.retain(|n| n.target.is_none() || !MACHINE_DERIVED.contains(&n.kind));
    plan.notices.extend(entered(prev, &list, |name| {
        let what = format!("Machine {namespace}/{name}");
        (Target::Machine { namespace: namespace.to_string(), name: name.to_string() }, what)
    }));
    plan.status.features.would_remediate = list;
    plan
}

/// Turns a NodeHealthCheck plan into its dry-run form: no action (nothing created, deleted or
/// annotated), requests it would have made are not recorded as in flight, and the would-be
/// remediations are in `status.wouldRemediate`.
pub(crate) fn nhc(
    mut plan: Plan<NodeHealthCheckStatus>,
    previous: Option<&NodeHealthCheckStatus>,
    now: Timestamp,
) -> Plan<NodeHealthCheckStatus> {
    let prev: &[WouldRemediate] = previous.map_or(&[], |p| p.features.would_remediate.as_slice());
    let list = merge(prev, would(&plan.actions), now);
    let unsent: Vec<(&str, &Value)> = plan
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::CreateRemediation { object, target, .. } => Some((target.name(), object)),
            _ => None,
        })
        .collect();
    let mut status = plan.status.clone();
    crate::partial::forget_requests(&mut status, &unsent);
    plan.actions.clear();
    plan.notices.extend(entered(prev, &list, |name| (Target::local_node(name), format!("Node {name}"))));
    status.features.would_remediate = list;
    // The status changed only if it differs from the previous one apart from its update time.
    status.last_update_time = previous.and_then(|p| p.last_update_time.clone());
    if previous != Some(&status) {
        status.last_update_time = Some(Time(now));
    } else {
        // The engine tells about undecided Nodes only when the status moves; the request it
        // recorded (and this plan forgot) moved it, the dry-run status did not.
        plan.notices.retain(|n| n.kind != NoticeKind::NoDecision || n.target.is_none());
    }
    plan.status = status;
    plan
}
