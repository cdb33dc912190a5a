//! One check remediates a target at a time (`vigil_engine::holders`): the derivation of who
//! holds which target, the skip rule of both kinds, upstream's overlapping-NodeHealthCheck
//! behaviour, and the invariant over any set of overlapping checks.

mod support;

use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use support::{NS as MNS, at, cluster, machine, mhc, mhc_policy, mhc_spec, node as mnode, t0};
use vigil_api::conditions::get_condition;
use vigil_api::node_health_check::NodeHealthCheckStatus;
use vigil_api::views::NodeView;
use vigil_api::views::{ClusterView, MachineView, RemediationView, TemplateView};
use vigil_api::{MachineHealthCheck, NodeHealthCheck};
use vigil_engine::holders::{
    CheckRef, Claim, Holder, Holders, LOCAL_CLUSTER, REASON_HELD, Target, WAITING_FOR_OTHER_CHECK, mhc_claims,
    nhc_claims,
};
use vigil_engine::machine::{self, MhcInput, NodeSource};
use vigil_engine::machine_write::{apply_merge_patch, machine_status_patch};
use vigil_engine::node::{self, NhcInput};
use vigil_engine::{Action, NoticeKind, Plan};

const SNR_API: &str = "self-node-remediation.medik8s.io/v1alpha1";
const FAR_API: &str = "fence-agents-remediation.medik8s.io/v1alpha1";
const MEDIK8S: &str = "medik8s";
const TIMED_OUT: &str = "remediation.medik8s.io/nhc-timed-out";

fn nref(name: &str) -> CheckRef {
    CheckRef::Node { name: name.into() }
}

fn mref() -> CheckRef {
    CheckRef::Machine { namespace: MNS.into(), name: "mhc".into() }
}

// ---------------------------------------------------------------- NodeHealthCheck fixtures

/// `(kind, api)` of a remediator the fixtures know.
fn remediator(kind: &str) -> (&'static str, &'static str) {
    match kind {
        "SelfNodeRemediation" => ("SelfNodeRemediationTemplate", SNR_API),
        _ => ("FenceAgentsRemediationTemplate", FAR_API),
    }
}

/// A NodeHealthCheck named `name` selecting every Node without `skip`, unhealthy after
/// `Ready=False` for `after`, remediating with `kind` (template named after the kind).
fn nhc(name: &str, kind: &str, after: &str) -> NodeHealthCheck {
    let (template_kind, api) = remediator(kind);
    serde_json::from_value(json!({
        "apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck",
        "metadata": {"name": name, "uid": format!("uid-{name}"), "generation": 1},
        "spec": {
            "selector": {"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]},
            "maxUnhealthy": "100%",
            "unhealthyConditions": [{"type": "Ready", "status": "False", "duration": after}],
            "remediationTemplate": {"apiVersion": api, "kind": template_kind, "name": kind.to_lowercase(), "namespace": MEDIK8S},
        },
    }))
    .expect("a NodeHealthCheck")
}

fn nhc_template(kind: &str) -> TemplateView {
    let (template_kind, api) = remediator(kind);
    TemplateView::read(&json!({
        "apiVersion": api, "kind": template_kind,
        "metadata": {"name": kind.to_lowercase(), "namespace": MEDIK8S},
        "spec": {"template": {"spec": {}}},
    }))
    .expect("a template")
}

/// A Node whose `Ready` is `status` since `since`.
fn node(name: &str, status: &str, since: Timestamp) -> NodeView {
    mnode(name).ready(status, since).build()
}

/// A remediation object of `kind` for `node`, owned by NodeHealthCheck `owner`, created at `created`.
fn nhc_object(kind: &str, owner: &str, node: &str, created: Timestamp) -> RemediationView {
    let (_, api) = remediator(kind);
    RemediationView::read(&json!({
        "apiVersion": api, "kind": kind,
        "metadata": {
            "name": format!("{node}-{owner}"), "namespace": MEDIK8S, "uid": format!("uid-{node}-{owner}"),
            "creationTimestamp": created.to_string(),
            "annotations": {"remediation.medik8s.io/node-name": node, "remediation.medik8s.io/template-name": kind.to_lowercase()},
            "ownerReferences": [{"apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck", "name": owner, "uid": format!("uid-{owner}")}],
        },
    }))
    .expect("an object")
}

fn timed_out(mut v: RemediationView) -> RemediationView {
    v.meta.annotations.insert(TIMED_OUT.into(), t0().to_string());
    v
}

fn decide_nhc(
    check: &NodeHealthCheck,
    nodes: &[NodeView],
    objects: &[RemediationView],
    holders: &Holders,
    now: Timestamp,
) -> Plan<NodeHealthCheckStatus> {
    let policy = vigil_api::validate::node_health_check(check).expect("valid");
    let templates: Vec<TemplateView> = policy
        .steps
        .iter()
        .map(|s| {
            let kind = s.template.remediation_kind().to_string();
            nhc_template(&kind)
        })
        .collect();
    let template_refs: Vec<Option<&TemplateView>> = templates.iter().map(Some).collect();
    let node_refs: Vec<&NodeView> = nodes.iter().collect();
    let object_refs: Vec<&RemediationView> = objects.iter().collect();
    let input = NhcInput {
        check,
        policy: &policy,
        nodes: &node_refs,
        templates: &template_refs,
        remediations: &object_refs,
        around: Default::default(),
    };
    node::decide_among(&input, holders, now)
}

fn creates<S>(plan: &Plan<S>) -> Vec<String> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            Action::CreateRemediation { target, .. } => Some(target.key()),
            _ => None,
        })
        .collect()
}

fn skips<S>(plan: &Plan<S>) -> Vec<(String, String, String)> {
    plan.notices
        .iter()
        .filter(|n| n.kind == NoticeKind::RemediationSkipped)
        .map(|n| (n.target_key().unwrap_or_default(), n.reason.to_string(), n.message.clone()))
        .collect()
}

