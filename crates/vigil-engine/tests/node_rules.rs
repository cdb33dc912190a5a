//! NodeHealthCheck rules, one table (or scenario) per numbered rule of `node::decide`'s contract:
//! what gets created, annotated and deleted, the counts and phase a user sees, the notices, and
//! the exact instant the plan asks to be woken.

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};
use vigil_api::NodeHealthCheck;
use vigil_api::conditions::get_condition;
use vigil_api::node_health_check::{NodeHealthCheckStatus, NodeRemediation, RemediationReference};
use vigil_api::views::NodeView;
use vigil_api::views::{RemediationView, TemplateView};
use vigil_engine::node::{NhcInput, decide};
use vigil_engine::{Action, NoticeKind, ObjectRef, Plan};

const SNR_API: &str = "self-node-remediation.medik8s.io/v1alpha1";
const FAR_API: &str = "fence-agents-remediation.medik8s.io/v1alpha1";
const NS: &str = "medik8s";
const EXCLUDE: &str = "remediation.medik8s.io/exclude-from-remediation";
const CONFIRMED: &str = "remediation.medik8s.io/manually-confirmed-healthy";
const TIMED_OUT: &str = "remediation.medik8s.io/nhc-timed-out";

fn t0() -> Timestamp {
    "2030-01-01T00:00:00Z".parse().expect("timestamp")
}

/// `t0 + secs`.
fn at(secs: i64) -> Timestamp {
    t0() + SignedDuration::from_secs(secs)
}

fn ns1(t: Timestamp) -> Timestamp {
    t + SignedDuration::from_nanos(1)
}

// ---------------------------------------------------------------- builders

/// A Node; `ready` is `(status, since)`, `None` since meaning no lastTransitionTime.
struct NodeB(Value);

fn node(name: &str) -> NodeB {
    NodeB(json!({"metadata": {"name": name, "labels": {}, "annotations": {}}, "status": {"conditions": []}}))
}

impl NodeB {
    fn label(mut self, k: &str, v: &str) -> Self {
        self.0["metadata"]["labels"][k] = json!(v);
        self
    }
    fn annotate(mut self, k: &str, v: &str) -> Self {
        self.0["metadata"]["annotations"][k] = json!(v);
        self
    }
    fn cond(mut self, type_: &str, status: &str, since: Option<Timestamp>) -> Self {
        let mut c = json!({"type": type_, "status": status});
        if let Some(t) = since {
            c["lastTransitionTime"] = json!(t.to_string());
        }
        self.0["status"]["conditions"].as_array_mut().expect("list").push(c);
        self
    }
    fn cond_reason(mut self, type_: &str, status: &str, reason: &str, since: Timestamp) -> Self {
        self = self.cond(type_, status, Some(since));
        if let Some(c) = self.0["status"]["conditions"].as_array_mut().and_then(|l| l.last_mut()) {
            c["reason"] = json!(reason);
        }
        self
    }
    fn ready(self, status: &str, since: Timestamp) -> Self {
        self.cond("Ready", status, Some(since))
    }
    fn cordoned(mut self) -> Self {
        self.0["spec"] = json!({"unschedulable": true});
        self
    }
    fn build(self) -> NodeView {
        NodeView::from(serde_json::from_value::<Node>(self.0).expect("node"))
    }
}

fn healthy(name: &str) -> NodeView {
    node(name).ready("True", t0()).build()
}

/// Ready=False since t0: unhealthy from `at(300) + 1ns` with the default 300s rule.
fn sick(name: &str) -> NodeView {
    node(name).ready("False", t0()).build()
}

fn snr_ref() -> Value {
    json!({"apiVersion": SNR_API, "kind": "SelfNodeRemediationTemplate", "name": "snr", "namespace": NS})
}

fn far_ref() -> Value {
    json!({"apiVersion": FAR_API, "kind": "FenceAgentsRemediationTemplate", "name": "far", "namespace": NS})
}

/// The default spec (selects Nodes without a `skip` label, medik8s' default conditions,
/// minHealthy 51%, SNR), with `extra`'s fields on top.
fn spec(extra: Value) -> Value {
    let mut s = json!({
        "selector": {"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]},
        "minHealthy": "51%",
        "remediationTemplate": snr_ref(),
    });
    let extra = extra.as_object().cloned().unwrap_or_default();
    if extra.contains_key("maxUnhealthy") {
        s.as_object_mut().expect("object").remove("minHealthy");
    }
    if extra.contains_key("escalatingRemediations") {
        s.as_object_mut().expect("object").remove("remediationTemplate");
    }
    for (k, v) in extra {
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

fn template_view(api: &str, kind: &str, name: &str) -> TemplateView {
    TemplateView::read(&json!({
        "apiVersion": api, "kind": kind,
        "metadata": {"name": name, "namespace": NS},
        "spec": {"template": {"spec": {"from": name}}}
    }))
    .expect("template")
}

/// Everything one decision looks at, plus a tiny applier so scenarios can run over time.
struct World {
    check: NodeHealthCheck,
    nodes: Vec<NodeView>,
    templates: Vec<Option<TemplateView>>,
    objects: Vec<RemediationView>,
}

fn world(spec: Value, nodes: Vec<NodeView>) -> World {
    let check: NodeHealthCheck = serde_json::from_value(json!({
        "apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck",
        "metadata": {"name": "nhc", "uid": "nhc-uid", "generation": 3},
        "spec": spec,
    }))
    .expect("check");
    let policy = vigil_api::validate::node_health_check(&check).expect("valid spec");
    let templates = policy
        .all_steps()
        .map(|s| Some(template_view(&s.template.api_version, &s.template.kind, &s.template.name)))
        .collect();
    World { check, nodes, templates, objects: Vec::new() }
}

impl World {
    fn decide(&self, now: Timestamp) -> Plan<NodeHealthCheckStatus> {
        let policy = vigil_api::validate::node_health_check(&self.check).expect("valid spec");
        let nodes: Vec<&NodeView> = self.nodes.iter().collect();
        let templates: Vec<Option<&TemplateView>> = self.templates.iter().map(Option::as_ref).collect();
        let remediations: Vec<&RemediationView> = self.objects.iter().collect();
        let input = NhcInput {
            check: &self.check,
            policy: &policy,
            nodes: &nodes,
            templates: &templates,
            remediations: &remediations,
            around: Default::default(),
        };
        let plan = decide(&input, now);
        for n in &plan.notices {
            assert!(
                !matches!(n.kind, NoticeKind::RemediationCreated | NoticeKind::RemediationDeleted),
                "the applier reports writes, not the engine: {n:?}"
            );
        }
        plan
    }

    /// Applies the plan as an API server would (objects get a uid and creation time) and
    /// stores its status.
    fn apply(&mut self, plan: &Plan<NodeHealthCheckStatus>, now: Timestamp) {
        for a in &plan.actions {
            match a {
                Action::CreateRemediation { object, .. } => {
                    let mut o = object.clone();
                    assert!(o["metadata"].get("generateName").is_none(), "never a server-generated name: {o}");
                    let name = o["metadata"]["name"].as_str().expect("name").to_string();
                    o["metadata"]["uid"] = json!(format!("uid-{name}"));
                    o["metadata"]["creationTimestamp"] = json!(now.to_string());
                    let view = RemediationView::read(&o).expect("named");
                    let exists = self.objects.iter().any(|x| {
                        x.meta.kind == view.meta.kind
                            && x.meta.namespace == view.meta.namespace
                            && x.meta.name == view.meta.name
                    });
                    if !exists {
                        self.objects.push(view);
                    }
                }
                Action::DeleteRemediation { object, .. } => self.objects.retain(|x| !same(x, object)),
                Action::AnnotateRemediation { object, key, value, .. } => {
                    for x in self.objects.iter_mut().filter(|x| same(x, object)) {
                        x.meta.annotations.insert(key.clone(), value.clone());
                    }
                }
                Action::SetMachineConditions { .. } => panic!("not a NodeHealthCheck action"),
                // This world keeps no Leases: every Node's Lease is free.
                Action::WriteLease(_) | Action::DeleteLease { .. } => {}
            }
        }
        self.check.status = Some(plan.status.clone());
    }

    /// Decides and applies.
    fn step(&mut self, now: Timestamp) -> Plan<NodeHealthCheckStatus> {
        let plan = self.decide(now);
        self.apply(&plan, now);
        plan
    }

    fn set_node(&mut self, n: NodeView) {
        let name = n.name.clone();
        self.nodes.retain(|x| x.name != name);
        self.nodes.push(n);
    }
}

fn same(x: &RemediationView, o: &ObjectRef) -> bool {
    x.meta.kind == o.kind && x.meta.namespace == o.namespace && x.meta.name == o.name
}

/// A remediation object as it exists in the cluster, owned by the test check.
fn object(kind: &str, api: &str, name: &str, node: &str, template: &str, created: Timestamp) -> Value {
    json!({
        "apiVersion": api, "kind": kind,
        "metadata": {
            "name": name, "namespace": NS, "uid": format!("uid-{name}"),
            "creationTimestamp": created.to_string(),
            "annotations": {
                "remediation.medik8s.io/node-name": node,
                "remediation.medik8s.io/template-name": template,
            },
            "ownerReferences": [{"apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck", "name": "nhc", "uid": "nhc-uid"}],
        },
    })
}

fn snr(node: &str, created: Timestamp) -> Value {
    object("SelfNodeRemediation", SNR_API, node, node, "snr", created)
}

fn view(v: Value) -> RemediationView {
    RemediationView::read(&v).expect("named")
}

fn with_conditions(mut v: Value, conds: &[(&str, &str)]) -> Value {
    v["status"] = json!({"conditions": conds.iter().map(|(t, s)| json!({"type": t, "status": s})).collect::<Vec<_>>()});
    v
}

// ---------------------------------------------------------------- plan accessors

fn created(plan: &Plan<NodeHealthCheckStatus>) -> Vec<(String, String)> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            Action::CreateRemediation { object, target, .. } => {
                Some((object["kind"].as_str().unwrap_or("").to_string(), target.key()))
            }
            _ => None,
        })
        .collect()
}

fn created_targets(plan: &Plan<NodeHealthCheckStatus>) -> Vec<String> {
    created(plan).into_iter().map(|(_, t)| t).collect()
}

fn deleted(plan: &Plan<NodeHealthCheckStatus>) -> Vec<String> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            Action::DeleteRemediation { object, .. } => Some(object.to_string()),
            _ => None,
        })
        .collect()
}

fn annotated(plan: &Plan<NodeHealthCheckStatus>) -> Vec<(String, String, String)> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            Action::AnnotateRemediation { object, key, value, .. } => {
                Some((object.to_string(), key.clone(), value.clone()))
            }
            _ => None,
        })
        .collect()
}

