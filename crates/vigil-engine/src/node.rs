//! NodeHealthCheck rules (medik8s semantics), as one pure function: [`decide`].
//!
//! The decision is made in two passes over the Nodes and the check's remediation objects, both
//! sorted by Node name (so the plan never depends on input or hash order):
//!
//! 1. judge every selected Node from its conditions and count the healthy ones (a Node whose
//!    remediation objects are still around is not healthy yet), which gives the threshold and
//!    storm-cooldown state;
//! 2. for every Node that is selected or still has objects, decide what to create, annotate
//!    and delete, and what its `status.unhealthyNodes` entry says.
//!
//! Notices are derived by comparing with the previous status only, so deciding twice on the same
//! input tells the operator nothing new the second time.
//!
//! Deliberate choices beyond medik8s (each also explained where it is made):
//! - counts stay true while paused;
//! - a status record without a `uid` for an object that is not seen yet is a creation requested
//!   by an earlier plan ("in flight"): it is completed (fixed names are created again, idempotent)
//!   whatever the threshold, pause or control-plane rule says now, because the decision was
//!   already taken; an in-flight `generateName` request is not repeated (a repeat could create a
//!   second remediation for the same Node) until its step's timeout passed with no object seen;
//! - the check is `Disabled` while any step's template is missing or invalid, so the operator
//!   learns it before a Node needs it, but steps whose templates are usable keep working;
//! - `NoDecision` for a Node whose matching condition has no `lastTransitionTime` is told when
//!   the status changes (no status field can remember such Nodes);
//! - escalation moves an already-remediated Node along even while the threshold blocks or a pause
//!   is requested;
//! - objects of Nodes that still exist but are no longer selected are removed like those of
//!   deleted Nodes: nothing else would ever clean them up.

use crate::backoff::{self, Gate as Backoff, Ledger};
use crate::domains::{Budgets, FAILURE_DOMAINS_HEALTHY, Tally};
use crate::holders::{Holders, Waits};
pub use crate::partial::forget_requests;
use crate::partial::remediation_phase;
use crate::plan::{Action, Earliest, Notice, NoticeKind, ObjectRef, Plan};
use crate::target::{CheckRef, Target, is_control_plane, same_str};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::ops::Range;
use vigil_api::NodeHealthCheck;
use vigil_api::conditions::ConditionStatus;
use vigil_api::conditions::{self, DesiredCondition, get_condition, set_condition};
use vigil_api::duration::format_go_duration;
use vigil_api::node_health_check::{NodeHealthCheckStatus, NodeRemediation, RemediationReference, UnhealthyNode};
use vigil_api::reason::Reason;
use vigil_api::threshold::Rounding;
use vigil_api::validate::{ConditionRule, DomainKey, HealthyDelay, NhcPolicy, NhcThreshold, RemediationStep};
use vigil_api::views::{RemediationView, TemplateView};
use vigil_api::well_known::{
    DISABLED, EXCLUDE_FROM_REMEDIATION_LABEL, MANUALLY_CONFIRMED_HEALTHY_ANNOTATION,
    MULTIPLE_TEMPLATES_SUPPORT_ANNOTATION, NHC_TIMED_OUT_ANNOTATION, NODE_NAME_ANNOTATION,
    PERMANENT_NODE_DELETION_EXPECTED, REMEDIATION_ALLOWED, SUCCEEDED, TEMPLATE_NAME_ANNOTATION,
};

/// Everything a NodeHealthCheck decision looks at.
pub struct NhcInput<'a> {
    /// The check (metadata, current status).
    pub check: &'a NodeHealthCheck,
    /// Its validated spec.
    pub policy: &'a NhcPolicy,
    /// The Nodes of the cluster; the engine applies the selector. Every Node is always right;
    /// passing only those [`needs_node`] keeps plus every Node a remediation object names
    /// ([`crate::concerns::remediation_node_name`]) gives the same plan, so an adapter need not hand over the whole
    /// cluster to each check.
    pub nodes: &'a [&'a Node],
    /// The template of each of `policy.steps`, same order; `None` when it was not found.
    pub templates: &'a [Option<&'a TemplateView>],
    /// Remediation objects of the steps' kinds in the templates' namespaces, whoever owns them.
    pub remediations: &'a [&'a RemediationView],
}

/// Phase while a step's template is missing or invalid.
const PHASE_DISABLED: &str = "Disabled";
/// Phase while pause requests are present.
const PHASE_PAUSED: &str = "Paused";

/// Kind of the owner reference that marks the check's own remediation objects.
const OWNER_KIND: &str = "NodeHealthCheck";

/// The smallest step of time: a verdict due at `deadline` changes at `deadline + 1ns`.
const ONE_NS: SignedDuration = SignedDuration::from_nanos(1);

/// `t + d`, or `None` beyond the representable range (that instant never comes).
fn after(t: Timestamp, d: SignedDuration) -> Option<Timestamp> {
    t.checked_add(d).ok()
}

/// A Node's verdict from its conditions alone (remediation objects not considered).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Matches no rule.
    Clear,
    /// Matches a rule whose duration has not passed yet.
    Pending,
    /// Matches this rule with a condition that has no `lastTransitionTime`: no decision.
    Undecided(usize),
    /// Has matched this rule for longer than its duration.
    Unhealthy(usize),
}

fn node_name(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or("")
}

/// `map[key]`, walking the entries with [`same_str`] (label and annotation maps are small).
fn entry<'m>(map: &'m BTreeMap<String, String>, key: &str) -> Option<&'m str> {
    map.iter().find(|(k, _)| same_str(k, key)).map(|(_, v)| v.as_str())
}

fn has_label_value(node: &Node, key: &str, value: &str) -> bool {
    node.metadata.labels.as_ref().and_then(|l| entry(l, key)).is_some_and(|v| v == value)
}