fn holders_of(checks: &[&NodeHealthCheck], objects: &[RemediationView]) -> Holders {
    let refs: Vec<&RemediationView> = objects.iter().collect();
    Holders::from_claims(checks.iter().flat_map(|c| nhc_claims(c, &refs)))
}

// ---------------------------------------------------------------- the derivation

fn claim(target: Target, check: CheckRef, since: Option<Timestamp>) -> Claim {
    Claim { target, check, since }
}

#[test]
fn nhc_claims_table() {
    let me = nhc("a", "SelfNodeRemediation", "5m");
    // A request of an earlier plan not seen yet (no uid) holds; a seen or timed-out one does not.
    let mut with_status = me.clone();
    with_status.status = Some(
        serde_json::from_value(json!({"unhealthyNodes": [
            {"name": "n-flight", "remediations": [{"resource": {"apiVersion": SNR_API, "kind": "SelfNodeRemediation", "namespace": MEDIK8S, "name": "n-flight"}, "started": at(10).to_string(), "templateName": "selfnoderemediation"}]},
            {"name": "n-seen", "remediations": [{"resource": {"apiVersion": SNR_API, "kind": "SelfNodeRemediation", "namespace": MEDIK8S, "name": "n-seen", "uid": "u"}, "started": at(10).to_string()}]},
            {"name": "n-gave-up", "remediations": [{"resource": {"apiVersion": SNR_API, "kind": "SelfNodeRemediation", "namespace": MEDIK8S, "name": ""}, "started": at(10).to_string(), "timedOut": at(20).to_string()}]},
        ]}))
        .expect("status"),
    );
    let mut wrong_uid = nhc_object("SelfNodeRemediation", "a", "n-uid", at(1));
    wrong_uid.meta.owners[0].uid = "uid-another-a".into();
    let mut no_annotation = nhc_object("SelfNodeRemediation", "a", "n-anon", at(1));
    no_annotation.meta.annotations.clear();
    let rows: Vec<(&str, &NodeHealthCheck, Vec<RemediationView>, Vec<Claim>)> = vec![
        (
            "an object it owns holds its node-name annotation's Node, since its creation",
            &me,
            vec![nhc_object("SelfNodeRemediation", "a", "n1", at(5))],
            vec![claim(Target::local_node("n1"), nref("a"), Some(at(5)))],
        ),
        (
            "an object being deleted still holds (its remediator is at work)",
            &me,
            vec![{
                let mut o = nhc_object("SelfNodeRemediation", "a", "n1", at(5));
                o.meta.deleting = true;
                o
            }],
            vec![claim(Target::local_node("n1"), nref("a"), Some(at(5)))],
        ),
        (
            "an object it gave up on (nhc-timed-out) holds nothing",
            &me,
            vec![timed_out(nhc_object("SelfNodeRemediation", "a", "n1", at(5)))],
            vec![],
        ),
        (
            "another check's object, a same-named check of another uid, an object without node: nothing",
            &me,
            vec![nhc_object("FenceAgentsRemediation", "b", "n1", at(5)), wrong_uid, no_annotation],
            vec![],
        ),
        (
            "status: only an in-flight request (no uid, not timed out) holds, since it started",
            &with_status,
            vec![],
            vec![claim(Target::local_node("n-flight"), nref("a"), Some(at(10)))],
        ),
    ];
    for (what, check, objects, want) in rows {
        let refs: Vec<&RemediationView> = objects.iter().collect();
        assert_eq!(nhc_claims(check, &refs), want, "{what}");
    }
}

/// A Machine of the MachineHealthCheck fixtures with Node `node` (same name), as a view.
fn mview(m: support::MachineJson) -> MachineView {
    m.view()
}

