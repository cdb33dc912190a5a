//! The remediation object a NodeHealthCheck makes, field by field, as medik8s' NodeHealthCheck
//! operator makes it (what a remediator sees must not change when Vigil replaces it), and what
//! follows from what the remediators report: `Succeeded=False` gives a step up at once,
//! `Succeeded=True` is never annotated as timed out, the next step's object waits until the
//! previous one's `nhc-timed-out` annotation is seen, and `PermanentNodeDeletionExpected=True`
//! keeps a deleted Node's object until it succeeds.

mod support;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};
use vigil_api::NodeHealthCheck;
use vigil_api::node_health_check::NodeHealthCheckStatus;
use vigil_api::views::{LeaseView, NodeView, OpenShiftMachineView, RemediationView, TemplateView};
use vigil_engine::lookup::Observed;
use vigil_engine::node::{Around, NhcInput, decide};
use vigil_engine::{Action, NoticeKind, Plan};

const SNR_API: &str = "self-node-remediation.medik8s.io/v1alpha1";
const FAR_API: &str = "fence-agents-remediation.medik8s.io/v1alpha1";
const NS: &str = "medik8s";
const NHC_TIMED_OUT: &str = "remediation.medik8s.io/nhc-timed-out";

fn at(secs: i64) -> Timestamp {
    "2030-01-01T00:00:00Z".parse::<Timestamp>().expect("timestamp") + SignedDuration::from_secs(secs)
}

fn node(name: &str, ready: &str, labels: Value, annotations: Value) -> Value {
    json!({"metadata": {"name": name, "uid": format!("uid-{name}"), "labels": labels, "annotations": annotations},
           "spec": {},
           "status": {"conditions": [{"type": "Ready", "status": ready, "lastTransitionTime": at(0).to_string()}]}})
}

fn worker(name: &str, ready: &str) -> Value {
    node(name, ready, json!({"role": "worker"}), json!({}))
}

fn step_ref(api: &str, kind: &str, name: &str) -> Value {
    json!({"apiVersion": api, "kind": kind, "name": name, "namespace": NS})
}