/// A handful of flags, without allocating for the usual few.
#[derive(Default)]
struct Flags {
    small: u64,
    large: Vec<bool>,
}

impl Flags {
    fn get(&self, i: usize) -> bool {
        match i.checked_sub(64) {
            None => self.small >> i & 1 == 1,
            Some(j) => self.large.get(j).copied().unwrap_or(false),
        }
    }

    fn set(&mut self, i: usize) {
        match i.checked_sub(64) {
            None => self.small |= 1 << i,
            Some(j) => {
                if self.large.len() <= j {
                    self.large.resize(j + 1, false);
                }
                self.large[j] = true;
            }
        }
    }
}

/// Whether a decision of the check with `policy` reads `node`: the check selects it, or it is a
/// control-plane Node (at most one of those is remediated at a time, whoever selects it). Other
/// Nodes only matter through the remediation objects that name them
/// ([`crate::concerns::remediation_node_name`]).
pub fn needs_node(policy: &NhcPolicy, node: &Node) -> bool {
    is_control_plane(node) || policy.selector.matches(node.metadata.labels.as_ref())
}

fn has_annotation(node: &Node, key: &str) -> bool {
    node.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(key))
}

/// Judges a Node against the rules; offers the instant its verdict can change. A matching
/// condition set aside by the stale-signal guard ([`crate::stale`]) matches nothing and is put in
/// `stale` (the first one); a guarded fresh one offers the instant it turns stale.
fn judge(
    node: &Node,
    rules: &[ConditionRule],
    now: Timestamp,
    wake: &mut Earliest,
    stale: &mut Option<crate::stale::Stale>,
) -> Verdict {
    let conds = node.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or(&[]);
    let mut undecided = None;
    let mut unhealthy = None;
    let mut pending = false;
    let mut first_deadline: Option<Timestamp> = None;
    // A condition one guarded rule sets aside matches no rule, guarded or not.
    let guarded = rules.iter().any(|r| r.max_age.is_some());
    for (i, rule) in rules.iter().enumerate() {
        for c in conds.iter().filter(|c| crate::stale::matches(c, rule)) {
            if guarded {
                match crate::stale::freshness(c, rules, now) {
                    crate::stale::Freshness::Stale(s) => {
                        stale.get_or_insert(s);
                        continue;
                    }
                    crate::stale::Freshness::FreshUntil(t) => wake.offer(t),
                    crate::stale::Freshness::Unguarded => {}
                }
            }
            if unhealthy.is_some() {
                continue; // already decided; only staleness is still looked for
            }
            match &c.last_transition_time {
                None => {
                    undecided.get_or_insert(i);
                }
                Some(Time(since)) => {
                    pending = true;
                    match after(*since, rule.timeout) {
                        Some(deadline) if deadline < now => unhealthy = Some(i),
                        Some(deadline) => {
                            first_deadline = Some(first_deadline.map_or(deadline, |d| d.min(deadline)));
                        }
                        None => {}
                    }
                }
            }
        }
    }
    if let Some(i) = unhealthy {
        return Verdict::Unhealthy(i);
    }
    if let Some(t) = first_deadline.and_then(|d| after(d, ONE_NS)) {
        wake.offer(t);
    }
    match (undecided, pending) {
        (Some(i), _) => Verdict::Undecided(i),
        (None, true) => Verdict::Pending,
        (None, false) => Verdict::Clear,
    }
}

/// The rule a Node has broken past its duration at `now` and since when, judged exactly as
/// [`decide`] judges it, so `vigil check` can say why a Node is unhealthy without a second rule.
pub fn unhealthy_because<'p>(
    node: &Node,
    policy: &'p NhcPolicy,
    now: Timestamp,
) -> Option<(&'p ConditionRule, Timestamp)> {
    let Verdict::Unhealthy(i) = judge(node, &policy.conditions, now, &mut Earliest::default(), &mut None) else {
        return None;
    };
    let rule = policy.conditions.get(i)?;
    let conds = node.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or(&[]);
    conds
        .iter()
        .filter(|c| c.type_ == rule.type_ && c.status == rule.status)
        .filter_map(|c| c.last_transition_time.as_ref().map(|Time(t)| *t))
        .min()
        .map(|since| (rule, since))
}

/// Whether a step's template can be used to make remediation objects.
#[derive(Clone, Copy)]
enum Usable<'a> {
    /// Found, with the `spec` to copy into objects.
    Yes(&'a TemplateView, &'a Value),
    /// Not found.
    Missing,
    /// Found but without `spec.template` / `spec.template.spec`.
    Invalid(&'static str),
}

fn usable<'a>(templates: &[Option<&'a TemplateView>], i: usize) -> Usable<'a> {
    match templates.get(i).copied().flatten() {
        None => Usable::Missing,
        Some(view) => match view.template.as_ref() {
            None => Usable::Invalid("has no spec.template"),
            Some(t) => match t.get("spec") {
                Some(spec) if spec.is_object() => Usable::Yes(view, spec),
                _ => Usable::Invalid("has no spec.template.spec"),
            },
        },
    }
}

/// A remediation object owned by the check, with the Node it remediates and its step.
struct Owned<'a> {
    node: &'a str,
    view: &'a RemediationView,
    /// Its template-name annotation.
    template: Option<&'a str>,
    step: Option<usize>,
}

fn object_ref(view: &RemediationView) -> ObjectRef {
    ObjectRef {
        api_version: view.meta.api_version.clone(),
        kind: view.meta.kind.clone(),
        namespace: view.meta.namespace.clone(),
        name: view.meta.name.clone(),
    }
}

fn step_of(view: &RemediationView, template: Option<&str>, steps: &[RemediationStep]) -> Option<usize> {
    let template = template?;
    steps.iter().rposition(|s| {
        s.template.name == template
            && s.template.remediation_kind() == view.meta.kind
            && s.template.namespace == view.meta.namespace
    })
}