fn notices(plan: &Plan<NodeHealthCheckStatus>) -> Vec<(NoticeKind, String)> {
    plan.notices.iter().map(|n| (n.kind, n.target_key().unwrap_or_default())).collect()
}

/// Notices about the whole check (no target), as (kind, reason).
fn global(plan: &Plan<NodeHealthCheckStatus>) -> Vec<(NoticeKind, &str)> {
    plan.notices.iter().filter(|n| n.target.is_none()).map(|n| (n.kind, n.reason.as_str())).collect()
}

fn listed(plan: &Plan<NodeHealthCheckStatus>) -> Vec<String> {
    plan.status.unhealthy_nodes.iter().map(|u| u.name.clone()).collect()
}

fn allowed_condition(plan: &Plan<NodeHealthCheckStatus>) -> (String, String, String) {
    let c = get_condition(&plan.status.conditions, "RemediationAllowed").expect("RemediationAllowed");
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

fn strs(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

// ---------------------------------------------------------------- rule 1: targets

#[test]
fn rule1_only_selected_nodes_are_targets() {
    // (selector, expected observed, expected created)
    let table: Vec<(Value, i32, Vec<&str>)> = vec![
        (json!({"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]}), 4, vec!["a1", "b1"]),
        (json!({"matchLabels": {"pool": "a"}}), 2, vec!["a1"]),
        (json!({"matchExpressions": [{"key": "pool", "operator": "In", "values": ["b"]}]}), 2, vec!["b1"]),
    ];
    for (selector, observed, want) in table {
        let nodes = vec![
            node("a1").label("pool", "a").ready("False", t0()).build(),
            node("a2").label("pool", "a").ready("True", t0()).build(),
            node("b1").label("pool", "b").ready("False", t0()).build(),
            node("b2").label("pool", "b").ready("True", t0()).build(),
            node("x").label("skip", "yes").label("pool", "c").ready("False", t0()).build(),
        ];
        let w = world(spec(json!({"selector": selector, "minHealthy": 0})), nodes);
        let plan = w.decide(at(301));
        assert_eq!(plan.status.observed_nodes, observed, "{selector}");
        assert_eq!(plan.status.healthy_nodes, observed / 2, "{selector}");
        assert_eq!(created_targets(&plan), strs(&want), "{selector}");
        assert_eq!(listed(&plan), strs(&want), "unselected node x never appears: {selector}");
    }
}

// ---------------------------------------------------------------- rule 2: verdicts

#[test]
fn rule2_condition_durations_decide_unhealthy_pending_or_healthy() {
    let now = at(1000);
    // (node, healthy?, listed+created?, next_wake, NoDecision?)
    let table: Vec<(NodeView, bool, bool, Option<Timestamp>, bool)> = vec![
        (node("n").ready("True", at(990)).build(), true, false, None, false),
        // held exactly 5m: still pending, the verdict changes 1ns later
        (node("n").ready("False", at(700)).build(), false, false, Some(ns1(now)), false),
        (node("n").ready("False", at(700) - SignedDuration::from_nanos(1)).build(), false, true, None, false),
        (node("n").ready("Unknown", at(900)).build(), false, false, Some(ns1(at(1200))), false),
        // a condition no rule names is not a problem
        (node("n").ready("True", at(0)).cond("MemoryPressure", "True", Some(at(0))).build(), true, false, None, false),
        // no lastTransitionTime: no decision, no timer, not healthy
        (node("n").cond("Ready", "Unknown", None).build(), false, false, None, true),
        // undecided on one rule but expired on another: unhealthy
        (
            node("n").cond("Ready", "Unknown", None).cond("DiskPressure", "True", Some(at(0))).build(),
            false,
            true,
            None,
            false,
        ),
    ];
    for (i, (n, is_healthy, is_unhealthy, wake, no_decision)) in table.into_iter().enumerate() {
        let s = spec(json!({"minHealthy": 0, "unhealthyConditions": [
            {"type": "Ready", "status": "False", "duration": "5m"},
            {"type": "Ready", "status": "Unknown", "duration": "5m"},
            {"type": "DiskPressure", "status": "True", "duration": "1m"},
        ]}));
        let mut w = world(s, vec![n, healthy("other")]);
        let plan = w.step(now);
        assert_eq!(plan.status.observed_nodes, 2, "case {i}");
        assert_eq!(plan.status.healthy_nodes, 1 + i32::from(is_healthy), "case {i}");
        assert_eq!(listed(&plan), if is_unhealthy { strs(&["n"]) } else { vec![] }, "case {i}");
        assert_eq!(created_targets(&plan), if is_unhealthy { strs(&["n"]) } else { vec![] }, "case {i}");
        assert_eq!(plan.next_wake, wake, "case {i}");
        let said =
            plan.notices.iter().any(|n| n.kind == NoticeKind::NoDecision && n.target_key().as_deref() == Some("n"));
        assert_eq!(said, no_decision, "case {i}: {:?}", plan.notices);
        // the same input again tells nothing new
        assert_eq!(w.decide(now).notices, vec![], "case {i}");
    }
}

#[test]
fn rule2_unhealthy_reason_names_the_first_expired_rule() {
    let s = spec(json!({"minHealthy": 0, "unhealthyConditions": [
        {"type": "Ready", "status": "Unknown", "duration": "5m"},
        {"type": "DiskPressure", "status": "True", "duration": "90s"},
    ]}));
    let mut n2 = node("n2").ready("Unknown", at(0)).cond("DiskPressure", "True", Some(at(0)));
    n2.0["status"]["conditions"][1]["reason"] = json!("KubeletHasDiskPressure");
    let w = world(s, vec![n2.build()]);
    let plan = w.decide(at(100));
    let n = plan.notices.iter().find(|n| n.kind == NoticeKind::Unhealthy).expect("unhealthy notice");
    assert_eq!(n.reason, "DiskPressure=True");
    assert_eq!(
        n.message, "Node n2 has had condition DiskPressure=True with reason KubeletHasDiskPressure for more than 1m30s",
        "the condition's reason says what broke"
    );
}

// ---------------------------------------------------------------- rule 3: exclusion

#[test]
fn rule3_excluded_nodes_are_counted_but_never_remediated() {
    let table: Vec<(&str, Vec<&str>)> =
        vec![("true", vec!["n1"]), ("false", vec!["n1", "n2"]), ("yes", vec!["n1", "n2"])];
    for (value, want) in table {
        let nodes = vec![sick("n1"), node("n2").label(EXCLUDE, value).ready("False", t0()).build(), healthy("n3")];
        let w = world(spec(json!({"minHealthy": 1})), nodes);
        let plan = w.decide(at(301));
        assert_eq!(created_targets(&plan), strs(&want), "label value {value}");
        assert_eq!(plan.status.observed_nodes, 3);
        assert_eq!(plan.status.healthy_nodes, 1);
        assert_eq!(listed(&plan), strs(&["n1", "n2"]), "an excluded unhealthy node is still reported");
    }
}

#[test]
fn rule3_an_excluded_node_is_not_escalated() {
    let mut w = world(escalating(), vec![sick("n1"), healthy("n2"), healthy("n3")]);
    w.step(at(301));
    w.set_node(node("n1").label(EXCLUDE, "true").ready("False", t0()).build());
    let plan = w.decide(at(10_000));
    assert_eq!(plan.actions, vec![]);
    assert_eq!(plan.next_wake, None);
}

// ---------------------------------------------------------------- rule 4: threshold

#[test]
fn rule4_threshold_allows_or_blocks() {
    // (threshold field, value, nodes, unhealthy, allowed, threshold text)
    let table: Vec<(&str, Value, usize, usize, bool, &str)> = vec![
        ("minHealthy", json!("51%"), 5, 2, true, "minHealthy 51% (needs 3 healthy)"),
        ("minHealthy", json!("51%"), 5, 3, false, "minHealthy 51% (needs 3 healthy)"),
        ("minHealthy", json!(3), 3, 1, false, "minHealthy 3 (needs 3 healthy)"),
        ("minHealthy", json!(2), 3, 1, true, "minHealthy 2 (needs 2 healthy)"),
        ("minHealthy", json!(0), 2, 2, true, "minHealthy 0 (needs 0 healthy)"),
        ("maxUnhealthy", json!("40%"), 5, 2, true, "maxUnhealthy 40% (allows 2 unhealthy)"),
        ("maxUnhealthy", json!("40%"), 5, 3, false, "maxUnhealthy 40% (allows 2 unhealthy)"),
        ("maxUnhealthy", json!(0), 3, 1, false, "maxUnhealthy 0 (allows 0 unhealthy)"),
        // a percentage rounds up, as medik8s does: 75% of 10 is 7.5, so 8 are allowed
        ("maxUnhealthy", json!("75%"), 10, 8, true, "maxUnhealthy 75% (allows 8 unhealthy)"),
        ("maxUnhealthy", json!("75%"), 10, 9, false, "maxUnhealthy 75% (allows 8 unhealthy)"),
        ("maxUnhealthy", json!("40%"), 7, 3, true, "maxUnhealthy 40% (allows 3 unhealthy)"),
        // an absolute value above the node count just allows
        ("maxUnhealthy", json!(10), 3, 3, true, "maxUnhealthy 10 (allows 10 unhealthy)"),
    ];
    for (field, value, total, unhealthy, allowed, text) in table {
        let nodes: Vec<NodeView> = (0..total)
            .map(|i| if i < unhealthy { sick(&format!("n{i}")) } else { healthy(&format!("n{i}")) })
            .collect();
        let mut extra = json!({});
        extra[field] = value.clone();
        let w = world(spec(extra), nodes);
        let plan = w.decide(at(301));
        let case = format!("{field} {value} with {unhealthy}/{total} unhealthy");
        assert_eq!(created_targets(&plan).len(), if allowed { unhealthy } else { 0 }, "{case}");
        let (status, reason, message) = allowed_condition(&plan);
        let healthy_count = total - unhealthy;
        assert_eq!(
            message,
            format!("{total} nodes observed, {healthy_count} healthy, {unhealthy} not healthy; {text}"),
            "{case}"
        );
        if allowed {
            assert_eq!((status.as_str(), reason.as_str()), ("True", "RemediationAllowed"), "{case}");
            assert!(!notices(&plan).iter().any(|(k, _)| *k == NoticeKind::RemediationBlocked), "{case}");
        } else {
            assert_eq!((status.as_str(), reason.as_str()), ("False", "TooFewHealthy"), "{case}");
            let blocked: Vec<_> = plan.notices.iter().filter(|n| n.kind == NoticeKind::RemediationBlocked).collect();
            assert_eq!(blocked.len(), 1, "{case}");
            assert_eq!(blocked[0].reason, "TooFewHealthy");
            assert_eq!(blocked[0].message, message);
        }
        // every unhealthy node is reported either way
        assert_eq!(plan.status.unhealthy_nodes.len(), unhealthy, "{case}");
    }
}

// ---------------------------------------------------------------- rule 5: storm cooldown

#[test]
fn rule5_storm_cooldown_keeps_blocking_after_recovery() {
    let nodes = vec![sick("n1"), sick("n2"), sick("n3"), healthy("n4"), healthy("n5")];
    let mut w = world(spec(json!({"stormCooldownDuration": "10m"})), nodes);

    let p1 = w.step(at(301));
    assert_eq!(allowed_condition(&p1).1, "TooFewHealthy");
    assert_eq!(created_targets(&p1), Vec::<String>::new());
    assert_eq!(p1.status.storm_recovery_start_time, None);

    // two nodes recover: the threshold is met again, but the cooldown starts
    w.set_node(healthy("n2"));
    w.set_node(healthy("n3"));
    let p2 = w.step(at(400));
    let (status, reason, message) = allowed_condition(&p2);
    assert_eq!((status.as_str(), reason.as_str()), ("False", "StormCooldown"));
    assert!(message.contains("storm cooldown of 10m0s"), "{message}");
    assert_eq!(p2.status.storm_recovery_start_time, Some(Time(at(400))));
    assert_eq!(p2.next_wake, Some(at(1000)));
    assert_eq!(created_targets(&p2), Vec::<String>::new());
    assert_eq!(global(&p2), vec![(NoticeKind::RemediationBlocked, "StormCooldown")]);
    assert_eq!(notices(&p2)[1..], [(NoticeKind::Healthy, "n2".into()), (NoticeKind::Healthy, "n3".into())]);

    // still cooling one second before the end: no news
    let p3 = w.step(at(999));
    assert_eq!(allowed_condition(&p3).1, "StormCooldown");
    assert_eq!(p3.notices, vec![]);
    assert_eq!(p3.status.storm_recovery_start_time, Some(Time(at(400))));

    // at the end instant remediation is allowed and the start time is cleared
    let p4 = w.step(at(1000));
    assert_eq!(allowed_condition(&p4).0, "True");
    assert_eq!(p4.status.storm_recovery_start_time, None);
    assert_eq!(created_targets(&p4), strs(&["n1"]));
    assert_eq!(
        p4.notices.iter().map(|n| (n.kind, n.reason.as_str())).collect::<Vec<_>>(),
        vec![(NoticeKind::RemediationAllowed, "RemediationAllowed")]
    );
}

#[test]
fn rule5_a_new_storm_during_cooldown_blocks_again_and_clears_the_start() {
    let nodes = vec![sick("n1"), sick("n2"), sick("n3"), healthy("n4"), healthy("n5")];
    let mut w = world(spec(json!({"stormCooldownDuration": "10m"})), nodes);
    w.step(at(301));
    w.set_node(healthy("n2"));
    w.set_node(healthy("n3"));
    w.step(at(400));
    w.set_node(sick("n2"));
    w.set_node(sick("n3"));
    let plan = w.step(at(500));
    assert_eq!(allowed_condition(&plan).1, "TooFewHealthy");
    assert_eq!(plan.status.storm_recovery_start_time, None);
    assert_eq!(global(&plan), vec![(NoticeKind::RemediationBlocked, "TooFewHealthy")]);
}

#[test]
fn rule5_without_cooldown_recovery_allows_at_once() {
    for cooldown in [None, Some("0s")] {
        let nodes = vec![sick("n1"), sick("n2"), sick("n3"), healthy("n4"), healthy("n5")];
        let extra = match cooldown {
            Some(c) => json!({"stormCooldownDuration": c}),
            None => json!({}),
        };
        let mut w = world(spec(extra), nodes);
        w.step(at(301));
        w.set_node(healthy("n2"));
        w.set_node(healthy("n3"));
        let plan = w.step(at(400));
        assert_eq!(allowed_condition(&plan).0, "True", "{cooldown:?}");
        assert_eq!(plan.status.storm_recovery_start_time, None);
        assert_eq!(created_targets(&plan), strs(&["n1"]));
    }
}

// ---------------------------------------------------------------- rule 6: pause

#[test]
fn rule6_pause_stops_new_remediation_only() {
    let mut s = escalating();
    s["minHealthy"] = json!(0);
    let mut w = world(s, vec![sick("n1"), healthy("n2"), healthy("n3"), healthy("n4")]);
    w.step(at(301)); // n1 remediated with SNR before the pause
    w.check.spec.pause_requests = vec!["maintenance by alice".into(), "upgrade".into()];
    w.set_node(sick("n2"));

    let plan = w.step(at(302));
    assert_eq!(created_targets(&plan), Vec::<String>::new(), "no new remediation while paused");
    assert_eq!(plan.status.phase.as_deref(), Some("Paused"));
    assert_eq!(plan.status.reason.as_deref(), Some("Remediation paused by request: maintenance by alice; upgrade"));
    assert_eq!(notices(&plan), vec![(NoticeKind::Unhealthy, "n2".into()), (NoticeKind::Paused, String::new())]);
    assert_eq!(plan.status.healthy_nodes, 2, "counts stay true while paused");

    // escalation of n1 goes on while paused
    let plan = w.step(ns1(at(601)));
    assert_eq!(created(&plan), vec![("FenceAgentsRemediation".to_string(), "n1".to_string())]);

    // and so does cleanup of a recovered node
    w.set_node(healthy("n1"));
    let plan = w.step(at(700));
    assert_eq!(deleted(&plan), strs(&["FenceAgentsRemediation medik8s/n1", "SelfNodeRemediation medik8s/n1"]));

    // resuming starts the pending one
    w.check.spec.pause_requests.clear();
    let plan = w.step(at(701));
    assert_eq!(created_targets(&plan), strs(&["n2"]));
    assert!(notices(&plan).contains(&(NoticeKind::Resumed, String::new())));
}

// ---------------------------------------------------------------- rule 7: remediation objects

#[test]
fn rule7_the_manifest_and_status_record() {
    let w = world(spec(json!({})), vec![sick("n1"), healthy("n2"), healthy("n3")]);
    let plan = w.decide(at(301));
    assert_eq!(
        plan.actions,
        vec![Action::CreateRemediation {
            object: json!({
                "apiVersion": SNR_API,
                "kind": "SelfNodeRemediation",
                "metadata": {
                    "namespace": NS,
                    "name": "n1",
                    "annotations": {
                        "remediation.medik8s.io/node-name": "n1",
                        "remediation.medik8s.io/template-name": "snr",
                    },
                    "labels": {"app.kubernetes.io/part-of": "node-healthcheck-controller"},
                    "ownerReferences": [{
                        "apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck", "name": "nhc", "uid": "nhc-uid",
                        "controller": false, "blockOwnerDeletion": false,
                    }],
                },
                "spec": {"from": "snr"},
            }),
            target: vigil_engine::target::Target::local_node("n1"),
            // medik8s' node Lease, taken first: a step of the default 10m plus a minute.
            lease: Some(vigil_engine::plan::LeaseWrite {
                namespace: "medik8s-leases".into(),
                name: "node-n1".into(),
                holder: "NodeHealthCheck-nhc".into(),
                duration_seconds: 660,
                acquire_time: at(301),
                renew_time: at(301),
                transitions: 0,
                node: "n1".into(),
                node_uid: None,
                resource_version: None,
                uid: None,
            }),
            after: Vec::new(),
        }]
    );
    assert_eq!(plan.status.unhealthy_nodes.len(), 1);
    assert_eq!(
        plan.status.unhealthy_nodes[0].remediations,
        vec![NodeRemediation {
            resource: RemediationReference {
                api_version: SNR_API.into(),
                kind: "SelfNodeRemediation".into(),
                namespace: NS.into(),
                name: "n1".into(),
                uid: None,
            },
            started: Time(at(301)),
            timed_out: None,
            template_name: Some("snr".into()),
        }]
    );
    assert_eq!(plan.status.phase.as_deref(), Some("Remediating"));
}

#[test]
fn rule7_owner_uid_is_left_out_when_unknown() {
    let mut w = world(spec(json!({})), vec![sick("n1"), healthy("n2"), healthy("n3")]);
    w.check.metadata.uid = None;
    let plan = w.decide(at(301));
    let Some(Action::CreateRemediation { object, .. }) = plan.actions.first() else { panic!("a create") };
    assert_eq!(
        object["metadata"]["ownerReferences"],
        json!([{"apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck", "name": "nhc", "controller": false, "blockOwnerDeletion": false}])
    );
}

/// A medik8s NodeHealthCheck served in place (`vigil run --serve-medik8s`): its objects are owned
/// as the operator owns them (its `apiVersion`), and one the operator made is the check's own.
#[test]
fn rule7_a_medik8s_check_served_in_place_owns_objects_as_the_operator_does() {
    let w = world(spec(json!({})), vec![sick("n1"), sick("n2"), healthy("n3"), healthy("n4"), healthy("n5")]);
    let policy = vigil_api::validate::medik8s_node_health_check(&w.check).expect("valid spec");
    let mut theirs = snr("n2", at(0));
    theirs["metadata"]["ownerReferences"][0]["apiVersion"] = json!("remediation.medik8s.io/v1alpha1");
    let objects = [view(theirs)];
    let nodes: Vec<&NodeView> = w.nodes.iter().collect();
    let templates: Vec<Option<&TemplateView>> = w.templates.iter().map(Option::as_ref).collect();
    let remediations: Vec<&RemediationView> = objects.iter().collect();
    let input = NhcInput {
        check: &w.check,
        policy: &policy,
        nodes: &nodes,
        templates: &templates,
        remediations: &remediations,
        around: Default::default(),
    };
    let plan = decide(&input, at(301));
    let creates: Vec<&Value> = plan
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::CreateRemediation { object, .. } => Some(object),
            _ => None,
        })
        .collect();
    assert_eq!(creates.len(), 1, "n1 only: n2 has the operator's object {:?}", plan.actions);
    assert_eq!(
        creates[0]["metadata"]["ownerReferences"],
        json!([{"apiVersion": "remediation.medik8s.io/v1alpha1", "kind": "NodeHealthCheck", "name": "nhc",
                "uid": "nhc-uid", "controller": false, "blockOwnerDeletion": false}])
    );
    let n2 = plan.status.unhealthy_nodes.iter().find(|u| u.name == "n2").expect("n2 listed");
    assert_eq!(n2.remediations[0].resource.uid.as_deref(), Some("uid-n2"), "the operator's object is the check's own");
}

/// The template of `w` with `multiple-templates-support` (upstream: objects named by the API
/// server, `generateName`).
fn several_per_node(w: &mut World) {
    w.templates[0] = Some(
        TemplateView::read(&json!({
            "apiVersion": SNR_API, "kind": "SelfNodeRemediationTemplate",
            "metadata": {"name": "snr", "namespace": NS,
                         "annotations": {"remediation.medik8s.io/multiple-templates-support": "true"}},
            "spec": {"template": {"spec": {"x": 1}}}
        }))
        .expect("template"),
    );
}

fn snr_template_ref() -> vigil_api::validate::TemplateRef {
    vigil_api::validate::TemplateRef {
        api_version: SNR_API.into(),
        kind: "SelfNodeRemediationTemplate".into(),
        namespace: NS.into(),
        name: "snr".into(),
    }
}

// Deliberately unlike upstream (which uses `generateName`): the object's name is computed, so a
// create repeated or landing late is refused while the object exists.
#[test]
fn rule7_multiple_templates_support_names_each_object_so_a_repeat_is_refused() {
    let mut w = world(spec(json!({})), vec![sick("n1"), healthy("n2"), healthy("n3")]);
    several_per_node(&mut w);
    let p1 = w.decide(at(301));
    let Some(Action::CreateRemediation { object, .. }) = p1.actions.first() else { panic!("a create") };
    let name = vigil_engine::node::several_per_node_name("n1", "nhc", &snr_template_ref(), 0);
    assert_eq!(object["metadata"]["name"], json!(name));
    assert!(name.starts_with("n1-") && name != "n1", "{name}");
    assert!(object["metadata"].get("generateName").is_none(), "never a server-generated name");
    assert_eq!(object["metadata"]["annotations"]["remediation.medik8s.io/node-name"], json!("n1"));
    assert_eq!(p1.status.unhealthy_nodes[0].remediations[0].resource.name, name);

    // Not visible yet: the same object is asked for again (a second create of it is a 409).
    w.check.status = Some(p1.status.clone());
    let p2 = w.decide(at(302));
    assert_eq!(created_names(&p2), vec![name.clone()]);
    assert_eq!(p2.status.unhealthy_nodes, p1.status.unhealthy_nodes, "its start is kept");
    assert_eq!(p2.notices, vec![]);

    // Once seen, the record gets its uid, and keeps its start.
    w.apply(&p1, at(303));
    let p3 = w.decide(at(304));
    let r = &p3.status.unhealthy_nodes[0].remediations[0];
    assert_eq!(r.resource.name, name);
    assert_eq!(r.resource.uid.as_deref(), Some(format!("uid-{name}").as_str()));
    assert_eq!(r.started, Time(at(301)));
    assert_eq!(p3.actions, vec![]);
}

fn created_names(plan: &Plan<NodeHealthCheckStatus>) -> Vec<String> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            Action::CreateRemediation { object, .. } => object["metadata"]["name"].as_str().map(str::to_string),
            _ => None,
        })
        .collect()
}