fn single() -> Value {
    json!({"selector": {"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]}, "minHealthy": "51%",
           "remediationTemplate": step_ref(SNR_API, "SelfNodeRemediationTemplate", "snr")})
}

fn escalating() -> Value {
    json!({"selector": {"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]}, "minHealthy": "51%", "escalatingRemediations": [
        {"remediationTemplate": step_ref(SNR_API, "SelfNodeRemediationTemplate", "snr"), "order": 1, "timeout": "5m"},
        {"remediationTemplate": step_ref(FAR_API, "FenceAgentsRemediationTemplate", "far"), "order": 2, "timeout": "10m"},
    ]})
}

/// A cluster as an API server keeps it, and the check's decisions over it.
struct World {
    check: NodeHealthCheck,
    nodes: Vec<Value>,
    templates: Vec<Option<TemplateView>>,
    objects: Vec<Value>,
    leases: Vec<Value>,
    /// OpenShift Machines: `None` not served, `Some(None)` served but not listed yet.
    machines: Option<Option<Vec<Value>>>,
}

fn world(spec: Value, nodes: Vec<Value>) -> World {
    let check: NodeHealthCheck = serde_json::from_value(json!({
        "apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck",
        "metadata": {"name": "nhc", "uid": "nhc-uid", "generation": 1}, "spec": spec}))
    .expect("check");
    let policy = vigil_api::validate::node_health_check(&check).expect("valid");
    let templates = policy
        .all_steps()
        .map(|s| {
            TemplateView::read(&json!({
                "apiVersion": s.template.api_version, "kind": s.template.kind,
                "metadata": {"name": s.template.name, "namespace": NS},
                "spec": {"template": {"spec": {"agent": s.template.name}}}
            }))
        })
        .collect();
    World { check, nodes, templates, objects: Vec::new(), leases: Vec::new(), machines: None }
}

impl World {
    fn decide(&self, now: Timestamp) -> Plan<NodeHealthCheckStatus> {
        let policy = vigil_api::validate::node_health_check(&self.check).expect("valid");
        let mut nodes: Vec<NodeView> = self
            .nodes
            .iter()
            .map(|v| NodeView::from(serde_json::from_value::<Node>(v.clone()).expect("node")))
            .collect();
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        let node_refs: Vec<&NodeView> = nodes.iter().collect();
        let templates: Vec<Option<&TemplateView>> = self.templates.iter().map(Option::as_ref).collect();
        let objects: Vec<RemediationView> = self.objects.iter().filter_map(RemediationView::read).collect();
        let object_refs: Vec<&RemediationView> = objects.iter().collect();
        let leases: Vec<LeaseView> = self.leases.iter().filter_map(LeaseView::read).collect();
        let lease_refs: Vec<&LeaseView> = leases.iter().collect();
        let machines: Vec<OpenShiftMachineView> =
            self.machines.iter().flatten().flatten().filter_map(OpenShiftMachineView::read).collect();
        let machine_refs: Vec<&OpenShiftMachineView> = machines.iter().collect();
        let input = NhcInput {
            check: &self.check,
            policy: &policy,
            nodes: &node_refs,
            templates: &templates,
            remediations: &object_refs,
            around: Around {
                leases: &lease_refs,
                machines: match &self.machines {
                    None => Observed::NotServed,
                    Some(None) => Observed::Unknown("waiting for the first complete list of OpenShift Machines"),
                    Some(Some(_)) => Observed::Known(&machine_refs),
                },
                ..Around::default()
            },
        };
        decide(&input, now)
    }

    /// Applies a plan as the API server would.
    fn apply(&mut self, plan: &Plan<NodeHealthCheckStatus>, now: Timestamp) {
        for a in &plan.actions {
            match a {
                Action::CreateRemediation { object, lease, .. } => {
                    if let Some(l) = lease {
                        let mut m = l.manifest();
                        m["metadata"]["uid"] = json!(format!("uid-{}", l.name));
                        m["metadata"]["resourceVersion"] = json!("1");
                        self.leases.retain(|x| x["metadata"]["name"] != l.name.as_str());
                        self.leases.push(m);
                    }
                    let mut o = object.clone();
                    let name = o["metadata"]["name"].as_str().expect("a fixed name").to_string();
                    o["metadata"]["uid"] = json!(format!("uid-{}-{name}", o["kind"].as_str().unwrap_or("")));
                    o["metadata"]["creationTimestamp"] = json!(now.to_string());
                    self.objects.push(o);
                }
                Action::DeleteRemediation { object, .. } => {
                    self.objects
                        .retain(|x| x["metadata"]["name"] != object.name.as_str() || x["kind"] != object.kind.as_str());
                }
                Action::AnnotateRemediation { object, key, value, .. } => {
                    for x in self
                        .objects
                        .iter_mut()
                        .filter(|x| x["metadata"]["name"] == object.name.as_str() && x["kind"] == object.kind.as_str())
                    {
                        x["metadata"]["annotations"][key] = json!(value);
                    }
                }
                Action::WriteLease(_) | Action::DeleteLease { .. } => {}
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

    /// The remediator reports on its object of `kind`.
    fn report(&mut self, kind: &str, conditions: Value) {
        for o in self.objects.iter_mut().filter(|o| o["kind"] == kind) {
            o["status"]["conditions"] = conditions.clone();
        }
    }

    fn object(&self, kind: &str) -> Option<&Value> {
        self.objects.iter().find(|o| o["kind"] == kind)
    }
}

fn condition(type_: &str, status: &str, reason: &str) -> Value {
    json!({"type": type_, "status": status, "reason": reason, "message": "", "lastTransitionTime": at(0).to_string()})
}

fn annotated(plan: &Plan<NodeHealthCheckStatus>) -> Vec<(String, String)> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            Action::AnnotateRemediation { object, key, .. } => Some((object.kind.clone(), key.clone())),
            _ => None,
        })
        .collect()
}

fn waiting(plan: &Plan<NodeHealthCheckStatus>, node: &str) -> Option<(String, String)> {
    let entry = plan.status.unhealthy_nodes.iter().find(|u| u.name == node)?;
    entry.waiting.as_ref().map(|w| (w.reason.clone(), w.message.clone()))
}

fn machine(namespace: &str, name: &str) -> Value {
    json!({"apiVersion": "machine.openshift.io/v1beta1", "kind": "Machine",
           "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-machine-{name}")}})
}

fn check_owner() -> Value {
    json!({"apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck", "name": "nhc", "uid": "nhc-uid",
           "controller": false, "blockOwnerDeletion": false})
}

fn machine_owner(name: &str) -> Value {
    json!({"apiVersion": "machine.openshift.io/v1beta1", "kind": "Machine", "name": name,
           "uid": format!("uid-machine-{name}"), "controller": false})
}

/// One case of the contract: the Node, whether the Machine API is served (and its Machines), and
/// the object expected (its labels and owners), or the wait when none may be made.
struct Case {
    what: &'static str,
    labels: Value,
    annotations: Value,
    machines: Option<Option<Vec<Value>>>,
    expect: Result<(Value, Vec<Value>), &'static str>,
}

