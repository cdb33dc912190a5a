//! The MachineHealthCheck decision, in its phases: pause, targets, safety (Cluster and Nodes
//! readable), verdicts, short-circuit, writes per target, reports.

use super::input::{MhcInput, NodeSource};
use super::judge::{Verdict, counts_healthy, evaluate_with_node, machine_domain};
use super::own_clock::{self, OwnClock};
use super::remediate::{Place, Request, Started, pacing, remediate};
use super::status::{
    Builder, MachineWrites, backoff_status, pacing_status, report_domains, report_no_decision, report_pause,
    report_short_circuit, selected_elsewhere, stale_targets,
};
use crate::backoff::Ledger;
use crate::decision::{Choices, Context, Features, Overlap};
use crate::disruptions::{self, Signal};
use crate::domains::Budgets;
use crate::domains::Tally;
use crate::features::{self, Found};
use crate::holders::Holders;
use crate::lookup::Lookup;
use crate::pacing::Pacer;
use crate::peers::{MhcPeers, Owners};
use crate::plan::count;
use crate::plan::{Action, Earliest, NoticeKind, ObjectRef, Plan, Seen};
use crate::target::is_target;
use crate::target::{CheckRef, LOCAL_CLUSTER, Target, made_for};
use jiff::Timestamp;
use std::collections::BTreeMap;
use vigil_api::conditions::ConditionStatus;
use vigil_api::conditions::{self, DesiredCondition};
use vigil_api::machine_health_check::MachineHealthCheckStatus;
use vigil_api::reason::Reason;
use vigil_api::shared::{BackedOffPool, ChosenRemediation, QueuedTarget, RemediationRecord};
use vigil_api::threshold::Rounding;
use vigil_api::validate::{MhcPolicy, TemplateRef};
use vigil_api::views::NodeView;
use vigil_api::views::{ClusterView, MachineView};
use vigil_api::well_known::*;

/// Decides what a MachineHealthCheck should do now when it is the only check: [`decide_among`]
/// with nobody else holding anything.
pub fn decide(input: &MhcInput<'_>, now: Timestamp) -> Plan<MachineHealthCheckStatus> {
    decide_among(input, &Holders::none(), LOCAL_CLUSTER, now)
}

/// Decides what a MachineHealthCheck should do now, among other checks: a Machine whose Node
/// (in `node_cluster`: [`crate::holders::LOCAL_CLUSTER`] for a self-hosted cluster, else the
/// workload cluster's `namespace/clusterName`) another check holds is not remediated (see
/// [`crate::holders`]).
pub fn decide_among(
    input: &MhcInput<'_>,
    holders: &Holders,
    node_cluster: &str,
    now: Timestamp,
) -> Plan<MachineHealthCheckStatus> {
    decide_among_peers(input, holders, &MhcPeers::none(), node_cluster, now)
}

