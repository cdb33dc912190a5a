//! What a NodeHealthCheck reads around its Nodes: medik8s' node Leases (taken before a Node is
//! remediated, honoured while another holder has one, renewed, given up when overdue,
//! released), planned maintenance, the cluster upgrade pause, and remediation objects that are
//! being deleted while their remediator finishes. Each scenario runs the pure decision over
//! time in a small world that applies its plans as an API server would (Lease writes against
//! their version, finalizers holding deleted objects).

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};
use vigil_api::NodeHealthCheck;
use vigil_api::conditions::get_condition;
use vigil_api::node_health_check::NodeHealthCheckStatus;
use vigil_api::views::{ClusterVersionView, LeaseView, MaintenanceView, NodeView, RemediationView, TemplateView};
use vigil_engine::lookup::Observed;
use vigil_engine::node::{Around, NhcInput, decide};
use vigil_engine::plan::LeaseWrite;
use vigil_engine::{Action, NoticeKind, Plan};

const SNR_API: &str = "self-node-remediation.medik8s.io/v1alpha1";
const FAR_API: &str = "fence-agents-remediation.medik8s.io/v1alpha1";
const NS: &str = "medik8s";
const LEASES: &str = "medik8s-leases";
const ME: &str = "NodeHealthCheck-nhc";

fn t0() -> Timestamp {
    "2030-01-01T00:00:00Z".parse().expect("timestamp")
}

fn at(secs: i64) -> Timestamp {
    t0() + SignedDuration::from_secs(secs)
}

fn ns1(t: Timestamp) -> Timestamp {
    t + SignedDuration::from_nanos(1)
}

/// A worker Node; `ready` is its Ready status since t0.
fn node(name: &str, ready: &str) -> Value {
    json!({"metadata": {"name": name, "uid": format!("uid-{name}"), "labels": {}, "annotations": {}},
           "spec": {},
           "status": {"conditions": [{"type": "Ready", "status": ready, "lastTransitionTime": t0().to_string()}]}})
}

fn view_of(v: &Value) -> NodeView {
    NodeView::from(serde_json::from_value::<Node>(v.clone()).expect("node"))
}

fn snr_ref() -> Value {
    json!({"apiVersion": SNR_API, "kind": "SelfNodeRemediationTemplate", "name": "snr", "namespace": NS})
}

fn far_ref() -> Value {
    json!({"apiVersion": FAR_API, "kind": "FenceAgentsRemediationTemplate", "name": "far", "namespace": NS})
}

fn spec(extra: Value) -> Value {
    let mut s = json!({
        "selector": {"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]},
        "minHealthy": "51%",
        "remediationTemplate": snr_ref(),
    });
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        if k == "escalatingRemediations" {
            s.as_object_mut().expect("object").remove("remediationTemplate");
        }
        s[k] = v;
    }
    s
}

fn escalating() -> Value {
    spec(json!({"escalatingRemediations": [
        {"remediationTemplate": snr_ref(), "order": 1, "timeout": "5m"},
        {"remediationTemplate": far_ref(), "order": 2, "timeout": "10m"},
    ]}))
}

/// The cluster as an API server keeps it, and a decision of the check over it.
struct World {
    check: NodeHealthCheck,
    nodes: Vec<Value>,
    templates: Vec<Option<TemplateView>>,
    objects: Vec<Value>,
    leases: Vec<Value>,
    maintenances: Vec<MaintenanceView>,
    versions: Option<Vec<ClusterVersionView>>,
    /// Whether the NodeMaintenances can be read.
    maintenances_known: bool,
    /// Deleted objects keep a finalizer (their remediator finishing) until released.
    finalizers: bool,
    rv: u64,
}

