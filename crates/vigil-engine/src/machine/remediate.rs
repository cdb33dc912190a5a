//! Starting the remediation of one unhealthy Machine: asking its owner (`OwnerRemediated=False`)
//! or creating a remediation object from the template, unless another check holds the target
//! or the pool is backed off.

use super::input::MhcInput;
use super::status::{Builder, MachineWrites};
use crate::backoff::{self, Gate, Ledger};
use crate::holders::{Holders, Waits};
use crate::plan::{Action, NoticeKind};
use crate::target::Target;
use jiff::Timestamp;
use serde_json::{Value, json};
use vigil_api::conditions::ConditionStatus;
use vigil_api::conditions::DesiredCondition;
use vigil_api::reason::Reason;
use vigil_api::validate::MhcPolicy;
use vigil_api::views::{MachineView, TemplateView};
use vigil_api::well_known::*;

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

/// What other checks hold, as one MachineHealthCheck decision sees it.
pub(super) struct Overlap<'h> {
    pub(super) holders: &'h Holders,
    /// Where the check's Nodes live (the cluster key of its targets).
    pub(super) node_cluster: &'h str,
    pub(super) waits: Waits,
}

impl Overlap<'_> {
    /// Whether another check holds the Machine's target; if so, records the wait (with a skip
    /// notice when it is news).
    pub(super) fn held_elsewhere(&mut self, b: &mut Builder<'_>, machine: &MachineView, key: &str) -> bool {
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

/// What decides whether a remediation may start besides the short-circuit: other checks
/// holding the target, and the pool's back-off.
pub(super) struct Started<'s, 'h, 'p> {
    pub(super) overlap: &'s mut Overlap<'h>,
    pub(super) ledger: &'s mut Ledger<'p>,
}

impl Started<'_, '_, '_> {
    /// Whether the back-off lets `machine` start now; records the start when it counts. A
    /// Machine already in the history (the same start asked for again), or one a check in
    /// dry-run already lists, is not counted twice.
    pub(super) fn backoff_allows(&mut self, input: &MhcInput<'_>, machine: &MachineView) -> bool {
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
pub(super) fn remediate(
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