/// [`decide_among`] with the other MachineHealthChecks that may select the same Machines
/// (`peers`, see [`crate::peers`]): a Machine whose conditions another check owns is evaluated
/// and counted, but this check writes nothing on it and does not remediate it, and says so with
/// the condition [`SELECTED_BY_ANOTHER_CHECK`].
///
/// The phases, in the order the spec numbers its rules: pause (rule 1), targets, safety (no
/// Cluster or no Nodes: no verdict), verdicts (rule 2), the short-circuit (rule 3), writes per
/// target (rules 4 and 5; with `maxInFlight` the targets are visited in pacing-queue order), the
/// feature reports; dry-run last.
pub fn decide_among_peers(
    input: &MhcInput<'_>,
    holders: &Holders,
    peers: &MhcPeers<'_>,
    node_cluster: &str,
    now: Timestamp,
) -> Plan<MachineHealthCheckStatus> {
    let mut b = Builder::for_decision(input.check, now);
    if report_pause(&mut b, input) {
        pacing_status(&mut b, input, Pacer::off());
        return b.finish();
    }
    let targets = select_targets(input);
    b.status.targets = targets.iter().map(|m| m.meta.name.clone()).collect();
    b.status.expected_machines = count(targets.len());
    let (cluster, nodes) = match readable(input) {
        Ok(sources) => sources,
        Err((why, message)) => {
            pacing_status(&mut b, input, Pacer::off());
            return report_no_decision(b, why, message);
        }
    };
    let mut judged = judge_targets(input, &targets, (cluster, nodes), now, b.out.wake());
    b.status.current_healthy = count(judged.healthy);
    let budgets = domain_budgets(input.policy, &targets, &judged);
    let me = CheckRef::of_mhc(input.check);
    let owners = peers.owners_for(&me);
    let stale = stale_targets(&mut b, input, &targets, nodes, owners);
    let allowed = report_short_circuit(&mut b, input.policy, targets.len(), judged.available, &judged.disrupted);

    let (pacing, pacer) = pacing(input, owners, &targets, &judged.verdicts, now);
    let pacer = pacer.with_disrupted(judged.disrupted_names(&targets));
    let features = features_of(input, pacer, budgets.as_ref(), now);
    let overlap = Overlap::new(holders, me.clone(), input.check.status.as_ref().map_or(&[][..], |p| &p.conditions));
    let mut writer =
        TargetWriter::new(Context { policy: input.policy, now }, input, owners, node_cluster, (features, overlap));
    for k in 0..targets.len() {
        let i = pacing.nth(k);
        let (machine, verdict) = (targets[i], &judged.verdicts[i]);
        // A paused failure domain starts nothing new, exactly as the check-wide short-circuit.
        let domain_open = !writer.features.domain_paused(judged.domain_of.get(i).copied().flatten());
        let place = Place { since: pacing.since(i, now), in_flight: pacing.in_flight(i) };
        writer.write(&mut b, machine, verdict, allowed && domain_open, judged.already_healthy[i], place);
    }
    let remediating = writer.remediating;
    let mut remediated = std::mem::take(&mut writer.remediated);
    let Written { held_elsewhere, backoff, queue, chosen } = writer.report(&mut b);
    let failure_domains = report_domains(&mut b, budgets.as_ref());
    let disruptions = judged.disrupted.status();
    let own = std::mem::take(&mut judged.own);
    remediated.sort_unstable();
    let mut flapping = own.flapping;
    crate::flapping::clear(&mut flapping, |name| remediated.binary_search(&name).is_ok());
    let expressions = (own.matches, unevaluated(input, &own.unknown, &mut b));
    b.status.features = features::status(Found {
        backoff,
        failure_domains,
        stale: &stale,
        chosen,
        queue,
        disruptions,
        flapping,
        expressions,
    });
    let mut plan = b.finish();
    plan.held_elsewhere = held_elsewhere;
    plan.short_circuited = !allowed;
    plan.remediating = remediating;
    if input.policy.dry_run {
        let namespace = input.check.metadata.namespace.as_deref().unwrap_or("default");
        plan = crate::dry_run::mhc(plan, input.check.status.as_ref(), namespace, now);
    }
    plan
}

/// `status.unevaluatedExpressions` of the targets an expression could not be evaluated for
/// (`found`), each told once.
fn unevaluated(
    input: &MhcInput<'_>,
    found: &[(&str, usize, String)],
    b: &mut Builder<'_>,
) -> Vec<vigil_api::shared::UnevaluatedExpression> {
    let namespace = input.check.metadata.namespace.as_deref().unwrap_or("default");
    let prev = input.check.status.as_ref().map_or(&[][..], |s| s.features.unevaluated_expressions.as_slice());
    let target = |name: &str| Target::Machine { namespace: namespace.to_string(), name: name.to_string() };
    crate::expressions::unevaluated(&input.policy.expressions, prev, found, ("Machine", &target), &mut b.out)
}

/// The verdicts no condition rule makes: their incidents get the check's own remediation, and a
/// record naming one stands for the incident (see [`crate::chosen::choose`]).
const NO_RULE_VERDICTS: [Reason; 4] =
    [Reason::HasRemediateAnnotation, Reason::MachineHasFailure, Reason::NodeDeleted, Reason::NodeStartupTimeout];

