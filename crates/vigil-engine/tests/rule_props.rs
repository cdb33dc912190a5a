//! Properties of reason-aware rules and remediation per condition, over random histories of one
//! target's conditions on both kinds:
//! - a rule with `reasons` never matches a condition whose reason it does not list (and one
//!   without `reasons` matches whatever the reason);
//! - the remediation chosen for a target never changes while it stays unhealthy, whatever other
//!   rules start or stop matching and even when the check's status is lost: every object made
//!   during the incident carries its rule, at most one remediation runs at a time, and a
//!   MachineHealthCheck never both asks the owner and makes an object.

mod support;

use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;
use serde_json::{Value, json};
use support::{MhcWorld, machine, t0};
use vigil_api::NodeHealthCheck;
use vigil_api::conditions::ConditionStatus;
use vigil_api::node_health_check::NodeHealthCheckStatus;
use vigil_api::views::NodeView;
use vigil_api::views::{RemediationView, TemplateView};
use vigil_api::well_known::{NHC_TIMED_OUT_ANNOTATION, OWNER_REMEDIATED, RULE_ANNOTATION};
use vigil_engine::node::{NhcInput, decide};
use vigil_engine::{Action, Plan};

const NS: &str = "medik8s";
const REASONS: [&str; 4] = ["KernelHasDeadlock", "DockerHung", "SmartError", "DiskFull"];

fn at(secs: i64) -> Timestamp {
    t0() + SignedDuration::from_secs(secs)
}

fn template_ref(kind: &str, name: &str) -> Value {
    json!({"apiVersion": "remediation.example.io/v1alpha1", "kind": kind, "name": name, "namespace": NS})
}

fn template_view(kind: &str, name: &str) -> TemplateView {
    TemplateView::read(&json!({
        "apiVersion": "remediation.example.io/v1alpha1", "kind": kind,
        "metadata": {"name": name, "namespace": NS},
        "spec": {"template": {"spec": {}}},
    }))
    .expect("template")
}

// ------------------------------------------------------------------- reasons

/// A rule's reasons: `None` (absent) or a non-empty subset of [`REASONS`].
fn reasons() -> impl Strategy<Value = Option<Vec<&'static str>>> {
    prop_oneof![Just(None), proptest::sample::subsequence(REASONS.to_vec(), 1..=REASONS.len()).prop_map(Some),]
}

/// A condition's reason: one of [`REASONS`], another word, or none.
fn condition_reason() -> impl Strategy<Value = Option<&'static str>> {
    prop_oneof![proptest::sample::select(REASONS.to_vec()).prop_map(Some), Just(Some("Other")), Just(None)]
}

fn node_with(reason: Option<&str>) -> NodeView {
    let n = support::node("n1").ready("True", t0());
    match reason {
        Some(r) => n.condition_with_reason("KernelDeadlock", "True", r, t0()),
        None => n.condition("KernelDeadlock", "True", t0()).without_reason(),
    }
    .build()
}

// ------------------------------------------------------------------- a NodeHealthCheck world

/// One Node `n1` (and two healthy ones) under a check whose own remediation is `Own`; rule 1
/// (`KernelDeadlock=True` with reason `KernelHasDeadlock`) gets `Fence`, rule 2
/// (`DiskFailing=True`) escalates `Own` for 5m then `Replace`.
fn nhc_check() -> NodeHealthCheck {
    serde_json::from_value(json!({
        "apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck",
        "metadata": {"name": "nhc", "uid": "nhc-uid"},
        "spec": {
            "selector": {"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]},
            "minHealthy": 0,
            "remediationTemplate": template_ref("OwnTemplate", "own"),
            "unhealthyConditions": [
                {"type": "Ready", "status": "False", "duration": "300s"},
                {"type": "KernelDeadlock", "status": "True", "duration": "60s", "reasons": ["KernelHasDeadlock"],
                 "remediationTemplate": template_ref("FenceTemplate", "fence")},
                {"type": "DiskFailing", "status": "True", "duration": "120s", "escalatingRemediations": [
                    {"remediationTemplate": template_ref("OwnTemplate", "own"), "order": 1, "timeout": "5m"},
                    {"remediationTemplate": template_ref("ReplaceTemplate", "replace"), "order": 2, "timeout": "10m"}]},
            ],
        },
    }))
    .expect("check")
}

/// What happens to n1 between two decisions.
#[derive(Debug, Clone, Copy)]
enum Event {
    /// Ready flips (False when it was True, and back).
    Ready,
    /// KernelDeadlock flips between True and False.
    Kernel,
    /// KernelDeadlock's reason changes (without a transition).
    KernelReason,
    /// DiskFailing flips between True and False.
    Disk,
    /// The check's status is lost (a restart reading an old one, a failed write).
    LoseStatus,
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        Just(Event::Ready),
        Just(Event::Kernel),
        Just(Event::KernelReason),
        Just(Event::Disk),
        Just(Event::LoseStatus)
    ]
}