#[test]
fn rule7_a_generate_name_request_recorded_by_an_earlier_version_is_awaited_until_its_step_timeout() {
    let mut w = world(escalating(), vec![sick("n1"), healthy("n2"), healthy("n3")]);
    several_per_node(&mut w);
    let p1 = w.decide(at(301));
    assert_eq!(created_targets(&p1), strs(&["n1"]));
    // A status an earlier version wrote: the request had no name (`generateName`), and its
    // object may still come.
    let mut status = p1.status.clone();
    status.unhealthy_nodes[0].remediations[0].resource.name = String::new();
    w.check.status = Some(status);
    let p2 = w.decide(at(601));
    assert_eq!(p2.actions, vec![], "within the step timeout the request is awaited");
    assert_eq!(p2.next_wake, Some(ns1(at(601))));
    w.check.status = Some(p2.status.clone());
    let t = ns1(at(601));
    let p3 = w.decide(t);
    let name = vigil_engine::node::several_per_node_name("n1", "nhc", &snr_template_ref(), 0);
    assert_eq!(created_names(&p3), vec![name.clone()], "lost: asked again, by name");
    let r = &p3.status.unhealthy_nodes[0].remediations;
    assert_eq!((r.len(), r[0].started.clone(), r[0].resource.name.as_str()), (1, Time(t), name.as_str()));
    assert_eq!(p3.notices, vec![]);
}