/// Whether a Machine's remediation is under way, as observed: its owner was asked
/// (`OwnerRemediated=False`), or a remediation object made for it exists (a check with a
/// template, or with remediation per condition a rule's).
fn under_way(input: &MhcInput<'_>, machine: &MachineView) -> bool {
    let owner_asked = machine.owner_remediated().is_some_and(|c| c.status == ConditionStatus::False);
    owner_asked
        || ((input.policy.remediation_template.is_some() || input.policy.per_rule_remediation())
            && input.objects_named(machine).into_iter().any(|o| made_for(o, machine)))
}

/// The check's targets: the Machines of its namespace it selects and that have not opted out,
/// sorted by name (already sorted is the fast path; already selected, the selector is not
/// matched again).
fn select_targets<'a>(input: &MhcInput<'a>) -> Vec<&'a MachineView> {
    let namespace = input.check.metadata.namespace.as_deref().unwrap_or("default");
    let mut targets: Vec<&MachineView> = if input.machines_selected {
        debug_assert!(input.machines.iter().all(|m| m.meta.namespace == namespace && is_target(input.policy, m)));
        input.machines.to_vec()
    } else {
        input.machines.iter().copied().filter(|m| m.meta.namespace == namespace && is_target(input.policy, m)).collect()
    };
    if !targets.is_sorted_by(|a, c| a.meta.name <= c.meta.name) {
        targets.sort_unstable_by(|a, c| a.meta.name.cmp(&c.meta.name));
    }
    targets
}

/// Safety first: the Cluster and the workload cluster's Nodes, or why no Machine can be judged
/// (a missing Cluster, an unreachable workload cluster: no Node is taken for deleted).
fn readable<'a>(input: &MhcInput<'a>) -> Result<(&'a ClusterView, &'a dyn Lookup<NodeView>), (Reason, String)> {
    match (input.cluster, input.nodes) {
        (None, _) => Err((
            Reason::ClusterNotFound,
            format!(
                "Cluster {}/{} was not found; no Machine is evaluated",
                input.check.metadata.namespace.as_deref().unwrap_or(""),
                input.policy.cluster_name
            ),
        )),
        (_, NodeSource::Unreachable(why)) => Err((
            Reason::WorkloadClusterUnreachable,
            format!(
                "The workload cluster cannot be reached ({why}); no Machine is evaluated, and no Node is taken for deleted"
            ),
        )),
        (Some(cluster), NodeSource::Reachable(nodes)) => Ok((cluster, nodes)),
    }
}

/// Rule 2 over every target: the verdicts, how many count healthy, and what the writes need.
struct JudgedTargets<'a> {
    verdicts: Vec<Verdict>,
    /// Whether each target's remediator is still finishing: a remediation object this check made
    /// for it is being deleted (a finalizer holds it). Empty when the check makes no objects.
    finishing: Vec<bool>,
    healthy: usize,
    /// How many targets count as available in the budgets: healthy and, with
    /// `voluntaryDisruptions: Count`, not taken down on purpose.
    available: usize,
    /// With `voluntaryDisruptions: Count`: the signal of each target taken out of the budget by
    /// one (else empty).
    disrupted_at: Vec<Option<Signal>>,
    /// Those targets, counted by signal.
    disrupted: disruptions::Disrupted,
    /// Each target's failure domain (empty without `spec.failureDomains`).
    domain_of: Vec<Option<&'a str>>,
    /// Whether a healthy target already says `HealthCheckSucceeded=True` as it would be written.
    already_healthy: Vec<bool>,
    /// What the rules on Vigil's own clock found (expressions, flapping).
    own: OwnClock<'a>,
}