/// n1's conditions: `(type, status, reason, lastTransitionTime)`.
#[derive(Debug, Clone)]
struct Conditions(Vec<(&'static str, &'static str, &'static str, Timestamp)>);

impl Conditions {
    fn healthy() -> Self {
        Conditions(vec![
            ("Ready", "True", "KubeletReady", t0()),
            ("KernelDeadlock", "False", "KernelHasNoDeadlock", t0()),
            ("DiskFailing", "False", "SmartOk", t0()),
        ])
    }

    fn flip(&mut self, type_: &str, on: &'static str, off: &'static str, reason: &'static str, now: Timestamp) {
        if let Some(c) = self.0.iter_mut().find(|c| c.0 == type_) {
            *c = (c.0, if c.1 == on { off } else { on }, reason, now);
        }
    }

    fn node(&self) -> NodeView {
        let mut n = support::node("n1");
        for (t, s, r, since) in &self.0 {
            n = n.condition_with_reason(t, s, r, *since);
        }
        n.build()
    }
}

struct NhcWorld {
    check: NodeHealthCheck,
    objects: Vec<RemediationView>,
    templates: Vec<TemplateView>,
}

impl NhcWorld {
    fn new() -> Self {
        let templates = vec![
            template_view("OwnTemplate", "own"),
            template_view("FenceTemplate", "fence"),
            template_view("ReplaceTemplate", "replace"),
        ];
        NhcWorld { check: nhc_check(), objects: Vec::new(), templates }
    }

    fn step(&mut self, n1: NodeView, now: Timestamp) -> Plan<NodeHealthCheckStatus> {
        let policy = vigil_api::validate::node_health_check(&self.check).expect("valid");
        let nodes =
            [n1, support::node("n2").ready("True", t0()).build(), support::node("n3").ready("True", t0()).build()];
        let node_refs: Vec<&NodeView> = nodes.iter().collect();
        let templates: Vec<Option<&TemplateView>> = policy
            .all_steps()
            .map(|s| self.templates.iter().find(|t| t.meta.kind == s.template.kind && t.meta.name == s.template.name))
            .collect();
        let objects: Vec<&RemediationView> = self.objects.iter().collect();
        let input = NhcInput {
            check: &self.check,
            policy: &policy,
            nodes: &node_refs,
            templates: &templates,
            remediations: &objects,
            around: Default::default(),
        };
        let plan = decide(&input, now);
        for a in &plan.actions {
            match a {
                Action::CreateRemediation { object, .. } => {
                    let mut o = object.clone();
                    o["metadata"]["uid"] = json!(format!("uid-{}-{}", o["kind"], o["metadata"]["name"]));
                    o["metadata"]["creationTimestamp"] = json!(now.to_string());
                    let view = RemediationView::read(&o).expect("named");
                    if !self.objects.iter().any(|x| x.meta.kind == view.meta.kind && x.meta.name == view.meta.name) {
                        self.objects.push(view);
                    }
                }
                Action::DeleteRemediation { object, .. } => {
                    self.objects.retain(|x| !(x.meta.kind == object.kind && x.meta.name == object.name))
                }
                Action::AnnotateRemediation { object, key, value, .. } => {
                    for x in
                        self.objects.iter_mut().filter(|x| x.meta.kind == object.kind && x.meta.name == object.name)
                    {
                        x.meta.annotations.insert(key.clone(), value.clone());
                    }
                }
                Action::SetMachineConditions { .. } => unreachable!("a NodeHealthCheck"),
                // This world keeps no Leases: every Node's Lease is free.
                Action::WriteLease(_) | Action::DeleteLease { .. } => {}
            }
        }
        self.check.status = Some(plan.status.clone());
        plan
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// A rule with `reasons` never matches a condition whose reason it does not list, on either
    /// kind; without `reasons` it matches whatever the reason.
    #[test]
    fn a_rule_with_reasons_never_matches_an_unlisted_reason(listed in reasons(), reason in condition_reason()) {
        let matches = listed.as_ref().is_none_or(|l| reason.is_some_and(|r| l.contains(&r)));
        let mut rule = json!({"type": "KernelDeadlock", "status": "True", "duration": "60s"});
        if let Some(l) = &listed {
            rule["reasons"] = json!(l);
        }
        // NodeHealthCheck: listed as unhealthy (and remediated) exactly when it matches.
        let mut check = nhc_check();
        check.spec.unhealthy_conditions = vec![serde_json::from_value(rule.clone()).expect("rule")];
        let mut w = NhcWorld { check, ..NhcWorld::new() };
        let plan = w.step(node_with(reason), at(61));
        prop_assert_eq!(plan.status.unhealthy_nodes.iter().any(|u| u.name == "n1"), matches);
        // MachineHealthCheck: the same rule written its way.
        if let Some(d) = rule.as_object_mut().and_then(|r| r.remove("duration")) {
            rule["timeout"] = d;
        }
        let mut mw = MhcWorld::new().spec("unhealthyConditions", json!([rule])).machine(machine("n1").node("n1"));
        mw.nodes.insert("n1".into(), node_with(reason));
        let plan = mw.decide(at(61));
        prop_assert_eq!(plan.status.current_healthy == 0, matches);
    }

    /// The remediation chosen for a Node never changes while it stays listed as unhealthy,
    /// whatever other rules start or stop matching and even when the status is lost; every
    /// object made meanwhile carries the incident's rule, and at most one runs at a time.
    #[test]
    fn a_nodes_chosen_remediation_never_changes_while_it_stays_unhealthy(
        events in proptest::collection::vec((event(), 1i64..400), 1..40),
    ) {
        let mut w = NhcWorld::new();
        let mut conditions = Conditions::healthy();
        let mut now = t0();
        let mut incident: Option<String> = None;
        for (e, dt) in events {
            now += SignedDuration::from_secs(dt);
            match e {
                Event::Ready => conditions.flip("Ready", "False", "True", "KubeletNotReady", now),
                Event::Kernel => conditions.flip("KernelDeadlock", "True", "False", "KernelHasDeadlock", now),
                Event::KernelReason => {
                    if let Some(c) = conditions.0.iter_mut().find(|c| c.0 == "KernelDeadlock") {
                        c.2 = if c.2 == "KernelHasDeadlock" { "DockerHung" } else { "KernelHasDeadlock" };
                    }
                }
                Event::Disk => conditions.flip("DiskFailing", "True", "False", "SmartError", now),
                Event::LoseStatus => w.check.status = None,
            }
            let plan = w.step(conditions.node(), now);
            let listed = plan.status.unhealthy_nodes.iter().any(|u| u.name == "n1");
            let chosen = plan.status.features.chosen_remediations.iter().find(|c| c.name == "n1").map(|c| c.rule.clone());
            match (&incident, listed) {
                (_, false) => incident = None,
                (None, true) => incident = chosen.clone(),
                (Some(rule), true) => {
                    // A lost status forgets a choice only while no object carries it.
                    if w.objects.iter().any(|o| o.meta.annotations.contains_key(RULE_ANNOTATION)) || !matches!(e, Event::LoseStatus) {
                        prop_assert_eq!(chosen.as_ref(), Some(rule), "the incident's rule changed at {}", now);
                    }
                    incident = chosen.clone();
                }
            }
            if let Some(rule) = &incident {
                for o in &w.objects {
                    prop_assert_eq!(o.meta.annotations.get(RULE_ANNOTATION), Some(rule), "{} carries another rule", o.meta.name);
                }
            }
            let running = w.objects.iter().filter(|o| !o.meta.annotations.contains_key(NHC_TIMED_OUT_ANNOTATION)).count();
            prop_assert!(running <= 1, "{} remediations run at once", running);
        }
    }

    /// The remediation chosen for a Machine never changes while it stays unhealthy, whatever
    /// other rules start or stop matching and even when the status is lost: the owner is never
    /// asked on top of an object, nor an object made on top of the owner's request.
    #[test]
    fn a_machines_chosen_remediation_never_changes_while_it_stays_unhealthy(
        events in proptest::collection::vec((event(), 1i64..400), 1..40),
    ) {
        let mut w = MhcWorld::new().spec(
            "unhealthyConditions",
            json!([
                {"type": "Ready", "status": "False", "timeout": "300s"},
                {"type": "KernelDeadlock", "status": "True", "timeout": "60s", "reasons": ["KernelHasDeadlock"],
                 "remediationTemplate": support::template_ref_json()},
                {"type": "DiskFailing", "status": "True", "timeout": "120s"},
            ]),
        ).machine(machine("m1").node("m1"));
        w.template = Some(support::template(support::NS));
        let mut conditions = Conditions::healthy();
        let mut now = t0();
        let mut incident: Option<String> = None;
        for (e, dt) in events {
            now += SignedDuration::from_secs(dt);
            match e {
                Event::Ready => conditions.flip("Ready", "False", "True", "KubeletNotReady", now),
                Event::Kernel => conditions.flip("KernelDeadlock", "True", "False", "KernelHasDeadlock", now),
                Event::KernelReason => {
                    if let Some(c) = conditions.0.iter_mut().find(|c| c.0 == "KernelDeadlock") {
                        c.2 = if c.2 == "KernelHasDeadlock" { "DockerHung" } else { "KernelHasDeadlock" };
                    }
                }
                Event::Disk => conditions.flip("DiskFailing", "True", "False", "SmartError", now),
                Event::LoseStatus => w.status = None,
            }
            let mut n = conditions.node();
            n.name = "m1".into();
            w.nodes.insert("m1".into(), n);
            let plan = w.decide(now);
            w.apply(&plan);
            let m1 = &w.machine_views()[0];
            let unhealthy = vigil_api::conditions::find(&m1.conditions, "HealthCheckSucceeded")
                .is_some_and(|c| c.status == ConditionStatus::False);
            let chosen = plan.status.features.chosen_remediations.iter().find(|c| c.name == "m1").map(|c| c.rule.clone());
            let object = w.remediations.get("m1");
            let incident_start = vigil_api::conditions::find(&m1.conditions, "HealthCheckSucceeded")
                .filter(|c| c.status == ConditionStatus::False)
                .and_then(|c| c.last_transition_time);
            let owner_asked = vigil_api::conditions::find(&m1.conditions, OWNER_REMEDIATED)
                .filter(|c| c.status == ConditionStatus::False)
                .and_then(|c| c.last_transition_time)
                .is_some_and(|t| incident_start.is_some_and(|s| t >= s));
            prop_assert!(!(owner_asked && object.is_some()), "the owner asked and an object made in one incident at {}", now);
            match (&incident, unhealthy) {
                (_, false) => incident = None,
                (None, true) => incident = chosen.clone(),
                (Some(rule), true) => {
                    // A lost status forgets a choice only while no object carries it (an owner's
                    // request is then still never followed by an object: checked above).
                    if !matches!(e, Event::LoseStatus) || object.is_some() {
                        prop_assert_eq!(chosen.as_ref(), Some(rule), "the incident's rule changed at {}", now);
                    }
                    incident = chosen.clone();
                }
            }
            if let (Some(rule), Some(o)) = (&incident, object) {
                prop_assert_eq!(o.meta.annotations.get(RULE_ANNOTATION), Some(rule));
            }
        }
    }
}