fn world(spec: Value, nodes: Vec<Value>) -> World {
    let check: NodeHealthCheck = serde_json::from_value(json!({
        "apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck",
        "metadata": {"name": "nhc", "uid": "nhc-uid", "generation": 1},
        "spec": spec,
    }))
    .expect("check");
    let policy = vigil_api::validate::node_health_check(&check).expect("valid");
    let templates = policy
        .all_steps()
        .map(|s| {
            TemplateView::read(&json!({
                "apiVersion": s.template.api_version, "kind": s.template.kind,
                "metadata": {"name": s.template.name, "namespace": NS},
                "spec": {"template": {"spec": {}}}
            }))
        })
        .collect();
    World {
        check,
        nodes,
        templates,
        objects: Vec::new(),
        leases: Vec::new(),
        maintenances: Vec::new(),
        versions: None,
        maintenances_known: true,
        finalizers: false,
        rv: 100,
    }
}

impl World {
    fn decide(&self, now: Timestamp) -> Plan<NodeHealthCheckStatus> {
        let policy = vigil_api::validate::node_health_check(&self.check).expect("valid");
        let mut nodes: Vec<NodeView> = self.nodes.iter().map(view_of).collect();
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        let node_refs: Vec<&NodeView> = nodes.iter().collect();
        let templates: Vec<Option<&TemplateView>> = self.templates.iter().map(Option::as_ref).collect();
        let objects: Vec<RemediationView> = self.objects.iter().filter_map(RemediationView::read).collect();
        let object_refs: Vec<&RemediationView> = objects.iter().collect();
        let leases: Vec<LeaseView> = self.leases.iter().filter_map(LeaseView::read).collect();
        let lease_refs: Vec<&LeaseView> = leases.iter().collect();
        let maintenance_refs: Vec<&MaintenanceView> = self.maintenances.iter().collect();
        let version_refs: Vec<&ClusterVersionView> = self.versions.iter().flatten().collect();
        let input = NhcInput {
            check: &self.check,
            policy: &policy,
            nodes: &node_refs,
            templates: &templates,
            remediations: &object_refs,
            around: Around {
                leases: &lease_refs,
                lease_namespace: LEASES,
                maintenances: match self.maintenances_known {
                    true => Observed::Known(&maintenance_refs),
                    false => Observed::Unknown("the watch of NodeMaintenances failed"),
                },
                cluster_versions: match &self.versions {
                    Some(_) => Observed::Known(&version_refs),
                    None => Observed::NotServed,
                },
                machines: Observed::NotServed,
            },
        };
        decide(&input, now)
    }

    fn next_rv(&mut self) -> String {
        self.rv += 1;
        self.rv.to_string()
    }

    /// Takes a Lease as the API server lets a writer: a create only when there is none, an
    /// update only of the version read. `false` when refused.
    fn write_lease(&mut self, l: &LeaseWrite) -> bool {
        let current = self.leases.iter().position(|x| x["metadata"]["name"] == l.name.as_str());
        let rv_now = current.map(|i| self.leases[i]["metadata"]["resourceVersion"].as_str().unwrap_or("").to_string());
        let ok = match (&l.resource_version, &rv_now) {
            (None, None) => true,
            (Some(want), Some(have)) => want == have,
            _ => false,
        };
        if !ok {
            return false;
        }
        let mut m = l.manifest();
        m["metadata"]["resourceVersion"] = json!(self.next_rv());
        m["metadata"]["uid"] = json!(format!("uid-{}", l.name));
        match current {
            Some(i) => self.leases[i] = m,
            None => self.leases.push(m),
        }
        true
    }