/// The `status.unhealthyNodes[].remediations` of one Node being rebuilt: one record per object
/// seen (index-aligned with the Node's objects), then the records of this plan's requests.
struct Book<'p> {
    prev: &'p [NodeRemediation],
    claimed: Flags,
    records: Vec<NodeRemediation>,
    /// Per object: whether the previous status already said it timed out.
    prev_timed_out: Flags,
}

impl<'p> Book<'p> {
    fn new(objs: &[Owned<'_>], prev: Option<&'p UnhealthyNode>, now: Timestamp) -> Self {
        let prev = prev.map_or(&[][..], |p| p.remediations.as_slice());
        let mut book = Book {
            prev,
            claimed: Flags::default(),
            records: Vec::with_capacity(objs.len()),
            prev_timed_out: Flags::default(),
        };
        for (k, o) in objs.iter().enumerate() {
            let meta = &o.view.meta;
            let template = o.template;
            let same_place =
                |r: &NodeRemediation| r.resource.kind == meta.kind && r.resource.namespace == meta.namespace;
            let found = (0..prev.len())
                .find(|&i| !book.claimed.get(i) && same_place(&prev[i]) && prev[i].resource.name == meta.name)
                .or_else(|| {
                    (0..prev.len()).find(|&i| {
                        !book.claimed.get(i)
                            && same_place(&prev[i])
                            && prev[i].resource.name.is_empty()
                            && prev[i].template_name.as_deref() == template
                    })
                });
            let earlier = found.map(|i| {
                book.claimed.set(i);
                &prev[i]
            });
            let annotated = entry(&meta.annotations, NHC_TIMED_OUT_ANNOTATION).map(|v| v.parse().unwrap_or(now));
            if earlier.is_some_and(|r| r.timed_out.is_some()) {
                book.prev_timed_out.set(k);
            }
            book.records.push(NodeRemediation {
                resource: RemediationReference {
                    api_version: meta.api_version.clone(),
                    kind: meta.kind.clone(),
                    namespace: meta.namespace.clone(),
                    name: meta.name.clone(),
                    uid: meta.uid.clone(),
                },
                started: earlier.map(|r| r.started.clone()).or_else(|| meta.created.map(Time)).unwrap_or(Time(now)),
                timed_out: earlier.and_then(|r| r.timed_out.clone()).or_else(|| annotated.map(Time)),
                template_name: template.map(str::to_string).or_else(|| earlier.and_then(|r| r.template_name.clone())),
            });
        }
        book
    }

    /// An earlier plan's request for `step` whose object has not been seen yet (no uid: it was
    /// never observed), claimed so that it is continued rather than made anew.
    fn take_in_flight(&mut self, step: &RemediationStep) -> Option<&'p NodeRemediation> {
        let i = (0..self.prev.len()).find(|&i| {
            let r = &self.prev[i];
            !self.claimed.get(i)
                && r.timed_out.is_none()
                && r.resource.uid.is_none()
                && r.template_name.as_deref() == Some(step.template.name.as_str())
                && r.resource.kind == step.template.remediation_kind()
                && r.resource.namespace == step.template.namespace
        })?;
        self.claimed.set(i);
        Some(&self.prev[i])
    }

    fn has_in_flight(&self, step: &RemediationStep) -> bool {
        self.prev.iter().enumerate().any(|(i, r)| {
            !self.claimed.get(i)
                && r.timed_out.is_none()
                && r.resource.uid.is_none()
                && r.template_name.as_deref() == Some(step.template.name.as_str())
                && r.resource.kind == step.template.remediation_kind()
                && r.resource.namespace == step.template.namespace
        })
    }

    /// The records, oldest first.
    fn finish(mut self) -> Vec<NodeRemediation> {
        self.records.sort_by(|a, b| {
            (&a.started, &a.resource.kind, &a.resource.namespace, &a.resource.name).cmp(&(
                &b.started,
                &b.resource.kind,
                &b.resource.namespace,
                &b.resource.name,
            ))
        });
        self.records
    }
}

/// What happened to a request for a remediation object.
enum Requested {
    /// A create action was added (or an in-flight `generateName` request is awaited).
    Done,
    /// The template cannot be used: reason and why.
    Skipped(Reason, String),
}

/// A Node the second pass looks at: selected, or owning objects of the check (or both).
struct Subject<'a> {
    name: &'a str,
    node: Option<&'a Node>,
    /// `Some` for a selected Node.
    verdict: Option<Verdict>,
    objs: Range<usize>,
}

/// What the threshold and storm cooldown say.
enum Gate {
    Allowed,
    TooFewHealthy,
    Cooldown { start: Timestamp, end: Option<Timestamp> },
}

/// Shared state of the second pass.
struct Pass<'a> {
    policy: &'a NhcPolicy,
    now: Timestamp,
    check_name: &'a str,
    check_uid: Option<&'a str>,
    templates: Vec<Usable<'a>>,
    allowed: bool,
    paused: bool,
    /// New remediation was not possible in the previous status but is now: a skip is news.
    newly_open: bool,
    /// The `Disabled` condition changed: a template skip is news.
    disabled_changed: bool,
    cp_busy: Vec<&'a str>,
    cp_taken: bool,
    /// Remediation objects of the steps' kinds that this check does not own.
    foreign: Vec<&'a RemediationView>,
    actions: Vec<Action>,
    notices: Vec<Notice>,
    wake: Earliest,
    /// What other checks hold (a Node held by another check is never started here).
    holders: &'a Holders,
    /// Targets waiting for another check.
    waits: Waits,
    /// The back-off history of this decision (`spec.backoff`).
    ledger: Ledger<'a>,
    /// The previous `status.wouldRemediate`: in dry-run, a Node listed there was already counted.
    would_before: &'a [vigil_api::machine_health_check::WouldRemediate],
    /// Failure-domain budgets (a Node of a paused domain is not started) and their label.
    domains: Option<(&'a Budgets, &'a str)>,
}

