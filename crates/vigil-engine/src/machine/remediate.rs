//! Starting the remediation of one unhealthy Machine: asking its owner (`OwnerRemediated=False`)
//! or creating a remediation object from the template, unless another check holds the target,
//! the pool is backed off or no pacing slot is free.

use super::input::MhcInput;
use super::judge::Verdict;
use super::status::{Builder, MachineWrites};
use crate::backoff;
use crate::decision::{Features, Overlap, Pacing};
use crate::holders::mhc_request;
use crate::pacing::Pacer;
use crate::peers::Owners;
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

/// What decides whether a remediation may start besides the short-circuit: other checks
/// holding the target, the pool's back-off and the pacing slots.
pub(super) struct Started<'s, 'h, 'p> {
    pub(super) overlap: &'s mut Overlap<'h>,
    pub(super) features: &'s mut Features<'p>,
    /// Where the check's Nodes live (the cluster key of its targets).
    pub(super) node_cluster: &'h str,
    /// When the Machine became unhealthy (its place in the pacing queue).
    pub(super) since: Timestamp,
    /// Its remediation is in flight already (a request of an earlier decision asked for again,
    /// e.g. a lost create): it keeps its slot and takes no new one.
    pub(super) in_flight: bool,
}

impl Started<'_, '_, '_> {
    /// Whether another check holds the Machine's target; if so, records the wait (with a skip
    /// notice when it is news).
    pub(super) fn held_elsewhere(&mut self, b: &mut Builder<'_>, machine: &MachineView) -> bool {
        let target = Target::of_machine(self.node_cluster, machine);
        self.overlap.held_elsewhere(Target::machine(machine), &target, &mut b.out)
    }

    /// Whether the last gates let `machine` start now: the pool's back-off, then a free pacing
    /// slot (`maxInFlight`; when none is free the Machine joins the queue; a Machine in flight
    /// already keeps its own). Records the start in both when it is let through. A Machine already
    /// in the history (the same start asked for again), or one a check in dry-run already lists,
    /// is not counted twice by the back-off.
    pub(super) fn may_start(&mut self, input: &MhcInput<'_>, machine: &MachineView) -> bool {
        let name = machine.meta.name.as_str();
        let listed = input.policy.dry_run
            && input.check.status.as_ref().is_some_and(|s| s.features.would_remediate.iter().any(|w| w.name == name));
        let pool = backoff::machine_pool(machine);
        let repeat = listed || self.features.recorded(name);
        let Some(admitted) = self.features.admit(pool, name, repeat, self.since, self.in_flight) else { return false };
        self.features.start(admitted);
        true
    }
}

/// One target's place for pacing: when it became unhealthy (its place in the queue) and whether
/// this check has its remediation in flight already.
#[derive(Debug, Clone, Copy)]
pub(super) struct Place {
    pub(super) since: Timestamp,
    pub(super) in_flight: bool,
}

/// Pacing for a MachineHealthCheck decision: the targets this check has in flight, counted from
/// the Machines, and the queue order (see [`crate::pacing`]). Machines another MachineHealthCheck
/// writes are its business, not this check's, so they are not counted.
pub(super) fn pacing(
    input: &MhcInput<'_>,
    owners: Owners<'_, '_>,
    targets: &[&MachineView],
    verdicts: &[Verdict],
    now: Timestamp,
) -> (Pacing, Pacer) {
    let Some(max) = input.policy.max_in_flight else {
        return (Pacing::unpaced(), Pacer::off());
    };
    let since: Vec<Option<Timestamp>> = targets.iter().zip(verdicts).map(|(m, v)| unhealthy_since(m, v, now)).collect();
    let in_flight: Vec<bool> = targets
        .iter()
        .zip(verdicts)
        .map(|(m, v)| owners.other_than_me(m).is_none() && in_flight(input, m, v))
        .collect();
    let busy = targets.iter().zip(&in_flight).filter(|(_, f)| **f).map(|(m, _)| m.meta.name.clone()).collect();
    let pacing = Pacing::paced(since, targets.iter().map(|m| m.meta.name.as_str()), in_flight);
    (pacing, Pacer::new(Some(max), targets.len(), busy))
}