    fn apply(&mut self, plan: &Plan<NodeHealthCheckStatus>, now: Timestamp) {
        for a in &plan.actions {
            match a {
                Action::CreateRemediation { object, lease, .. } => {
                    if let Some(l) = lease
                        && !self.write_lease(l)
                    {
                        continue;
                    }
                    let mut o = object.clone();
                    let name = o["metadata"]["name"].as_str().expect("a fixed name").to_string();
                    o["metadata"]["uid"] = json!(format!("uid-{name}-{}", self.rv));
                    o["metadata"]["creationTimestamp"] = json!(now.to_string());
                    if self.finalizers {
                        o["metadata"]["finalizers"] = json!(["remediator/finalizer"]);
                    }
                    if !self.objects.iter().any(|x| x["metadata"]["name"] == name.as_str() && x["kind"] == o["kind"]) {
                        self.objects.push(o);
                    }
                }
                Action::DeleteRemediation { object, .. } => {
                    let finalizers = self.finalizers;
                    self.objects.retain_mut(|x| {
                        if x["metadata"]["name"] != object.name.as_str() || x["kind"] != object.kind.as_str() {
                            return true;
                        }
                        x["metadata"]["deletionTimestamp"] = json!(now.to_string());
                        finalizers
                    });
                }
                Action::AnnotateRemediation { object, key, value, .. } => {
                    for x in self.objects.iter_mut().filter(|x| x["metadata"]["name"] == object.name.as_str()) {
                        x["metadata"]["annotations"][key] = json!(value);
                    }
                }
                Action::WriteLease(l) => {
                    assert!(self.write_lease(l), "a renewal is made against the version read: {l:?}");
                }
                Action::DeleteLease { lease, uid, resource_version, .. } => {
                    self.leases.retain(|x| {
                        !(x["metadata"]["name"] == lease.name.as_str()
                            && x["metadata"]["uid"].as_str() == uid.as_deref()
                            && x["metadata"]["resourceVersion"].as_str() == resource_version.as_deref())
                    });
                }
                Action::SetMachineConditions { .. } => panic!("not a NodeHealthCheck action"),
            }
        }
        self.check.status = Some(plan.status.clone());
    }

    fn step(&mut self, now: Timestamp) -> Plan<NodeHealthCheckStatus> {
        let plan = self.decide(now);
        self.apply(&plan, now);
        plan
    }

    /// The remediator lets go of every object being deleted.
    fn finish_deletions(&mut self) {
        self.objects.retain(|x| x["metadata"].get("deletionTimestamp").is_none());
    }

    fn set_ready(&mut self, name: &str, ready: &str, since: Timestamp) {
        for n in self.nodes.iter_mut().filter(|n| n["metadata"]["name"] == name) {
            n["status"]["conditions"] =
                json!([{"type": "Ready", "status": ready, "lastTransitionTime": since.to_string()}]);
        }
    }

    fn edit_node(&mut self, name: &str, edit: impl FnOnce(&mut Value)) {
        if let Some(n) = self.nodes.iter_mut().find(|n| n["metadata"]["name"] == name) {
            edit(n);
        }
    }

    fn lease(&self, node: &str) -> Option<LeaseView> {
        self.leases.iter().filter_map(LeaseView::read).find(|l| l.meta.name == format!("node-{node}"))
    }
}

/// A Lease another component holds on `node`.
fn foreign_lease(node: &str, holder: &str, renew: Timestamp, seconds: i64) -> Value {
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
           "metadata": {"name": format!("node-{node}"), "namespace": LEASES, "uid": "foreign-uid", "resourceVersion": "7",
                        "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": format!("uid-{node}")}]},
           "spec": {"holderIdentity": holder, "leaseDurationSeconds": seconds,
                    "acquireTime": renew.to_string(), "renewTime": renew.to_string(), "leaseTransitions": 4}})
}

fn created(plan: &Plan<NodeHealthCheckStatus>) -> Vec<(String, String)> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            Action::CreateRemediation { object, target, .. } => {
                Some((object["kind"].as_str().unwrap_or("").into(), target.key()))
            }
            _ => None,
        })
        .collect()
}

fn notices(plan: &Plan<NodeHealthCheckStatus>) -> Vec<(NoticeKind, String, String)> {
    plan.notices.iter().map(|n| (n.kind, n.target_key().unwrap_or_default(), n.reason.as_str().to_string())).collect()
}

fn waiting(plan: &Plan<NodeHealthCheckStatus>, node: &str) -> Option<(String, String)> {
    plan.status
        .unhealthy_nodes
        .iter()
        .find(|u| u.name == node)
        .and_then(|u| u.waiting.as_ref())
        .map(|w| (w.reason.clone(), w.message.clone()))
}

