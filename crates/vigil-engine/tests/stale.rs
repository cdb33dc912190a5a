//! The stale-signal guard (`maxConditionAge`), as tables for both check kinds and as properties:
//! a matching condition whose heartbeat is strictly older than the rule's age (or missing) matches
//! no rule, counts for nothing, is reported once, and the plan wakes the instant a fresh one turns
//! stale.

mod support;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::NodeCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use proptest::prelude::*;
use serde_json::{Value, json};
use support::*;
use vigil_api::NodeHealthCheck;
use vigil_api::node_health_check::NodeHealthCheckStatus;
use vigil_api::views::NodeView;
use vigil_api::views::{RemediationView, TemplateView};
use vigil_engine::node::{self, NhcInput};
use vigil_engine::plan::{Action, NoticeKind, Plan};

const MEDIK8S: &str = "medik8s";
/// The detector's condition type.
const DETECTOR: &str = "KernelDeadlock";

/// A condition with its own heartbeat (`None`: no `lastHeartbeatTime`).
fn cond(type_: &str, status: &str, since: Timestamp, heartbeat: Option<Timestamp>) -> NodeCondition {
    NodeCondition {
        type_: type_.into(),
        status: status.into(),
        last_transition_time: Some(Time(since)),
        last_heartbeat_time: heartbeat.map(Time),
        reason: Some("Test".into()),
        message: None,
    }
}

/// A Node with `Ready=True` since long ago and the given conditions.
fn node_with(name: &str, extra: Vec<NodeCondition>) -> NodeView {
    let mut n = node(name).ready("True", t0()).build_k8s();
    if let Some(cs) = n.status.as_mut().and_then(|s| s.conditions.as_mut()) {
        cs.extend(extra);
    }
    NodeView::from(n)
}

fn nhc(spec: Value, status: Option<&NodeHealthCheckStatus>) -> NodeHealthCheck {
    let mut v = json!({
        "apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck",
        "metadata": {"name": "nhc", "uid": "nhc-uid", "generation": 1},
        "spec": spec,
    });
    if let Some(s) = status {
        v["status"] = serde_json::to_value(s).expect("status");
    }
    serde_json::from_value(v).expect("check")
}

/// minHealthy as given; the detector rule (5m, maxConditionAge 10m) and the kubelet's
/// `Ready=Unknown` (5m, not guarded).
fn nhc_spec(min_healthy: Value, extra_rules: &[Value]) -> Value {
    let mut rules = vec![
        json!({"type": DETECTOR, "status": "True", "duration": "5m", "maxConditionAge": "10m"}),
        json!({"type": "Ready", "status": "Unknown", "duration": "5m"}),
    ];
    rules.extend(extra_rules.iter().cloned());
    json!({
        "selector": {"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]},
        "unhealthyConditions": rules,
        "minHealthy": min_healthy,
        "remediationTemplate": {"apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate", "name": "snr", "namespace": MEDIK8S},
    })
}

fn snr_template() -> TemplateView {
    TemplateView::read(&json!({
        "apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate",
        "metadata": {"name": "snr", "namespace": MEDIK8S},
        "spec": {"template": {"spec": {}}}
    }))
    .expect("template")
}

/// An SNR the check made for `node`.
fn snr(node: &str) -> RemediationView {
    RemediationView::read(&json!({
        "apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediation",
        "metadata": {"name": node, "namespace": MEDIK8S, "uid": format!("snr-{node}"),
                     "creationTimestamp": "2030-01-01T00:00:00Z",
                     "annotations": {"remediation.medik8s.io/node-name": node, "remediation.medik8s.io/template-name": "snr"},
                     "ownerReferences": [{"apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck", "name": "nhc", "uid": "nhc-uid"}]},
        "spec": {}
    }))
    .expect("remediation object")
}

fn decide_nhc(
    spec: &Value,
    status: Option<&NodeHealthCheckStatus>,
    nodes: &[NodeView],
    objects: &[RemediationView],
    now: Timestamp,
) -> Plan<NodeHealthCheckStatus> {
    let check = nhc(spec.clone(), status);
    let policy = vigil_api::validate::node_health_check(&check).expect("valid");
    let refs: Vec<&NodeView> = nodes.iter().collect();
    let template = snr_template();
    let templates = [Some(&template)];
    let objects: Vec<&RemediationView> = objects.iter().collect();
    node::decide(
        &NhcInput {
            check: &check,
            policy: &policy,
            nodes: &refs,
            templates: &templates,
            remediations: &objects,
            around: Default::default(),
        },
        now,
    )
}

fn created_for(plan: &Plan<NodeHealthCheckStatus>) -> Vec<String> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            Action::CreateRemediation { target, .. } => Some(target.key()),
            _ => None,
        })
        .collect()
}