/// Judges every target. Nodes are looked up in one tight pass first, and "already healthy?" in
/// another: both are memory-bound, and the processor overlaps more of them when nothing else
/// runs between (the common case of a healthy fleet writes nothing).
fn judge_targets<'a>(
    input: &MhcInput<'_>,
    targets: &[&'a MachineView],
    (cluster, nodes): (&ClusterView, &'a dyn Lookup<NodeView>),
    now: Timestamp,
    wake: &mut Earliest,
) -> JudgedTargets<'a> {
    let policy = input.policy;
    let target_nodes: Vec<Option<&NodeView>> =
        targets.iter().map(|m| m.node_name.as_deref().and_then(|n| nodes.lookup(n))).collect();
    let mut verdicts: Vec<Verdict> =
        targets.iter().zip(&target_nodes).map(|(m, node)| evaluate_with_node(m, *node, cluster, policy, now)).collect();
    let own = own_clock::apply(
        input.check,
        policy,
        (targets, &target_nodes),
        &mut verdicts,
        |m| under_way(input, m),
        now,
        wake,
    );
    let finishing = remediators_finishing(input, targets);
    let disrupted_at = disrupted_targets(policy, targets, &target_nodes, &verdicts, &finishing);
    let mut disrupted = disruptions::Disrupted::default();
    disrupted_at.iter().flatten().for_each(|s| disrupted.add(*s));
    let (mut healthy, mut available) = (0usize, 0usize);
    for (k, (machine, verdict)) in targets.iter().zip(&verdicts).enumerate() {
        if let Verdict::Pending { until } = verdict {
            wake.offer(*until);
        }
        let counts = counts_healthy(machine, verdict, finishing.get(k).copied().unwrap_or(false));
        healthy += usize::from(counts);
        available += usize::from(counts && disrupted_at.get(k).is_none_or(Option::is_none));
    }
    let domain_of = match &policy.failure_domains {
        Some(fd) => targets.iter().map(|m| machine_domain(fd, m, nodes)).collect(),
        None => Vec::new(),
    };
    let already_healthy = targets
        .iter()
        .zip(&verdicts)
        .map(|(m, v)| {
            debug_assert_eq!(
                m.says_healthy(),
                conditions::health_check_succeeded()
                    .is_satisfied_by(conditions::find(&m.conditions, HEALTH_CHECK_SUCCEEDED))
            );
            matches!(v, Verdict::Healthy) && m.says_healthy()
        })
        .collect();
    JudgedTargets { verdicts, finishing, healthy, available, disrupted_at, disrupted, domain_of, already_healthy, own }
}

/// With `voluntaryDisruptions: Count`, the signal of each target that is healthy by its verdict
/// (a Machine being deleted included) and taken down on purpose (see [`crate::disruptions`]);
/// empty otherwise.
fn disrupted_targets(
    policy: &MhcPolicy,
    targets: &[&MachineView],
    nodes: &[Option<&NodeView>],
    verdicts: &[Verdict],
    finishing: &[bool],
) -> Vec<Option<Signal>> {
    if !policy.count_disruptions {
        return Vec::new();
    }
    targets
        .iter()
        .zip(nodes)
        .zip(verdicts)
        .enumerate()
        .map(|(k, ((machine, node), verdict))| {
            let by_verdict = matches!(verdict, Verdict::Healthy | Verdict::NotEvaluated { counts_healthy: true, .. });
            let finishing = finishing.get(k).copied().unwrap_or(false);
            disruptions::of_machine(machine, *node).filter(|_| by_verdict && !finishing)
        })
        .collect()
}

impl JudgedTargets<'_> {
    /// The names of the targets taken down on purpose, for pacing.
    fn disrupted_names(&self, targets: &[&MachineView]) -> Vec<String> {
        targets.iter().zip(&self.disrupted_at).filter(|(_, s)| s.is_some()).map(|(m, _)| m.meta.name.clone()).collect()
    }

    /// Whether target `k` counts as available in the budgets.
    fn available_at(&self, k: usize, machine: &MachineView) -> bool {
        let finishing = self.finishing.get(k).copied().unwrap_or(false);
        counts_healthy(machine, &self.verdicts[k], finishing) && self.disrupted_at.get(k).is_none_or(Option::is_none)
    }
}