fn five_workers(sick: &[&str]) -> Vec<Value> {
    ["w1", "w2", "w3", "w4", "w5"].iter().map(|n| node(n, if sick.contains(n) { "False" } else { "True" })).collect()
}

// ---------------------------------------------------------------- node Leases

#[test]
fn a_node_whose_lease_another_holder_has_is_not_remediated_until_it_runs_out() {
    let mut w = world(spec(json!({})), five_workers(&["w1"]));
    // The node maintenance operator took w1's Lease at 4m for an hour.
    w.leases.push(foreign_lease("w1", "node-maintenance", at(240), 3600));
    let plan = w.step(at(301));
    assert_eq!(created(&plan), vec![], "never while another holder has the Lease");
    let (reason, message) = waiting(&plan, "w1").expect("the status says why");
    assert_eq!(reason, "NodeLeaseHeld");
    assert!(
        message.contains("Lease medik8s-leases/node-w1 is held by node-maintenance until 2030-01-01T01:04:00Z"),
        "{message}"
    );
    assert!(notices(&plan).contains(&(NoticeKind::RemediationSkipped, "w1".into(), "NodeLeaseHeld".into())));
    assert_eq!(plan.next_wake, Some(ns1(at(240 + 3600))), "woken when the Lease runs out");
    // Told once.
    let again = w.step(at(400));
    assert!(!notices(&again).iter().any(|(k, _, _)| *k == NoticeKind::RemediationSkipped), "{:?}", notices(&again));
    assert_eq!(waiting(&again, "w1").map(|w| w.0), Some("NodeLeaseHeld".into()));
    // Released (or run out): taken over, then remediated in the same decision.
    w.leases.clear();
    let plan = w.step(at(500));
    assert_eq!(created(&plan), vec![("SelfNodeRemediation".into(), "w1".into())]);
    let lease = w.lease("w1").expect("taken");
    assert_eq!(lease.holder.as_deref(), Some(ME));
    assert_eq!((lease.duration_seconds, lease.renew_time), (Some(660), Some(at(500))));
    assert_eq!(lease.meta.owners.first().map(|o| (o.kind.as_str(), o.name.as_str())), Some(("Node", "w1")));
    assert_eq!(waiting(&plan, "w1"), None);
}

#[test]
fn an_expired_foreign_lease_is_taken_over_against_its_version() {
    let mut w = world(spec(json!({})), five_workers(&["w1"]));
    w.leases.push(foreign_lease("w1", "node-maintenance", at(0), 60));
    let plan = w.step(at(301));
    let Some(Action::CreateRemediation { lease: Some(l), .. }) = plan.actions.first() else {
        panic!("expected a create with its Lease: {:?}", plan.actions)
    };
    assert_eq!((l.resource_version.as_deref(), l.transitions, l.acquire_time), (Some("7"), 5, at(301)));
    assert_eq!(w.lease("w1").and_then(|l| l.holder), Some(ME.into()));
    // Had anyone changed it meanwhile, the update is refused and nothing is created.
    let mut raced = world(spec(json!({})), five_workers(&["w1"]));
    raced.leases.push(foreign_lease("w1", "node-maintenance", at(0), 60));
    let plan = raced.decide(at(301));
    raced.leases[0]["metadata"]["resourceVersion"] = json!("8");
    raced.apply(&plan, at(301));
    assert!(raced.objects.is_empty(), "a lost Lease write means: do not start");
}