fn stale_notices<S>(plan: &Plan<S>) -> Vec<String> {
    plan.notices.iter().filter(|n| n.kind == NoticeKind::StaleCondition).filter_map(|n| n.target_key()).collect()
}

/// One hour in: the detector's condition has been True since t0 (so past its 5m).
fn now() -> Timestamp {
    at(3600)
}

fn ns(n: i64) -> SignedDuration {
    SignedDuration::from_nanos(n)
}

#[test]
fn node_health_check_sets_stale_conditions_aside() {
    let ten_min = SignedDuration::from_secs(600);
    let dead = |hb: Option<Timestamp>| node_with("n1", vec![cond(DETECTOR, "True", t0(), hb)]);
    // (what, n1, remediated, listed as stale)
    let rows: Vec<(&str, NodeView, Vec<&str>, Vec<&str>)> = vec![
        ("fresh heartbeat: remediated", dead(Some(now() - SignedDuration::from_secs(60))), vec!["n1"], vec![]),
        ("heartbeat exactly maxConditionAge old: still fresh", dead(Some(now() - ten_min)), vec!["n1"], vec![]),
        ("heartbeat 1ns older than maxConditionAge: stale", dead(Some(now() - ten_min - ns(1))), vec![], vec!["n1"]),
        ("no heartbeat at all: stale", dead(None), vec![], vec!["n1"]),
        (
            "stale detector, dead kubelet: remediated for the kubelet",
            node_with("n1", vec![cond(DETECTOR, "True", t0(), None), cond("Ready", "Unknown", t0(), Some(now()))]),
            vec!["n1"],
            vec!["n1"],
        ),
        (
            "a condition no rule matches is not the guard's business",
            node_with("n1", vec![cond(DETECTOR, "False", t0(), None)]),
            vec![],
            vec![],
        ),
    ];
    for (what, n1, remediated, stale) in rows {
        let nodes = [n1, node("n2").ready("True", t0()).build()];
        let plan = decide_nhc(&nhc_spec(json!(1), &[]), None, &nodes, &[], now());
        assert_eq!(created_for(&plan), remediated, "{what}");
        let listed: Vec<&str> = plan.status.features.stale_targets.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(listed, stale, "{what}");
        assert_eq!(plan.status.features.stale_target_count, stale.len() as i32, "{what}");
        assert_eq!(stale_notices(&plan), stale, "{what}: told on the transition");
        if remediated.is_empty() {
            assert_eq!(plan.status.healthy_nodes, 2, "{what}: a stale condition counts for nothing");
        }
    }
}

#[test]
fn a_stale_condition_matches_no_rule_of_its_type_and_the_strictest_age_wins() {
    let stale_true = node_with("n1", vec![cond(DETECTOR, "True", t0(), Some(now() - SignedDuration::from_secs(700)))]);
    let nodes = [stale_true, node("n2").ready("True", t0()).build()];
    // An Unknown rule of the same type does not pick up the stale condition.
    let unknown = json!({"type": DETECTOR, "status": "Unknown", "duration": "1m"});
    let plan = decide_nhc(&nhc_spec(json!(1), &[unknown]), None, &nodes, &[], now());
    assert_eq!(created_for(&plan), Vec::<String>::new());
    assert_eq!(plan.status.healthy_nodes, 2);
    // The same type and status guarded twice: the smaller age decides (unsure: do nothing)…
    let unguarded_twin = json!({"type": DETECTOR, "status": "True", "duration": "5m"});
    let plan = decide_nhc(&nhc_spec(json!(1), &[unguarded_twin]), None, &nodes, &[], now());
    assert_eq!(created_for(&plan), Vec::<String>::new(), "a guarded rule sets the condition aside for all rules");
    // …and without any maxConditionAge (the default) an old heartbeat means nothing.
    let mut spec = nhc_spec(json!(1), &[]);
    spec["unhealthyConditions"][0].as_object_mut().expect("rule").remove("maxConditionAge");
    let plan = decide_nhc(&spec, None, &nodes, &[], now());
    assert_eq!(created_for(&plan), ["n1"], "off by default: upstream behaviour");
    assert_eq!(plan.status.features.stale_target_count, 0);
}

