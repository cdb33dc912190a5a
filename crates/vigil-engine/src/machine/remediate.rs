//! Starting the remediation of one unhealthy Machine: asking its owner (`OwnerRemediated=False`)
//! or creating a remediation object from the template, unless another check holds the target
//! or the pool is backed off.

use super::input::MhcInput;
use super::status::{Builder, MachineWrites};
use crate::backoff::{self, Gate, Ledger};
use crate::holders::{Holders, Waits};
use crate::plan::{Action, NoticeKind};
use crate::target::Target;
use crate::target::made_for;
use jiff::Timestamp;
use serde_json::{Value, json};
use vigil_api::conditions::DesiredCondition;
use vigil_api::conditions::{self, ConditionStatus};
use vigil_api::reason::Reason;
use vigil_api::validate::{MhcPolicy, TemplateRef};
use vigil_api::views::{MachineView, TemplateView};
use vigil_api::well_known::*;

/// The remediation object for `machine` from the template `template_ref` (found as `template`),
/// or why it cannot be built; `rule` (remediation per condition) is recorded on it as
/// [`RULE_ANNOTATION`].
pub fn remediation_object(
    policy: &MhcPolicy,
    template_ref: &TemplateRef,
    template: &TemplateView,
    machine: &MachineView,
    rule: Option<&str>,
) -> Result<Value, String> {
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
    if let Some(rule) = rule {
        object["metadata"]["annotations"] = json!({ RULE_ANNOTATION: rule });
    }
    if let Some(spec) = body.get("spec") {
        object["spec"] = spec.clone();
    }
    Ok(object)
}

/// What one unhealthy Machine's remediation is: its template (with its place in the input's
/// lists; `None`: the owner), and with remediation per condition the rule that chose it.
pub(super) struct Request<'p> {
    pub(super) template: Option<(usize, &'p TemplateRef)>,
    /// The rule's label ([`vigil_api::validate::ConditionRule::label`]), when remediation per
    /// condition is on: then a remediation that started is never followed by another.
    pub(super) rule: Option<String>,
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
            && input.check.status.as_ref().is_some_and(|s| s.features.would_remediate.iter().any(|w| w.name == name));
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

/// Requests remediation of one unhealthy Machine (rule 4): from its owner without a template,
/// else from a remediator through an object made from the template. A deleting Machine is left
/// to its deletion. With remediation per condition, an incident whose remediation started stays
/// with it: a Machine with a remediation object is not handed to its owner
/// ([`started_otherwise`]; one whose owner was asked is the owner's, see `TargetWriter::request`).
#[allow(clippy::too_many_arguments)]
pub(super) fn remediate(
    b: &mut Builder<'_>,
    started: &mut Started<'_, '_, '_>,
    writes: &mut MachineWrites<'_>,
    input: &MhcInput<'_>,
    request: &Request<'_>,
    machine: &MachineView,
    key: &str,
    now: Timestamp,
) {
    if machine.meta.deleting || (request.rule.is_some() && started_otherwise(input, request, machine)) {
        return;
    }
    match request.template {
        None => ask_owner(b, started, writes, input, machine, key, now),
        Some(template) => ask_remediator(b, started, writes, input, template, request, machine, key, now),
    }
}

/// Whether the Machine's incident already has an external remediation while the owner would be
/// asked, read from objects alone (so neither a lost status write nor a spec edit that drops the
/// template's kind from what the check reads can start a second one): a remediation object made
/// for it exists, or the Machine says one was requested during this incident
/// (`ExternallyRemediated=False` waiting for the remediator, no older than its
/// `HealthCheckSucceeded=False`; a refused request made nothing and does not count).
fn started_otherwise(input: &MhcInput<'_>, request: &Request<'_>, machine: &MachineView) -> bool {
    if request.template.is_some() {
        return false;
    }
    let since = |type_: &str| {
        conditions::find(&machine.conditions, type_)
            .filter(|c| c.status == ConditionStatus::False)
            .filter(|c| {
                type_ != EXTERNALLY_REMEDIATED || c.reason.as_deref() == Some(Reason::WaitingForRemediation.as_str())
            })
            .and_then(|c| c.last_transition_time)
    };
    let requested = match (since(HEALTH_CHECK_SUCCEEDED), since(EXTERNALLY_REMEDIATED)) {
        (Some(incident), Some(asked)) => asked >= incident,
        _ => false,
    };
    requested || input.objects_named(machine).into_iter().any(|o| made_for(o, machine))
}

/// `OwnerRemediated=False`, once per incident (told), unless another check holds the target or
/// the pool is backed off.
fn ask_owner(
    b: &mut Builder<'_>,
    started: &mut Started<'_, '_, '_>,
    writes: &mut MachineWrites<'_>,
    input: &MhcInput<'_>,
    machine: &MachineView,
    key: &str,
    now: Timestamp,
) {
    let needs_request = writes.current(OWNER_REMEDIATED).is_none_or(|c| c.status == ConditionStatus::True);
    if !needs_request || started.overlap.held_elsewhere(b, machine, key) || !started.backoff_allows(input, machine) {
        return;
    }
    let desired = DesiredCondition::false_(OWNER_REMEDIATED, Reason::WaitingForRemediation, "Waiting for remediation");
    if writes.set(desired, now) {
        b.notice(
            NoticeKind::RemediationRequested,
            Some(key.to_string()),
            Reason::WaitingForRemediation,
            format!("Asked the owner of Machine {key} to remediate it"),
        );
    }
}

/// A remediation object from the template (`ExternallyRemediated=False`): not when one exists
/// already, another check holds the target or the pool is backed off; a missing or unusable
/// template is said on the Machine (told once).
#[allow(clippy::too_many_arguments)]
fn ask_remediator(
    b: &mut Builder<'_>,
    started: &mut Started<'_, '_, '_>,
    writes: &mut MachineWrites<'_>,
    input: &MhcInput<'_>,
    (index, template_ref): (usize, &TemplateRef),
    request: &Request<'_>,
    machine: &MachineView,
    key: &str,
    now: Timestamp,
) {
    let waiting =
        || DesiredCondition::false_(EXTERNALLY_REMEDIATED, Reason::WaitingForRemediation, "Waiting for remediation");
    let mut refuse = |b: &mut Builder<'_>, reason: Reason, message: String| {
        if writes.set(DesiredCondition::false_(EXTERNALLY_REMEDIATED, reason.clone(), message.clone()), now) {
            b.notice(NoticeKind::RemediationSkipped, Some(key.to_string()), reason, message);
        }
    };
    let Some(template) = input.templates.get(index).copied().flatten() else {
        return refuse(
            b,
            Reason::RemediationTemplateNotFound,
            format!("Remediation template {template_ref} not found"),
        );
    };
    if !input.objects_named(machine).is_empty() {
        // Already requested: leave it to the remediator, and go on with the other Machines.
        writes.set(waiting(), now);
        return;
    }
    if started.overlap.held_elsewhere(b, machine, key) {
        return;
    }
    match remediation_object(input.policy, template_ref, template, machine, request.rule.as_deref()) {
        Ok(_) if !started.backoff_allows(input, machine) => {}
        Ok(object) => {
            writes.set(waiting(), now);
            b.actions.push(Action::CreateRemediation { object, target: key.to_string() });
        }
        Err(why) => {
            refuse(b, Reason::RemediationRequestCreationFailed, format!("Cannot create a remediation request: {why}"))
        }
    }
}