/// Whether each target's remediator is still finishing ([`MhcInput::remediator_finishing`];
/// empty when the check makes no objects).
fn remediators_finishing(input: &MhcInput<'_>, targets: &[&MachineView]) -> Vec<bool> {
    if input.remediations.is_empty() {
        return Vec::new();
    }
    targets.iter().map(|m| input.remediator_finishing(m)).collect()
}

/// Failure-domain budgets, judged on the same counts as the short-circuit (targets taken down on
/// purpose included, when they count) and rounded down as it.
fn domain_budgets(policy: &MhcPolicy, targets: &[&MachineView], judged: &JudgedTargets<'_>) -> Option<Budgets> {
    policy.failure_domains.as_ref().map(|fd| {
        let mut tally = Tally::default();
        for (k, (machine, domain)) in targets.iter().zip(&judged.domain_of).enumerate() {
            tally.add(*domain, judged.available_at(k, machine));
        }
        tally.judge(fd, Rounding::Down)
    })
}

/// Rules 4 and 5, target by target: the verdict written on the Machine, remediation started
/// where allowed, a remediation object of a healthy Machine deleted; Machines another check owns
/// are only collected for the overlap report.
struct TargetWriter<'i, 'h> {
    cx: Context<'i, MhcPolicy>,
    input: &'i MhcInput<'i>,
    /// Who owns each target's conditions.
    owners: Owners<'i, 'i>,
    /// Where the check's Nodes live (the cluster key of its targets).
    node_cluster: &'h str,
    features: Features<'i>,
    overlap: Overlap<'h>,
    owned_elsewhere: BTreeMap<&'i CheckRef, Vec<String>>,
    healthy_condition: DesiredCondition,
    /// Every template of the policy ([`MhcPolicy::templates`]), as the input's lists are ordered.
    templates: Vec<&'i TemplateRef>,
    /// Targets this check writes whose remediation is under way: observed ([`under_way`]) or
    /// started by this plan.
    remediating: usize,
    /// Their names (a flapping record forgets them).
    remediated: Vec<&'i str>,
}

impl<'i, 'h> TargetWriter<'i, 'h> {
    fn new(
        cx: Context<'i, MhcPolicy>,
        input: &'i MhcInput<'i>,
        owners: Owners<'i, 'i>,
        node_cluster: &'h str,
        (features, overlap): (Features<'i>, Overlap<'h>),
    ) -> Self {
        TargetWriter {
            cx,
            input,
            owners,
            node_cluster,
            features,
            overlap,
            owned_elsewhere: BTreeMap::new(),
            healthy_condition: conditions::health_check_succeeded(),
            templates: input.policy.templates(),
            remediating: 0,
            remediated: Vec::new(),
        }
    }

    /// The writes for one target; `may_start`: neither the check-wide short-circuit nor its
    /// failure domain stops a new remediation; `place`: its place for pacing.
    fn write(
        &mut self,
        b: &mut Builder<'_>,
        machine: &'i MachineView,
        verdict: &Verdict,
        may_start: bool,
        already_healthy: bool,
        place: Place,
    ) {
        if let Some(owner) = self.owners.other_than_me(machine) {
            self.owned_elsewhere.entry(owner).or_default().push(machine.meta.key());
            return;
        }
        let mut writes = MachineWrites::new(machine);
        let mark = b.out.mark();
        match verdict {
            Verdict::Unhealthy { reason, message, rule, .. } => {
                self.unhealthy(b, &mut writes, reason, message, *rule, may_start.then_some(place))
            }
            Verdict::Healthy => self.healthy(b, &mut writes, already_healthy),
            // Not healthy yet: an incident's choice stands until the Machine is healthy again.
            Verdict::Pending { .. } | Verdict::NotEvaluated { .. } => self.keep_choice(machine),
        }
        // A check in dry-run sends none of its writes: only what was observed counts there.
        let starts = !self.input.policy.dry_run && (writes.asks_owner() || b.out.creates_since(mark));
        if starts || under_way(self.input, machine) {
            self.remediating += 1;
            self.remediated.push(&machine.meta.name);
        }
        if let Some(action) = writes.into_action() {
            b.out.act(action);
        }
    }