#[test]
fn a_held_lease_is_renewed_a_minute_before_it_runs_out_and_given_up_when_overdue() {
    let mut w = world(spec(json!({})), five_workers(&["w1"]));
    w.step(at(301));
    assert_eq!(w.lease("w1").and_then(|l| l.duration_seconds), Some(660));
    // The remediation runs (no Succeeded yet): renewed at 301 + 660 - 60.
    let plan = w.step(at(400));
    assert!(!plan.actions.iter().any(|a| matches!(a, Action::WriteLease(_))));
    assert_eq!(plan.next_wake, Some(ns1(at(301 + 600))));
    let plan = w.step(ns1(at(901)));
    assert!(plan.actions.iter().any(|a| matches!(a, Action::WriteLease(_))), "{:?}", plan.actions);
    let lease = w.lease("w1").expect("held");
    assert_eq!(lease.acquire_time, Some(at(301)), "a renewal keeps the acquire time");
    // Overdue three step durations (10m without escalation) after it was taken: the step is
    // given up (nhc-timed-out), the Lease released.
    let overdue = at(301 + 1800);
    w.step(overdue);
    let plan = w.step(ns1(overdue));
    assert!(
        plan.actions.iter().any(|a| matches!(a, Action::DeleteLease { node, .. } if node == "w1")),
        "{:?}",
        plan.actions
    );
    assert!(plan.actions.iter().any(
        |a| matches!(a, Action::AnnotateRemediation { key, .. } if key == "remediation.medik8s.io/nhc-timed-out")
    ));
    assert!(notices(&plan).contains(&(NoticeKind::RemediationTimedOut, "w1".into(), "NodeLeaseOverdue".into())));
    assert!(w.lease("w1").is_none());
}

#[test]
fn the_lease_is_released_once_the_node_needs_nothing() {
    let mut w = world(spec(json!({})), five_workers(&["w1"]));
    w.step(at(301));
    assert!(w.lease("w1").is_some());
    w.set_ready("w1", "True", at(400));
    let plan = w.step(at(401));
    assert!(plan.actions.iter().any(|a| matches!(a, Action::DeleteRemediation { .. })));
    assert!(w.lease("w1").is_some(), "kept while the object exists");
    let plan = w.step(at(402));
    assert!(plan.actions.iter().any(|a| matches!(a, Action::DeleteLease { node, .. } if node == "w1")));
    assert!(w.lease("w1").is_none());
}

#[test]
fn a_next_escalation_step_waits_for_another_holders_lease() {
    let mut w = world(escalating(), five_workers(&["w1"]));
    w.step(at(301));
    // The reboot fails; meanwhile the Lease ran out and the maintenance operator took it.
    for o in &mut w.objects {
        o["status"] = json!({"conditions": [{"type": "Succeeded", "status": "False", "lastTransitionTime": at(400).to_string()}]});
    }
    w.leases = vec![foreign_lease("w1", "node-maintenance", at(399), 3600)];
    let mut fenced = false;
    for t in [401, 402, 403] {
        fenced |= created(&w.step(at(t))).iter().any(|(k, _)| k == "FenceAgentsRemediation");
    }
    assert!(!fenced, "no fence while another holder has the Lease");
    assert_eq!(waiting(&w.decide(at(404)), "w1").map(|w| w.0), Some("NodeLeaseHeld".into()));
}

// ---------------------------------------------------------------- planned maintenance

#[test]
fn a_node_under_planned_maintenance_is_left_alone_and_for_a_grace_after() {
    let mut w = world(spec(json!({})), five_workers(&["w1"]));
    w.maintenances.push(
        MaintenanceView::read(
            &json!({"metadata": {"name": "nm-w1"}, "spec": {"nodeName": "w1", "reason": "kernel update"}}),
        )
        .expect("named"),
    );
    let plan = w.step(at(301));
    assert_eq!(created(&plan), vec![]);
    let (reason, message) = waiting(&plan, "w1").expect("says why");
    assert_eq!(reason, "NodeUnderMaintenance");
    assert!(message.contains("NodeMaintenance nm-w1 puts it in maintenance (reason: kernel update)"), "{message}");
    assert!(notices(&plan).contains(&(NoticeKind::RemediationPostponed, "w1".into(), "NodeUnderMaintenance".into())));
    // The maintenance ends; the Node is still NotReady: left alone for the 10m grace.
    w.maintenances.clear();
    let plan = w.step(at(1000));
    assert_eq!(created(&plan), vec![]);
    assert_eq!(waiting(&plan, "w1").map(|w| w.0), Some("MaintenanceGrace".into()));
    assert_eq!(plan.next_wake, Some(at(1600)));
    assert_eq!(created(&w.step(at(1599))), vec![]);
    assert_eq!(created(&w.step(at(1600))), vec![("SelfNodeRemediation".into(), "w1".into())]);
}

