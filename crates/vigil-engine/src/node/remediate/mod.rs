//! Remediating the unhealthy Nodes (pass 2), in the one shape of a decision
//! ([`crate::decision`]): the pass's state, and what its parts share. What each part does lives
//! in its own module: visiting every subject (`subject`), requesting the first step (`start`),
//! making an object (`request`), escalating and giving up (`escalate`), deleting the objects of
//! recovered Nodes (`recover`).

mod escalate;
mod recover;
pub(super) mod request;
mod start;
mod subject;

use super::gates::{Gates, Wait};
use super::input::NhcInput;
use super::judge::{Finding, Subject, unhealthy_since};
use super::objects::{Owned, owned_by_check};
use super::status::PHASE_PAUSED;
use super::templates::{Templates, Usable};
use crate::decision::{Context, Features, Outputs, Overlap, Pacing};
use crate::holders::nhc_held;
use crate::node_lease;
use crate::pacing::Pacer;
use crate::plan::{LeaseWrite, Notice, NoticeKind};
use crate::plan::{ONE_NS, after};
use crate::target::Target;
use crate::target::entry;
use jiff::Timestamp;
use vigil_api::conditions::{ConditionStatus, get_condition};
use vigil_api::node_health_check::{NodeHealthCheckStatus, NodeWait, UnhealthyNode};
use vigil_api::reason::Reason;
use vigil_api::shared::WouldRemediate;
use vigil_api::validate::{Ladder, NhcPolicy, RemediationStep};
use vigil_api::views::{NodeView, RemediationView};
use vigil_api::well_known::{NODE_NAME_ANNOTATION, REMEDIATION_ALLOWED, RULE_ANNOTATION};

/// The second pass of a NodeHealthCheck decision: the one shape's parts, and what only a
/// NodeHealthCheck has (its setting, its last gates, the control-plane rule, each Node's wait and
/// the Leases to keep).
pub(super) struct Pass<'a> {
    cx: Context<'a, NhcPolicy>,
    setting: Setting<'a>,
    out: Outputs,
    features: Features<'a>,
    overlap: Overlap<'a>,
    /// The upgrade pause, planned maintenance and the node Leases.
    gates: Gates<'a>,
    control_planes: ControlPlanes<'a>,
    /// The wait of the subject being decided.
    waiting: PendingWait<'a>,
    /// Nodes whose Lease this check keeps: a remediation of this check is live there (an object
    /// or a request not given up), or this plan creates one; every other Lease it holds is
    /// released.
    keep_leases: Vec<&'a str>,
}

/// What a NodeHealthCheck decision holds fixed while it visits its Nodes, besides the shared
/// [`Context`]: who makes the objects and from which templates, whether new remediation may
/// start, and what is news.
pub(super) struct Setting<'a> {
    check_name: &'a str,
    check_uid: Option<&'a str>,
    templates: Vec<Usable<'a>>,
    allowed: bool,
    paused: bool,
    /// New remediation was not possible in the previous status but is now: a skip is news.
    newly_open: bool,
    /// The `Disabled` condition changed: a template skip is news.
    disabled_changed: bool,
    /// Remediation objects of the steps' kinds that this check does not own.
    foreign: Vec<&'a RemediationView>,
    /// The previous `status.wouldRemediate`: in dry-run, a Node listed there was already counted.
    would_before: &'a [WouldRemediate],
    /// The Node label naming failure domains (`spec.failureDomains`).
    domain_label: Option<&'a str>,
}

impl<'a> Setting<'a> {
    /// The setting of `input`'s decision, whose previous status is `prev`; `allowed`: the budget
    /// lets new remediation start.
    pub(super) fn new(
        input: &NhcInput<'a>,
        prev: &'a NodeHealthCheckStatus,
        templates: &Templates<'a>,
        allowed: bool,
    ) -> Self {
        let (policy, check) = (input.policy, input.check);
        let check_name = check.metadata.name.as_deref().unwrap_or("");
        let check_uid = check.metadata.uid.as_deref().filter(|u| !u.is_empty());
        let prev_allowed = get_condition(&prev.conditions, REMEDIATION_ALLOWED);
        let prev_paused = prev.phase.as_deref() == Some(PHASE_PAUSED);
        Setting {
            check_name,
            check_uid,
            templates: templates.usable.clone(),
            allowed,
            paused: !policy.pause_requests.is_empty(),
            newly_open: prev_allowed.is_none_or(|c| c.status != ConditionStatus::True) || prev_paused,
            disabled_changed: templates.disabled_changed,
            foreign: input.remediations.iter().copied().filter(|r| !owned_by_check(r, check_name, check_uid)).collect(),
            would_before: &prev.features.would_remediate,
            domain_label: super::judge::domain_label(policy),
        }
    }
}