    /// An unhealthy Machine: its verdict (told once), the remediation its incident gets, and that
    /// remediation when it may start (`start`: its place for pacing; `None` when the short-circuit
    /// or its failure domain stops a new remediation).
    fn unhealthy(
        &mut self,
        b: &mut Builder<'_>,
        writes: &mut MachineWrites<'_>,
        reason: &Reason,
        message: &str,
        rule: Option<usize>,
        start: Option<Place>,
    ) {
        let machine = writes.machine;
        let key = machine.meta.key();
        let was_unhealthy = writes.current(HEALTH_CHECK_SUCCEEDED).is_some_and(|c| c.status == ConditionStatus::False);
        writes.set(DesiredCondition::false_(HEALTH_CHECK_SUCCEEDED, reason.clone(), message), self.cx.now);
        if !was_unhealthy {
            let kind = if *reason == Reason::Flapping { NoticeKind::Flapping } else { NoticeKind::Unhealthy };
            b.notice(kind, Some(Target::machine(machine)), reason.clone(), message);
        }
        let request = self.request(b, machine, &key, reason, rule);
        if let Some(place) = start {
            let mut started = Started {
                overlap: &mut self.overlap,
                features: &mut self.features,
                node_cluster: self.node_cluster,
                since: place.since,
                in_flight: place.in_flight,
            };
            remediate(b, &mut started, writes, self.input, &request, machine, &key, self.cx.now);
        }
    }