#[test]
fn the_signals_of_a_drain_for_maintenance() {
    let drain = |n: &mut Value| {
        n["spec"] = json!({"unschedulable": true, "taints": [{"key": "medik8s.io/drain", "effect": "NoSchedule"}]})
    };
    let kured = |n: &mut Value| {
        n["spec"] = json!({"unschedulable": true});
        n["metadata"]["annotations"]["weave.works/kured-reboot-in-progress"] = json!("2030-01-01T00:00:00Z");
    };
    let cordon_only = |n: &mut Value| n["spec"] = json!({"unschedulable": true});
    type Edit<'a> = &'a dyn Fn(&mut Value);
    let cases: [(&str, Edit<'_>, bool); 3] = [
        ("maintenance operator drain", &drain, false),
        ("kured reboot", &kured, false),
        ("a bare cordon", &cordon_only, true),
    ];
    for (what, edit, remediated) in cases {
        let mut w = world(spec(json!({})), five_workers(&["w1"]));
        w.edit_node("w1", edit);
        assert_eq!(!created(&w.step(at(301))).is_empty(), remediated, "{what}");
        // With plannedMaintenance off, only the Lease would stop it.
        let mut off = world(spec(json!({"plannedMaintenance": {"enabled": false}})), five_workers(&["w1"]));
        off.edit_node("w1", edit);
        assert!(!created(&off.step(at(301))).is_empty(), "{what}: off");
    }
}

#[test]
fn unknown_maintenance_starts_nothing_new() {
    let mut w = world(spec(json!({})), five_workers(&["w1"]));
    w.maintenances_known = false;
    let plan = w.step(at(301));
    assert_eq!(created(&plan), vec![]);
    let (reason, message) = waiting(&plan, "w1").expect("says why");
    assert_eq!(reason, "MaintenanceUnknown");
    assert!(message.contains("the watch of NodeMaintenances failed"), "{message}");
    w.maintenances_known = true;
    assert_eq!(created(&w.step(at(302))).len(), 1);
}

// ---------------------------------------------------------------- cluster upgrade

fn cluster_version(progressing: &str) -> ClusterVersionView {
    ClusterVersionView::read(&json!({
        "metadata": {"name": "version"},
        "status": {"desired": {"version": "4.19.1"}, "conditions": [
            {"type": "Progressing", "status": progressing, "lastTransitionTime": at(10).to_string(),
             "message": "Working towards 4.19.1"}]}
    }))
    .expect("named")
}

#[test]
fn nothing_new_is_remediated_while_the_cluster_upgrades() {
    let mut w = world(escalating(), five_workers(&["w1", "w2"]));
    w.versions = Some(vec![cluster_version("False")]);
    w.step(at(301)); // w1 and w2 rebooted before the upgrade
    assert_eq!(w.objects.len(), 2);
    w.versions = Some(vec![cluster_version("True")]);
    w.set_ready("w2", "True", at(350)); // w2 recovers during the upgrade
    w.nodes.push(node("w6", "False")); // w6 breaks during the upgrade
    // w1's reboot fails during the upgrade.
    for o in w.objects.iter_mut().filter(|o| o["metadata"]["name"] == "w1") {
        o["status"] = json!({"conditions": [{"type": "Succeeded", "status": "False", "lastTransitionTime": at(390).to_string()}]});
    }
    let plan = w.step(at(400));
    assert_eq!(created(&plan), vec![], "no new object: neither w6's first step nor w1's fence");
    let c = get_condition(&plan.status.conditions, "RemediationPostponed").expect("condition");
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "ClusterUpgrading"));
    assert!(c.message.contains("ClusterVersion version is Progressing=True to 4.19.1"), "{}", c.message);
    assert!(notices(&plan).contains(&(NoticeKind::RemediationPostponed, String::new(), "ClusterUpgrading".into())));
    // What is in flight goes on: w2's object goes, w1's failed reboot is given up.
    assert!(plan.actions.iter().any(|a| matches!(a, Action::DeleteRemediation { target, .. } if target.key() == "w2")));
    assert!(
        plan.actions.iter().any(|a| matches!(a, Action::AnnotateRemediation { object, .. } if object.name == "w1"))
    );
    // The upgrade ends: the fence and w6's reboot start, and it is told.
    w.versions = Some(vec![cluster_version("False")]);
    let plan = w.step(at(500));
    let mut made = created(&plan);
    made.sort();
    assert_eq!(made, vec![("FenceAgentsRemediation".into(), "w1".into()), ("SelfNodeRemediation".into(), "w6".into())]);
    let c = get_condition(&plan.status.conditions, "RemediationPostponed").expect("condition");
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "NotPostponed"));
    assert!(notices(&plan).contains(&(NoticeKind::RemediationResumed, String::new(), "NotPostponed".into())));
}