#[test]
fn rule7_a_fixed_name_request_not_seen_yet_is_repeated_with_its_start() {
    let mut w = world(spec(json!({})), vec![sick("n1"), healthy("n2"), healthy("n3")]);
    let p1 = w.decide(at(301));
    w.check.status = Some(p1.status.clone()); // the create was lost
    let p2 = w.decide(at(360));
    // The same object again; its Node's Lease is asked for from the new decision's instant.
    let without_lease = |actions: &[Action]| -> Vec<Action> {
        actions
            .iter()
            .map(|a| match a {
                Action::CreateRemediation { object, target, lease, after } => {
                    assert_eq!(lease.as_ref().map(|l| l.node.as_str()), Some("n1"));
                    Action::CreateRemediation {
                        object: object.clone(),
                        target: target.clone(),
                        lease: None,
                        after: after.clone(),
                    }
                }
                other => other.clone(),
            })
            .collect()
    };
    assert_eq!(without_lease(&p2.actions), without_lease(&p1.actions));
    assert_eq!(p2.status.unhealthy_nodes, p1.status.unhealthy_nodes);
    assert_eq!(p2.notices, vec![]);
}

#[test]
fn rule7_a_missing_or_invalid_template_disables_remediation() {
    let invalid_no_template = TemplateView::read(&json!({
        "apiVersion": SNR_API, "kind": "SelfNodeRemediationTemplate",
        "metadata": {"name": "snr", "namespace": NS}, "spec": {}
    }))
    .expect("template");
    let invalid_no_spec = TemplateView::read(&json!({
        "apiVersion": SNR_API, "kind": "SelfNodeRemediationTemplate",
        "metadata": {"name": "snr", "namespace": NS}, "spec": {"template": {"metadata": {}}}
    }))
    .expect("template");
    // (template, reason, problem)
    let table: Vec<(Option<TemplateView>, &str, &str)> = vec![
        (None, "RemediationTemplateNotFound", "remediation template SelfNodeRemediationTemplate medik8s/snr not found"),
        (
            Some(invalid_no_template),
            "RemediationTemplateInvalid",
            "remediation template SelfNodeRemediationTemplate medik8s/snr has no spec.template",
        ),
        (
            Some(invalid_no_spec),
            "RemediationTemplateInvalid",
            "remediation template SelfNodeRemediationTemplate medik8s/snr has no spec.template.spec",
        ),
    ];
    for (template, reason, problem) in table {
        let mut w = world(spec(json!({})), vec![sick("n1"), healthy("n2"), healthy("n3")]);
        w.templates[0] = template;
        let plan = w.step(at(301));
        assert_eq!(plan.actions, vec![], "{reason}");
        assert_eq!(plan.status.phase.as_deref(), Some("Disabled"));
        assert_eq!(plan.status.reason.as_deref(), Some(problem));
        let c = get_condition(&plan.status.conditions, "Disabled").expect("Disabled");
        assert_eq!((c.status.as_str(), c.reason.as_str(), c.message.as_str()), ("True", reason, problem));
        let skipped: Vec<_> = plan.notices.iter().filter(|n| n.kind == NoticeKind::RemediationSkipped).collect();
        assert_eq!(skipped.len(), 1, "{reason}");
        assert_eq!(skipped[0].target_key().as_deref(), Some("n1"));
        assert_eq!(skipped[0].reason, reason);
        assert_eq!(skipped[0].message, format!("Cannot remediate node n1: {problem}"));
        // said once
        assert_eq!(w.decide(at(302)).notices, vec![], "{reason}");
        // a second node needing it is told about too
        w.set_node(sick("n2"));
        w.check.spec.min_healthy = Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(0));
        let plan = w.decide(at(303));
        let skipped: Vec<_> = plan
            .notices
            .iter()
            .filter(|n| n.kind == NoticeKind::RemediationSkipped)
            .filter_map(|n| n.target_key())
            .collect();
        assert_eq!(skipped, strs(&["n2"]), "{reason}");
    }
}

#[test]
fn rule7_with_templates_found_the_disabled_condition_says_enabled() {
    let plan = world(spec(json!({})), vec![healthy("n1")]).decide(at(1));
    let c = get_condition(&plan.status.conditions, "Disabled").expect("Disabled");
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "Enabled"));
    assert_eq!(c.observed_generation, Some(3));
    assert_eq!(plan.status.phase.as_deref(), Some("Enabled"));
}

#[test]
fn rule7_only_objects_owned_by_this_check_count() {
    let foreign_owner = {
        let mut v = snr("n1", at(0));
        v["metadata"]["ownerReferences"][0]["name"] = json!("other-check");
        v
    };
    let stale_uid = {
        let mut v = snr("n1", at(0));
        v["metadata"]["ownerReferences"][0]["uid"] = json!("old-uid");
        v
    };
    let no_uid = {
        let mut v = snr("n1", at(0));
        v["metadata"]["ownerReferences"][0].as_object_mut().expect("owner").remove("uid");
        v
    };
    let no_node = {
        let mut v = snr("n1", at(0));
        v["metadata"]["annotations"].as_object_mut().expect("annotations").remove("remediation.medik8s.io/node-name");
        v
    };
    // (object, counts as n1's?)
    let table =
        vec![(snr("n1", at(0)), true), (foreign_owner, false), (stale_uid, false), (no_uid, true), (no_node, false)];
    for (i, (obj, ours)) in table.into_iter().enumerate() {
        let mut w = world(spec(json!({})), vec![healthy("n1"), healthy("n2"), healthy("n9")]);
        w.objects.push(view(obj));
        let plan = w.decide(at(301));
        assert_eq!(plan.status.healthy_nodes, if ours { 2 } else { 3 }, "case {i}");
        assert_eq!(deleted(&plan).len(), usize::from(ours), "case {i}: only our own objects are cleaned up");
    }
}

