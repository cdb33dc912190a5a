//! What a plan that was only partly carried out must no longer say. An adapter that could not
//! send a remediating write (its target was not confirmed, the create failed, the check runs in
//! dry-run) leaves it out; the status must then not report an object that does not exist, nor
//! the notices announce a request that was not made, so the next decision asks again instead of
//! waiting for it.

use crate::plan::{Action, NoticeKind, Plan};
use serde_json::Value;
use std::collections::BTreeSet;
use vigil_api::MachineHealthCheckStatus;
use vigil_api::node_health_check::NodeHealthCheckStatus;
use vigil_api::well_known::TEMPLATE_NAME_ANNOTATION;

/// A NodeHealthCheck's phase while some Node has remediation objects.
pub(crate) const PHASE_REMEDIATING: &str = "Remediating";
/// A NodeHealthCheck's phase when nothing else decides it.
pub(crate) const PHASE_ENABLED: &str = "Enabled";

/// Phase and reason when neither a template problem nor a pause request decides them.
pub(crate) fn remediation_phase(remediating: usize) -> (&'static str, String) {
    if remediating > 0 {
        (PHASE_REMEDIATING, format!("{remediating} node(s) being remediated"))
    } else {
        (PHASE_ENABLED, "No node is being remediated".to_string())
    }
}

/// Takes out of a plan's status the records of create requests that were not carried out
/// (`unsent`: target Node and the manifest of [`Action::CreateRemediation`]): an adapter that
/// could not send one, or whose create failed, must not report a remediation object that does
/// not exist, and the next decision then asks for it again instead of waiting for it.
pub fn forget_requests(status: &mut NodeHealthCheckStatus, unsent: &[(&str, &Value)]) {
    for (target, object) in unsent {
        let text = |p: &str| object.pointer(p).and_then(Value::as_str).unwrap_or("");
        let (kind, namespace, name) = (text("/kind"), text("/metadata/namespace"), text("/metadata/name"));
        let template = object
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(TEMPLATE_NAME_ANNOTATION))
            .and_then(Value::as_str);
        let Some(entry) = status.unhealthy_nodes.iter_mut().find(|e| e.name == *target) else { continue };
        if let Some(i) = entry.remediations.iter().position(|r| {
            r.resource.uid.is_none()
                && r.resource.kind == kind
                && r.resource.namespace == namespace
                && r.resource.name == name
                && r.template_name.as_deref() == template
        }) {
            entry.remediations.remove(i);
        }
    }
    if status.phase.as_deref() == Some(PHASE_REMEDIATING) {
        let remediating = status.unhealthy_nodes.iter().filter(|e| !e.remediations.is_empty()).count();
        let (phase, reason) = remediation_phase(remediating);
        status.phase = Some(phase.to_string());
        status.reason = Some(reason);
    }
}

/// A check status that may record requests of the plan that carries it.
pub trait Requests {
    /// Forgets the requests of `unsent` (target, manifest of [`Action::CreateRemediation`]).
    fn forget(&mut self, unsent: &[(&str, &Value)]);
}

impl Requests for NodeHealthCheckStatus {
    fn forget(&mut self, unsent: &[(&str, &Value)]) {
        forget_requests(self, unsent);
    }
}

impl Requests for MachineHealthCheckStatus {
    /// A MachineHealthCheck's status records no request: the Machine's conditions do.
    fn forget(&mut self, _unsent: &[(&str, &Value)]) {}
}

/// Leaves `left_out` (actions of `plan` that were not confirmed or failed) out of what the plan
/// reports: its status no longer lists the remediation objects they would have created, and no
/// `RemediationRequested` notice announces a request that was not made.
pub fn leave_out<S: Requests>(plan: &mut Plan<S>, left_out: &[Action]) {
    let unsent: Vec<(&str, &Value)> = left_out
        .iter()
        .filter_map(|a| match a {
            Action::CreateRemediation { object, target, .. } => Some((target.name(), object)),
            _ => None,
        })
        .collect();
    let targets: BTreeSet<&str> = left_out.iter().map(Action::target_name).collect();
    plan.notices.retain(|n| {
        !(n.kind == NoticeKind::RemediationRequested && n.target.as_ref().is_some_and(|t| targets.contains(t.name())))
    });
    if !unsent.is_empty() {
        plan.status.forget(&unsent);
    }
}
