//! Remediating the unhealthy Nodes: requesting the first step, escalating on timeout or failure,
//! deleting objects of recovered Nodes, one control-plane Node at a time, at most `maxInFlight`
//! at a time.

use super::gates::{Gates, Tend, Wait, maintenance_wait};
use super::input::NhcInput;
use super::judge::{Finding, Subject, node_domain, rule_text, unhealthy_since};
use super::objects::{Book, OWNER_KIND, Owned, object_ref, step_of};
use super::templates::Usable;
use crate::backoff::{self, Gate as Backoff, Ledger};
use crate::domains::Budgets;
use crate::holders::{Holders, Waits, nhc_held};
use crate::node_lease;
use crate::pacing::{Pacer, visit_order};
use crate::plan::{Action, Earliest, LeaseWrite, Notice, NoticeKind, Seen};
use crate::plan::{ONE_NS, after};
use crate::target::entry;
use crate::target::{Target, is_control_plane};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Map, Value, json};
use vigil_api::conditions::ConditionStatus;
use vigil_api::conditions::{self};
use vigil_api::duration::format_go_duration;
use vigil_api::node_health_check::{NodeRemediation, NodeWait, RemediationReference, UnhealthyNode};
use vigil_api::reason::Reason;
use vigil_api::shared::ChosenRemediation;
use vigil_api::validate::{ConditionRule, HealthyDelay, Ladder, NhcPolicy, RemediationStep, TemplateRef};
use vigil_api::views::NodeView;
use vigil_api::views::RemediationView;
use vigil_api::well_known::{
    CONTROL_PLANE_NODE_OBJECT_LABEL, EXCLUDE_FROM_REMEDIATION_LABEL, MANUALLY_CONFIRMED_HEALTHY_ANNOTATION,
    MULTIPLE_TEMPLATES_SUPPORT_ANNOTATION, NHC_TIMED_OUT_ANNOTATION, NODE_NAME_ANNOTATION, PART_OF_LABEL,
    PART_OF_NODE_HEALTHCHECK, PERMANENT_NODE_DELETION_EXPECTED, RULE_ANNOTATION, SUCCEEDED, TEMPLATE_NAME_ANNOTATION,
};

/// Whether `node` has label `key` set to `value`.
fn node_has_label_value(node: &NodeView, key: &str, value: &str) -> bool {
    node.labels.get(key).is_some_and(|v| v == value)
}

/// Whether `node` has annotation `key`.
fn node_has_annotation(node: &NodeView, key: &str) -> bool {
    node.has_annotation(key)
}

/// Why a remediation step is given up.
#[derive(Debug, Clone, Copy)]
pub(super) enum GaveUp {
    /// Its object reports `Succeeded=False`.
    Failed,
    /// Its timeout passed.
    TimedOut,
    /// The Node's Lease was held past its overdue instant (three step durations and the earlier
    /// steps' after it was taken): this long.
    LeaseOverdue(jiff::SignedDuration),
}

/// What happened to a request for a remediation object.
pub(super) enum Requested {
    /// A create action was added (or an earlier `generateName` request is awaited).
    Done,
    /// The template cannot be used: reason and why.
    Skipped(Reason, String),
    /// The object cannot be made yet (its owner Machine cannot be read): the Node's wait says
    /// why.
    Held,
}

/// Shared state of the second pass.
pub(super) struct Pass<'a> {
    pub(super) policy: &'a NhcPolicy,
    pub(super) now: Timestamp,
    pub(super) check_name: &'a str,
    pub(super) check_uid: Option<&'a str>,
    pub(super) templates: Vec<Usable<'a>>,
    pub(super) allowed: bool,
    pub(super) paused: bool,
    /// New remediation was not possible in the previous status but is now: a skip is news.
    pub(super) newly_open: bool,
    /// The `Disabled` condition changed: a template skip is news.
    pub(super) disabled_changed: bool,
    pub(super) cp_busy: Vec<&'a str>,
    pub(super) cp_taken: bool,
    /// Remediation objects of the steps' kinds that this check does not own.
    pub(super) foreign: Vec<&'a RemediationView>,
    pub(super) actions: Vec<Action>,
    pub(super) notices: Vec<Notice>,
    pub(super) wake: Earliest,
    /// What other checks hold (a Node held by another check is never started here).
    pub(super) holders: &'a Holders,
    /// Targets waiting for another check.
    pub(super) waits: Waits,
    /// The back-off history of this decision (`spec.backoff`).
    pub(super) ledger: Ledger<'a>,
    /// The previous `status.wouldRemediate`: in dry-run, a Node listed there was already counted.
    pub(super) would_before: &'a [vigil_api::shared::WouldRemediate],
    /// Failure-domain budgets (a Node of a paused domain is not started) and their label.
    pub(super) domains: Option<(&'a Budgets, &'a str)>,
    /// With remediation per condition: the previous and the new `status.chosenRemediations`.
    pub(super) chosen: Option<(&'a [ChosenRemediation], Vec<ChosenRemediation>)>,
    /// The pacing slots (`spec.maxInFlight`).
    pub(super) pacer: Pacer,
    /// The upgrade pause, planned maintenance and the node Leases.
    pub(super) gates: Gates<'a>,
    /// What the subject being decided waits for (its status entry's `waiting`).
    pub(super) wait: Option<Wait>,
    /// What it waited for in the previous status.
    pub(super) prev_wait: Option<&'a NodeWait>,
    /// Nodes whose Lease this check keeps: a remediation of this check is live there (an object
    /// or a request not given up), or this plan creates one; every other Lease it holds is
    /// released.
    pub(super) keep_leases: Vec<&'a str>,
}