/// When an unhealthy Machine became unhealthy, for the pacing queue: when its failure began (the
/// verdict's time), else when this check first marked it (`HealthCheckSucceeded=False`), else now
/// (it is marked in this decision). `None` for a Machine that is not unhealthy.
fn unhealthy_since(machine: &MachineView, verdict: &Verdict, now: Timestamp) -> Option<Timestamp> {
    let Verdict::Unhealthy { since, .. } = verdict else { return None };
    let marked = machine
        .health_check_succeeded()
        .filter(|c| c.status == ConditionStatus::False)
        .and_then(|c| c.last_transition_time);
    Some(since.or(marked).unwrap_or(now))
}

/// Whether this check has the remediation of `machine` in flight: its request stands (the one
/// reading of [`mhc_request`], as for the overlap rule) and the Machine is not healthy again:
/// `HealthCheckSucceeded` stays `False` after this decision (judged unhealthy now, or still marked
/// and not judged healthy; a Machine being deleted is never marked healthy, so it is in flight
/// until it is gone), or its remediator is still finishing (its object is being deleted).
fn in_flight(input: &MhcInput<'_>, machine: &MachineView, verdict: &Verdict) -> bool {
    if mhc_request(input.policy, machine, input.remediations).is_none() {
        return false;
    }
    match verdict {
        Verdict::Unhealthy { .. } => true,
        Verdict::Healthy if !machine.meta.deleting => input.remediator_finishing(machine),
        _ => machine.health_check_succeeded().is_some_and(|c| c.status == ConditionStatus::False),
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
        Some(template) => ask_remediator(b, started, writes, input, template, request, machine, now),
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

/// `OwnerRemediated=False`, once per incident (told), unless another check holds the target, the
/// pool is backed off or no pacing slot is free.
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
    if !needs_request || started.held_elsewhere(b, machine) || !started.may_start(input, machine) {
        return;
    }
    let desired = DesiredCondition::false_(OWNER_REMEDIATED, Reason::WaitingForRemediation, "Waiting for remediation");
    if writes.set(desired, now) {
        b.notice(
            NoticeKind::RemediationRequested,
            Some(Target::machine(machine)),
            Reason::WaitingForRemediation,
            format!("Asked the owner of Machine {key} to remediate it"),
        );
    }
}

/// A remediation object from the template (`ExternallyRemediated=False`): not when one exists
/// already, another check holds the target, the pool is backed off or no pacing slot is free; a
/// missing or unusable template is said on the Machine (told once).
#[allow(clippy::too_many_arguments)]
fn ask_remediator(
    b: &mut Builder<'_>,
    started: &mut Started<'_, '_, '_>,
    writes: &mut MachineWrites<'_>,
    input: &MhcInput<'_>,
    (index, template_ref): (usize, &TemplateRef),
    request: &Request<'_>,
    machine: &MachineView,
    now: Timestamp,
) {
    let waiting =
        || DesiredCondition::false_(EXTERNALLY_REMEDIATED, Reason::WaitingForRemediation, "Waiting for remediation");
    let mut refuse = |b: &mut Builder<'_>, reason: Reason, message: String| {
        if writes.set(DesiredCondition::false_(EXTERNALLY_REMEDIATED, reason.clone(), message.clone()), now) {
            b.notice(NoticeKind::RemediationSkipped, Some(Target::machine(machine)), reason, message);
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
    if started.held_elsewhere(b, machine) {
        return;
    }
    match remediation_object(input.policy, template_ref, template, machine, request.rule.as_deref()) {
        Ok(_) if !started.may_start(input, machine) => {}
        Ok(object) => {
            writes.set(waiting(), now);
            b.out.act(Action::CreateRemediation {
                object,
                target: Target::machine(machine),
                lease: None,
                after: Vec::new(),
            });
        }
        Err(why) => {
            refuse(b, Reason::RemediationRequestCreationFailed, format!("Cannot create a remediation request: {why}"))
        }
    }
}