#[test]
fn the_plan_wakes_the_instant_a_fresh_condition_turns_stale() {
    // True since 1m ago (pending until +4m), last heartbeat 9m50s ago: stale in 10s, first.
    let since = now() - SignedDuration::from_secs(60);
    let heartbeat = now() - SignedDuration::from_secs(590);
    let nodes = [node_with("n1", vec![cond(DETECTOR, "True", since, Some(heartbeat))])];
    let spec = nhc_spec(json!(0), &[]);
    let plan = decide_nhc(&spec, None, &nodes, &[], now());
    let turns_stale = heartbeat + SignedDuration::from_secs(600) + ns(1);
    assert_eq!(plan.next_wake, Some(turns_stale));
    assert_eq!(plan.status.healthy_nodes, 0, "pending while fresh");
    let before = decide_nhc(&spec, Some(&plan.status), &nodes, &[], turns_stale - ns(1));
    assert_eq!(before.status.features.stale_target_count, 0, "1ns before: still fresh");
    let then = decide_nhc(&spec, Some(&plan.status), &nodes, &[], turns_stale);
    assert_eq!(then.status.features.stale_target_count, 1);
    assert_eq!(stale_notices(&then), ["n1"]);
    assert_eq!(then.status.healthy_nodes, 1);
    // Told once: deciding again on that status says nothing new, and the list holds still.
    let again = decide_nhc(&spec, Some(&then.status), &nodes, &[], turns_stale + SignedDuration::from_secs(30));
    assert_eq!(stale_notices(&again), Vec::<String>::new());
    assert_eq!(again.status.features.stale_targets, then.status.features.stale_targets);
    // A fresh unhealthy condition also wakes when it turns stale (its remediation is then judged
    // as if the condition were gone).
    let unhealthy = [node_with("n1", vec![cond(DETECTOR, "True", t0(), Some(now() - SignedDuration::from_secs(60)))])];
    let plan = decide_nhc(&spec, None, &unhealthy, &[], now());
    assert_eq!(created_for(&plan), ["n1"]);
    assert_eq!(plan.next_wake, Some(now() + SignedDuration::from_secs(540) + ns(1)));
}

#[test]
fn a_remediation_in_progress_is_judged_as_if_the_stale_condition_were_gone() {
    let stale = [node_with("n1", vec![cond(DETECTOR, "True", t0(), Some(t0()))])];
    // healthyDelay 0 (the default): the Node matches nothing, so its object goes, as on recovery.
    let plan = decide_nhc(&nhc_spec(json!(0), &[]), None, &stale, &[snr("n1")], now());
    assert!(
        plan.actions.iter().any(|a| matches!(a, Action::DeleteRemediation { target, .. } if target.key() == "n1")),
        "{:?}",
        plan.actions
    );
    // A healthyDelay keeps it that long: a detector outage shorter than the delay ends nothing.
    let mut spec = nhc_spec(json!(0), &[]);
    spec["healthyDelay"] = json!("30m");
    let plan = decide_nhc(&spec, None, &stale, &[snr("n1")], now());
    assert!(plan.actions.iter().all(|a| !matches!(a, Action::DeleteRemediation { .. })), "{:?}", plan.actions);
    assert_eq!(plan.status.unhealthy_nodes[0].healthy_delayed, Some(true));
}