fn notice(kind: NoticeKind, target: &str, reason: Reason, message: String) -> Notice {
    Notice { kind, target: Some(target.to_string()), reason, message }
}

fn rule_text(rule: &ConditionRule) -> String {
    format!("{}={}", rule.type_, rule.status)
}

impl<'a> Pass<'a> {
    fn step_label(&self, s: usize) -> String {
        self.policy.steps.get(s).map_or_else(String::new, |st| st.template.to_string())
    }

    /// Offers the instant a step requested at `started` times out, when that is still ahead (an
    /// object not seen yet cannot be judged, but its timer already runs).
    fn offer_step_timeout(&mut self, step: &RemediationStep, started: Timestamp) {
        if let Some(t) = step.timeout.and_then(|d| after(started, d)).and_then(|d| after(d, ONE_NS))
            && t > self.now
        {
            self.wake.offer(t);
        }
    }

    /// Asks for an object of step `s` for Node `name` (the caller checked every other rule).
    fn request(&mut self, name: &str, s: usize, book: &mut Book<'_>) -> Requested {
        let Some(step) = self.policy.steps.get(s) else {
            return Requested::Skipped(Reason::RemediationTemplateNotFound, format!("no remediation step {s}"));
        };
        let (view, spec) = match self.templates.get(s).copied().unwrap_or(Usable::Missing) {
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
            // An earlier generateName request not seen yet: repeating it could make a second
            // object, so it is awaited, unless its step's timeout passed without any object
            // showing up (the request was lost; a single template has no timeout and waits).
            let lost = step.timeout.and_then(|d| after(r.started.0, d)).is_some_and(|end| end < self.now);
            if !lost {
                book.records.push(r.clone());
                self.offer_step_timeout(step, r.started.0);
                return Requested::Done;
            }
            earlier = None;
        }
        let generate = view.meta.annotations.get(MULTIPLE_TEMPLATES_SUPPORT_ANNOTATION).is_some_and(|v| v == "true");
        let kind = step.template.remediation_kind();
        if !generate
            && let Some(other) = self
                .foreign
                .iter()
                .find(|r| r.meta.kind == kind && r.meta.namespace == step.template.namespace && r.meta.name == name)
        {
            // The object this check would make exists and is not ours: leave it alone, and do
            // not list it in the status as a remediation this check started.
            let owner = other
                .meta
                .owners
                .first()
                .map_or_else(|| "no owner".to_string(), |o| format!("owner {} {}", o.kind, o.name));
            return Requested::Skipped(
                Reason::RemediationObjectExists,
                format!(
                    "Cannot remediate node {name}: {kind} {}/{name} already exists and belongs to another check ({owner})",
                    step.template.namespace
                ),
            );
        }
        let mut metadata = Map::new();
        metadata.insert("namespace".into(), Value::String(step.template.namespace.clone()));
        if generate {
            metadata.insert("generateName".into(), Value::String(format!("{name}-")));
        } else {
            metadata.insert("name".into(), Value::String(name.to_string()));
        }
        metadata.insert(
            "annotations".into(),
            json!({ NODE_NAME_ANNOTATION: name, TEMPLATE_NAME_ANNOTATION: step.template.name }),
        );
        let mut owner = Map::new();
        owner.insert("apiVersion".into(), Value::String(vigil_api::API_VERSION.into()));
        owner.insert("kind".into(), Value::String(OWNER_KIND.into()));
        owner.insert("name".into(), Value::String(self.check_name.to_string()));
        if let Some(uid) = self.check_uid {
            owner.insert("uid".into(), Value::String(uid.to_string()));
        }
        owner.insert("controller".into(), Value::Bool(false));
        owner.insert("blockOwnerDeletion".into(), Value::Bool(false));
        metadata.insert("ownerReferences".into(), Value::Array(vec![Value::Object(owner)]));
        let object = json!({
            "apiVersion": step.template.api_version,
            "kind": kind,
            "metadata": Value::Object(metadata),
            "spec": spec.clone(),
        });
        let started = earlier.map_or(self.now, |r| r.started.0);
        self.offer_step_timeout(step, started);
        book.records.push(NodeRemediation {
            resource: RemediationReference {
                api_version: step.template.api_version.clone(),
                kind: kind.to_string(),
                namespace: step.template.namespace.clone(),
                name: if generate { String::new() } else { name.to_string() },
                uid: None,
            },
            started: Time(started),
            timed_out: None,
            template_name: Some(step.template.name.clone()),
        });
        self.actions.push(Action::CreateRemediation { object, target: name.to_string() });
        Requested::Done
    }