#[test]
fn mhc_claims_table() {
    let owner_mhc = mhc(mhc_spec(), &[], None);
    let owner_policy = mhc_policy(&owner_mhc);
    let mut template_spec = mhc_spec();
    template_spec["remediationTemplate"] = support::template_ref_json();
    let template_mhc = mhc(template_spec, &[], None);
    let template_policy = mhc_policy(&template_mhc);
    let asked = machine("m1").node("n1").new_condition("OwnerRemediated", "False", at(7));
    /// (what, with a template?, Machines, Machines with an object, claims wanted)
    type Row = (&'static str, bool, Vec<MachineView>, Vec<support::MachineJson>, Vec<Claim>);
    let rows: Vec<Row> = vec![
        (
            "owner remediation requested: the Machine's Node is held, since the request",
            false,
            vec![mview(asked.clone())],
            vec![],
            vec![claim(Target::Node { cluster: "ns/c1".into(), name: "n1".into() }, mref(), Some(at(7)))],
        ),
        (
            "OwnerRemediated=True, or a Machine the check does not select: nothing",
            false,
            vec![
                mview(machine("m1").node("n1").new_condition("OwnerRemediated", "True", at(7))),
                mview(asked.clone().label("pool", "other")),
            ],
            vec![],
            vec![],
        ),
        (
            "a Machine without a Node is held as itself",
            false,
            vec![mview(machine("m2").new_condition("OwnerRemediated", "False", at(8)))],
            vec![],
            vec![claim(Target::Machine { namespace: MNS.into(), name: "m2".into() }, mref(), Some(at(8)))],
        ),
        (
            "template: its object (named after and owned by the Machine) holds the Node",
            true,
            vec![mview(machine("m1").node("n1"))],
            vec![machine("m1")],
            vec![claim(Target::Node { cluster: "ns/c1".into(), name: "n1".into() }, mref(), None)],
        ),
        (
            "template: a stale ExternallyRemediated=False on a healthy Machine holds nothing",
            true,
            vec![mview(machine("m1").node("n1").new_condition("HealthCheckSucceeded", "True", at(3)).new_condition(
                "ExternallyRemediated",
                "False",
                at(4),
            ))],
            vec![],
            vec![],
        ),
    ];
    for (what, with_template, machines, objects_for, want) in rows {
        let (check, policy) =
            if with_template { (&template_mhc, &template_policy) } else { (&owner_mhc, &owner_policy) };
        let objects = support::remediation_map(
            objects_for
                .iter()
                .map(|m| support::remediation_json(MNS, &m.view().meta.name, "Machine", &m.view().meta.name)),
        );
        let refs: Vec<&MachineView> = machines.iter().collect();
        // One lookup per template of the check (none for the owner's).
        let lookups: Vec<&dyn vigil_engine::Lookup<RemediationView>> =
            if with_template { vec![&objects] } else { Vec::new() };
        assert_eq!(mhc_claims(check, policy, "ns/c1", &refs, &lookups), want, "{what}");
    }
}

#[test]
fn an_external_request_in_flight_holds_the_node() {
    // The engine's own write: decide once, apply the Machine conditions, and the request holds
    // the Node before its object is seen.
    let mut world = support::MhcWorld::new().with_template().machine_with_node(machine("m1"), "False", t0());
    let plan = world.decide(at(301));
    assert_eq!(support::created_names(&plan), ["m1"]);
    world.apply(&plan);
    world.remediations.clear(); // the create was lost, or is not seen yet
    let check = world.check();
    let views = world.machine_views();
    let refs: Vec<&MachineView> = views.iter().collect();
    let claims = mhc_claims(&check, &mhc_policy(&check), LOCAL_CLUSTER, &refs, &[&world.remediations]);
    assert_eq!(claims, [claim(Target::local_node("m1"), mref(), Some(at(301)))]);
}

#[test]
fn holders_pick_the_earliest_start_then_the_name_and_report_ties() {
    let n = Target::local_node("n1");
    let rows: Vec<(&str, Vec<Claim>, Holder)> = vec![
        (
            "the earliest start wins",
            vec![claim(n.clone(), nref("a"), Some(at(9))), claim(n.clone(), nref("b"), Some(at(3)))],
            Holder { check: nref("b"), since: Some(at(3)), also: vec![nref("a")] },
        ),
        (
            "same start: the smaller identity (MachineHealthCheck before NodeHealthCheck, then name)",
            vec![
                claim(n.clone(), nref("b"), Some(at(3))),
                claim(n.clone(), nref("a"), Some(at(3))),
                claim(n.clone(), mref(), Some(at(3))),
            ],
            Holder { check: mref(), since: Some(at(3)), also: vec![nref("a"), nref("b")] },
        ),
        (
            "a known start wins over an unknown one",
            vec![claim(n.clone(), nref("a"), None), claim(n.clone(), nref("b"), Some(at(50)))],
            Holder { check: nref("b"), since: Some(at(50)), also: vec![nref("a")] },
        ),
        (
            "one check's claims count once, from its earliest",
            vec![claim(n.clone(), nref("a"), Some(at(9))), claim(n.clone(), nref("a"), Some(at(2)))],
            Holder { check: nref("a"), since: Some(at(2)), also: vec![] },
        ),
    ];
    for (what, claims, want) in rows {
        let holders = Holders::from_claims(claims);
        assert_eq!(holders.holder(&n), Some(&want), "{what}");
        assert_eq!(holders.ties().count(), usize::from(!want.also.is_empty()), "{what}");
        assert_eq!(holders.holder(&Target::local_node("n2")), None, "{what}");
    }
    // A Node of a workload cluster is not the local Node of the same name.
    let h = Holders::from_claims([claim(Target::Node { cluster: "ns/c1".into(), name: "n1".into() }, mref(), None)]);
    assert_eq!(h.holder(&n), None);
}

// ---------------------------------------------------------------- the skip rule, NodeHealthCheck

fn waiting_condition(status: &NodeHealthCheckStatus) -> Option<(String, String, String)> {
    get_condition(&status.conditions, WAITING_FOR_OTHER_CHECK)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[test]
fn nhc_skip_rule_table() {
    let a = nhc("a", "SelfNodeRemediation", "5m");
    let b = nhc("b", "FenceAgentsRemediation", "5m");
    let sick = || vec![node("n1", "False", t0()), node("n2", "True", t0())];
    let now = at(301);
    /// (what, objects, who decides, creates, skip notices, holders told)
    type Row<'c> = (&'static str, Vec<RemediationView>, &'c NodeHealthCheck, Vec<&'static str>, usize, Vec<CheckRef>);
    let rows: Vec<Row<'_>> = vec![
        ("nobody holds n1: b starts", vec![], &b, vec!["n1"], 0, vec![]),
        (
            "a holds n1: b waits, says so, and a is told",
            vec![nhc_object("SelfNodeRemediation", "a", "n1", at(100))],
            &b,
            vec![],
            1,
            vec![nref("a")],
        ),
        (
            "a gave up on n1 (timed out): b starts at once",
            vec![timed_out(nhc_object("SelfNodeRemediation", "a", "n1", at(100)))],
            &b,
            vec!["n1"],
            0,
            vec![],
        ),
        (
            "a holds another Node: b starts on n1",
            vec![nhc_object("SelfNodeRemediation", "a", "n2", at(100))],
            &b,
            vec!["n1"],
            0,
            vec![],
        ),
    ];
    for (what, objects, who, want_creates, want_skips, want_told) in rows {
        let holders = holders_of(&[&a, &b], &objects);
        let plan = decide_nhc(who, &sick(), &objects, &holders, now);
        assert_eq!(creates(&plan), want_creates, "{what}");
        let skipped = skips(&plan);
        assert_eq!(skipped.len(), want_skips, "{what}: {skipped:?}");
        assert_eq!(plan.held_elsewhere.iter().map(|h| h.holder.clone()).collect::<Vec<_>>(), want_told, "{what}");
        if want_skips == 1 {
            let message = "node n1 is being remediated by NodeHealthCheck/a; NodeHealthCheck/b waits";
            assert_eq!(skipped[0], ("n1".to_string(), REASON_HELD.to_string(), message.to_string()), "{what}");
            assert_eq!(plan.held_elsewhere[0].message, message, "{what}");
            assert_eq!(plan.held_elsewhere[0].waiter, nref("b"), "{what}");
            assert_eq!(
                waiting_condition(&plan.status),
                Some(("True".into(), REASON_HELD.into(), "node n1 is being remediated by NodeHealthCheck/a".into())),
                "{what}"
            );
            let entry = plan.status.unhealthy_nodes.iter().find(|e| e.name == "n1").expect("listed");
            assert!(entry.remediations.is_empty(), "{what}: waits with nothing started");
        } else {
            assert_eq!(waiting_condition(&plan.status), None, "{what}: a check that never waited shows nothing");
        }
    }
}