/// A ClusterVersion progressing towards `version`, saying `message`.
fn upgrading_to(version: &str, message: &str) -> ClusterVersionView {
    ClusterVersionView::read(&json!({
        "metadata": {"name": "version"},
        "status": {"desired": {"version": version}, "conditions": [
            {"type": "Progressing", "status": "True", "lastTransitionTime": at(10).to_string(), "message": message}]}
    }))
    .expect("named")
}

#[test]
fn a_new_cause_of_postponement_is_told_and_the_upgrades_progress_is_not() {
    let mut w = world(spec(json!({})), five_workers(&["w1"]));
    let told = |plan: &vigil_engine::Plan<vigil_api::NodeHealthCheckStatus>| {
        plan.notices
            .iter()
            .filter(|n| n.kind == NoticeKind::RemediationPostponed)
            .map(|n| n.message.clone())
            .collect::<Vec<_>>()
    };
    w.versions = Some(vec![upgrading_to("4.19.1", "Working towards 4.19.1: 12 of 903 done")]);
    let first = told(&w.step(at(301)));
    assert_eq!(first.len(), 1, "{first:?}");
    // Only the progress moves: the same cause, not told again (an upgrade is not an Event a minute).
    w.versions = Some(vec![upgrading_to("4.19.1", "Working towards 4.19.1: 412 of 903 done")]);
    assert_eq!(told(&w.step(at(310))), Vec::<String>::new());
    // Another version without the upgrade ever ending: a new cause, told.
    w.versions = Some(vec![upgrading_to("4.19.2", "Working towards 4.19.2")]);
    let second = told(&w.step(at(320)));
    assert!(second.len() == 1 && second[0].contains("Progressing=True to 4.19.2"), "{second:?}");
    // The ClusterVersion is done but w1 still moves to its new machine config: told.
    w.versions = Some(Vec::new());
    w.edit_node("w1", |n| {
        n["metadata"]["annotations"]["machineconfiguration.openshift.io/currentConfig"] = json!("rendered-worker-a");
        n["metadata"]["annotations"]["machineconfiguration.openshift.io/desiredConfig"] = json!("rendered-worker-b");
    });
    let third = told(&w.step(at(330)));
    assert!(third.len() == 1 && third[0].contains("Node w1 moves from machine config"), "{third:?}");
    assert_eq!(created(&w.step(at(340))), vec![], "still postponed");
}