#[test]
fn the_object_carries_medik8s_contract_field_by_field() {
    let part_of = json!({"app.kubernetes.io/part-of": "node-healthcheck-controller"});
    let cp_labels = json!({"app.kubernetes.io/part-of": "node-healthcheck-controller",
                           "remediation.medik8s.io/isControlPlaneNode": ""});
    let in_ns = json!({"machine.openshift.io/machine": "medik8s/m1"});
    let cases = [
        Case {
            what: "a worker, no Machine API",
            labels: json!({}),
            annotations: json!({}),
            machines: None,
            expect: Ok((part_of.clone(), vec![check_owner()])),
        },
        Case {
            what: "a control-plane Node",
            labels: json!({"node-role.kubernetes.io/control-plane": ""}),
            annotations: json!({}),
            machines: None,
            expect: Ok((cp_labels.clone(), vec![check_owner()])),
        },
        Case {
            what: "a control-plane Node by its older label",
            labels: json!({"node-role.kubernetes.io/master": ""}),
            annotations: json!({}),
            machines: None,
            expect: Ok((cp_labels, vec![check_owner()])),
        },
        Case {
            what: "the Node's Machine in the template's namespace",
            labels: json!({}),
            annotations: in_ns.clone(),
            machines: Some(Some(vec![machine(NS, "m1"), machine(NS, "m2")])),
            expect: Ok((part_of.clone(), vec![check_owner(), machine_owner("m1")])),
        },
        Case {
            what: "the Node's Machine in another namespace: it cannot own the object",
            labels: json!({}),
            annotations: json!({"machine.openshift.io/machine": "openshift-machine-api/m1"}),
            machines: Some(Some(vec![machine("openshift-machine-api", "m1")])),
            expect: Ok((part_of.clone(), vec![check_owner()])),
        },
        Case {
            what: "a Node naming no Machine",
            labels: json!({}),
            annotations: json!({}),
            machines: Some(Some(vec![machine(NS, "m1")])),
            expect: Ok((part_of.clone(), vec![check_owner()])),
        },
        Case {
            what: "the annotation without the Machine API",
            labels: json!({}),
            annotations: in_ns.clone(),
            machines: None,
            expect: Ok((part_of, vec![check_owner()])),
        },
        Case {
            what: "Machines not listed yet",
            labels: json!({}),
            annotations: in_ns.clone(),
            machines: Some(None),
            expect: Err(
                "its Machine medik8s/m1 (annotation machine.openshift.io/machine), the owner of its remediation object, cannot be read: waiting for the first complete list of OpenShift Machines",
            ),
        },
        Case {
            what: "the Machine named is not there",
            labels: json!({}),
            annotations: in_ns,
            machines: Some(Some(vec![machine(NS, "m2")])),
            expect: Err(
                "its Machine medik8s/m1 (annotation machine.openshift.io/machine), the owner of its remediation object, does not exist",
            ),
        },
    ];
    for case in cases {
        let sick = node("n1", "False", case.labels.clone(), case.annotations.clone());
        let nodes = vec![sick, worker("n2", "True"), worker("n3", "True")];
        let mut w = world(single(), nodes);
        w.machines = case.machines;
        let plan = w.decide(at(301));
        let made = support::creates(&plan);
        match case.expect {
            Ok((labels, owners)) => {
                assert_eq!(made.len(), 1, "{}: {:?}", case.what, plan.actions);
                let o = made[0];
                assert_eq!(o["apiVersion"], SNR_API, "{}", case.what);
                assert_eq!(o["kind"], "SelfNodeRemediation", "{}: the template's kind minus Template", case.what);
                assert_eq!(o["metadata"]["namespace"], NS, "{}: the template's namespace", case.what);
                assert_eq!(o["metadata"]["name"], "n1", "{}: named after the Node", case.what);
                assert!(o["metadata"].get("generateName").is_none(), "{}", case.what);
                assert_eq!(
                    o["metadata"]["annotations"],
                    json!({"remediation.medik8s.io/node-name": "n1", "remediation.medik8s.io/template-name": "snr"}),
                    "{}",
                    case.what
                );
                assert_eq!(o["metadata"]["labels"], labels, "{}", case.what);
                assert_eq!(o["metadata"]["ownerReferences"], json!(owners), "{}", case.what);
                assert_eq!(o["spec"], json!({"agent": "snr"}), "{}: the template's spec.template.spec", case.what);
                assert_eq!(waiting(&plan, "n1"), None, "{}", case.what);
            }
            Err(why) => {
                assert!(made.is_empty(), "{}: no object without its owner: {:?}", case.what, plan.actions);
                let (reason, message) = waiting(&plan, "n1").unwrap_or_default();
                assert_eq!(reason, "NodeMachineUnknown", "{}", case.what);
                assert_eq!(message, format!("Not remediating node n1: {why}"), "{}", case.what);
                assert!(
                    plan.notices
                        .iter()
                        .any(|n| n.kind == NoticeKind::RemediationSkipped && n.reason.as_str() == "NodeMachineUnknown"),
                    "{}: told",
                    case.what
                );
            }
        }
    }
}