    /// A selected, unhealthy, not excluded Node without objects: start remediation if allowed.
    fn start(&mut self, name: &str, node: &Node, listed_before: bool, book: &mut Book<'_>) {
        let Some(first) = self.policy.steps.first() else {
            return;
        };
        let news = !listed_before || self.newly_open;
        // One check remediates a Node at a time: a Node another check holds waits here, even
        // for a request of an earlier plan (the other check started first).
        let holders = self.holders;
        let target = Target::local_node(name);
        if let Some(holder) = holders.other_than(&target, self.waits.me()) {
            if let Some(n) = self.waits.wait(name, &target, holder) {
                self.notices.push(n);
            }
            return;
        }
        if book.has_in_flight(first) {
            // Completing an earlier plan's request is not a new remediation.
            if let Requested::Skipped(reason, message) = self.request(name, 0, book)
                && (self.disabled_changed || reason == Reason::RemediationObjectExists)
            {
                // (the request's record is dropped with an existing foreign object: said once)
                self.notices.push(notice(NoticeKind::RemediationSkipped, name, reason, message));
            }
            return;
        }
        if self.paused || !self.allowed {
            return;
        }
        // A paused failure domain starts nothing new, as the check-wide short-circuit.
        if let Some((budgets, key)) = self.domains
            && budgets.is_paused(node_domain(node, key))
        {
            return;
        }
        if let Usable::Missing | Usable::Invalid(_) = self.templates.first().copied().unwrap_or(Usable::Missing) {
            if let Requested::Skipped(reason, message) = self.request(name, 0, book)
                && (news || self.disabled_changed)
            {
                self.notices.push(notice(NoticeKind::RemediationSkipped, name, reason, message));
            }
            return;
        }
        let cp = is_control_plane(node);
        if cp && (self.cp_taken || self.cp_busy.iter().any(|n| *n != name)) {
            if news {
                let other = self.cp_busy.iter().find(|n| **n != name).copied();
                let message = match other {
                    Some(other) => format!(
                        "Not remediating control-plane node {name}: control-plane node {other} is being remediated"
                    ),
                    None => format!(
                        "Not remediating control-plane node {name}: another control-plane node is being remediated"
                    ),
                };
                self.notices.push(notice(
                    NoticeKind::RemediationSkipped,
                    name,
                    Reason::ControlPlaneRemediationInProgress,
                    message,
                ));
            }
            return;
        }
        let pool = self
            .policy
            .backoff
            .as_ref()
            .map_or_else(String::new, |b| backoff::node_pool(node, b.pool_label.as_deref().unwrap_or_default()));
        let repeat = self.policy.dry_run && self.would_before.iter().any(|w| w.name == name);
        let gate = self.ledger.gate(&pool, name, repeat);
        if gate == Backoff::Wait {
            return;
        }
        match self.request(name, 0, book) {
            Requested::Done => {
                if gate == Backoff::Start {
                    self.ledger.record(&pool, name);
                }
                if cp {
                    self.cp_taken = true;
                }
            }
            Requested::Skipped(reason, message) => {
                if news {
                    self.notices.push(notice(NoticeKind::RemediationSkipped, name, reason, message));
                }
            }
        }
    }