#[test]
fn a_node_moving_to_a_new_machine_config_postpones_every_remediation() {
    let moving = |served: bool| {
        let mut w = world(spec(json!({})), five_workers(&["w1", "w2"]));
        // On OpenShift ClusterVersion is served (here: none listed, so none progressing).
        w.versions = served.then(Vec::new);
        w.edit_node("w2", |n| {
            n["metadata"]["annotations"]["machineconfiguration.openshift.io/currentConfig"] =
                json!("rendered-worker-a");
            n["metadata"]["annotations"]["machineconfiguration.openshift.io/desiredConfig"] =
                json!("rendered-worker-b");
        });
        w
    };
    // Not OpenShift: the annotations are nobody's upgrade; both failed Nodes are remediated.
    let plan = moving(false).step(at(301));
    assert_eq!(created(&plan).len(), 2, "{:?}", created(&plan));
    assert!(get_condition(&plan.status.conditions, "RemediationPostponed").is_none());
    let mut w = moving(true);
    let plan = w.step(at(301));
    assert_eq!(created(&plan), vec![]);
    let c = get_condition(&plan.status.conditions, "RemediationPostponed").expect("condition");
    assert!(
        c.message.contains("Node w2 moves from machine config rendered-worker-a to rendered-worker-b"),
        "{}",
        c.message
    );
    // No RemediationPostponed condition while nothing ever postponed.
    let calm = world(spec(json!({})), five_workers(&["w1"]));
    assert!(get_condition(&calm.decide(at(301)).status.conditions, "RemediationPostponed").is_none());
}

#[test]
fn an_unreadable_upgrade_state_postpones_and_says_so() {
    let w = world(spec(json!({})), five_workers(&["w1"]));
    let policy = vigil_api::validate::node_health_check(&w.check).expect("valid");
    let nodes: Vec<NodeView> = w.nodes.iter().map(view_of).collect();
    let refs: Vec<&NodeView> = nodes.iter().collect();
    let templates: Vec<Option<&TemplateView>> = w.templates.iter().map(Option::as_ref).collect();
    let input = NhcInput {
        check: &w.check,
        policy: &policy,
        nodes: &refs,
        templates: &templates,
        remediations: &[],
        around: Around {
            cluster_versions: Observed::Unknown("waiting for the first complete list of ClusterVersions"),
            ..Around::default()
        },
    };
    let plan = decide(&input, at(301));
    assert_eq!(created(&plan), vec![]);
    let c = get_condition(&plan.status.conditions, "RemediationPostponed").expect("condition");
    assert_eq!(c.reason, "UpgradeStateUnknown");
    assert!(c.message.contains("waiting for the first complete list of ClusterVersions"), "{}", c.message);
}

// ---------------------------------------------------------------- remediators finishing

#[test]
fn an_object_being_deleted_keeps_its_node_counted_until_it_is_gone() {
    // minHealthy 51% of 5: 3 healthy needed. w1 was rebooted and is Ready again; its object is
    // deleted but the remediator holds it while it finishes fencing.
    let mut w = world(spec(json!({})), five_workers(&["w1"]));
    w.finalizers = true;
    w.step(at(301));
    w.set_ready("w1", "True", at(400));
    w.step(at(401)); // the delete
    assert!(w.objects.iter().all(|o| o["metadata"].get("deletionTimestamp").is_some()), "still there, being deleted");
    let plan = w.step(at(402));
    assert_eq!(plan.status.healthy_nodes, 4, "w1 is not healthy while its object exists");
    let (reason, message) = waiting(&plan, "w1").expect("listed, and says why");
    assert_eq!(reason, "RemediatorFinishing");
    assert!(
        message.contains("waiting for the remediator to finish: SelfNodeRemediation medik8s/w1 is being deleted"),
        "{message}"
    );
    // Two more Nodes fail: only one more may be remediated (3 healthy needed), w1 still counts.
    w.set_ready("w2", "False", at(0));
    w.set_ready("w3", "False", at(0));
    let plan = w.step(at(403));
    assert_eq!(plan.status.healthy_nodes, 2);
    assert_eq!(created(&plan), vec![], "2 of 5 healthy: below minHealthy while w1's object is being deleted");
    // The remediator finishes: w1 is healthy, w2 and w3 may go.
    w.finish_deletions();
    let plan = w.step(at(404));
    assert_eq!(plan.status.healthy_nodes, 3);
    assert_eq!(created(&plan).len(), 2);
    assert!(plan.notices.iter().any(|n| n.kind == NoticeKind::Healthy && n.target_key().as_deref() == Some("w1")));
}