#[test]
fn a_machine_listed_later_lets_the_object_be_made_with_its_owner() {
    let sick = node("n1", "False", json!({}), json!({"machine.openshift.io/machine": "medik8s/m1"}));
    let mut w = world(single(), vec![sick, worker("n2", "True"), worker("n3", "True")]);
    w.machines = Some(None);
    assert!(support::creates(&w.step(at(301))).is_empty());
    w.machines = Some(Some(vec![machine(NS, "m1")]));
    let plan = w.step(at(302));
    let made = support::creates(&plan);
    assert_eq!(made.len(), 1, "{:?}", plan.actions);
    assert_eq!(made[0]["metadata"]["ownerReferences"], json!([check_owner(), machine_owner("m1")]));
}

/// One case of escalation: what the first step's object reports, and when.
struct Escalation {
    what: &'static str,
    /// Conditions the first step's remediator writes.
    reports: Value,
    /// When the check decides (the first step's object was made at 301 s; its timeout is 5m).
    now: i64,
    /// Whether the first step is given up then.
    gives_up: bool,
    /// Whether its object is annotated `nhc-timed-out`.
    annotates: bool,
}

/// The kinds of a plan's remediation writes, in the plan's order (the controller sends a Node's
/// `nhc-timed-out` annotation, and has it confirmed, before the next step's object).
fn writes(plan: &Plan<NodeHealthCheckStatus>) -> Vec<String> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            Action::CreateRemediation { object, .. } => {
                Some(format!("create {}", object["kind"].as_str().unwrap_or("")))
            }
            Action::AnnotateRemediation { object, key, .. } => Some(format!("annotate {} {key}", object.kind)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_step_given_up_is_annotated_before_the_next_steps_object() {
    let cases = [
        Escalation {
            what: "Succeeded=False: at once, not at the timeout",
            reports: json!([condition("Succeeded", "False", "FenceAgentFailed")]),
            now: 310,
            gives_up: true,
            annotates: true,
        },
        Escalation {
            what: "no Succeeded condition, timeout passed",
            reports: json!([condition("Processing", "True", "RemediationStarted")]),
            now: 302 + 300,
            gives_up: true,
            annotates: true,
        },
        Escalation {
            what: "Succeeded=True, timeout passed: given up, never annotated",
            reports: json!([condition("Succeeded", "True", "RemediationFinishedSuccessfully")]),
            now: 302 + 300,
            gives_up: true,
            annotates: false,
        },
        Escalation {
            what: "still working before its timeout",
            reports: json!([condition("Processing", "True", "RemediationStarted")]),
            now: 400,
            gives_up: false,
            annotates: false,
        },
        Escalation {
            what: "Succeeded=Unknown before its timeout",
            reports: json!([condition("Succeeded", "Unknown", "RemediationStarted")]),
            now: 400,
            gives_up: false,
            annotates: false,
        },
    ];
    let annotate = format!("annotate SelfNodeRemediation {NHC_TIMED_OUT}");
    for case in cases {
        let mut w = world(escalating(), vec![worker("n1", "False"), worker("n2", "True"), worker("n3", "True")]);
        let first = w.step(at(301));
        assert_eq!(support::creates(&first).len(), 1, "{}", case.what);
        w.report("SelfNodeRemediation", case.reports.clone());
        let plan = w.step(at(case.now));
        let want: Vec<String> = match (case.gives_up, case.annotates) {
            (false, _) => vec![],
            (true, true) => vec![annotate.clone(), "create FenceAgentsRemediation".into()],
            (true, false) => vec!["create FenceAgentsRemediation".into()],
        };
        assert_eq!(writes(&plan), want, "{}", case.what);
        let record = &plan.status.unhealthy_nodes[0].remediations[0];
        assert_eq!(record.timed_out.is_some(), case.gives_up, "{}", case.what);
        if !case.gives_up {
            continue;
        }
        let reason = if case.what.starts_with("Succeeded=False") { "RemediationFailed" } else { "RemediationTimedOut" };
        assert!(
            plan.notices.iter().any(|n| n.kind == NoticeKind::RemediationTimedOut && n.reason.as_str() == reason),
            "{}: told {:?}",
            case.what,
            plan.notices
        );
        let kept = w.object("SelfNodeRemediation").expect("the first object stays");
        assert_eq!(kept["metadata"]["annotations"].get(NHC_TIMED_OUT).is_some(), case.annotates, "{}", case.what);
        let again = w.step(at(case.now + 1));
        assert_eq!(writes(&again), Vec::<String>::new(), "{}: nothing more", case.what);
    }
}

#[test]
fn a_lost_annotation_is_written_again_and_never_on_a_succeeded_object() {
    for (succeeded, want) in [(false, 1), (true, 0)] {
        let mut w = world(escalating(), vec![worker("n1", "False"), worker("n2", "True"), worker("n3", "True")]);
        w.step(at(301));
        let plan = w.decide(at(602));
        assert!(plan.status.unhealthy_nodes[0].remediations[0].timed_out.is_some());
        // The status was written, the writes were lost.
        w.check.status = Some(plan.status.clone());
        if succeeded {
            w.report("SelfNodeRemediation", json!([condition("Succeeded", "True", "RemediationFinishedSuccessfully")]));
        }
        let again = w.decide(at(700));
        let annotates = writes(&again).iter().filter(|w| w.starts_with("annotate")).count();
        assert_eq!(annotates, want, "Succeeded=True: {succeeded}: {:?}", writes(&again));
        assert_eq!(writes(&again).last().map(String::as_str), Some("create FenceAgentsRemediation"));
    }
}

#[test]
fn the_last_step_given_up_says_no_template_is_left_in_the_same_decision() {
    let mut w = world(single(), vec![worker("n1", "False"), worker("n2", "True"), worker("n3", "True")]);
    w.step(at(301));
    w.report("SelfNodeRemediation", json!([condition("Succeeded", "False", "RemediationFailed")]));
    let plan = w.step(at(310));
    assert_eq!(annotated(&plan), vec![("SelfNodeRemediation".to_string(), NHC_TIMED_OUT.to_string())]);
    let told: Vec<NoticeKind> = plan.notices.iter().map(|n| n.kind).collect();
    assert!(told.contains(&NoticeKind::NoTemplateLeft), "{told:?}");
    assert!(told.contains(&NoticeKind::RemediationTimedOut), "{told:?}");
    let again = w.step(at(311));
    assert!(!again.notices.iter().any(|n| n.kind == NoticeKind::NoTemplateLeft), "told once");
    assert!(support::creates(&again).is_empty() && annotated(&again).is_empty(), "{:?}", again.actions);
}

/// A deleted Node's object: `(PermanentNodeDeletionExpected, Succeeded)` → kept?
#[test]
fn a_deleted_nodes_object_is_kept_while_its_remediator_deletes_the_node_on_purpose() {
    let cases = [
        (Some("True"), None, true),
        (Some("True"), Some("False"), true),
        (Some("True"), Some("Unknown"), true),
        (Some("True"), Some("True"), false),
        (Some("False"), None, false),
        (Some("Unknown"), None, false),
        (None, None, false),
    ];
    for (permanent, succeeded, kept) in cases {
        let mut w = world(single(), vec![worker("n1", "False"), worker("n2", "True"), worker("n3", "True")]);
        w.step(at(301));
        let mut reports = Vec::new();
        if let Some(p) = permanent {
            reports.push(condition("PermanentNodeDeletionExpected", p, "MachineDeleted"));
        }
        if let Some(s) = succeeded {
            reports.push(condition("Succeeded", s, "RemediationStarted"));
        }
        w.report("SelfNodeRemediation", json!(reports));
        w.nodes.retain(|n| n["metadata"]["name"] != "n1");
        let plan = w.step(at(320));
        let deleted = plan.actions.iter().any(|a| matches!(a, Action::DeleteRemediation { .. }));
        assert_eq!(!deleted, kept, "PermanentNodeDeletionExpected={permanent:?} Succeeded={succeeded:?}");
        if kept {
            // Kept until it succeeds.
            w.report(
                "SelfNodeRemediation",
                json!([
                    condition("PermanentNodeDeletionExpected", "True", "MachineDeleted"),
                    condition("Succeeded", "True", "MachineDeleted")
                ]),
            );
            let plan = w.step(at(330));
            assert!(plan.actions.iter().any(|a| matches!(a, Action::DeleteRemediation { .. })), "{:?}", plan.actions);
        }
    }
}