/// The remediation of one Node's incident: the check's own, or with remediation per condition the
/// one of the rule that started it ([`crate::chosen`]), and that rule's label.
pub(super) struct Incident<'p> {
    pub(super) ladder: Ladder<'p>,
    /// The rule's label, recorded on every object made for the incident; `None` when remediation
    /// per condition is off (objects then carry no annotation of Vigil's).
    pub(super) rule: Option<String>,
}

/// Pacing's view of a decision's subjects (`spec.maxInFlight`, see [`crate::pacing`]): the order
/// to visit them in, when each one that may start became unhealthy, and the slots.
pub(super) struct Pacing {
    /// Indexes into the subjects in queue order when paced; `None`: name order.
    pub(super) order: Option<Vec<usize>>,
    /// Per subject (empty when not paced): when it became unhealthy, for an unhealthy Node
    /// without objects (one that may start); `None` for the others.
    pub(super) since: Vec<Option<Timestamp>>,
    pub(super) pacer: Pacer,
}

/// Pacing for a NodeHealthCheck decision among `observed` selected Nodes: the Nodes this check has
/// in flight — those it holds (its own remediation objects not given up on, its requests not
/// seen yet: the one reading of [`nhc_held`], as for the overlap rule) that are not healthy
/// again (a Node gone counts until its objects are) — and the queue order.
pub(super) fn pacing(input: &NhcInput<'_>, subjects: &[Subject<'_>], observed: usize, now: Timestamp) -> Pacing {
    let Some(max) = input.policy.max_in_flight else {
        return Pacing { order: None, since: Vec::new(), pacer: Pacer::off() };
    };
    let since: Vec<Option<Timestamp>> = subjects
        .iter()
        .map(|s| match (s.verdict, s.node) {
            (Some(Finding::Unhealthy(rule)), Some(node)) if s.objs.is_empty() => {
                Some(input.policy.conditions.get(rule).and_then(|r| unhealthy_since(node, r)).unwrap_or(now))
            }
            _ => None,
        })
        .collect();
    let mut held: Vec<&str> = nhc_held(input.check, input.remediations).map(|(node, _)| node).collect();
    held.sort_unstable();
    held.dedup();
    let in_flight = subjects
        .iter()
        .filter(|s| s.verdict != Some(Finding::Clear) && held.binary_search(&s.name).is_ok())
        .map(|s| s.name.to_string())
        .collect();
    let order = Some(visit_order(true, since.iter().copied().zip(subjects.iter().map(|s| s.name))));
    Pacing { order, since, pacer: Pacer::new(Some(max), observed, in_flight) }
}