#[test]
fn rule7_an_object_of_our_name_owned_by_another_check_is_not_listed_as_ours() {
    let foreign = {
        let mut v = snr("n1", at(0));
        v["metadata"]["ownerReferences"][0]["name"] = json!("other-check");
        v["metadata"]["ownerReferences"][0]["uid"] = json!("other-uid");
        v
    };
    let mut w = world(spec(json!({})), vec![sick("n1"), healthy("n2"), healthy("n3")]);
    w.objects.push(view(foreign.clone()));
    let plan = w.step(at(301));
    assert_eq!(plan.actions, vec![], "the other check's object is left alone and not re-created");
    let [entry] = plan.status.unhealthy_nodes.as_slice() else { panic!("n1 listed: {:?}", plan.status) };
    assert_eq!((entry.name.as_str(), entry.remediations.len()), ("n1", 0), "no remediation this check did not start");
    assert_eq!(plan.status.phase.as_deref(), Some("Enabled"));
    let skipped: Vec<_> = plan.notices.iter().filter(|n| n.kind == NoticeKind::RemediationSkipped).collect();
    assert_eq!(skipped.len(), 1);
    assert_eq!(skipped[0].reason, "RemediationObjectExists");
    assert_eq!(
        skipped[0].message,
        "Cannot remediate node n1: SelfNodeRemediation medik8s/n1 already exists and belongs to another check (owner NodeHealthCheck other-check)"
    );
    let again = w.step(at(302));
    assert_eq!((again.actions.len(), again.notices.len()), (0, 0), "said once: {:?}", again.notices);

    // A create this check asked for, answered by someone else's object of that name (the API
    // server refused ours as AlreadyExists): the record of the request is dropped.
    let mut w = world(spec(json!({})), vec![sick("n1"), healthy("n2"), healthy("n3")]);
    let asked = w.decide(at(301));
    assert_eq!(created_targets(&asked), strs(&["n1"]));
    w.check.status = Some(asked.status.clone());
    assert_eq!(asked.status.phase.as_deref(), Some("Remediating"));
    w.objects.push(view(foreign));
    let plan = w.decide(at(302));
    assert_eq!(plan.actions, vec![]);
    assert_eq!(plan.status.unhealthy_nodes[0].remediations, vec![]);
    assert_eq!(plan.status.phase.as_deref(), Some("Enabled"));
    let reasons: Vec<&str> = plan.notices.iter().map(|n| n.reason.as_str()).collect();
    assert_eq!(reasons, ["RemediationObjectExists"]);
}

#[test]
fn rule7_deleting_objects_count_but_are_not_acted_on() {
    let mut obj = snr("n1", at(0));
    obj["metadata"]["deletionTimestamp"] = json!(at(350).to_string());
    let mut w = world(spec(json!({})), vec![healthy("n1"), healthy("n2"), healthy("n3")]);
    w.objects.push(view(obj));
    let plan = w.decide(at(400));
    assert_eq!(plan.actions, vec![]);
    assert_eq!(plan.status.healthy_nodes, 2, "not healthy until the object is gone");
    assert_eq!(listed(&plan), strs(&["n1"]));
    // an unhealthy node whose only object is being deleted waits for it to go
    w.set_node(sick("n1"));
    assert_eq!(w.decide(at(400)).actions, vec![]);
}

#[test]
fn rule7_one_control_plane_node_at_a_time() {
    let cp = |name: &str, label: &str, sick: bool| {
        node(name).label(label, "").ready(if sick { "False" } else { "True" }, t0()).build()
    };
    let cp_label = "node-role.kubernetes.io/control-plane";
    let master = "node-role.kubernetes.io/master";
    let mut w = world(
        spec(json!({"maxUnhealthy": "100%"})),
        vec![
            cp("cp-c", cp_label, true),
            cp("cp-b", master, true),
            cp("cp-a", cp_label, false),
            sick("w1"),
            healthy("w2"),
        ],
    );
    let plan = w.step(at(301));
    assert_eq!(created_targets(&plan), strs(&["cp-b", "w1"]), "the first control-plane node by name, and workers");
    let skipped: Vec<_> = plan.notices.iter().filter(|n| n.kind == NoticeKind::RemediationSkipped).collect();
    assert_eq!(skipped.len(), 1);
    assert_eq!(skipped[0].target_key().as_deref(), Some("cp-c"));
    assert_eq!(skipped[0].reason, "ControlPlaneRemediationInProgress");
    assert_eq!(listed(&plan), strs(&["cp-b", "cp-c", "w1"]));

    // next time: cp-b's object exists, cp-c is still waiting, and nobody is told again
    let plan = w.step(at(302));
    assert_eq!(plan.actions, vec![]);
    assert_eq!(plan.notices, vec![]);

    // cp-b recovers: its object goes, then cp-c gets its turn
    w.set_node(cp("cp-b", master, false));
    let plan = w.step(at(303));
    assert_eq!(deleted(&plan), strs(&["SelfNodeRemediation medik8s/cp-b"]));
    assert_eq!(created_targets(&plan), Vec::<String>::new(), "cp-b's object still exists in this plan");
    let plan = w.step(at(304));
    assert_eq!(created_targets(&plan), strs(&["cp-c"]));
}

#[test]
fn rule7_a_control_plane_remediation_by_anyone_blocks() {
    let mut foreign = snr("cp-a", at(0));
    foreign["metadata"]["ownerReferences"] = json!([{"apiVersion": "x/v1", "kind": "Other", "name": "o", "uid": "u"}]);
    let cp = |name: &str, sick: bool| {
        node(name)
            .label("node-role.kubernetes.io/control-plane", "")
            .ready(if sick { "False" } else { "True" }, t0())
            .build()
    };
    let mut w = world(spec(json!({"maxUnhealthy": "100%"})), vec![cp("cp-a", false), cp("cp-b", true), healthy("w1")]);
    w.objects.push(view(foreign.clone()));
    let plan = w.decide(at(301));
    assert_eq!(created_targets(&plan), Vec::<String>::new());
    assert_eq!(
        notices(&plan),
        vec![(NoticeKind::Unhealthy, "cp-b".into()), (NoticeKind::RemediationSkipped, "cp-b".into())]
    );

    // an object for a control-plane node that is not in the cluster does not block
    w.nodes.retain(|n| n.name != "cp-a");
    assert_eq!(created_targets(&w.decide(at(301))), strs(&["cp-b"]));

    // nor does another owner's object for the node itself
    let mut own = snr("cp-b", at(0));
    own["metadata"]["name"] = json!("someone-elses");
    own["metadata"]["ownerReferences"] = json!([{"apiVersion": "x/v1", "kind": "Other", "name": "o", "uid": "u"}]);
    w.objects = vec![view(own)];
    assert_eq!(created_targets(&w.decide(at(301))), strs(&["cp-b"]));
}

#[test]
fn rule7_escalation_times_out_each_step_then_stops() {
    let mut w = world(escalating(), vec![sick("n1"), healthy("n2"), healthy("n3")]);
    let p = w.step(at(301));
    assert_eq!(created(&p), vec![("SelfNodeRemediation".into(), "n1".into())]);

    let p = w.step(at(302));
    assert_eq!(p.actions, vec![]);
    assert_eq!(p.next_wake, Some(ns1(at(601))), "SNR started at 301 with a 5m timeout");

    let p = w.step(at(601));
    assert_eq!(p.actions, vec![], "exactly at the deadline it has not timed out yet");

    let t = ns1(at(601));
    let p = w.step(t);
    assert_eq!(annotated(&p), vec![("SelfNodeRemediation medik8s/n1".into(), TIMED_OUT.into(), t.to_string())]);
    assert_eq!(created(&p), vec![("FenceAgentsRemediation".into(), "n1".into())]);
    // The plan says the next step is created only after the first one's annotation is written.
    let after: Vec<String> = p
        .actions
        .iter()
        .flat_map(|a| a.after().iter().map(|o| format!("{} {}/{}", o.kind, o.namespace, o.name)))
        .collect();
    assert_eq!(after, ["SelfNodeRemediation medik8s/n1"]);
    assert_eq!(notices(&p), vec![(NoticeKind::RemediationTimedOut, "n1".into())]);
    assert_eq!(
        p.notices[0].message,
        "SelfNodeRemediation medik8s/n1 for node n1 (template snr) did not succeed within 5m0s; escalating to FenceAgentsRemediationTemplate medik8s/far"
    );
    let records = &p.status.unhealthy_nodes[0].remediations;
    assert_eq!(records.len(), 2);
    assert_eq!(
        (records[0].resource.kind.as_str(), records[0].timed_out.clone()),
        ("SelfNodeRemediation", Some(Time(t)))
    );
    assert_eq!((records[1].resource.kind.as_str(), records[1].started.clone()), ("FenceAgentsRemediation", Time(t)));
    assert_eq!(p.next_wake, Some(ns1(t + SignedDuration::from_mins(10))));

    // deciding again changes nothing and tells nothing
    let again = w.decide(t);
    assert_eq!((again.actions.clone(), again.notices.clone()), (vec![], vec![]));

    let t2 = ns1(t + SignedDuration::from_mins(10));
    let p = w.step(t2);
    assert_eq!(annotated(&p), vec![("FenceAgentsRemediation medik8s/n1".into(), TIMED_OUT.into(), t2.to_string())]);
    assert_eq!(created(&p), vec![]);
    assert_eq!(
        notices(&p),
        vec![(NoticeKind::RemediationTimedOut, "n1".into()), (NoticeKind::NoTemplateLeft, "n1".into())]
    );
    assert_eq!(p.next_wake, None);

    let p = w.step(t2 + SignedDuration::from_hours(1));
    assert_eq!((p.actions.clone(), p.notices.clone()), (vec![], vec![]), "no template left is said once");
}

#[test]
fn rule7_a_failed_remediation_is_given_up_at_once_even_with_one_template() {
    let mut w = world(spec(json!({})), vec![sick("n1"), healthy("n2"), healthy("n3")]);
    w.objects.push(view(with_conditions(snr("n1", at(301)), &[("Succeeded", "False")])));
    let p = w.step(at(302));
    assert_eq!(annotated(&p), vec![("SelfNodeRemediation medik8s/n1".into(), TIMED_OUT.into(), at(302).to_string())]);
    assert_eq!(
        notices(&p),
        vec![
            (NoticeKind::Unhealthy, "n1".into()),
            (NoticeKind::RemediationTimedOut, "n1".into()),
            (NoticeKind::NoTemplateLeft, "n1".into())
        ]
    );
    assert_eq!(p.notices[1].reason, "RemediationFailed");
    let p = w.step(at(303));
    assert_eq!((p.actions.clone(), p.notices.clone()), (vec![], vec![]));

    // a single template never times out by time alone
    let mut w = world(spec(json!({})), vec![sick("n1"), healthy("n2"), healthy("n3")]);
    w.objects.push(view(snr("n1", at(301))));
    let p = w.decide(at(100_000));
    assert_eq!((p.actions.clone(), p.next_wake), (vec![], None));
}

#[test]
fn rule7_escalation_goes_on_while_the_threshold_blocks() {
    let mut w = world(escalating(), vec![sick("n1"), healthy("n2"), healthy("n3")]);
    w.step(at(301));
    w.set_node(sick("n2")); // 1 of 3 healthy: below 51%
    let p = w.step(ns1(at(601)));
    assert_eq!(allowed_condition(&p).1, "TooFewHealthy");
    assert_eq!(created(&p), vec![("FenceAgentsRemediation".into(), "n1".into())], "n1 moves on, n2 waits");
}