#[test]
fn a_dead_detector_does_not_short_circuit_the_check() {
    // Four Nodes with the dead detector's last word, one with a dead kubelet, minHealthy 3 of 5.
    let old = Some(now() - SignedDuration::from_secs(1200));
    let mut nodes: Vec<NodeView> =
        (2..=5).map(|i| node_with(&format!("n{i}"), vec![cond(DETECTOR, "True", t0(), old)])).collect();
    nodes.insert(0, node_with("n1", vec![cond("Ready", "Unknown", t0(), Some(now()))]));
    let plan = decide_nhc(&nhc_spec(json!(3), &[]), None, &nodes, &[], now());
    assert_eq!(created_for(&plan), ["n1"], "the dead kubelet is remediated, the stale detector's Nodes are not");
    assert_eq!((plan.status.healthy_nodes, plan.status.features.stale_target_count), (4, 4));
    // Without the guard the same fleet blocks everything.
    let mut spec = nhc_spec(json!(3), &[]);
    spec["unhealthyConditions"][0].as_object_mut().expect("rule").remove("maxConditionAge");
    let plan = decide_nhc(&spec, None, &nodes, &[], now());
    assert_eq!(created_for(&plan), Vec::<String>::new());
    assert_eq!(plan.status.healthy_nodes, 0);
}

#[test]
fn machine_health_check_sets_stale_conditions_aside() {
    let detector = json!({"type": DETECTOR, "status": "True", "timeout": "300s", "maxConditionAge": "10m"});
    let world = |heartbeat: Option<Timestamp>| {
        let mut rules = mhc_spec()["unhealthyConditions"].clone();
        rules.as_array_mut().expect("rules").push(detector.clone());
        let mut w = MhcWorld::new().spec("unhealthyConditions", rules).machine(machine("m1").node("m1"));
        w.nodes.insert("m1".into(), node_with("m1", vec![cond(DETECTOR, "True", t0(), heartbeat)]));
        w
    };
    let fresh = world(Some(now() - SignedDuration::from_secs(60))).decide(now());
    assert_eq!(written(&fresh, "m1", "HealthCheckSucceeded").map(|(c, _)| c.status.as_str()), Some("False"));
    assert_eq!(written(&fresh, "m1", "OwnerRemediated").map(|(c, _)| c.status.as_str()), Some("False"));
    assert_eq!(fresh.next_wake, Some(now() + SignedDuration::from_secs(540) + ns(1)), "wakes when it turns stale");

    let mut w = world(Some(now() - SignedDuration::from_secs(601)));
    let stale = w.decide(now());
    assert_eq!(written(&stale, "m1", "HealthCheckSucceeded").map(|(c, _)| c.status.as_str()), Some("True"));
    assert!(written(&stale, "m1", "OwnerRemediated").is_none(), "nothing remediated");
    assert_eq!(stale.status.current_healthy, 1);
    assert_eq!(
        (stale.status.features.stale_target_count, stale.status.features.stale_targets[0].name.as_str()),
        (1, "m1")
    );
    assert_eq!(stale_notices(&stale), [key("m1")]);
    let message = &stale.notices.iter().find(|n| n.kind == NoticeKind::StaleCondition).expect("notice").message;
    assert!(message.contains("MachineHealthCheck/ns/mhc") && message.contains("maxConditionAge 10m0s"), "{message}");
    w.apply(&stale);
    assert_eq!(stale_notices(&w.decide(now() + SignedDuration::from_secs(5))), Vec::<String>::new(), "told once");

    // A Machine already handed to its owner stays handed over: OwnerRemediated is not undone.
    let mut w = world(Some(now() - SignedDuration::from_secs(60)));
    let plan = w.decide(now());
    w.apply(&plan);
    w.nodes.insert("m1".into(), node_with("m1", vec![cond(DETECTOR, "True", t0(), Some(t0()))]));
    let later = w.decide(now() + SignedDuration::from_secs(600));
    assert_eq!(written(&later, "m1", "HealthCheckSucceeded").map(|(c, _)| c.status.as_str()), Some("True"));
    assert!(written(&later, "m1", "OwnerRemediated").is_none(), "as for a condition that went away");
}