    /// A selected, unhealthy, not excluded Node with objects: give up on its latest step when
    /// it timed out or failed and go on with the next one.
    ///
    /// This runs whatever the threshold, storm cooldown or pause requests say: it only moves an
    /// already-remediated Node along (medik8s does the same), and stopping half-way would leave
    /// a Node with a remediator that has already given up.
    fn escalate(&mut self, name: &str, objs: &[Owned<'_>], book: &mut Book<'_>) {
        let Some(latest) = objs.iter().filter_map(|o| o.step).max() else {
            return;
        };
        let Some(k) = objs.iter().position(|o| o.step == Some(latest) && !o.view.meta.deleting) else {
            return; // the latest step's objects are being deleted: wait until they are gone
        };
        let Some(step) = self.policy.steps.get(latest) else {
            return;
        };
        let view = objs[k].view;
        let annotated = entry(&view.meta.annotations, NHC_TIMED_OUT_ANNOTATION).is_some();
        let mut gave_up_now = false;
        if !annotated {
            if let Some(Time(at)) = book.records[k].timed_out.clone() {
                // An earlier plan gave up but the annotation did not make it: write it again.
                self.actions.push(Action::AnnotateRemediation {
                    object: object_ref(view),
                    key: NHC_TIMED_OUT_ANNOTATION.into(),
                    value: at.to_string(),
                });
            } else {
                let failed =
                    conditions::find(&view.conditions, SUCCEEDED).is_some_and(|c| c.status == ConditionStatus::False);
                let deadline = step.timeout.and_then(|d| after(book.records[k].started.0, d));
                let expired = deadline.is_some_and(|d| d < self.now);
                if failed || expired {
                    gave_up_now = true;
                    book.records[k].timed_out = Some(Time(self.now));
                    self.actions.push(Action::AnnotateRemediation {
                        object: object_ref(view),
                        key: NHC_TIMED_OUT_ANNOTATION.into(),
                        value: self.now.to_string(),
                    });
                    let what = if failed {
                        "reported Succeeded=False".to_string()
                    } else {
                        format!("did not succeed within {}", format_go_duration(step.timeout.unwrap_or_default()))
                    };
                    let then = if latest + 1 < self.policy.steps.len() {
                        format!("escalating to {}", self.step_label(latest + 1))
                    } else {
                        "no remediation template left".to_string()
                    };
                    self.notices.push(notice(
                        NoticeKind::RemediationTimedOut,
                        name,
                        if failed { Reason::RemediationFailed } else { Reason::RemediationTimedOut },
                        format!(
                            "{} {}/{} for node {name} (template {}) {what}; {then}",
                            view.meta.kind, view.meta.namespace, view.meta.name, step.template.name
                        ),
                    ));
                } else if let Some(t) = deadline.and_then(|d| after(d, ONE_NS)) {
                    self.wake.offer(t);
                    return;
                } else {
                    return;
                }
            }
        }
        let next = latest + 1;
        if next >= self.policy.steps.len() {
            if gave_up_now || !book.prev_timed_out.get(k) {
                self.notices.push(notice(
                    NoticeKind::NoTemplateLeft,
                    name,
                    Reason::NoTemplateLeft,
                    format!(
                        "Every remediation step for node {name} timed out or failed ({} step(s)); no remediation template left to try",
                        self.policy.steps.len()
                    ),
                ));
            }
            return;
        }
        if let Requested::Skipped(reason, message) = self.request(name, next, book)
            && (gave_up_now || self.disabled_changed)
        {
            self.notices.push(notice(NoticeKind::RemediationSkipped, name, reason, message));
        }
    }

    /// A selected Node that matches no rule but still has objects: remove them once the
    /// healthy delay allows. Returns `(conditionsHealthyTimestamp, healthyDelayed)`.
    fn recover(&mut self, node: &Node, objs: &[Owned<'_>], prev: Option<&UnhealthyNode>) -> (Timestamp, bool) {
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
            HealthyDelay::UntilConfirmed => has_annotation(node, MANUALLY_CONFIRMED_HEALTHY_ANNOTATION),
        };
        if release {
            self.delete_all(objs, false);
        }
        (since, !release)
    }

    /// Deletes the objects that are not being deleted yet; with `spare_permanent`, keeps those
    /// whose remediator is deleting the Node on purpose and still working.
    fn delete_all(&mut self, objs: &[Owned<'_>], spare_permanent: bool) {
        for o in objs.iter().filter(|o| !o.view.meta.deleting) {
            let c = &o.view.conditions;
            if spare_permanent
                && conditions::is_true(c, PERMANENT_NODE_DELETION_EXPECTED)
                && !conditions::is_true(c, SUCCEEDED)
            {
                continue;
            }
            self.actions.push(Action::DeleteRemediation { object: object_ref(o.view), target: o.node.to_string() });
        }
    }
}

fn owned_by_check(view: &RemediationView, name: &str, uid: Option<&str>) -> bool {
    view.meta
        .owners
        .iter()
        .any(|o| o.kind == OWNER_KIND && o.name == name && (o.uid.is_empty() || uid.is_none_or(|u| u == o.uid)))
}

fn threshold_text(t: NhcThreshold, observed: usize) -> String {
    match t {
        NhcThreshold::MinHealthy(v) => format!("minHealthy {v} (needs {} healthy)", v.scaled(observed, Rounding::Up)),
        NhcThreshold::MaxUnhealthy(v) => {
            format!("maxUnhealthy {v} (allows {} unhealthy)", v.scaled(observed, Rounding::Up))
        }
    }
}

/// Whether `healthy` of `observed` Nodes meet the check's threshold (remediation allowed); public
/// so a picture of a run can draw the threshold with this one rule.
pub fn threshold_met(t: NhcThreshold, observed: usize, healthy: usize) -> bool {
    match t {
        NhcThreshold::MinHealthy(v) => healthy as u64 >= v.scaled(observed, Rounding::Up),
        // medik8s rounds a maxUnhealthy percentage up (75% of 10 allows 8), unlike Cluster API
        NhcThreshold::MaxUnhealthy(v) => (observed - healthy) as u64 <= v.scaled(observed, Rounding::Up),
    }
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// What pass 1 found.
struct Scan<'a> {
    /// Whether the Nodes were strictly sorted by name; when not, nothing else is meaningful.
    sorted: bool,
    /// Nodes with something to decide (not healthy, or owning objects), in name order.
    subjects: Vec<Subject<'a>>,
    /// Per Node (same index as the scanned list): selected, matching no rule, without objects.
    healthy_at: Vec<bool>,
    observed: usize,
    healthy: usize,
    /// Control-plane Nodes, sorted.
    cp_names: Vec<&'a str>,
    /// Selected Nodes with a matching condition set aside as stale, in name order.
    stale: Vec<(String, crate::stale::Stale)>,
    wake: Earliest,
    /// Per failure domain, with `spec.failureDomains`.
    tally: Option<Tally>,
}

/// Pass 1: one look at every Node (name order, labels, conditions), merged with the check's
/// objects by Node name. Healthy Nodes without objects are only counted: nothing is decided for
/// them, which keeps the common case to a few comparisons a Node.
fn scan_nodes<'a>(all: &[&'a Node], owned: &[Owned<'a>], policy: &NhcPolicy, now: Timestamp) -> Scan<'a> {
    let mut scan = Scan {
        sorted: true,
        subjects: Vec::new(),
        healthy_at: vec![false; all.len()],
        observed: 0,
        healthy: 0,
        cp_names: Vec::new(),
        stale: Vec::new(),
        wake: Earliest::default(),
        tally: policy.failure_domains.as_ref().map(|_| Tally::default()),
    };
    let domain_key = domain_label(policy);
    let mut b = 0usize;
    let mut last = "";
    for (i, &node) in all.iter().enumerate() {
        let name = node_name(node);
        if name <= last {
            // out of order, a duplicate, or no name ("" sorts first)
            scan.sorted = false;
            return scan;
        }
        last = name;
        gone_before(owned, &mut b, Some(name), &mut scan.subjects);
        let start = b;
        while b < owned.len() && owned[b].node == name {
            b += 1;
        }
        if is_control_plane(node) {
            scan.cp_names.push(name);
        }
        if policy.selector.matches(node.metadata.labels.as_ref()) {
            scan.observed += 1;
            let mut stale = None;
            let verdict = judge(node, &policy.conditions, now, &mut scan.wake, &mut stale);
            if let Some(stale) = stale {
                scan.stale.push((name.to_string(), stale));
            }
            if let Some(tally) = &mut scan.tally {
                tally.add(domain_key.and_then(|k| node_domain(node, k)), verdict == Verdict::Clear && start == b);
            }
            if verdict == Verdict::Clear && start == b {
                scan.healthy += 1;
                scan.healthy_at[i] = true;
            } else {
                scan.subjects.push(Subject { name, node: Some(node), verdict: Some(verdict), objs: start..b });
            }
        } else if start < b {
            scan.subjects.push(Subject { name, node: Some(node), verdict: None, objs: start..b });
        }
    }
    gone_before(owned, &mut b, None, &mut scan.subjects);
    scan
}

/// The Node label naming failure domains, with `spec.failureDomains` (validation admits only a
/// label key on a NodeHealthCheck; any other key puts every Node in no domain, where the
/// check-wide budget alone applies).
fn domain_label(policy: &NhcPolicy) -> Option<&str> {
    match policy.failure_domains.as_ref().map(|fd| &fd.key) {
        Some(DomainKey::NodeLabel(key)) => Some(key.as_str()),
        _ => None,
    }
}

/// A Node's failure domain: the label's value; a Node without it (or with an empty value) is in
/// no domain.
fn node_domain<'n>(node: &'n Node, key: &str) -> Option<&'n str> {
    node.metadata.labels.as_ref().and_then(|l| entry(l, key)).filter(|v| !v.is_empty())
}