/// One control-plane Node is remediated at a time: those already being remediated, and whether
/// this plan starts one.
struct ControlPlanes<'a> {
    busy: Vec<&'a str>,
    taken: bool,
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

/// What the subject being decided waits for (its status entry's `waiting`), and what it waited
/// for in the previous status.
#[derive(Default)]
struct PendingWait<'a> {
    now: Option<Wait>,
    before: Option<&'a NodeWait>,
}

/// What happened to a request for a remediation object.
enum Requested {
    /// A create action was added (or an earlier `generateName` request is awaited).
    Done,
    /// The template cannot be used: reason and why.
    Skipped(Reason, String),
    /// The object cannot be made yet (its owner Machine cannot be read): the Node's wait says
    /// why.
    Held,
}

/// The remediation of one Node's incident: the check's own, or with remediation per condition the
/// one of the rule that started it ([`crate::chosen`]), and that rule's label.
pub(super) struct Incident<'p> {
    pub(super) ladder: Ladder<'p>,
    /// The rule's label, recorded on every object made for the incident; `None` when remediation
    /// per condition is off (objects then carry no annotation of Vigil's).
    pub(super) rule: Option<String>,
}

/// Pacing for a NodeHealthCheck decision among `observed` selected Nodes: the Nodes this check has
/// in flight — those it holds (its own remediation objects not given up on, its requests not
/// seen yet: the one reading of [`nhc_held`], as for the overlap rule) that are not healthy
/// again (a Node gone counts until its objects are) — and the queue order; the healthy Nodes
/// taken down on purpose (`disrupted`, when they count) each hold a slot too.
pub(super) fn pacing(
    input: &NhcInput<'_>,
    subjects: &[Subject<'_>],
    observed: usize,
    disrupted: &[&str],
    now: Timestamp,
) -> (Pacing, Pacer) {
    let Some(max) = input.policy.max_in_flight else {
        return (Pacing::unpaced(), Pacer::off());
    };
    let since: Vec<Option<Timestamp>> = subjects
        .iter()
        .map(|s| match (s.verdict, s.node) {
            (Some(Finding::Unhealthy(rule)), Some(node)) if s.objs.is_empty() => {
                Some(input.policy.conditions.get(rule).and_then(|r| unhealthy_since(node, r)).unwrap_or(now))
            }
            (Some(Finding::Expression(_)), Some(_)) if s.objs.is_empty() => Some(s.since.unwrap_or(now)),
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
    let pacing = Pacing::paced(since, subjects.iter().map(|s| s.name), Vec::new());
    let pacer = Pacer::new(Some(max), observed, in_flight).with_disrupted(disrupted.iter().map(|n| n.to_string()));
    (pacing, pacer)
}

impl<'a> Pass<'a> {
    /// The second pass, from the one shape's parts (`out` may already hold the decision's first
    /// notices) and what only a NodeHealthCheck has; `cp_busy`: the control-plane Nodes already
    /// being remediated.
    pub(super) fn new(
        (cx, out, features, overlap): (Context<'a, NhcPolicy>, Outputs, Features<'a>, Overlap<'a>),
        setting: Setting<'a>,
        gates: Gates<'a>,
        cp_busy: Vec<&'a str>,
    ) -> Self {
        Pass {
            cx,
            setting,
            out,
            features,
            overlap,
            gates,
            control_planes: ControlPlanes { busy: cp_busy, taken: false },
            waiting: PendingWait::default(),
            keep_leases: Vec::new(),
        }
    }

    /// Releases every other Lease this check holds (no Node of its needs it any more), and hands
    /// back what the pass decided, what the features remember and the waits for other checks.
    pub(super) fn finish(mut self) -> (Outputs, Features<'a>, Overlap<'a>) {
        let mut keep = std::mem::take(&mut self.keep_leases);
        keep.sort_unstable();
        for release in self.gates.releases(&|node| keep.binary_search(&node).is_ok()) {
            self.out.act(release);
        }
        (self.out, self.features, self.overlap)
    }

    /// The incident of a Node that `verdict` finds unhealthy now: the check's own remediation,
    /// or with remediation per condition the rule recorded on its objects, else in the previous
    /// status, else the verdict's rule (the first condition rule in spec order past its duration,
    /// else the first expression held for its duration); recorded for the status and told when
    /// it is news.
    pub(super) fn incident(&mut self, name: &str, objs: &[Owned<'_>], verdict: Finding) -> Incident<'a> {
        let (policy, now) = (self.cx.policy, self.cx.now);
        let Some(choices) = self.features.choices() else {
            return Incident { ladder: policy.ladder(None), rule: None };
        };
        let annotated = objs.iter().find_map(|o| entry(&o.view.meta.annotations, RULE_ANNOTATION));
        let before = choices.before(name);
        let recorded = [annotated, before.map(|p| p.rule.as_str())];
        let rule = match verdict {
            Finding::Unhealthy(rule) => Some(rule),
            Finding::Expression(i) => Some(policy.conditions.len() + i),
            _ => None,
        };
        let choice = crate::chosen::choose(&recorded, policy.rules(), &[], rule, "");
        let ladder = policy.ladder(choice.rule);
        let record = crate::chosen::record(
            name,
            Target::local_node(name),
            &format!("Node {name}"),
            &choice,
            ladder.describe(),
            before,
            now,
        );
        choices.record(record, &mut self.out);
        Incident { ladder, rule: Some(choice.label) }
    }

    /// Keeps a listed Node's choice while its incident goes on without a verdict that chooses
    /// (recovering, undecided, deselected): the previous one, else its objects' record.
    fn keep_choice(&mut self, name: &str, objs: &[Owned<'_>]) {
        let (policy, now) = (self.cx.policy, self.cx.now);
        if let Some(choices) = self.features.choices() {
            let annotated = objs.iter().find_map(|o| entry(&o.view.meta.annotations, RULE_ANNOTATION));
            choices.keep(name, annotated, policy.rules(), |i| policy.ladder(Some(i)).describe(), now);
        }
    }

    /// How notices name step `s` of `ladder`: its template.
    pub(super) fn step_label(ladder: &Ladder<'_>, s: usize) -> String {
        ladder.steps.get(s).map_or_else(String::new, |st| st.template.to_string())
    }

    /// Offers the instant a step requested at `started` times out, when that is still ahead (an
    /// object not seen yet cannot be judged, but its timer already runs).
    pub(super) fn offer_step_timeout(&mut self, step: &RemediationStep, started: Timestamp) {
        if let Some(t) = step.timeout.and_then(|d| after(started, d)).and_then(|d| after(d, ONE_NS))
            && t > self.cx.now
        {
            self.out.wake_at(t);
        }
    }

    /// Records what the subject `name` waits for, telling it (as `kind`) when it is news.
    pub(super) fn hold(&mut self, name: &str, wait: Wait, kind: NoticeKind) {
        if self.waiting.before.is_none_or(|w| w.reason != wait.reason) {
            self.out.tell(Notice::about_node(kind, name, wait.reason.clone(), wait.message.clone()));
        }
        self.waiting.now = Some(wait);
    }

    /// Tells that a request for `name` was skipped (a [`NoticeKind::RemediationSkipped`] notice
    /// with its reason) when `news` holds for that reason: a skip is said once, not at every
    /// decision.
    fn tell_skipped(&mut self, name: &str, requested: Requested, news: impl FnOnce(&Reason) -> bool) {
        if let Requested::Skipped(reason, message) = requested
            && news(&reason)
        {
            self.out.tell(Notice::about_node(NoticeKind::RemediationSkipped, name, reason, message));
        }
    }

    /// The Lease write a new object for step `s` of `ladder` on `node` needs first (`Some(None)`:
    /// none, this check holds it long enough); `None` when another holder has it (the Node's
    /// wait then says who, told once).
    fn lease_for(&mut self, name: &str, node: &NodeView, ladder: &Ladder<'_>, s: usize) -> Option<Option<LeaseWrite>> {
        let (current, _) = node_lease::step_durations(ladder, s);
        match self.gates.lease(node, current, self.out.wake()) {
            Ok(lease) => Some(lease),
            Err(wait) => {
                self.hold(name, wait, NoticeKind::RemediationSkipped);
                None
            }
        }
    }
}