    /// What remediates an unhealthy Machine: the check's own remediation, or with remediation
    /// per condition the one of the rule that started its incident (recorded on its remediation
    /// object, else in the previous status, else the verdict's rule; see [`crate::chosen`]),
    /// reported in the status and told when it is news.
    fn request(
        &mut self,
        b: &mut Builder<'_>,
        machine: &MachineView,
        key: &str,
        reason: &Reason,
        rule: Option<usize>,
    ) -> Request<'i> {
        let (policy, now) = (self.cx.policy, self.cx.now);
        let annotated = self.annotated_rule(machine);
        let Some(choices) = self.features.choices() else {
            let template = policy.remediation_template.as_ref();
            return Request { template: template.and_then(|t| self.index_of(t)).zip(template), rule: None };
        };
        let before = choices.before(&machine.meta.name);
        let recorded = [annotated, before.map(|p| p.rule.as_str())];
        let choice = crate::chosen::choose(&recorded, policy.rules(), &NO_RULE_VERDICTS, rule, reason.as_str());
        let (mut template, mut remediation) = policy.remediation_of(choice.rule);
        // A Machine that carries `OwnerRemediated=False` is being remediated by its owner (that is
        // how Cluster API's owners read it, whenever it was written): its incident is the owner's,
        // and no object is made on top.
        let owner_asked = machine.owner_remediated().is_some_and(|c| c.status == ConditionStatus::False);
        if template.is_some() && owner_asked {
            template = None;
            remediation = format!("owner (OwnerRemediated=False is set; {remediation} is not started on top)");
        }
        let record = crate::chosen::record(
            &machine.meta.name,
            Target::machine(machine),
            &format!("Machine {key}"),
            &choice,
            remediation,
            before,
            now,
        );
        choices.record(record, &mut b.out);
        let template = template.and_then(|t| self.templates.iter().position(|x| *x == t)).zip(template);
        Request { template, rule: Some(choice.label) }
    }

    /// Keeps the choice of a Machine whose incident goes on without a verdict that chooses: the
    /// previous one, else its remediation object's record.
    fn keep_choice(&mut self, machine: &MachineView) {
        let (policy, now) = (self.cx.policy, self.cx.now);
        let annotated = self.annotated_rule(machine);
        if let Some(choices) = self.features.choices() {
            choices.keep(&machine.meta.name, annotated, policy.rules(), |i| policy.remediation_of(Some(i)).1, now);
        }
    }

    /// The rule recorded on the remediation object made for `machine`, if any.
    fn annotated_rule(&self, machine: &MachineView) -> Option<&'i str> {
        self.input
            .objects_named(machine)
            .into_iter()
            .filter(|o| made_for(o, machine))
            .find_map(|o| o.meta.annotations.get(RULE_ANNOTATION))
            .map(String::as_str)
    }

    /// Where a template is in the input's lists.
    fn index_of(&self, template: &TemplateRef) -> Option<usize> {
        self.templates.iter().position(|t| *t == template)
    }

    /// A healthy Machine: `HealthCheckSucceeded=True` (news when it was unhealthy) and its
    /// remediation object, if Vigil made one, deleted.
    fn healthy(&mut self, b: &mut Builder<'_>, writes: &mut MachineWrites<'_>, already_healthy: bool) {
        let machine = writes.machine;
        if !machine.meta.deleting && !already_healthy {
            let was_unhealthy =
                writes.current(HEALTH_CHECK_SUCCEEDED).is_some_and(|c| c.status == ConditionStatus::False);
            writes.set_ref(&self.healthy_condition, self.cx.now);
            if was_unhealthy {
                let key = machine.meta.key();
                b.notice(
                    NoticeKind::Healthy,
                    Some(Target::machine(machine)),
                    Reason::HealthCheckSucceeded,
                    format!("Machine {key} is healthy again"),
                );
            }
        }
        for object in self.input.objects_named(machine) {
            if made_for(object, machine) && !object.meta.deleting {
                b.out.act(Action::DeleteRemediation {
                    object: ObjectRef {
                        api_version: object.meta.api_version.clone(),
                        kind: object.meta.kind.clone(),
                        namespace: object.meta.namespace.clone(),
                        name: object.meta.name.clone(),
                    },
                    target: Target::machine(machine),
                    seen: Seen::of(&object.meta),
                });
            }
        }
    }

    /// The reports of the writes: waiting for other checks, Machines another check owns, the
    /// back-off, the pacing queue, the chosen remediations.
    fn report(mut self, b: &mut Builder<'_>) -> Written {
        if let Some(waiting) = self.overlap.condition() {
            b.condition(waiting, None, None);
        }
        // Visited in pacing order, listed by name.
        self.owned_elsewhere.values_mut().for_each(|machines| machines.sort());
        selected_elsewhere(b, &self.owned_elsewhere);
        let (ledger, pacer, chosen) = self.features.finish();
        let backoff = backoff_status(b, ledger, self.cx.policy);
        let queue = pacing_status(b, self.input, pacer);
        Written { held_elsewhere: self.overlap.into_held_elsewhere(), backoff, queue, chosen }
    }
}

/// What the writes leave to report.
struct Written {
    /// The holders to tell that this check waits for them.
    held_elsewhere: Vec<crate::plan::HeldElsewhere>,
    /// The back-off's history and backed-off pools.
    backoff: (Vec<RemediationRecord>, Vec<BackedOffPool>),
    /// The pacing queue (listed) and how many wait.
    queue: (Vec<QueuedTarget>, i32),
    /// With remediation per condition: each unhealthy target's chosen remediation.
    chosen: Vec<ChosenRemediation>,
}

/// The decision's features: the back-off's ledger and the choices from the previous status, the
/// pacer and the failure-domain budgets.
fn features_of<'i>(input: &MhcInput<'i>, pacer: Pacer, budgets: Option<&'i Budgets>, now: Timestamp) -> Features<'i> {
    let previous = input.check.status.as_ref();
    let history = previous.map_or(&[][..], |p| p.features.remediation_history.as_slice());
    let ledger = Ledger::new(input.policy.backoff.as_ref(), input.policy.dry_run, history, now);
    let chosen = previous.map_or(&[][..], |p| p.features.chosen_remediations.as_slice());
    let choices = input.policy.per_rule_remediation().then(|| Choices::new(chosen));
    Features::new(ledger, pacer, budgets, choices)
}