/// Adds a subject for each Node from `owned[*b..]` named before `limit` (all when `None`): the
/// scan passed their place, so they are not in the cluster.
fn gone_before<'a>(owned: &[Owned<'a>], b: &mut usize, limit: Option<&str>, subjects: &mut Vec<Subject<'a>>) {
    while *b < owned.len() && limit.is_none_or(|l| owned[*b].node < l) {
        let gone = owned[*b].node;
        let start = *b;
        while *b < owned.len() && owned[*b].node == gone {
            *b += 1;
        }
        subjects.push(Subject { name: gone, node: None, verdict: None, objs: start..*b });
    }
}

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

/// The check's own remediation objects, sorted by Node then identity.
fn own_objects<'a>(input: &NhcInput<'a>, check_name: &str, check_uid: Option<&str>) -> Vec<Owned<'a>> {
    let policy = input.policy;
    let mut owned: Vec<Owned<'a>> = input
        .remediations
        .iter()
        .filter(|r| owned_by_check(r, check_name, check_uid))
        .filter_map(|r| {
            let node = entry(&r.meta.annotations, NODE_NAME_ANNOTATION)?;
            let template = entry(&r.meta.annotations, TEMPLATE_NAME_ANNOTATION);
            Some(Owned { node, view: r, template, step: step_of(r, template, &policy.steps) })
        })
        .collect();
    owned.sort_unstable_by(|a, b| {
        (a.node, &a.view.meta.kind, &a.view.meta.namespace, &a.view.meta.name).cmp(&(
            b.node,
            &b.view.meta.kind,
            &b.view.meta.namespace,
            &b.view.meta.name,
        ))
    });
    owned
}

/// Judge (pass 1). Nodes usually come sorted by name (adapters index them in sorted maps): the
/// scan checks that as it goes, and only when they are not (or some has no name, or two share
/// one) is it redone over a sorted copy without those (the first of a name wins). Returns the
/// list the scan's indexes refer to.
fn judge_nodes<'a>(
    input: &NhcInput<'a>,
    owned: &[Owned<'a>],
    now: Timestamp,
) -> (std::borrow::Cow<'a, [&'a Node]>, Scan<'a>) {
    let scan = scan_nodes(input.nodes, owned, input.policy, now);
    if scan.sorted {
        return (std::borrow::Cow::Borrowed(input.nodes), scan);
    }
    let mut copy: Vec<&Node> = input.nodes.iter().copied().filter(|n| !node_name(n).is_empty()).collect();
    copy.sort_by(|a, b| node_name(a).cmp(node_name(b)));
    copy.dedup_by(|a, b| node_name(a) == node_name(b));
    let scan = scan_nodes(&copy, owned, input.policy, now);
    (std::borrow::Cow::Owned(copy), scan)
}

/// Budget: whether the threshold lets remediation start (`RemediationAllowed`), held back by a
/// storm cool-down after it was not met; offers the cool-down's end and returns its start.
fn budget(
    policy: &NhcPolicy,
    prev: &NodeHealthCheckStatus,
    observed: usize,
    healthy: usize,
    now: Timestamp,
    wake: &mut Earliest,
) -> (DesiredCondition, Option<Timestamp>) {
    let met = threshold_met(policy.threshold, observed, healthy);
    let counts = format!(
        "{observed} nodes observed, {healthy} healthy, {} not healthy; {}",
        observed - healthy,
        threshold_text(policy.threshold, observed)
    );
    let prev_allowed = get_condition(&prev.conditions, REMEDIATION_ALLOWED);
    let gate = if !met {
        Gate::TooFewHealthy
    } else if !policy.storm_cooldown.is_positive() {
        Gate::Allowed
    } else {
        match &prev.storm_recovery_start_time {
            Some(Time(start)) => match after(*start, policy.storm_cooldown) {
                Some(end) if now >= end => Gate::Allowed,
                end => Gate::Cooldown { start: *start, end },
            },
            None if prev_allowed.is_some_and(|c| {
                c.status == ConditionStatus::False
                    && (c.reason == Reason::TooFewHealthy || c.reason == Reason::StormCooldown)
            }) =>
            {
                Gate::Cooldown { start: now, end: after(now, policy.storm_cooldown) }
            }
            None => Gate::Allowed,
        }
    };
    match gate {
        Gate::Allowed => (DesiredCondition::true_(REMEDIATION_ALLOWED, Reason::RemediationAllowed, counts), None),
        Gate::TooFewHealthy => (DesiredCondition::false_(REMEDIATION_ALLOWED, Reason::TooFewHealthy, counts), None),
        Gate::Cooldown { start, end } => {
            if let Some(end) = end {
                wake.offer(end);
            }
            let until = end.map_or_else(|| "the end of time".to_string(), |e| e.to_string());
            let message = format!(
                "{counts}; the threshold is met again, but the storm cooldown of {} that started at {start} lasts until {until}",
                format_go_duration(policy.storm_cooldown)
            );
            (DesiredCondition::false_(REMEDIATION_ALLOWED, Reason::StormCooldown, message), Some(start))
        }
    }
}

/// The templates of the steps, and the `Disabled` condition they make.
struct Templates<'a> {
    usable: Vec<Usable<'a>>,
    disabled: Option<(Reason, String)>,
    disabled_condition: DesiredCondition,
    disabled_changed: bool,
}