#[test]
fn rule7_a_lost_timed_out_annotation_is_written_again_without_news() {
    let mut w = world(escalating(), vec![sick("n1"), healthy("n2"), healthy("n3")]);
    w.step(at(301));
    let t = ns1(at(601));
    let p = w.decide(t);
    w.check.status = Some(p.status.clone()); // status written, actions lost
    let again = w.decide(at(700));
    assert_eq!(annotated(&again), vec![("SelfNodeRemediation medik8s/n1".into(), TIMED_OUT.into(), t.to_string())]);
    assert_eq!(created(&again), vec![("FenceAgentsRemediation".into(), "n1".into())]);
    assert_eq!(again.notices, vec![]);
    assert_eq!(again.status.unhealthy_nodes, p.status.unhealthy_nodes, "the FAR record keeps its start");
}

// ---------------------------------------------------------------- rule 8: recovery

#[test]
fn rule8_healthy_delay_decides_when_objects_go() {
    // (healthyDelay, decide at (seconds after recovery) -> deleted?)
    type Checks = Vec<(i64, bool)>;
    let table: Vec<(Option<&str>, Checks)> =
        vec![(None, vec![(0, true)]), (Some("0s"), vec![(0, true)]), (Some("10m"), vec![(0, false), (600, false)])];
    for (delay, steps) in table {
        let extra = delay.map_or(json!({}), |d| json!({"healthyDelay": d}));
        let mut w = world(spec(extra), vec![sick("n1"), healthy("n2"), healthy("n3")]);
        w.step(at(301));
        w.set_node(node("n1").ready("True", at(350)).build());
        let recovered = at(400);
        for (after, want_delete) in steps {
            let now = recovered + SignedDuration::from_secs(after);
            let p = w.step(now);
            assert_eq!(deleted(&p).len(), usize::from(want_delete), "{delay:?} at +{after}s");
            let e = &p.status.unhealthy_nodes[0];
            assert_eq!(e.conditions_healthy_timestamp, Some(Time(recovered)), "{delay:?}: first seen healthy");
            assert_eq!(e.healthy_delayed, (!want_delete).then_some(true), "{delay:?}");
            assert_eq!(p.status.healthy_nodes, 2, "not healthy while its object exists");
            if !want_delete {
                assert_eq!(p.next_wake, Some(ns1(recovered + SignedDuration::from_mins(10))));
            }
        }
        if delay == Some("10m") {
            let p = w.step(ns1(recovered + SignedDuration::from_mins(10)));
            assert_eq!(deleted(&p), strs(&["SelfNodeRemediation medik8s/n1"]));
        }
        // the object is gone: the node is healthy and leaves the status
        let p = w.step(at(2000));
        assert_eq!(listed(&p), Vec::<String>::new());
        assert_eq!(p.status.healthy_nodes, 3);
        assert_eq!(notices(&p), vec![(NoticeKind::Healthy, "n1".into())]);
        assert_eq!(p.status.phase.as_deref(), Some("Enabled"));
    }
}

#[test]
fn rule8_negative_delay_waits_for_manual_confirmation() {
    let mut w = world(spec(json!({"healthyDelay": "-1s"})), vec![sick("n1"), healthy("n2"), healthy("n3")]);
    w.step(at(301));
    w.set_node(healthy("n1"));
    let p = w.step(at(100_000));
    assert_eq!(deleted(&p), Vec::<String>::new());
    assert_eq!(p.status.unhealthy_nodes[0].healthy_delayed, Some(true));
    assert_eq!(p.next_wake, None);
    w.set_node(node("n1").ready("True", t0()).annotate(CONFIRMED, "").build());
    let p = w.step(at(100_001));
    assert_eq!(deleted(&p), strs(&["SelfNodeRemediation medik8s/n1"]));
}

#[test]
fn rule8_matching_a_rule_again_clears_the_healthy_timestamp() {
    let mut w = world(spec(json!({"healthyDelay": "10m"})), vec![sick("n1"), healthy("n2"), healthy("n3")]);
    w.step(at(301));
    w.set_node(healthy("n1"));
    let p = w.step(at(400));
    assert_eq!(p.status.unhealthy_nodes[0].conditions_healthy_timestamp, Some(Time(at(400))));
    // not ready again, for a short while only (pending): the wait is reset
    w.set_node(node("n1").ready("False", at(450)).build());
    let p = w.step(at(460));
    let e = &p.status.unhealthy_nodes[0];
    assert_eq!((e.conditions_healthy_timestamp.clone(), e.healthy_delayed), (None, None));
    assert_eq!(p.actions, vec![]);
    // healthy again: a new wait starts now
    w.set_node(healthy("n1"));
    let p = w.step(at(500));
    assert_eq!(p.status.unhealthy_nodes[0].conditions_healthy_timestamp, Some(Time(at(500))));
}

// ---------------------------------------------------------------- rule 9: vanished nodes

#[test]
fn rule9_objects_of_deleted_nodes_are_removed_unless_deletion_is_expected() {
    // (object conditions, deleted?)
    let table: Vec<(&[(&str, &str)], bool)> = vec![
        (&[], true),
        (&[("PermanentNodeDeletionExpected", "True")], false),
        (&[("PermanentNodeDeletionExpected", "True"), ("Succeeded", "True")], true),
        (&[("PermanentNodeDeletionExpected", "True"), ("Succeeded", "False")], false),
        (&[("PermanentNodeDeletionExpected", "False")], true),
    ];
    for (conds, want) in table {
        let mut w = world(spec(json!({})), vec![healthy("n1"), healthy("n2")]);
        w.objects.push(view(with_conditions(snr("gone", at(0)), conds)));
        let p = w.step(at(10));
        assert_eq!(deleted(&p), if want { strs(&["SelfNodeRemediation medik8s/gone"]) } else { vec![] }, "{conds:?}");
        assert_eq!(listed(&p), strs(&["gone"]), "{conds:?}: listed while its object exists");
        assert_eq!((p.status.observed_nodes, p.status.healthy_nodes), (2, 2));
        let p = w.step(at(11));
        assert_eq!(listed(&p), if want { vec![] } else { strs(&["gone"]) }, "{conds:?}: leaves with its objects");
        assert_eq!(p.notices, vec![]);
    }
}

#[test]
fn rule9_objects_of_nodes_no_longer_selected_are_removed() {
    let mut w = world(spec(json!({})), vec![sick("n1"), healthy("n2"), healthy("n3")]);
    w.step(at(301));
    w.set_node(node("n1").label("skip", "yes").ready("False", t0()).build());
    let p = w.step(at(302));
    assert_eq!(deleted(&p), strs(&["SelfNodeRemediation medik8s/n1"]));
    assert_eq!(p.status.observed_nodes, 2);
}

// ---------------------------------------------------------------- rule 10: status

#[test]
fn rule10_phase_priority() {
    // (template missing, paused, a node being remediated) -> phase
    let table = [
        (true, true, true, "Disabled"),
        (false, true, true, "Paused"),
        (false, false, true, "Remediating"),
        (false, false, false, "Enabled"),
        (false, true, false, "Paused"),
    ];
    for (missing, paused, remediating, want) in table {
        let mut w = world(spec(json!({})), vec![healthy("n1"), healthy("n2"), healthy("n3")]);
        if missing {
            w.templates[0] = None;
        }
        if paused {
            w.check.spec.pause_requests = vec!["x".into()];
        }
        if remediating {
            w.set_node(sick("n1"));
            w.objects.push(view(snr("n1", at(301))));
        }
        let p = w.decide(at(400));
        assert_eq!(p.status.phase.as_deref(), Some(want), "{missing} {paused} {remediating}");
    }
}

#[test]
fn rule10_a_no_change_decision_keeps_the_status_as_is() {
    let mut w = world(spec(json!({})), vec![sick("n3"), healthy("n1"), sick("n2"), healthy("n4"), healthy("n5")]);
    let p1 = w.step(at(301));
    assert_eq!(p1.status.last_update_time, Some(Time(at(301))));
    assert_eq!(p1.status.observed_generation, Some(3));
    assert_eq!(listed(&p1), strs(&["n2", "n3"]), "sorted by name");
    // the objects show up: their records learn their uids
    let p2 = w.step(at(302));
    assert_eq!(p2.status.unhealthy_nodes[0].remediations[0].resource.uid.as_deref(), Some("uid-n2"));
    assert_eq!(p2.status.last_update_time, Some(Time(at(302))));
    let before = w.check.status.clone();
    let p2 = w.step(at(500));
    assert_eq!(Some(&p2.status), before.as_ref());
    assert_eq!(p2.status.last_update_time, Some(Time(at(302))), "nothing changed: no write");
    let c = get_condition(&p2.status.conditions, "RemediationAllowed").expect("condition");
    assert_eq!(c.last_transition_time, Time(at(301)));

    // a change moves lastUpdateTime, but not the transition time of unchanged conditions
    w.set_node(healthy("n3"));
    let p3 = w.step(at(600));
    assert_eq!(p3.status.last_update_time, Some(Time(at(600))));
    let c = get_condition(&p3.status.conditions, "RemediationAllowed").expect("condition");
    assert_eq!(c.last_transition_time, Time(at(301)));
}

#[test]
fn rule10_remediating_while_paused_keeps_true_counts() {
    let mut w = world(spec(json!({"pauseRequests": ["p"]})), vec![sick("n1"), healthy("n2"), healthy("n3")]);
    w.objects.push(view(snr("n1", at(301))));
    let p = w.decide(at(400));
    assert_eq!((p.status.observed_nodes, p.status.healthy_nodes), (3, 2));
}

// ---------------------------------------------------------------- rule 11: notices

#[test]
fn rule11_notices_follow_transitions_only() {
    let mut w = world(spec(json!({})), vec![node("n2").ready("Unknown", t0()).build(), healthy("n1"), healthy("n3")]);
    let p = w.step(at(301));
    assert_eq!(notices(&p), vec![(NoticeKind::Unhealthy, "n2".into())]);
    assert_eq!(p.notices[0].reason, "Ready=Unknown");
    assert_eq!(p.notices[0].message, "Node n2 has had condition Ready=Unknown for more than 5m0s");
    assert!(p.notices[0].kind.is_warning());
    assert_eq!(w.step(at(302)).notices, vec![]);

    w.set_node(healthy("n2"));
    let p = w.step(at(303));
    assert_eq!(notices(&p), vec![], "still has its object: not healthy yet");
    let p = w.step(at(304));
    assert_eq!(notices(&p), vec![(NoticeKind::Healthy, "n2".into())]);
    assert_eq!(w.step(at(305)).notices, vec![]);

    // blocked, then allowed again
    w.set_node(sick("n1"));
    w.set_node(sick("n2"));
    let p = w.step(at(400));
    assert_eq!(
        notices(&p),
        vec![
            (NoticeKind::RemediationBlocked, String::new()),
            (NoticeKind::Unhealthy, "n1".into()),
            (NoticeKind::Unhealthy, "n2".into())
        ]
    );
    w.set_node(healthy("n1"));
    let p = w.step(at(401));
    assert_eq!(notices(&p), vec![(NoticeKind::RemediationAllowed, String::new()), (NoticeKind::Healthy, "n1".into())]);
    assert_eq!(created_targets(&p), strs(&["n2"]));
}