#[test]
fn a_waiting_nhc_is_told_once_then_takes_over_when_the_holder_lets_go() {
    let a = nhc("a", "SelfNodeRemediation", "5m");
    let mut b = nhc("b", "FenceAgentsRemediation", "5m");
    let nodes = vec![node("n1", "False", t0())];
    let mut objects = vec![nhc_object("SelfNodeRemediation", "a", "n1", at(100))];

    let first = decide_nhc(&b, &nodes, &objects, &holders_of(&[&a, &b], &objects), at(301));
    assert_eq!((creates(&first).len(), skips(&first).len(), first.held_elsewhere.len()), (0, 1, 1));
    b.status = Some(first.status.clone());

    // Decided again on the same state: still waiting, nothing new to tell anyone.
    let again = decide_nhc(&b, &nodes, &objects, &holders_of(&[&a, &b], &objects), at(400));
    assert_eq!((creates(&again).len(), skips(&again).len(), again.held_elsewhere.len()), (0, 0, 0));
    assert_eq!(again.status.conditions, first.status.conditions);
    b.status = Some(again.status.clone());

    // The holder gives up: b starts right away (its 5m ran long ago; the wait restarts no timer).
    objects = vec![timed_out(objects.remove(0))];
    let take_over = decide_nhc(&b, &nodes, &objects, &holders_of(&[&a, &b], &objects), at(500));
    assert_eq!(creates(&take_over), ["n1"]);
    assert_eq!(
        waiting_condition(&take_over.status),
        Some(("False".into(), "NoTargetWaiting".into(), "No target of this check is held by another check".into()))
    );
}