impl<'a> Pass<'a> {
    /// The incident of a Node that rule `rule` finds unhealthy now: the check's own remediation,
    /// or with remediation per condition the rule recorded on its objects, else in the previous
    /// status, else `rule` (the first rule in spec order past its duration); recorded for the
    /// status and told when it is news.
    pub(super) fn incident(&mut self, name: &str, objs: &[Owned<'_>], rule: usize) -> Incident<'a> {
        let policy = self.policy;
        let Some((previous, chosen)) = &mut self.chosen else {
            return Incident { ladder: policy.ladder(None), rule: None };
        };
        let annotated = objs.iter().find_map(|o| entry(&o.view.meta.annotations, RULE_ANNOTATION));
        let before = crate::chosen::previous(previous, name);
        let recorded = [annotated, before.map(|p| p.rule.as_str())];
        let choice = crate::chosen::choose(&recorded, policy.conditions.iter(), &[], Some(rule), "");
        let ladder = policy.ladder(choice.rule);
        let (entry, notice) = crate::chosen::record(
            name,
            Target::local_node(name),
            &format!("Node {name}"),
            &choice,
            ladder.describe(),
            before,
            self.now,
        );
        chosen.push(entry);
        self.notices.extend(notice);
        Incident { ladder, rule: Some(choice.label) }
    }

    /// Keeps a listed Node's choice while its incident goes on without a verdict that chooses
    /// (recovering, undecided, deselected): the previous one, else its objects' record.
    fn keep_choice(&mut self, name: &str, objs: &[Owned<'_>]) {
        let policy = self.policy;
        if let Some((previous, chosen)) = &mut self.chosen {
            let annotated = objs.iter().find_map(|o| entry(&o.view.meta.annotations, RULE_ANNOTATION));
            chosen.extend(crate::chosen::kept(
                name,
                crate::chosen::previous(previous, name),
                annotated,
                policy.conditions.iter(),
                |i| policy.ladder(Some(i)).describe(),
                self.now,
            ));
        }
    }

    pub(super) fn step_label(ladder: &Ladder<'_>, s: usize) -> String {
        ladder.steps.get(s).map_or_else(String::new, |st| st.template.to_string())
    }

    /// Offers the instant a step requested at `started` times out, when that is still ahead (an
    /// object not seen yet cannot be judged, but its timer already runs).
    pub(super) fn offer_step_timeout(&mut self, step: &RemediationStep, started: Timestamp) {
        if let Some(t) = step.timeout.and_then(|d| after(started, d)).and_then(|d| after(d, ONE_NS))
            && t > self.now
        {
            self.wake.offer(t);
        }
    }

    /// Asks for an object of step `s` of the incident's remediation for Node `name` (the caller
    /// checked every other rule).
    pub(super) fn request(
        &mut self,
        node: &NodeView,
        s: usize,
        book: &mut Book<'_>,
        incident: &Incident<'_>,
        lease: Option<LeaseWrite>,
    ) -> Requested {
        let name = node.name.as_str();
        let Some(step) = incident.ladder.steps.get(s) else {
            return Requested::Skipped(Reason::RemediationTemplateNotFound, format!("no remediation step {s}"));
        };
        let (view, spec) = match self.templates.get(incident.ladder.offset + s).copied().unwrap_or(Usable::Missing) {
            Usable::Yes(view, spec) => (view, spec),
            Usable::Missing => {
                return Requested::Skipped(
                    Reason::RemediationTemplateNotFound,
                    format!("Cannot remediate node {name}: remediation template {} not found", step.template),
                );
            }
            Usable::Invalid(why) => {
                return Requested::Skipped(
                    Reason::RemediationTemplateInvalid,
                    format!("Cannot remediate node {name}: remediation template {} {why}", step.template),
                );
            }
        };
        let mut earlier = book.take_in_flight(step);
        if let Some(r) = earlier.filter(|r| r.resource.name.is_empty()) {
            // A request with a server-generated name (`generateName`), recorded by a version
            // that made them, not seen yet: repeating it could make a second object, so it is
            // awaited, unless its step's timeout passed without any object showing up (the
            // request was lost; a single template has no timeout and waits).
            let lost = step.timeout.and_then(|d| after(r.started.0, d)).is_some_and(|end| end < self.now);
            if !lost {
                book.records.push(r.clone());
                self.offer_step_timeout(step, r.started.0);
                return Requested::Done;
            }
            earlier = None;
        }
        let several = view.meta.annotations.get(MULTIPLE_TEMPLATES_SUPPORT_ANNOTATION).is_some_and(|v| v == "true");
        let object_name = match several {
            true => several_per_node_name(name, self.check_name, &step.template, s),
            false => name.to_string(),
        };
        let kind = step.template.remediation_kind();
        if let Some(skipped) = self.taken_by_another(name, &object_name, step) {
            return skipped;
        }
        let machine = match self.gates.machine_owner(node, &step.template.namespace) {
            Ok(machine) => machine,
            Err(wait) => {
                // Kept, to be made once the owner can be read.
                book.records.extend(earlier.cloned());
                self.hold(name, wait, NoticeKind::RemediationSkipped);
                return Requested::Held;
            }
        };
        let object = self.manifest(node, &object_name, step, spec, (incident.rule.as_deref(), machine));
        let started = earlier.map_or(self.now, |r| r.started.0);
        self.offer_step_timeout(step, started);
        book.records.push(NodeRemediation {
            resource: RemediationReference {
                api_version: step.template.api_version.clone(),
                kind: kind.to_string(),
                namespace: step.template.namespace.clone(),
                name: object_name,
                uid: None,
            },
            started: Time(started),
            timed_out: None,
            template_name: Some(step.template.name.clone()),
        });
        self.actions.push(Action::CreateRemediation { object, target: Target::local_node(name), lease });
        Requested::Done
    }

    /// The object `object_name` this check would make for Node `name` exists and is not ours:
    /// leave it alone, and do not list it in the status as a remediation this check started.
    fn taken_by_another(&self, name: &str, object_name: &str, step: &RemediationStep) -> Option<Requested> {
        let kind = step.template.remediation_kind();
        let other = self.foreign.iter().find(|r| {
            r.meta.kind == kind && r.meta.namespace == step.template.namespace && r.meta.name == object_name
        })?;
        let owner = other
            .meta
            .owners
            .first()
            .map_or_else(|| "no owner".to_string(), |o| format!("owner {} {}", o.kind, o.name));
        Some(Requested::Skipped(
            Reason::RemediationObjectExists,
            format!(
                "Cannot remediate node {name}: {kind} {}/{object_name} already exists and belongs to another check ({owner})",
                step.template.namespace
            ),
        ))
    }

    /// The remediation object `object_name` for `node` from `step`'s template, as medik8s makes
    /// it but never with a server-generated name (see [`several_per_node_name`]): annotated with
    /// the Node and template (and with remediation per condition the incident's `rule`),
    /// labelled `app.kubernetes.io/part-of: node-healthcheck-controller` (and
    /// `remediation.medik8s.io/isControlPlaneNode` for a control-plane Node), owned by the check
    /// (an owner reference that is neither controller nor blocks deletion) and by the Node's
    /// OpenShift `machine` when there is one ([`Gates::machine_owner`]).
    fn manifest(
        &self,
        node: &NodeView,
        object_name: &str,
        step: &RemediationStep,
        spec: &Value,
        (rule, machine): (Option<&str>, Option<Value>),
    ) -> Value {
        let name = node.name.as_str();
        let kind = step.template.remediation_kind();
        let mut metadata = Map::new();
        metadata.insert("namespace".into(), Value::String(step.template.namespace.clone()));
        metadata.insert("name".into(), Value::String(object_name.to_string()));
        let mut annotations = json!({ NODE_NAME_ANNOTATION: name, TEMPLATE_NAME_ANNOTATION: step.template.name });
        if let Some(rule) = rule {
            annotations[RULE_ANNOTATION] = Value::String(rule.to_string());
        }
        metadata.insert("annotations".into(), annotations);
        let mut labels = json!({ PART_OF_LABEL: PART_OF_NODE_HEALTHCHECK });
        if is_control_plane(node) {
            labels[CONTROL_PLANE_NODE_OBJECT_LABEL] = Value::String(String::new());
        }
        metadata.insert("labels".into(), labels);
        let mut owner = Map::new();
        owner.insert("apiVersion".into(), Value::String(self.policy.api.api_version().into()));
        owner.insert("kind".into(), Value::String(OWNER_KIND.into()));
        owner.insert("name".into(), Value::String(self.check_name.to_string()));
        if let Some(uid) = self.check_uid {
            owner.insert("uid".into(), Value::String(uid.to_string()));
        }
        owner.insert("controller".into(), Value::Bool(false));
        owner.insert("blockOwnerDeletion".into(), Value::Bool(false));
        let owners = std::iter::once(Value::Object(owner)).chain(machine).collect();
        metadata.insert("ownerReferences".into(), Value::Array(owners));
        let object = json!({
            "apiVersion": step.template.api_version,
            "kind": kind,
            "metadata": Value::Object(metadata),
            "spec": spec.clone(),
        });
        object
    }

    /// A selected, unhealthy, not excluded Node without objects, unhealthy since `since`: start
    /// the incident's remediation if allowed.
    pub(super) fn start(
        &mut self,
        name: &str,
        node: &NodeView,
        listed_before: bool,
        book: &mut Book<'_>,
        incident: &Incident<'_>,
        since: Timestamp,
    ) {
        let Some(first) = incident.ladder.steps.first() else {
            return;
        };
        let news = !listed_before || self.newly_open;
        if self.held_by_another_check(name) {
            return;
        }
        if book.has_in_flight(first) {
            self.complete_request(name, node, book, incident);
            return;
        }
        if self.starts_nothing_new(node) {
            return;
        }
        if let Usable::Missing | Usable::Invalid(_) =
            self.templates.get(incident.ladder.offset).copied().unwrap_or(Usable::Missing)
        {
            let requested = self.request(node, 0, book, incident, None);
            let told = news || self.disabled_changed;
            self.tell_skipped(name, requested, |_| told);
            return;
        }
        self.start_new(name, node, news, book, incident, since);
    }

    /// One check remediates a Node at a time: a Node another check holds waits (said when the
    /// wait is news), even for a request of an earlier plan (the other check started first).
    fn held_by_another_check(&mut self, name: &str) -> bool {
        let holders = self.holders;
        let target = Target::local_node(name);
        let Some(holder) = holders.other_than(&target, self.waits.me()) else { return false };
        if let Some(n) = self.waits.wait(target.clone(), &target, holder, holders.is_left_to_holder(&target)) {
            self.notices.push(n);
        }
        true
    }

    /// Completes an earlier plan's request for the first step. Not a new remediation, but its
    /// object is made only while the Node's Lease can be held.
    fn complete_request(&mut self, name: &str, node: &NodeView, book: &mut Book<'_>, incident: &Incident<'_>) {
        let Some(lease) = self.lease_for(name, node, &incident.ladder, 0) else { return };
        let requested = self.request(node, 0, book, incident, lease);
        let disabled_changed = self.disabled_changed;
        // (the request's record is dropped with an existing foreign object: said once)
        self.tell_skipped(name, requested, |reason| disabled_changed || *reason == Reason::RemediationObjectExists);
    }

    /// Whether no new remediation may start on `node` now: the check paused or short-circuited,
    /// the cluster upgrading, the Node under planned maintenance, or its failure domain paused.
    fn starts_nothing_new(&self, node: &NodeView) -> bool {
        if self.paused || !self.allowed || self.gates.upgrade.is_some() || self.wait.is_some() {
            return true;
        }
        self.domains.is_some_and(|(budgets, key)| budgets.is_paused(node_domain(node, key)))
    }

    /// Starts a new remediation of `name` through its last gates: one control-plane Node at a
    /// time, the Node's Lease (another holder's, the node maintenance operator's, keeps it
    /// waiting), the pool's back-off, then a free pacing slot (else it joins the queue).
    fn start_new(
        &mut self,
        name: &str,
        node: &NodeView,
        news: bool,
        book: &mut Book<'_>,
        incident: &Incident<'_>,
        since: Timestamp,
    ) {
        let cp = is_control_plane(node);
        if cp && self.control_plane_busy(name, news) {
            return;
        }
        let Some(lease) = self.lease_for(name, node, &incident.ladder, 0) else { return };
        let pool = self
            .policy
            .backoff
            .as_ref()
            .map_or_else(String::new, |b| backoff::node_pool(node, b.pool_label.as_deref().unwrap_or_default()));
        let repeat = self.policy.dry_run && self.would_before.iter().any(|w| w.name == name);
        let gate = self.ledger.gate(&pool, name, repeat);
        if gate == Backoff::Wait || !self.pacer.gate(name, since) {
            return;
        }
        match self.request(node, 0, book, incident, lease) {
            Requested::Done => {
                if gate == Backoff::Start {
                    self.ledger.record(&pool, name);
                }
                self.pacer.record(name);
                if cp {
                    self.cp_taken = true;
                }
            }
            skipped @ Requested::Skipped(..) => self.tell_skipped(name, skipped, |_| news),
            Requested::Held => {}
        }
    }

    /// Tells that a request for `name` was skipped (a [`NoticeKind::RemediationSkipped`] notice
    /// with its reason) when `news` holds for that reason: a skip is said once, not at every
    /// decision.
    fn tell_skipped(&mut self, name: &str, requested: Requested, news: impl FnOnce(&Reason) -> bool) {
        if let Requested::Skipped(reason, message) = requested
            && news(&reason)
        {
            self.notices.push(Notice::about_node(NoticeKind::RemediationSkipped, name, reason, message));
        }
    }

    /// At most one control-plane Node is remediated at a time: whether another one is (told
    /// when it is news).
    fn control_plane_busy(&mut self, name: &str, news: bool) -> bool {
        if !self.cp_taken && self.cp_busy.iter().all(|n| *n == name) {
            return false;
        }
        if news {
            let message = match self.cp_busy.iter().find(|n| **n != name) {
                Some(other) => {
                    format!("Not remediating control-plane node {name}: control-plane node {other} is being remediated")
                }
                None => {
                    format!("Not remediating control-plane node {name}: another control-plane node is being remediated")
                }
            };
            self.notices.push(Notice::about_node(
                NoticeKind::RemediationSkipped,
                name,
                Reason::ControlPlaneRemediationInProgress,
                message,
            ));
        }
        true
    }

    /// A selected, unhealthy, not excluded Node with objects: give up on its latest step when
    /// it timed out or failed and go on with the next one.
    ///
    /// This runs whatever the threshold, storm cooldown or pause requests say: it only moves an
    /// already-remediated Node along (medik8s does the same), and stopping half-way would leave
    /// a Node with a remediator that has already given up.
    pub(super) fn escalate(
        &mut self,
        name: &str,
        node: &NodeView,
        objs: &[Owned<'_>],
        book: &mut Book<'_>,
        incident: &Incident<'_>,
    ) {
        let steps = incident.ladder.steps;
        let step_of_obj: Vec<Option<usize>> = objs.iter().map(|o| step_of(o.view, o.template, steps)).collect();
        let Some(latest) = step_of_obj.iter().flatten().copied().max() else {
            return;
        };
        let Some(k) = (0..objs.len()).position(|k| step_of_obj[k] == Some(latest) && !objs[k].view.meta.deleting)
        else {
            return; // the latest step's objects are being deleted: wait until they are gone
        };
        let view = objs[k].view;
        let annotated = entry(&view.meta.annotations, NHC_TIMED_OUT_ANNOTATION).is_some();
        let next = latest + 1;
        let mut gave_up_now = false;
        if !annotated {
            if let Some(Time(at)) = book.records[k].timed_out.clone() {
                // An earlier plan gave up but the annotation did not make it: written again
                // (never on an object that reports Succeeded=True, as when giving up).
                if !conditions::is_true(&view.conditions, SUCCEEDED) {
                    self.actions.push(Action::AnnotateRemediation {
                        object: object_ref(view),
                        key: NHC_TIMED_OUT_ANNOTATION.into(),
                        value: at.to_string(),
                        seen: Seen::of(&view.meta),
                    });
                }
            } else {
                let started = book.records[k].started.0;
                let Some(why) = self.judge_step(name, node, (view, started), latest, &incident.ladder) else {
                    return;
                };
                gave_up_now = true;
                book.records[k].timed_out = Some(Time(self.now));
                self.give_up(name, view, latest, why, &incident.ladder);
            }
        }
        if next >= steps.len() {
            if gave_up_now || !book.prev_timed_out.get(k) {
                self.notices.push(Notice::about_node(
                    NoticeKind::NoTemplateLeft,
                    name,
                    Reason::NoTemplateLeft,
                    format!(
                        "Every remediation step for node {name} timed out or failed ({} step(s)); no remediation template left to try",
                        steps.len()
                    ),
                ));
            }
            return;
        }
        // The next step is a new remediation: it waits for an upgrade, planned maintenance and
        // another holder's Lease as a first step does.
        if self.gates.upgrade.is_some() || self.wait.is_some() {
            return;
        }
        let Some(lease) = self.lease_for(name, node, &incident.ladder, next) else { return };
        let requested = self.request(node, next, book, incident, lease);
        let told = gave_up_now || self.disabled_changed;
        self.tell_skipped(name, requested, |_| told);
    }

    /// The Lease write a new object for step `s` of `ladder` on `node` needs first (`Some(None)`:
    /// none, this check holds it long enough); `None` when another holder has it (the Node's
    /// wait then says who, told once).
    fn lease_for(&mut self, name: &str, node: &NodeView, ladder: &Ladder<'_>, s: usize) -> Option<Option<LeaseWrite>> {
        let (current, _) = node_lease::step_durations(ladder, s);
        match self.gates.lease(node, current, &mut self.wake) {
            Ok(lease) => Some(lease),
            Err(wait) => {
                self.hold(name, wait, NoticeKind::RemediationSkipped);
                None
            }
        }
    }

    /// Whether step `latest` of `node`'s remediation, whose object `view` was requested at
    /// `started`, is given up now: `Succeeded=False` at once, its timeout passed, or the Node's
    /// Lease held past its overdue instant (released). Otherwise the Lease is renewed when due and
    /// the decision wakes at the step's timeout.
    fn judge_step(
        &mut self,
        name: &str,
        node: &NodeView,
        (view, started): (&RemediationView, Timestamp),
        latest: usize,
        ladder: &Ladder<'_>,
    ) -> Option<GaveUp> {
        let step = ladder.steps.get(latest)?;
        let failed = conditions::find(&view.conditions, SUCCEEDED).is_some_and(|c| c.status == ConditionStatus::False);
        let deadline = step.timeout.and_then(|d| after(started, d));
        let timed_out = deadline.is_some_and(|d| d < self.now);
        // The Node's Lease, while the step runs: renewed, or given up as overdue.
        let (current, previous) = node_lease::step_durations(ladder, latest);
        let tend = match failed || timed_out {
            true => Tend::Nothing,
            false => self.gates.tend(Some(node), name, current, previous, &mut self.wake),
        };
        match (failed, timed_out, tend) {
            (true, _, _) => Some(GaveUp::Failed),
            (_, true, _) => Some(GaveUp::TimedOut),
            (_, _, Tend::Overdue(release)) => {
                self.actions.push(release);
                Some(GaveUp::LeaseOverdue(current.checked_mul(3).unwrap_or(current) + previous))
            }
            (_, _, tend) => {
                if let Tend::Renew(lease) = tend {
                    self.actions.push(Action::WriteLease(lease));
                }
                if let Some(t) = deadline.and_then(|d| after(d, ONE_NS)) {
                    self.wake.offer(t);
                }
                None
            }
        }
    }

    /// Records what the subject `name` waits for, telling it (as `kind`) when it is news.
    pub(super) fn hold(&mut self, name: &str, wait: Wait, kind: NoticeKind) {
        if self.prev_wait.is_none_or(|w| w.reason != wait.reason) {
            self.notices.push(Notice::about_node(kind, name, wait.reason.clone(), wait.message.clone()));
        }
        self.wait = Some(wait);
    }

    /// Gives up on step `latest` of Node `name` (its object `view` failed or timed out): the
    /// `nhc-timed-out` annotation, and a notice saying what comes next.
    fn give_up(&mut self, name: &str, view: &RemediationView, latest: usize, why: GaveUp, ladder: &Ladder<'_>) {
        let Some(step) = ladder.steps.get(latest) else {
            return;
        };
        // An object that reports Succeeded=True is never annotated as timed out (medik8s).
        if !conditions::is_true(&view.conditions, SUCCEEDED) {
            self.actions.push(Action::AnnotateRemediation {
                object: object_ref(view),
                key: NHC_TIMED_OUT_ANNOTATION.into(),
                value: self.now.to_string(),
                seen: Seen::of(&view.meta),
            });
        }
        let what = match why {
            GaveUp::Failed => "reported Succeeded=False".to_string(),
            GaveUp::TimedOut => {
                format!("did not succeed within {}", format_go_duration(step.timeout.unwrap_or_default()))
            }
            GaveUp::LeaseOverdue(span) => format!(
                "held the Node's Lease past its overdue time ({} after it was taken); the Lease is released",
                format_go_duration(span)
            ),
        };
        let then = if latest + 1 < ladder.steps.len() {
            format!("escalating to {}", Self::step_label(ladder, latest + 1))
        } else {
            "no remediation template left".to_string()
        };
        self.notices.push(Notice::about_node(
            NoticeKind::RemediationTimedOut,
            name,
            match why {
                GaveUp::Failed => Reason::RemediationFailed,
                GaveUp::TimedOut => Reason::RemediationTimedOut,
                GaveUp::LeaseOverdue(_) => Reason::NodeLeaseOverdue,
            },
            format!(
                "{} {}/{} for node {name} (template {}) {what}; {then}",
                view.meta.kind, view.meta.namespace, view.meta.name, step.template.name
            ),
        ));
    }

    /// A selected Node that matches no rule but still has objects: remove them once the
    /// healthy delay allows. Returns `(conditionsHealthyTimestamp, healthyDelayed)`.
    pub(super) fn recover(
        &mut self,
        node: &NodeView,
        objs: &[Owned<'_>],
        prev: Option<&UnhealthyNode>,
    ) -> (Timestamp, bool) {
        let since = prev.and_then(|p| p.conditions_healthy_timestamp.as_ref()).map_or(self.now, |t| t.0);
        let release = match self.policy.healthy_delay {
            HealthyDelay::After(d) if d.is_zero() => true,
            HealthyDelay::After(d) => match after(since, d) {
                Some(end) if end < self.now => true,
                Some(end) => {
                    if let Some(t) = after(end, ONE_NS) {
                        self.wake.offer(t);
                    }
                    false
                }
                None => false,
            },
            HealthyDelay::UntilConfirmed => node_has_annotation(node, MANUALLY_CONFIRMED_HEALTHY_ANNOTATION),
        };
        if release {
            self.delete_all(objs, false);
        }
        (since, !release)
    }

    /// Deletes the objects that are not being deleted yet; with `spare_permanent`, keeps those
    /// whose remediator is deleting the Node on purpose and still working.
    pub(super) fn delete_all(&mut self, objs: &[Owned<'_>], spare_permanent: bool) {
        for o in objs.iter().filter(|o| !o.view.meta.deleting) {
            let c = &o.view.conditions;
            if spare_permanent
                && conditions::is_true(c, PERMANENT_NODE_DELETION_EXPECTED)
                && !conditions::is_true(c, SUCCEEDED)
            {
                continue;
            }
            self.actions.push(Action::DeleteRemediation {
                object: object_ref(o.view),
                target: Target::local_node(o.node),
                seen: Seen::of(&o.view.meta),
            });
        }
    }
}

/// The longest name [`several_per_node_name`] gives: what upstream's `generateName` gave (the
/// API server keeps a generated name within 63 characters), so no remediator meets a longer one.
const SEVERAL_PER_NODE_NAME_MAX: usize = 63;

/// The name of the object of step `step` (made from `template`) of check `check` for Node `node`,
/// when the template supports several objects per Node (`multiple-templates-support`, where
/// upstream lets the API server generate a name): `<node>-<suffix>`, the suffix a hash of the
/// check, the template, the Node and the step, the Node's name cut (at a character that may end
/// a name) so the whole stays within [`SEVERAL_PER_NODE_NAME_MAX`].
///
/// Every decider computes the same name for the same step of the same Node, so a create repeated
/// — a retry, or a deposed replica's request landing after another replica made the object — is
/// refused (409) while the object exists: at most one object per check, Node and step at a time.
/// The incident's start is deliberately not part of it: two deciders need not observe the same
/// start (each decides at its own instant, and a Node's condition can change its transition time
/// within one incident), and a name that differs between them is a second object. Incidents
/// are told apart by deletion instead: an incident's objects are deleted when it ends, and a new
/// one waits while one is still being deleted. Remediators that support several objects per
/// Node find the Node through the `remediation.medik8s.io/node-name` annotation, not the name.
pub fn several_per_node_name(node: &str, check: &str, template: &TemplateRef, step: usize) -> String {
    let key = format!(
        "{check}\0{}\0{}\0{}\0{}\0{node}\0{step}",
        template.api_version, template.kind, template.namespace, template.name
    );
    // The top 40 bits, as 10 hexadecimal digits.
    let suffix = format!("{:010x}", crate::shard::fnv1a(key.as_bytes()) >> 24);
    let room = SEVERAL_PER_NODE_NAME_MAX - suffix.len() - 1;
    let cut = node.char_indices().nth(room).map_or(node, |(i, _)| &node[..i]);
    let prefix = cut.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    if prefix.is_empty() { suffix } else { format!("{prefix}-{suffix}") }
}

/// Control-plane Nodes already being remediated (by anyone) or with a request in flight.
pub(super) fn busy_control_planes<'a>(
    cp_names: &[&'a str],
    remediations: &[&RemediationView],
    prev_entries: &[&UnhealthyNode],
) -> Vec<&'a str> {
    let prev_entry_of =
        |name: &str| prev_entries.binary_search_by(|e| e.name.as_str().cmp(name)).ok().map(|i| prev_entries[i]);
    let mut cp_flags = vec![false; cp_names.len()];
    if !cp_names.is_empty() {
        for r in remediations {
            if let Some(n) = entry(&r.meta.annotations, NODE_NAME_ANNOTATION)
                && let Ok(i) = cp_names.binary_search(&n)
            {
                cp_flags[i] = true;
            }
        }
        for (i, n) in cp_names.iter().enumerate() {
            if prev_entry_of(n)
                .is_some_and(|e| e.remediations.iter().any(|r| r.timed_out.is_none() && r.resource.uid.is_none()))
            {
                cp_flags[i] = true;
            }
        }
    }
    cp_names.iter().zip(&cp_flags).filter(|(_, f)| **f).map(|(n, _)| *n).collect()
}

/// Remediate (pass 2): each subject in `pacing`'s order (name order unless paced), with its
/// previous status entry — start, escalate, recover or clean up — giving the new `unhealthyNodes`
/// (by name) and the Nodes that could not be judged (by name).
pub(super) fn remediate<'a>(
    pass: &mut Pass<'a>,
    subjects: &[Subject<'a>],
    owned: &[Owned<'a>],
    prev_entries: &[&'a UnhealthyNode],
    all: &[&'a NodeView],
    healthy_at: &[bool],
    pacing: &Pacing,
) -> (Vec<UnhealthyNode>, Vec<(&'a str, usize)>) {
    // A listed Node that is not a subject any more and is healthy now has recovered.
    let recovered = |name: &str| {
        all.binary_search_by(|n| n.name.as_str().cmp(name)).is_ok_and(|i| healthy_at[i]).then(|| {
            Notice::about_node(
                NoticeKind::Healthy,
                name,
                Reason::NodeHealthy,
                format!("Node {name} is healthy and has no remediation objects left"),
            )
        })
    };
    let matched = match_previous(subjects, prev_entries);
    let mut entries: Vec<Option<UnhealthyNode>> = (0..subjects.len()).map(|_| None).collect();
    let mut undecided: Vec<(&str, usize)> = Vec::new();
    for k in 0..subjects.len() {
        let i = pacing.order.as_ref().map_or(k, |order| order[k]);
        for e in &prev_entries[matched.gone_before[i].clone()] {
            pass.notices.extend(recovered(&e.name));
        }
        let s = &subjects[i];
        let since = pacing.since.get(i).copied().flatten().unwrap_or(pass.now);
        entries[i] = pass.subject(s, &owned[s.objs.clone()], matched.prev_of[i], &mut undecided, since);
    }
    for e in &prev_entries[matched.gone_before[subjects.len()].clone()] {
        pass.notices.extend(recovered(&e.name));
    }
    undecided.sort_by_key(|(name, _)| *name);
    (entries.into_iter().flatten().collect(), undecided)
}

/// The previous entries walked alongside the subjects (both by name): each subject's own, and
/// the entries of Nodes that are no subject any more, placed before the subject that follows
/// them (the last range: after every subject).
struct Matched<'a> {
    prev_of: Vec<Option<&'a UnhealthyNode>>,
    gone_before: Vec<std::ops::Range<usize>>,
}

fn match_previous<'a>(subjects: &[Subject<'_>], prev_entries: &[&'a UnhealthyNode]) -> Matched<'a> {
    let mut prev_of = Vec::with_capacity(subjects.len());
    let mut gone_before = Vec::with_capacity(subjects.len() + 1);
    let mut p = 0usize;
    for s in subjects {
        let start = p;
        while p < prev_entries.len() && prev_entries[p].name.as_str() < s.name {
            p += 1;
        }
        gone_before.push(start..p);
        prev_of.push(match prev_entries.get(p) {
            Some(e) if e.name == s.name => {
                p += 1;
                Some(*e)
            }
            _ => None,
        });
    }
    gone_before.push(p..prev_entries.len());
    Matched { prev_of, gone_before }
}

impl<'a> Pass<'a> {
    /// One subject: a Node that matches no rule any more recovers, an unhealthy one is started or
    /// escalated (unless excluded by label), an undecided one is noted, a deleted or deselected
    /// one loses its objects. Its entry when it stays listed.
    fn subject(
        &mut self,
        s: &Subject<'a>,
        objs: &[Owned<'a>],
        prev_entry: Option<&'a UnhealthyNode>,
        undecided: &mut Vec<(&'a str, usize)>,
        since: Timestamp,
    ) -> Option<UnhealthyNode> {
        let mut book = Book::new(objs, prev_entry, self.now);
        let mut healthy_since = None;
        let mut delayed = false;
        let mut chose = false;
        self.prev_wait = prev_entry.and_then(|e| e.waiting.as_ref());
        self.wait = None;
        let actions_before = self.actions.len();
        let listed = match (s.verdict, s.node) {
            (Some(Finding::Clear), Some(node)) => {
                // a subject that matches no rule still has objects (pass 1 kept only those)
                let (since, wait) = self.recover(node, objs, prev_entry);
                healthy_since = Some(Time(since));
                delayed = wait;
                !objs.is_empty()
            }
            (Some(Finding::Unhealthy(rule)), Some(node)) => {
                if prev_entry.is_none()
                    && let Some(r) = self.policy.conditions.get(rule)
                {
                    self.notices.push(unhealthy_notice(node, r, s.name));
                }
                let incident = self.incident(s.name, objs, rule);
                chose = true;
                let maintenance = self.gates.maintenance(node, self.prev_wait, &mut self.wake);
                if let Some(wait) = maintenance_wait(s.name, &maintenance) {
                    self.hold(s.name, wait, NoticeKind::RemediationPostponed);
                }
                if !node_has_label_value(node, EXCLUDE_FROM_REMEDIATION_LABEL, "true") {
                    if objs.is_empty() {
                        self.start(s.name, node, prev_entry.is_some(), &mut book, &incident, since);
                    } else {
                        self.escalate(s.name, node, objs, &mut book, &incident);
                    }
                }
                true
            }
            (Some(verdict), _) => {
                if let Finding::Undecided(rule) = verdict {
                    undecided.push((s.name, rule));
                }
                !objs.is_empty()
            }
            (None, _) => {
                // Deleted or no longer selected: nothing will watch this Node for the check.
                self.delete_all(objs, true);
                !objs.is_empty()
            }
        };
        if listed && !chose {
            self.keep_choice(s.name, objs);
        }
        if self.wait.is_none() && !objs.is_empty() && objs.iter().all(|o| o.view.meta.deleting) {
            self.wait = Some(finishing(objs));
        }
        // The Lease stays while a remediation of this check is live (an object or a request not
        // given up); once every step gave up, nobody remediates the Node and it is released.
        let creates = self.actions[actions_before..].iter().any(|a| matches!(a, Action::CreateRemediation { .. }));
        if creates || book.records.iter().any(|r| r.timed_out.is_none()) {
            self.keep_leases.push(s.name);
        }
        let waiting = self.wait.take().map(|w| w.entry(self.prev_wait, self.now));
        listed.then(|| UnhealthyNode {
            name: s.name.to_string(),
            remediations: book.finish(),
            conditions_healthy_timestamp: healthy_since,
            healthy_delayed: delayed.then_some(true),
            waiting,
        })
    }
}

/// The wait of a Node whose remediation objects are all being deleted: their remediators still
/// hold them (finalizers) while they finish, fencing included, so the Node still counts as
/// remediated, in every budget, until they are gone.
fn finishing(objs: &[Owned<'_>]) -> Wait {
    let names: Vec<String> =
        objs.iter().map(|o| format!("{} {}/{}", o.view.meta.kind, o.view.meta.namespace, o.view.meta.name)).collect();
    Wait {
        reason: Reason::RemediatorFinishing,
        message: format!(
            "waiting for the remediator to finish: {} {} being deleted and still held by its remediator",
            names.join(", "),
            if names.len() == 1 { "is" } else { "are" }
        ),
        until: None,
    }
}

/// The `Unhealthy` notice of a Node newly found unhealthy by `rule`; the condition's reason says
/// what broke, as upstream's messages do.
fn unhealthy_notice(node: &NodeView, rule: &ConditionRule, name: &str) -> Notice {
    let why = node
        .conditions
        .iter()
        .find(|c| crate::stale::matches(c, rule))
        .and_then(|c| c.reason.as_deref())
        .filter(|reason| !reason.is_empty())
        .map_or_else(String::new, |reason| format!(" with reason {reason}"));
    Notice::about_node(
        NoticeKind::Unhealthy,
        name,
        Reason::Rule(rule_text(rule)),
        format!(
            "Node {name} has had condition {}{why} for more than {}",
            rule_text(rule),
            format_go_duration(rule.timeout)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(name: &str) -> TemplateRef {
        TemplateRef {
            api_version: "self-node-remediation.medik8s.io/v1alpha1".into(),
            kind: "SelfNodeRemediationTemplate".into(),
            namespace: "medik8s".into(),
            name: name.into(),
        }
    }

    /// A DNS-1123 subdomain name of at most 63 characters.
    fn valid(name: &str) -> bool {
        name.len() <= SEVERAL_PER_NODE_NAME_MAX
            && name.split('.').all(|label| {
                !label.is_empty()
                    && label.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            })
    }

    #[test]
    fn several_per_node_names_are_the_same_for_every_decider_and_differ_per_step_check_and_template() {
        let name = several_per_node_name("w1", "workers", &template("reboot"), 0);
        assert_eq!(name, several_per_node_name("w1", "workers", &template("reboot"), 0), "deterministic");
        assert!(name.starts_with("w1-") && name.len() == "w1-".len() + 10, "{name}");
        let others = [
            several_per_node_name("w1", "workers", &template("reboot"), 1),
            several_per_node_name("w1", "other", &template("reboot"), 0),
            several_per_node_name("w1", "workers", &template("fence"), 0),
            several_per_node_name("w2", "workers", &template("reboot"), 0),
        ];
        for other in &others {
            assert_ne!(&name, other);
        }
        // Pinned: a change would give an object made before it another name (a second object).
        assert_eq!(name, "w1-e5b7c699b4");
    }

    #[test]
    fn several_per_node_names_stay_valid_and_within_what_generate_name_gave() {
        let long = format!("{}.example.com", "a".repeat(60));
        let cut_at_dot = format!("{}.b", "a".repeat(51));
        let cut_at_dash = format!("{}-b", "a".repeat(51));
        for node in ["w1", "node-1.zone-a.example.com", long.as_str(), cut_at_dot.as_str(), cut_at_dash.as_str(), "-"] {
            let name = several_per_node_name(node, "workers", &template("reboot"), 2);
            assert!(valid(&name), "{node}: {name}");
        }
        // Two long names sharing their first 52 characters still differ (the hash has the whole name).
        let a = several_per_node_name(&format!("{}-x", "a".repeat(60)), "c", &template("t"), 0);
        let b = several_per_node_name(&format!("{}-y", "a".repeat(60)), "c", &template("t"), 0);
        assert_ne!(a, b);
        assert_eq!(a.len(), SEVERAL_PER_NODE_NAME_MAX);
    }
}