proptest! {
    /// Over random heartbeats, ages and transition times: a Node whose only matching condition
    /// is stale is never remediated and counts as healthy; one whose condition is fresh gets
    /// exactly the verdict it gets without the guard; and the wake-up is never later than the
    /// instant a fresh condition turns stale.
    #[test]
    fn stale_never_remediates_and_fresh_is_judged_as_without_the_guard(
        nodes in prop::collection::vec((0i64..1800, prop::option::of(0i64..1800)), 1..8),
        age_min in 1i64..20,
    ) {
        let age = SignedDuration::from_secs(age_min * 60);
        let built: Vec<NodeView> = nodes
            .iter()
            .enumerate()
            .map(|(i, (since, hb))| {
                let heartbeat = hb.map(|h| now() - SignedDuration::from_secs(h));
                node_with(&format!("n{i:02}"), vec![cond(DETECTOR, "True", now() - SignedDuration::from_secs(*since), heartbeat)])
            })
            .collect();
        let mut guarded = nhc_spec(json!(0), &[]);
        guarded["unhealthyConditions"][0]["maxConditionAge"] = json!(format!("{age_min}m"));
        let mut plain = guarded.clone();
        plain["unhealthyConditions"][0].as_object_mut().expect("rule").remove("maxConditionAge");
        let with = decide_nhc(&guarded, None, &built, &[], now());
        let without = decide_nhc(&plain, None, &built, &[], now());
        let with_created = created_for(&with);
        let without_created = created_for(&without);
        let mut stale_count = 0;
        for (i, (_, hb)) in nodes.iter().enumerate() {
            let name = format!("n{i:02}");
            let fresh = hb.is_some_and(|h| SignedDuration::from_secs(h) <= age);
            if fresh {
                prop_assert_eq!(with_created.contains(&name), without_created.contains(&name), "{} fresh", name);
                let turns_stale = now() - SignedDuration::from_secs(hb.unwrap_or(0)) + age + ns(1);
                prop_assert!(with.next_wake.is_some_and(|w| w <= turns_stale), "{}: wake {:?} after {}", name, with.next_wake, turns_stale);
            } else {
                stale_count += 1;
                prop_assert!(!with_created.contains(&name), "{} stale but remediated", name);
                prop_assert!(with.status.features.stale_targets.iter().any(|s| s.name == name), "{} not listed", name);
            }
        }
        prop_assert_eq!(with.status.features.stale_target_count, stale_count);
        let pending_or_unhealthy = nodes.len() as i32 - stale_count;
        prop_assert_eq!(with.status.healthy_nodes, stale_count, "every stale Node counts healthy, no fresh one does");
        prop_assert_eq!(with.status.observed_nodes - with.status.healthy_nodes, pending_or_unhealthy);
    }
}

proptest! {
    /// MachineHealthCheck: over random heartbeats, a Machine whose Node's only matching condition
    /// is stale is never marked unhealthy nor handed to its owner, and is listed; a fresh one is
    /// marked exactly as without the guard.
    #[test]
    fn machine_stale_is_never_remediated_and_fresh_is_judged_as_without_the_guard(
        heartbeats in prop::collection::vec(prop::option::of(0i64..1800), 1..6),
    ) {
        let guarded = json!({"type": DETECTOR, "status": "True", "timeout": "300s", "maxConditionAge": "10m"});
        let mut plain = guarded.clone();
        plain.as_object_mut().expect("rule").remove("maxConditionAge");
        let world = |rule: &Value| {
            let mut w = MhcWorld::new().spec("unhealthyConditions", json!([rule]));
            for (i, hb) in heartbeats.iter().enumerate() {
                let name = format!("m{i}");
                let heartbeat = hb.map(|h| now() - SignedDuration::from_secs(h));
                w = w.machine(machine(&name).node(&name));
                w.nodes.insert(name.clone(), node_with(&name, vec![cond(DETECTOR, "True", t0(), heartbeat)]));
            }
            w
        };
        let with = world(&guarded).decide(now());
        let without = world(&plain).decide(now());
        let owner_asked = |plan: &Plan<vigil_api::MachineHealthCheckStatus>, name: &str| {
            written(plan, name, "OwnerRemediated").map(|(c, _)| c.status)
        };
        for (i, hb) in heartbeats.iter().enumerate() {
            let name = format!("m{i}");
            if hb.is_some_and(|h| h <= 600) {
                prop_assert_eq!(owner_asked(&with, &name), owner_asked(&without, &name), "{} fresh", name);
            } else {
                prop_assert_eq!(owner_asked(&with, &name), None, "{} stale but handed to its owner", name);
                let verdict = written(&with, &name, "HealthCheckSucceeded").map(|(c, _)| c.status.to_string());
                prop_assert_eq!(verdict.as_deref(), Some("True"), "{} stale counts as healthy", name);
                prop_assert!(with.status.features.stale_targets.iter().any(|s| s.name == name), "{} not listed", name);
            }
        }
    }
}