// ---------------------------------------------------------------- rule 12: next_wake

#[test]
fn rule12_next_wake_is_the_earliest_pending_instant() {
    // (nodes, now, want)
    let table: Vec<(Vec<NodeView>, Timestamp, Option<Timestamp>)> = vec![
        (vec![healthy("a"), healthy("b")], at(100), None),
        (
            vec![node("a").ready("Unknown", at(100)).build(), node("b").ready("False", at(50)).build(), healthy("c")],
            at(200),
            Some(ns1(at(350))),
        ),
        // an unhealthy node without escalation has nothing to wait for
        (vec![sick("a"), healthy("b"), healthy("c")], at(400), None),
        (vec![sick("a"), node("b").ready("False", at(390)).build(), healthy("c")], at(400), Some(ns1(at(690)))),
    ];
    for (i, (nodes, now, want)) in table.into_iter().enumerate() {
        let w = world(spec(json!({"minHealthy": 0})), nodes);
        assert_eq!(w.decide(now).next_wake, want, "case {i}");
    }
}

#[test]
fn rule12_next_wake_takes_the_earliest_of_timers_of_every_kind() {
    let mut w =
        world(spec(json!({"healthyDelay": "2m"})), vec![sick("n1"), healthy("n2"), healthy("n3"), healthy("n4")]);
    w.step(at(301));
    w.set_node(healthy("n1"));
    w.set_node(node("n2").ready("False", at(250)).build()); // pending until 550
    let p = w.step(at(400)); // n1's delay ends at 520
    assert_eq!(p.next_wake, Some(ns1(at(520))));
    w.set_node(node("n2").ready("False", at(150)).build()); // pending until 450
    let p = w.decide(at(400));
    assert_eq!(p.next_wake, Some(ns1(at(450))));
}

// ---------------------------------------------------------------- reason-aware rules and remediation per condition

const MDR_API: &str = "machine-deletion-remediation.medik8s.io/v1alpha1";
const RULE_ANNOTATION: &str = "vigil.dev/rule";
const KERNEL: &str = "spec.unhealthyConditions[1] KernelDeadlock=True";
const DISK: &str = "spec.unhealthyConditions[2] DiskFailing=True";
const READY: &str = "spec.unhealthyConditions[0] Ready=False";

fn mdr_ref() -> Value {
    json!({"apiVersion": MDR_API, "kind": "MachineDeletionRemediationTemplate", "name": "replace", "namespace": NS})
}

/// The check's own remediation is SNR; a `KernelDeadlock=True` with reason `KernelHasDeadlock`
/// for 60s gets FAR; a `DiskFailing=True` for 60s gets SNR for 5m, then MDR.
fn per_rule_spec() -> Value {
    spec(json!({"unhealthyConditions": [
        {"type": "Ready", "status": "False", "duration": "300s"},
        {"type": "KernelDeadlock", "status": "True", "duration": "60s", "reasons": ["KernelHasDeadlock"],
         "remediationTemplate": far_ref()},
        {"type": "DiskFailing", "status": "True", "duration": "60s", "escalatingRemediations": [
            {"remediationTemplate": snr_ref(), "order": 1, "timeout": "5m"},
            {"remediationTemplate": mdr_ref(), "order": 2, "timeout": "10m"}]},
    ]}))
}

/// `n1` with `Ready=True` and the given `(type, status, reason, since)` conditions, and two
/// healthy Nodes (so the 51% threshold allows one remediation).
fn per_rule_world(conditions: &[(&str, &str, &str, Timestamp)]) -> World {
    world(per_rule_spec(), vec![n1_with(("True", t0()), conditions), healthy("n2"), healthy("n3")])
}

fn n1_with(ready: (&str, Timestamp), conditions: &[(&str, &str, &str, Timestamp)]) -> NodeView {
    let mut n = node("n1").ready(ready.0, ready.1);
    for (t, st, r, since) in conditions {
        n = n.cond_reason(t, st, r, *since);
    }
    n.build()
}

fn chosen(plan: &Plan<NodeHealthCheckStatus>) -> Vec<(String, String, String)> {
    plan.status
        .features
        .chosen_remediations
        .iter()
        .map(|c| (c.name.clone(), c.rule.clone(), c.remediation.clone()))
        .collect()
}

fn rule_annotations(plan: &Plan<NodeHealthCheckStatus>) -> Vec<String> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            Action::CreateRemediation { object, .. } => {
                Some(object["metadata"]["annotations"][RULE_ANNOTATION].as_str().unwrap_or("<none>").to_string())
            }
            _ => None,
        })
        .collect()
}

const FAR_REMEDIATION: &str =
    "spec.unhealthyConditions[1].remediationTemplate (FenceAgentsRemediationTemplate medik8s/far)";
const DISK_REMEDIATION: &str = "spec.unhealthyConditions[2].escalatingRemediations (SelfNodeRemediationTemplate medik8s/snr, then MachineDeletionRemediationTemplate medik8s/replace)";
const OWN_REMEDIATION: &str = "spec.remediationTemplate (SelfNodeRemediationTemplate medik8s/snr)";

#[test]
fn reasons_decide_whether_a_node_condition_matches_a_rule() {
    // (what, KernelDeadlock's reason, the kind created at 61s)
    let rows = [
        ("a listed reason matches", Some("KernelHasDeadlock"), Some("FenceAgentsRemediation")),
        ("another reason does not", Some("DockerHung"), None),
        ("reasons compare exactly", Some("kernelHasDeadlock"), None),
        ("no reason matches no rule with reasons", None, None),
    ];
    for (what, reason, kind) in rows {
        let want: Vec<(String, String)> = kind.map(|k| (k.to_string(), "n1".to_string())).into_iter().collect();
        let n = match reason {
            Some(r) => n1_with(("True", t0()), &[("KernelDeadlock", "True", r, t0())]),
            None => node("n1").ready("True", t0()).cond("KernelDeadlock", "True", Some(t0())).build(),
        };
        let w = world(per_rule_spec(), vec![n, healthy("n2"), healthy("n3")]);
        let plan = w.decide(at(61));
        assert_eq!(created(&plan), want, "{what}");
        assert_eq!(plan.status.healthy_nodes, if want.is_empty() { 3 } else { 2 }, "{what}");
    }
    // Without reasons (medik8s' rule) any reason matches.
    let any = spec(json!({"unhealthyConditions": [{"type": "KernelDeadlock", "status": "True", "duration": "60s"}]}));
    let w = world(
        any,
        vec![n1_with(("True", t0()), &[("KernelDeadlock", "True", "DockerHung", t0())]), healthy("n2"), healthy("n3")],
    );
    assert_eq!(created_targets(&w.decide(at(61))), ["n1"]);
    // The timer is the condition's lastTransitionTime: a listed reason that replaced another
    // without a status change (the transition time kept) matches at once.
    let w = per_rule_world(&[("KernelDeadlock", "True", "KernelHasDeadlock", t0())]);
    assert_eq!(created_targets(&w.decide(at(3600))), ["n1"]);
}

/// The stale-signal guard applies to the conditions a rule matches, reasons included: a
/// condition whose reason the guarded rule does not list is neither matched nor reported stale.
#[test]
fn the_stale_guard_reads_the_same_reasons() {
    let guarded = spec(json!({"unhealthyConditions": [{"type": "KernelDeadlock", "status": "True", "duration": "60s",
        "reasons": ["KernelHasDeadlock"], "maxConditionAge": "3m"}]}));
    // Heartbeat at t0 (the builder's), 10m ago at 600s: stale if matched.
    for (reason, stale) in [("KernelHasDeadlock", 1), ("DockerHung", 0)] {
        let w = world(
            guarded.clone(),
            vec![n1_with(("True", t0()), &[("KernelDeadlock", "True", reason, t0())]), healthy("n2")],
        );
        let plan = w.decide(at(600));
        assert_eq!(plan.status.features.stale_target_count, stale, "{reason}");
        assert!(created(&plan).is_empty(), "{reason}: stale or not matched, never remediated");
    }
}

#[test]
fn a_rules_own_remediation_is_used_for_the_nodes_it_made_unhealthy_and_reported() {
    // (what, n1's conditions, Ready, what is created at the instant, the chosen rule and remediation)
    type Row<'a> =
        (&'a str, Vec<(&'a str, &'a str, &'a str, Timestamp)>, &'a str, Timestamp, &'a str, &'a str, &'a str);
    let rows: Vec<Row<'_>> = vec![
        (
            "the rule's template",
            vec![("KernelDeadlock", "True", "KernelHasDeadlock", t0())],
            "True",
            at(61),
            "FenceAgentsRemediation",
            KERNEL,
            FAR_REMEDIATION,
        ),
        (
            "the rule's escalation, first step",
            vec![("DiskFailing", "True", "SmartError", t0())],
            "True",
            at(61),
            "SelfNodeRemediation",
            DISK,
            DISK_REMEDIATION,
        ),
        (
            "a rule without its own: the check's",
            vec![],
            "False",
            at(301),
            "SelfNodeRemediation",
            READY,
            OWN_REMEDIATION,
        ),
        (
            "several match: the first in spec order",
            vec![("DiskFailing", "True", "SmartError", t0()), ("KernelDeadlock", "True", "KernelHasDeadlock", t0())],
            "False",
            at(301),
            "SelfNodeRemediation",
            READY,
            OWN_REMEDIATION,
        ),
        (
            "KernelDeadlock before DiskFailing",
            vec![("DiskFailing", "True", "SmartError", t0()), ("KernelDeadlock", "True", "KernelHasDeadlock", t0())],
            "True",
            at(61),
            "FenceAgentsRemediation",
            KERNEL,
            FAR_REMEDIATION,
        ),
    ];
    for (what, conditions, ready, now, kind, rule, remediation) in rows {
        let w = world(per_rule_spec(), vec![n1_with((ready, t0()), &conditions), healthy("n2"), healthy("n3")]);
        let plan = w.decide(now);
        assert_eq!(created(&plan), [(kind.to_string(), "n1".to_string())], "{what}");
        let template = if kind == "FenceAgentsRemediation" { "far" } else { "snr" };
        let object = plan.actions.iter().find_map(|a| match a {
            Action::CreateRemediation { object, .. } => Some(object),
            _ => None,
        });
        assert_eq!(object.map(|o| o["spec"]["from"].clone()), Some(json!(template)), "{what}: the template's own spec");
        assert_eq!(rule_annotations(&plan), [rule], "{what}: the choice is on the object");
        assert_eq!(chosen(&plan), [("n1".to_string(), rule.to_string(), remediation.to_string())], "{what}");
        let told: Vec<_> = plan.notices.iter().filter(|n| n.kind == NoticeKind::RemediationChosen).collect();
        assert_eq!(told.len(), 1, "{what}");
        assert!(told[0].message.contains(rule) && told[0].message.contains(remediation), "{what}: {}", told[0].message);
        assert_eq!(told[0].reason.as_str(), "RemediationChosen");
    }
    // A rule's template that is missing disables the check (said once) and stops that rule's
    // remediation only: a Node of another rule is still remediated.
    let mut w = world(
        per_rule_spec(),
        vec![
            n1_with(("True", t0()), &[("KernelDeadlock", "True", "KernelHasDeadlock", t0())]),
            node("n2").ready("False", t0()).build(),
            healthy("n3"),
            healthy("n4"),
            healthy("n5"),
        ],
    );
    w.templates[1] = None; // FAR, the KernelDeadlock rule's own
    let plan = w.decide(at(301));
    assert_eq!(created(&plan), [("SelfNodeRemediation".to_string(), "n2".to_string())]);
    let disabled = get_condition(&plan.status.conditions, "Disabled").expect("Disabled");
    assert_eq!((disabled.status.as_str(), disabled.reason.as_str()), ("True", "RemediationTemplateNotFound"));
    assert!(disabled.message.contains("FenceAgentsRemediationTemplate medik8s/far not found"), "{}", disabled.message);
    assert!(
        plan.notices.iter().any(|n| n.kind == NoticeKind::RemediationSkipped
            && n.target_key().as_deref() == Some("n1")
            && n.message.contains("far not found")),
        "{:?}",
        plan.notices
    );

    // Off by default: no report, no annotation of Vigil's.
    let w = world(spec(json!({})), vec![sick("n1"), healthy("n2"), healthy("n3")]);
    let plan = w.decide(ns1(at(300)));
    assert_eq!(rule_annotations(&plan), ["<none>"]);
    assert!(chosen(&plan).is_empty());
    assert!(plan.notices.iter().all(|n| n.kind != NoticeKind::RemediationChosen));
}