/// Templates: the check is Disabled while any step's template is missing or invalid.
fn template_state<'a>(input: &NhcInput<'a>, prev: &NodeHealthCheckStatus) -> Templates<'a> {
    let policy = input.policy;
    let templates: Vec<Usable<'_>> = (0..policy.steps.len()).map(|i| usable(input.templates, i)).collect();
    let mut missing = Vec::new();
    let mut invalid = Vec::new();
    for (step, state) in policy.steps.iter().zip(&templates) {
        match state {
            Usable::Yes(..) => {}
            Usable::Missing => missing.push(format!("remediation template {} not found", step.template)),
            Usable::Invalid(why) => invalid.push(format!("remediation template {} {why}", step.template)),
        }
    }
    let disabled = if missing.is_empty() && invalid.is_empty() {
        None
    } else {
        let reason =
            if missing.is_empty() { Reason::RemediationTemplateInvalid } else { Reason::RemediationTemplateNotFound };
        missing.extend(invalid);
        Some((reason, missing.join("; ")))
    };
    let disabled_condition = match &disabled {
        Some((reason, message)) => DesiredCondition::true_(DISABLED, reason.clone(), message.clone()),
        None => {
            DesiredCondition::false_(DISABLED, Reason::Enabled, "All remediation templates were found and are valid")
        }
    };
    let disabled_changed = get_condition(&prev.conditions, DISABLED).is_none_or(|c| {
        c.status != disabled_condition.status
            || c.reason != disabled_condition.reason
            || c.message != disabled_condition.message
    });

    Templates { usable: templates, disabled, disabled_condition, disabled_changed }
}

/// Control-plane Nodes already being remediated (by anyone) or with a request in flight.
fn busy_control_planes<'a>(
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

/// Remediate (pass 2): each subject in name order, merged with the previous status entries —
/// start, escalate, recover or clean up — giving the new `unhealthyNodes` and the Nodes that
/// could not be judged.
fn remediate<'a>(
    pass: &mut Pass<'a>,
    subjects: &[Subject<'a>],
    owned: &[Owned<'a>],
    prev_entries: &[&'a UnhealthyNode],
    all: &[&'a Node],
    healthy_at: &[bool],
) -> (Vec<UnhealthyNode>, Vec<(&'a str, usize)>) {
    let (policy, now) = (pass.policy, pass.now);
    let mut entries: Vec<UnhealthyNode> = Vec::new();
    let mut undecided: Vec<(&str, usize)> = Vec::new();
    // A listed Node that is not a subject any more and is healthy now has recovered.
    let recovered = |name: &str| {
        all.binary_search_by(|n| node_name(n).cmp(name)).is_ok_and(|i| healthy_at[i]).then(|| {
            notice(
                NoticeKind::Healthy,
                name,
                Reason::NodeHealthy,
                format!("Node {name} is healthy and has no remediation objects left"),
            )
        })
    };
    let mut p = 0usize;
    for s in subjects {
        let objs = &owned[s.objs.clone()];
        while p < prev_entries.len() && prev_entries[p].name.as_str() < s.name {
            pass.notices.extend(recovered(&prev_entries[p].name));
            p += 1;
        }
        let prev_entry = match prev_entries.get(p) {
            Some(e) if e.name == s.name => {
                p += 1;
                Some(*e)
            }
            _ => None,
        };
        let mut book = Book::new(objs, prev_entry, now);
        let mut healthy_since = None;
        let mut delayed = false;
        let listed = match (s.verdict, s.node) {
            (Some(Verdict::Clear), Some(node)) => {
                // a subject that matches no rule still has objects (pass 1 kept only those)
                let (since, wait) = pass.recover(node, objs, prev_entry);
                healthy_since = Some(Time(since));
                delayed = wait;
                !objs.is_empty()
            }
            (Some(Verdict::Unhealthy(rule)), Some(node)) => {
                if prev_entry.is_none()
                    && let Some(r) = policy.conditions.get(rule)
                {
                    // The condition's reason says what broke, as upstream's messages do.
                    let why = node
                        .status
                        .as_ref()
                        .and_then(|st| st.conditions.as_deref())
                        .and_then(|cs| cs.iter().find(|c| c.type_ == r.type_ && c.status == r.status))
                        .and_then(|c| c.reason.as_deref())
                        .filter(|reason| !reason.is_empty())
                        .map_or_else(String::new, |reason| format!(" with reason {reason}"));
                    pass.notices.push(notice(
                        NoticeKind::Unhealthy,
                        s.name,
                        Reason::Rule(rule_text(r)),
                        format!(
                            "Node {} has had condition {}{why} for more than {}",
                            s.name,
                            rule_text(r),
                            format_go_duration(r.timeout)
                        ),
                    ));
                }
                if !has_label_value(node, EXCLUDE_FROM_REMEDIATION_LABEL, "true") {
                    if objs.is_empty() {
                        pass.start(s.name, node, prev_entry.is_some(), &mut book);
                    } else {
                        pass.escalate(s.name, objs, &mut book);
                    }
                }
                true
            }
            (Some(verdict), _) => {
                if let Verdict::Undecided(rule) = verdict {
                    undecided.push((s.name, rule));
                }
                !objs.is_empty()
            }
            (None, _) => {
                // Deleted or no longer selected: nothing will watch this Node for the check.
                pass.delete_all(objs, true);
                !objs.is_empty()
            }
        };
        if listed {
            entries.push(UnhealthyNode {
                name: s.name.to_string(),
                remediations: book.finish(),
                conditions_healthy_timestamp: healthy_since,
                healthy_delayed: delayed.then_some(true),
            });
        }
    }

    for e in &prev_entries[p..] {
        pass.notices.extend(recovered(&e.name));
    }
    (entries, undecided)
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