#[test]
fn escalation_of_a_node_the_check_already_holds_is_unaffected() {
    // Two checks hold n1 already (from before this rule): a is the holder (older), b escalates
    // its own remediation all the same; nothing is deleted to resolve the tie.
    let a = nhc("a", "SelfNodeRemediation", "5m");
    let b: NodeHealthCheck = serde_json::from_value(json!({
        "apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck",
        "metadata": {"name": "b", "uid": "uid-b", "generation": 1},
        "spec": {
            "selector": {"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]},
            "maxUnhealthy": "100%",
            "unhealthyConditions": [{"type": "Ready", "status": "False", "duration": "5m"}],
            "escalatingRemediations": [
                {"remediationTemplate": {"apiVersion": FAR_API, "kind": "FenceAgentsRemediationTemplate", "name": "fenceagentsremediation", "namespace": MEDIK8S}, "order": 1, "timeout": "5m"},
                {"remediationTemplate": {"apiVersion": SNR_API, "kind": "SelfNodeRemediationTemplate", "name": "selfnoderemediation", "namespace": MEDIK8S}, "order": 2, "timeout": "5m"},
            ],
        },
    }))
    .expect("check");
    let nodes = vec![node("n1", "False", t0())];
    let objects = vec![
        nhc_object("SelfNodeRemediation", "a", "n1", at(100)),
        nhc_object("FenceAgentsRemediation", "b", "n1", at(200)),
    ];
    let holders = holders_of(&[&a, &b], &objects);
    let h = holders.holder(&Target::local_node("n1")).expect("held");
    assert_eq!((h.check.clone(), h.also.clone()), (nref("a"), vec![nref("b")]));
    // b's fencing step timed out at 200s + 5m: b escalates to its next step.
    let plan = decide_nhc(&b, &nodes, &objects, &holders, at(501));
    assert_eq!(creates(&plan), ["n1"]);
    assert!(skips(&plan).is_empty());
    assert!(plan.actions.iter().all(|a| !matches!(a, Action::DeleteRemediation { .. })), "a tie deletes nothing");
}

#[test]
fn an_earlier_request_is_not_completed_while_an_older_check_holds_the_node() {
    let a = nhc("a", "SelfNodeRemediation", "5m");
    let mut b = nhc("b", "FenceAgentsRemediation", "5m");
    b.status = Some(
        serde_json::from_value(json!({"unhealthyNodes": [{"name": "n1", "remediations": [
            {"resource": {"apiVersion": FAR_API, "kind": "FenceAgentsRemediation", "namespace": MEDIK8S, "name": "n1"}, "started": at(200).to_string(), "templateName": "fenceagentsremediation"}
        ]}]}))
        .expect("status"),
    );
    let nodes = vec![node("n1", "False", t0())];
    let objects = vec![nhc_object("SelfNodeRemediation", "a", "n1", at(100))];
    let plan = decide_nhc(&b, &nodes, &objects, &holders_of(&[&a, &b], &objects), at(301));
    assert!(creates(&plan).is_empty());
    assert_eq!(skips(&plan).len(), 1);
    // Alone, the same request is completed.
    let alone = decide_nhc(&b, &nodes, &objects, &Holders::none(), at(301));
    assert_eq!(creates(&alone), ["n1"]);
}

/// Upstream: medik8s node-healthcheck-operator, controllers/nodehealthcheck_controller_test.go,
/// "an unhealthy node lease is already taken" / "a remediation CR isn't created until lease is
/// obtained". Facts: while another holder has the Node's lease, the NHC creates no remediation
/// CR; its status lists the Node as unhealthy with no remediations, phase Enabled,
/// Disabled=False/Enabled; a Warning RemediationSkipped event says the lease is taken; once the
/// lease is free the CR is created. Vigil's lease is the other check's remediation object.
#[test]
fn upstream_an_unhealthy_node_held_elsewhere_gets_no_remediation_until_free() {
    let holder = nhc("other", "FenceAgentsRemediation", "1m");
    let check = nhc("test", "SelfNodeRemediation", "5m");
    let nodes = vec![
        node("unhealthy-worker-node-1", "False", t0()),
        node("healthy-1", "True", t0()),
        node("healthy-2", "True", t0()),
    ];
    let mut objects = vec![nhc_object("FenceAgentsRemediation", "other", "unhealthy-worker-node-1", at(61))];
    let plan = decide_nhc(&check, &nodes, &objects, &holders_of(&[&holder, &check], &objects), at(301));
    assert!(creates(&plan).is_empty(), "no remediation CR while the Node is held");
    let s = &plan.status;
    assert_eq!((s.healthy_nodes, s.observed_nodes), (2, 3));
    assert_eq!(s.unhealthy_nodes.len(), 1);
    assert_eq!(s.unhealthy_nodes[0].name, "unhealthy-worker-node-1");
    assert!(s.unhealthy_nodes[0].remediations.is_empty());
    assert_eq!(s.phase.as_deref(), Some("Enabled"));
    let disabled = get_condition(&s.conditions, "Disabled").expect("Disabled");
    assert_eq!((disabled.status.as_str(), disabled.reason.as_str()), ("False", "Enabled"));
    let skipped: Vec<_> = plan.notices.iter().filter(|n| n.kind == NoticeKind::RemediationSkipped).collect();
    assert_eq!(skipped.len(), 1);
    assert!(skipped[0].kind.is_warning(), "a Warning event, as upstream");
    // The holder lets go (upstream: the lease expires): the CR is created.
    objects.clear();
    let mut check = check;
    check.status = Some(plan.status);
    let plan = decide_nhc(&check, &nodes, &objects, &holders_of(&[&holder, &check], &objects), at(400));
    assert_eq!(creates(&plan), ["unhealthy-worker-node-1"]);
}

// ---------------------------------------------------------------- the skip rule, MachineHealthCheck

#[test]
fn mhc_skip_rule_table() {
    let nobody = Holders::none();
    let held_by_nhc = Holders::from_claims([claim(Target::local_node("m1"), nref("reboot"), Some(at(100)))]);
    let held_by_me = Holders::from_claims([claim(Target::local_node("m1"), mref(), Some(at(100)))]);
    let elsewhere =
        Holders::from_claims([claim(Target::Node { cluster: "ns/c1".into(), name: "m1".into() }, nref("x"), None)]);
    // (what, template?, holders, owner request written?, objects created, skip notices)
    let rows: Vec<(&str, bool, &Holders, bool, usize, usize)> = vec![
        ("owner: nobody holds the Node: the owner is asked", false, &nobody, true, 0, 0),
        ("owner: an NHC holds the Node: waits, nothing written", false, &held_by_nhc, false, 0, 1),
        ("owner: it holds the Node itself: asks", false, &held_by_me, true, 0, 0),
        ("owner: a Node of the same name in another cluster is another Node", false, &elsewhere, true, 0, 0),
        ("template: nobody holds the Node: the object is created", true, &nobody, false, 1, 0),
        ("template: an NHC holds the Node: waits", true, &held_by_nhc, false, 0, 1),
    ];
    for (what, template, holders, owner_asked, want_creates, want_skips) in rows {
        let mut w = support::MhcWorld::new().machine_with_node(machine("m1"), "False", t0());
        if template {
            w = w.with_template();
        }
        let plan = w.decide_among(holders, LOCAL_CLUSTER, at(301));
        let asked = support::written(&plan, "m1", "OwnerRemediated").is_some();
        assert_eq!(asked, owner_asked, "{what}");
        assert_eq!(creates(&plan).len(), want_creates, "{what}");
        assert_eq!(skips(&plan).len(), want_skips, "{what}");
        let unhealthy = support::written(&plan, "m1", "HealthCheckSucceeded").map(|(c, _)| c.status.to_string());
        assert_eq!(unhealthy.as_deref(), Some("False"), "{what}: the verdict is written either way");
        assert_eq!(
            support::written(&plan, "m1", "ExternallyRemediated").is_some(),
            template && want_skips == 0,
            "{what}"
        );
        let waiting = get_condition(&plan.status.conditions, WAITING_FOR_OTHER_CHECK);
        assert_eq!(waiting.map(|c| c.status.as_str()), (want_skips == 1).then_some("True"), "{what}");
        if want_skips == 1 {
            assert_eq!(
                skips(&plan)[0].2,
                "node m1 is being remediated by NodeHealthCheck/reboot; MachineHealthCheck/ns/mhc waits",
                "{what}"
            );
            assert_eq!(plan.held_elsewhere[0].holder, nref("reboot"), "{what}");
        }
    }
}

/// Issue 8: two overlapping MachineHealthChecks with different remediation kinds. The first
/// (owner remediation) asked the owner; the second (a template) would create a remediation
/// object for the same Machine: it waits, naming the first.
#[test]
fn a_second_mhc_with_a_template_waits_for_the_owner_remediation_of_the_first() {
    let mut owner = support::MhcWorld::new().machine_with_node(machine("m1"), "False", t0());
    let plan = owner.decide(at(301));
    owner.apply(&plan);
    let first = owner.check();

    let mut spec = mhc_spec();
    spec["remediationTemplate"] = support::template_ref_json();
    let mut second = mhc(spec, &[], None);
    second.metadata.name = Some("external".into());
    let second_policy = mhc_policy(&second);
    let views = owner.machine_views();
    let refs: Vec<&MachineView> = views.iter().collect();
    let no_objects: HashMap<String, RemediationView> = HashMap::new();
    let mut claims = mhc_claims(&first, &mhc_policy(&first), "ns/c1", &refs, &[]);
    claims.extend(mhc_claims(&second, &second_policy, "ns/c1", &refs, &[&no_objects]));
    let holders = Holders::from_claims(claims);
    let template = support::template(MNS);
    let cluster_view = ClusterView::read(&cluster().json()).expect("cluster");
    let input = MhcInput {
        check: &second,
        policy: &second_policy,
        cluster: Some(&cluster_view),
        machines: &refs,
        machines_selected: false,
        nodes: NodeSource::Reachable(&owner.nodes),
        templates: &[Some(&template)],
        remediations: &[&no_objects],
    };
    let plan = machine::decide_among(&input, &holders, "ns/c1", at(302));
    assert!(creates(&plan).is_empty(), "no second remediation of m1");
    assert_eq!(
        skips(&plan),
        [(
            "ns/m1".to_string(),
            REASON_HELD.to_string(),
            "node m1 of cluster ns/c1 is being remediated by MachineHealthCheck/ns/mhc; MachineHealthCheck/ns/external waits"
                .to_string()
        )]
    );
}

// ---------------------------------------------------------------- the invariant

/// One overlapping world: Nodes `n0..`, NodeHealthChecks (SNR or FAR, various durations) and
/// optionally an owner-remediating MachineHealthCheck of the self-hosted cluster whose Machines
/// are the same Nodes; objects that already exist (possibly given up on).
#[derive(Debug, Clone)]
struct Overlap {
    /// Per Node: `Ready=False` since this many seconds before now, or healthy.
    sick_for: Vec<Option<i64>>,
    /// Per NHC: remediator kind and unhealthy duration in seconds.
    nhcs: Vec<(bool, i64)>,
    /// Whether an MHC is there too.
    with_mhc: bool,
    /// Existing objects: (NHC index, Node index, created seconds before now, timed out).
    existing: Vec<(usize, usize, i64, bool)>,
    /// Decision order (a permutation seed).
    order_seed: u64,
}

fn overlap_strategy() -> impl Strategy<Value = Overlap> {
    (1usize..5, 1usize..4)
        .prop_flat_map(|(n_nodes, n_nhcs)| {
            (
                prop::collection::vec(prop::option::of(0i64..900), n_nodes),
                prop::collection::vec((any::<bool>(), prop::sample::select(vec![60i64, 300, 600])), n_nhcs),
                any::<bool>(),
                prop::collection::vec((0..n_nhcs, 0..n_nodes, 0i64..600, any::<bool>()), 0..4),
                any::<u64>(),
            )
        })
        .prop_map(|(sick_for, nhcs, with_mhc, existing, order_seed)| Overlap {
            sick_for,
            nhcs,
            with_mhc,
            existing,
            order_seed,
        })
}

struct Fleet {
    now: Timestamp,
    nodes: Vec<NodeView>,
    nhcs: Vec<NodeHealthCheck>,
    mhc: Option<(MachineHealthCheck, Vec<Value>)>,
    objects: Vec<RemediationView>,
}

impl Fleet {
    fn new(o: &Overlap) -> Self {
        let now = at(10_000);
        let ago = |s: i64| now - SignedDuration::from_secs(s);
        let nodes = o
            .sick_for
            .iter()
            .enumerate()
            .map(|(i, s)| match s {
                Some(s) => node(&format!("n{i}"), "False", ago(*s)),
                None => node(&format!("n{i}"), "True", t0()),
            })
            .collect();
        let nhcs: Vec<NodeHealthCheck> = o
            .nhcs
            .iter()
            .enumerate()
            .map(|(i, (snr, d))| {
                nhc(
                    &format!("c{i}"),
                    if *snr { "SelfNodeRemediation" } else { "FenceAgentsRemediation" },
                    &format!("{d}s"),
                )
            })
            .collect();
        let mut objects: Vec<RemediationView> = Vec::new();
        for &(c, n, created, gave_up) in &o.existing {
            let kind = if o.nhcs[c].0 { "SelfNodeRemediation" } else { "FenceAgentsRemediation" };
            let obj = nhc_object(kind, &format!("c{c}"), &format!("n{n}"), ago(created));
            if !objects.iter().any(|x| x.meta.name == obj.meta.name && x.meta.kind == obj.meta.kind) {
                objects.push(if gave_up { timed_out(obj) } else { obj });
            }
        }
        let mhc = o.with_mhc.then(|| {
            let machines =
                (0..o.sick_for.len()).map(|i| machine(&format!("n{i}")).node(&format!("n{i}")).json()).collect();
            (mhc(mhc_spec(), &[], None), machines)
        });
        Fleet { now, nodes, nhcs, mhc, objects }
    }

    fn machine_views(&self) -> Vec<MachineView> {
        self.mhc.iter().flat_map(|(_, ms)| ms.iter().map(|m| MachineView::read(m).expect("machine"))).collect()
    }

    fn holders(&self) -> Holders {
        let refs: Vec<&RemediationView> = self.objects.iter().collect();
        let mut claims: Vec<Claim> = self.nhcs.iter().flat_map(|c| nhc_claims(c, &refs)).collect();
        if let Some((check, _)) = &self.mhc {
            let views = self.machine_views();
            let mrefs: Vec<&MachineView> = views.iter().collect();
            claims.extend(mhc_claims(check, &mhc_policy(check), LOCAL_CLUSTER, &mrefs, &[]));
        }
        Holders::from_claims(claims)
    }

    /// Decides check `i` (the MHC is index `nhcs.len()`); returns the Nodes it starts
    /// remediating (creates for a Node it did not hold, owner requests) and applies the plan.
    fn decide_and_apply(&mut self, i: usize, holders: &Holders) -> (CheckRef, Vec<String>) {
        if i < self.nhcs.len() {
            let check = self.nhcs[i].clone();
            let plan = decide_nhc(&check, &self.nodes, &self.objects, holders, self.now);
            let me = CheckRef::of_nhc(&check);
            for a in &plan.actions {
                if let Action::CreateRemediation { object, .. } = a {
                    let mut o = object.clone();
                    let name = o["metadata"]["name"].as_str().map(str::to_string).unwrap_or_else(|| "gen".into());
                    o["metadata"]["name"] = json!(format!("{name}-{}", me));
                    o["metadata"]["creationTimestamp"] = json!(self.now.to_string());
                    self.objects.push(RemediationView::read(&o).expect("object"));
                }
            }
            self.nhcs[i].status = Some(plan.status.clone());
            (me, creates(&plan))
        } else {
            let Some((check, machines)) = self.mhc.clone() else { return (mref(), vec![]) };
            let policy = mhc_policy(&check);
            let cluster_view = ClusterView::read(&cluster().json()).expect("cluster");
            let views = self.machine_views();
            let refs: Vec<&MachineView> = views.iter().collect();
            let nodes: HashMap<String, NodeView> = self.nodes.iter().map(|n| (n.name.clone(), n.clone())).collect();
            let input = MhcInput {
                check: &check,
                policy: &policy,
                cluster: Some(&cluster_view),
                machines: &refs,
                machines_selected: false,
                nodes: NodeSource::Reachable(&nodes),
                templates: &[],
                remediations: &[],
            };
            let plan = machine::decide_among(&input, holders, LOCAL_CLUSTER, self.now);
            let mut started = Vec::new();
            let mut machines = machines;
            for a in &plan.actions {
                if let Action::SetMachineConditions { machine, version, conditions } = a {
                    if conditions.iter().any(|(c, _)| c.type_ == "OwnerRemediated" && c.status == "False") {
                        started.push(machine.name.clone());
                    }
                    let m = machines
                        .iter_mut()
                        .find(|m| m["metadata"]["name"] == json!(machine.name))
                        .expect("known machine");
                    let patch = machine_status_patch(m, *version, conditions);
                    apply_merge_patch(m, &patch);
                }
            }
            let mut check = check;
            check.status = Some(plan.status.clone());
            self.mhc = Some((check, machines));
            (mref(), started)
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// For any set of overlapping checks and any observed state, decided one after another (as
    /// the controller does, each reading the writes of those before): at most one check starts
    /// remediating any one Node, and never a Node another check holds.
    #[test]
    fn one_check_starts_on_a_node_and_never_on_a_held_one(o in overlap_strategy()) {
        let mut fleet = Fleet::new(&o);
        let n_checks = fleet.nhcs.len() + usize::from(fleet.mhc.is_some());
        let mut order: Vec<usize> = (0..n_checks).collect();
        let mut seed = o.order_seed;
        for k in (1..order.len()).rev() {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            order.swap(k, (seed >> 33) as usize % (k + 1));
        }
        let mut starters: BTreeMap<String, BTreeSet<CheckRef>> = BTreeMap::new();
        for i in order {
            let holders = fleet.holders();
            let (me, created) = fleet.decide_and_apply(i, &holders);
            for node in created {
                let held = holders.holder(&Target::local_node(&node));
                // A create for a Node the check already held is its own escalation.
                if held.is_some_and(|h| h.check == me || h.also.contains(&me)) {
                    continue;
                }
                prop_assert!(held.is_none(), "{me} started {node}, held by {held:?}");
                starters.entry(node).or_default().insert(me.clone());
            }
        }
        for (node, checks) in &starters {
            prop_assert!(checks.len() <= 1, "{node} started by {checks:?}");
        }
    }

    /// On one observed state, no check's plan starts on a Node another check holds.
    #[test]
    fn no_plan_starts_on_a_node_another_check_holds(o in overlap_strategy()) {
        let fleet = Fleet::new(&o);
        let holders = fleet.holders();
        let n_checks = fleet.nhcs.len() + usize::from(fleet.mhc.is_some());
        for i in 0..n_checks {
            let mut f = Fleet { now: fleet.now, nodes: fleet.nodes.clone(), nhcs: fleet.nhcs.clone(), mhc: fleet.mhc.clone(), objects: fleet.objects.clone() };
            let (me, created) = f.decide_and_apply(i, &holders);
            for node in created {
                let held = holders.holder(&Target::local_node(&node));
                prop_assert!(
                    held.is_none_or(|h| h.check == me || h.also.contains(&me)),
                    "{me} started {node}, held by {held:?}"
                );
            }
        }
    }
}

/// With remediation per condition a MachineHealthCheck holds the Node of a Machine its rule's own
/// template is remediating (the object, or the request before it is seen), as it holds one its
/// own template or its owner remediates, so an NHC selecting the same Node waits.
#[test]
fn a_rules_own_remediation_holds_the_node() {
    let mut world = support::MhcWorld::new()
        .spec(
            "unhealthyConditions",
            json!([
                {"type": "Ready", "status": "False", "timeout": "300s", "remediationTemplate": support::template_ref_json()},
                {"type": "Ready", "status": "Unknown", "timeout": "300s"},
            ]),
        )
        .machine_with_node(machine("m1"), "False", t0());
    world.template = Some(support::template(MNS));
    let plan = world.decide(at(301));
    assert_eq!(support::created_names(&plan), ["m1"]);
    world.apply(&plan);
    let check = world.check();
    let policy = mhc_policy(&check);
    let views = world.machine_views();
    let refs: Vec<&MachineView> = views.iter().collect();
    let (_, maps) = world.sources(&policy);
    let lookups = support::lookups(&maps);
    let claims = mhc_claims(&check, &policy, LOCAL_CLUSTER, &refs, &lookups);
    // (the fixture's API server sets no creationTimestamp: the start is unknown)
    assert_eq!(claims, [claim(Target::local_node("m1"), mref(), None)], "the object holds it");
    world.remediations.clear(); // the create was lost, or is not seen yet
    let (_, maps) = world.sources(&policy);
    let lookups = support::lookups(&maps);
    let claims = mhc_claims(&check, &policy, LOCAL_CLUSTER, &refs, &lookups);
    assert_eq!(claims, [claim(Target::local_node("m1"), mref(), Some(at(301)))], "the request holds it");
}

// ---------------------------------------------------------------- checks in different shards

/// Holders of `held` with the cross-shard rule applied to n1, which checks `a` and `b` select,
/// `a` in shard `a_shard` and `b` in `b_shard`, among `shards` shards.
fn across_shards(shards: u32, a_shard: u32, b_shard: u32, held: Holders) -> Holders {
    let selecting = vec![(nref("b"), b_shard), (nref("a"), a_shard)];
    let selections = BTreeMap::from([(Target::local_node("n1"), selecting)]);
    vigil_engine::cross_shard::leave_to_first(held, shards, &selections)
}

#[test]
fn cross_shard_rule_table() {
    let a = nhc("a", "SelfNodeRemediation", "5m");
    let b = nhc("b", "FenceAgentsRemediation", "5m");
    let sick = || vec![node("n1", "False", t0()), node("n2", "True", t0())];
    let now = at(301);
    let left = "node n1 is left to NodeHealthCheck/a, the first of the checks in different shards selecting it; \
                NodeHealthCheck/b waits";
    let started = "node n1 is being remediated by NodeHealthCheck/a; NodeHealthCheck/b waits";
    let a_object = || vec![nhc_object("SelfNodeRemediation", "a", "n1", at(100))];
    /// (what, shards, a's shard, b's shard, objects, a creates, b creates, b's skip message)
    type Row = (&'static str, u32, u32, u32, Vec<RemediationView>, bool, bool, Option<&'static str>);
    let rows: Vec<Row> = vec![
        ("different shards: a, first by name, starts; b waits and says so", 6, 0, 1, vec![], true, false, Some(left)),
        ("the order is the checks', whatever the shard numbers", 6, 5, 1, vec![], true, false, Some(left)),
        ("a started: b waits for its remediation, as unsharded", 6, 0, 1, a_object(), false, false, Some(started)),
        ("same shard: first come, by claims (nobody holds n1: either may start)", 6, 2, 2, vec![], true, true, None),
        ("one shard: unchanged", 1, 0, 0, vec![], true, true, None),
    ];
    for (what, shards, a_shard, b_shard, objects, a_creates, b_creates, b_skip) in rows {
        let holders = across_shards(shards, a_shard, b_shard, holders_of(&[&a, &b], &objects));
        let plan_a = decide_nhc(&a, &sick(), &objects, &holders, now);
        assert_eq!(creates(&plan_a) == ["n1"], a_creates, "{what}: a");
        assert!(skips(&plan_a).is_empty(), "{what}: a waits for nobody: {:?}", skips(&plan_a));
        let plan_b = decide_nhc(&b, &sick(), &objects, &holders, now);
        assert_eq!(creates(&plan_b) == ["n1"], b_creates, "{what}: b");
        let messages: Vec<String> = skips(&plan_b).into_iter().map(|(_, reason, m)| format!("{reason}: {m}")).collect();
        assert_eq!(messages, b_skip.map(|m| format!("{REASON_HELD}: {m}")).into_iter().collect::<Vec<_>>(), "{what}");
        let waiting = get_condition(&plan_b.status.conditions, WAITING_FOR_OTHER_CHECK);
        assert_eq!(
            waiting.map(|c| (c.status.as_str(), c.reason.as_str())),
            b_skip.map(|_| ("True", REASON_HELD)),
            "{what}"
        );
        let told: Vec<&CheckRef> = plan_b.held_elsewhere.iter().map(|h| &h.holder).collect();
        assert_eq!(told, b_skip.map(|_| nref("a")).iter().collect::<Vec<_>>(), "{what}: the holder is told");
        // With one shard, or within a shard, the rule leaves the holders as the claims say.
        if shards == 1 || a_shard == b_shard {
            assert_eq!(holders, holders_of(&[&a, &b], &objects), "{what}");
        }
    }
}

/// A MachineHealthCheck of the self-hosted cluster and a NodeHealthCheck in another shard select
/// the same Node: the MachineHealthCheck ranks first (`CheckRef` order), asks the owner, and the
/// NodeHealthCheck waits for it.
#[test]
fn cross_shard_a_self_hosted_machine_check_and_a_node_check_start_once() {
    let selections = BTreeMap::from([(Target::local_node("m1"), vec![(nref("reboot"), 1), (mref(), 4)])]);
    let holders = vigil_engine::cross_shard::leave_to_first(Holders::none(), 6, &selections);
    let w = support::MhcWorld::new().machine_with_node(machine("m1"), "False", t0());
    let plan = w.decide_among(&holders, LOCAL_CLUSTER, at(301));
    assert!(support::written(&plan, "m1", "OwnerRemediated").is_some(), "the MachineHealthCheck asks the owner");
    assert!(skips(&plan).is_empty(), "{:?}", skips(&plan));
    let reboot = nhc("reboot", "SelfNodeRemediation", "5m");
    let plan = decide_nhc(&reboot, &[node("m1", "False", t0())], &[], &holders, at(301));
    assert!(creates(&plan).is_empty(), "the NodeHealthCheck does not start");
    assert_eq!(
        skips(&plan).into_iter().map(|s| s.2).collect::<Vec<_>>(),
        ["node m1 is left to MachineHealthCheck/ns/mhc, the first of the checks in different shards selecting it; \
          NodeHealthCheck/reboot waits"]
    );
}