// Over 80 lines on purpose: one incident told as a story, each step's expectations next to it.
#[test]
fn a_chosen_escalation_goes_on_when_another_rule_starts_matching_and_across_a_lost_status() {
    // DiskFailing at t0: the rule's escalation starts with SNR at 61s.
    let mut w = per_rule_world(&[("DiskFailing", "True", "SmartError", t0())]);
    let p = w.step(at(61));
    assert_eq!(created(&p), [("SelfNodeRemediation".to_string(), "n1".to_string())]);
    // Ready=False since t0 (rule 0, the check's own SNR, which never escalates) holds from 301s.
    w.set_node(n1_with(("False", t0()), &[("DiskFailing", "True", "SmartError", t0())]));
    let p = w.step(at(302));
    assert!(created(&p).is_empty(), "nothing on top of the running step");
    assert_eq!(chosen(&p)[0].1, DISK);
    assert!(p.notices.iter().all(|n| n.kind != NoticeKind::RemediationChosen), "nothing new to tell");
    // The status is lost before the step times out: the object's annotation keeps the rule.
    w.check.status = None;
    let p = w.step(at(303));
    assert_eq!(chosen(&p)[0].1, DISK);
    assert!(created(&p).is_empty());
    // 61s + 5m: SNR gave up, the rule's next step (MDR) starts. The check's own would have none.
    let p = w.step(ns1(at(361)));
    assert_eq!(created(&p), [("MachineDeletionRemediation".to_string(), "n1".to_string())]);
    assert_eq!(rule_annotations(&p), [DISK]);
    assert!(p.notices.iter().all(|n| n.kind != NoticeKind::NoTemplateLeft));
}

#[test]
fn a_choice_made_while_remediation_is_blocked_is_kept_until_it_starts() {
    // n1 (KernelDeadlock) and n2 (Ready=False) unhealthy: 1 of 3 healthy, below 51%: blocked.
    let n2_sick = node("n2").ready("False", t0()).build();
    let mut w = world(
        per_rule_spec(),
        vec![n1_with(("True", t0()), &[("KernelDeadlock", "True", "KernelHasDeadlock", t0())]), n2_sick, healthy("n3")],
    );
    let p = w.step(at(301));
    assert!(created(&p).is_empty());
    assert_eq!(
        chosen(&p).iter().map(|c| (c.0.as_str(), c.1.as_str())).collect::<Vec<_>>(),
        [("n1", KERNEL), ("n2", READY)]
    );
    // n1's Ready turns False too (rule 0, earlier in spec order); then n2 recovers.
    w.set_node(n1_with(("False", at(400)), &[("KernelDeadlock", "True", "KernelHasDeadlock", t0())]));
    w.step(at(701));
    w.set_node(healthy("n2"));
    let p = w.step(at(702));
    assert_eq!(
        created(&p),
        [("FenceAgentsRemediation".to_string(), "n1".to_string())],
        "the incident's rule, not rule 0"
    );
}

/// `Plan::remediating` (the `vigil_check_remediating` gauge) counts the unhealthy Nodes the
/// status lists with remediation objects: none while `minHealthy` blocks them, both once it lets
/// them start, one once the other is healthy again and its object is seen gone.
#[test]
fn remediating_counts_nodes_listed_with_remediation_objects() {
    let nodes = vec![sick("a"), sick("b"), healthy("c"), healthy("d"), healthy("e")];
    let blocked = world(spec(json!({"minHealthy": 4})), nodes.clone()).decide(at(301));
    assert_eq!(
        (blocked.status.unhealthy_nodes.len(), blocked.remediating),
        (2, 0),
        "blocked: unhealthy, not remediating"
    );
    let mut w = world(spec(json!({"minHealthy": 2})), nodes);
    let first = w.step(at(301));
    assert_eq!(created_targets(&first), strs(&["a", "b"]));
    assert_eq!(first.remediating, 2);
    w.set_node(healthy("a"));
    let plan = w.step(at(400));
    assert_eq!(deleted(&plan).len(), 1);
    assert_eq!(plan.remediating, 2, "a's entry stays until its object is seen gone");
    assert_eq!(w.step(at(401)).remediating, 1);
}

/// Pacing applies to a rule's own remediation as to the check's (a start is a start): with
/// `maxInFlight: 1`, two Nodes the same rule made unhealthy get its template one at a time,
/// longest-unhealthy first, and the rule's object holds the slot until its Node is healthy.
/// A Node carrying `health=bad`.
const BAD_LABEL: &str = "'health' in node.labels && node.labels['health'] == 'bad'";

#[test]
fn an_expressions_own_remediation_is_used_for_the_nodes_it_made_unhealthy() {
    let mut spec = per_rule_spec();
    spec["unhealthyExpressions"] = json!([
        {"expression": BAD_LABEL, "duration": "0s", "remediationTemplate": far_ref()},
        {"expression": "node.unschedulable", "duration": "0s", "escalatingRemediations": [
            {"remediationTemplate": snr_ref(), "order": 1, "timeout": "5m"},
            {"remediationTemplate": mdr_ref(), "order": 2, "timeout": "10m"}]},
    ]);
    let bad_rule = format!("spec.unhealthyExpressions[0] {BAD_LABEL}");
    let far = "spec.unhealthyExpressions[0].remediationTemplate (FenceAgentsRemediationTemplate medik8s/far)";
    let cordoned_rule = "spec.unhealthyExpressions[1] node.unschedulable";
    let ladder = "spec.unhealthyExpressions[1].escalatingRemediations (SelfNodeRemediationTemplate medik8s/snr, then MachineDeletionRemediationTemplate medik8s/replace)";
    // (what, n1, what is created, the chosen rule and remediation)
    let rows: [(&str, NodeView, &str, &str, &str); 3] = [
        (
            "the expression's template",
            node("n1").ready("True", t0()).label("health", "bad").build(),
            "FenceAgentsRemediation",
            &bad_rule,
            far,
        ),
        (
            "the expression's escalation",
            node("n1").ready("True", t0()).cordoned().build(),
            "SelfNodeRemediation",
            cordoned_rule,
            ladder,
        ),
        (
            "a condition rule before an expression",
            node("n1").ready("False", t0()).label("health", "bad").build(),
            "SelfNodeRemediation",
            READY,
            OWN_REMEDIATION,
        ),
    ];
    for (what, n1, kind, rule, remediation) in rows {
        let w = world(spec.clone(), vec![n1, healthy("n2"), healthy("n3")]);
        let plan = w.decide(at(301));
        assert_eq!(created(&plan), [(kind.to_string(), "n1".to_string())], "{what}");
        assert_eq!(rule_annotations(&plan), [rule], "{what}: the choice is on the object");
        assert_eq!(chosen(&plan), [("n1".to_string(), rule.to_string(), remediation.to_string())], "{what}");
    }
    // An expression's MachineDeletion template cannot be combined with maxUnhealthy, as a
    // condition rule's cannot.
    let refused = self::spec(json!({"maxUnhealthy": 1, "unhealthyExpressions": [
        {"expression": "node.unschedulable", "duration": "0s", "escalatingRemediations": [
            {"remediationTemplate": mdr_ref(), "order": 1, "timeout": "5m"}]}]}));
    let check: NodeHealthCheck = serde_json::from_value(json!({
        "apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck",
        "metadata": {"name": "nhc"}, "spec": refused,
    }))
    .expect("check");
    let err = vigil_api::validate::node_health_check(&check).expect_err("refused");
    assert!(err.to_string().contains("spec.unhealthyExpressions[0].escalatingRemediations[0]"), "{err}");
}

#[test]
fn pacing_applies_to_a_rules_own_remediation() {
    let mut s = per_rule_spec();
    s["maxInFlight"] = json!(1);
    let deadlocked = |name: &str, since: Timestamp| {
        node(name).ready("True", t0()).cond_reason("KernelDeadlock", "True", "KernelHasDeadlock", since).build()
    };
    let nodes = vec![deadlocked("n1", at(10)), deadlocked("n2", t0()), healthy("n3"), healthy("n4"), healthy("n5")];
    let mut w = world(s, nodes);
    let first = w.step(at(120));
    assert_eq!(created(&first), [("FenceAgentsRemediation".to_string(), "n2".to_string())], "longest-unhealthy first");
    let queued: Vec<&str> = first.status.features.queued.iter().map(|q| q.name.as_str()).collect();
    assert_eq!((queued, first.status.features.queued_count), (vec!["n1"], 1));
    let second = w.step(at(130));
    assert!(created(&second).is_empty(), "n2's object of the rule's template holds the only slot");
    assert_eq!(second.status.features.queued_count, 1);
    w.set_node(healthy("n2"));
    let third = w.step(at(140));
    assert_eq!(created(&third), [("FenceAgentsRemediation".to_string(), "n1".to_string())], "a freed slot");
    assert_eq!(third.status.features.queued_count, 0);
    assert_eq!(rule_annotations(&third), [KERNEL], "n1's object records the rule that chose it");
}
