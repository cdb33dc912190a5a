//! Dry-run (shadow mode) rules, as tables: what a check in dry-run reports, and that it never
//! writes. The properties (same counts and conditions as the real plan, exactly the targets the
//! real plan would remediate, settles at once) are in `machine_props.rs` and `node_props.rs`.

mod support;

use jiff::Timestamp;
use serde_json::{Value, json};
use support::*;
use vigil_api::NodeHealthCheck;
use vigil_api::node_health_check::NodeHealthCheckStatus;
use vigil_api::views::NodeView;
use vigil_api::views::{RemediationView, TemplateView};
use vigil_engine::node::{self, NhcInput};
use vigil_engine::plan::{NoticeKind, Plan};

/// `(name, action, since)` of a status list.
fn listed(list: &[vigil_api::shared::WouldRemediate]) -> Vec<(String, String, Timestamp)> {
    list.iter().map(|w| (w.name.clone(), w.action.clone(), w.since.0)).collect()
}

#[test]
fn machine_health_check_in_dry_run_lists_what_it_would_remediate() {
    struct Row {
        what: &'static str,
        world: MhcWorld,
        would: Vec<(&'static str, &'static str)>,
        allowed: &'static str,
    }
    let sick = |w: MhcWorld, name: &str| w.machine_with_node(machine(name), "False", t0());
    let well = |w: MhcWorld, name: &str| w.machine_with_node(machine(name), "True", t0());
    let base = || MhcWorld::new().spec("dryRun", json!(true));
    let rows = [
        Row {
            what: "owner remediation",
            world: well(sick(base(), "m1"), "m2"),
            would: vec![("m1", "OwnerRemediated=False")],
            allowed: "True",
        },
        Row {
            what: "external remediation",
            world: well(sick(base().with_template(), "m1"), "m2"),
            would: vec![("m1", "create TestRemediation")],
            allowed: "True",
        },
        Row {
            what: "maxUnhealthy is evaluated: 2 unhealthy of 3 > 1",
            world: well(sick(sick(base().spec("maxUnhealthy", json!(1)), "m1"), "m2"), "m3"),
            would: vec![],
            allowed: "False",
        },
        Row { what: "all healthy", world: well(well(base(), "m1"), "m2"), would: vec![], allowed: "True" },
    ];
    for row in rows {
        let plan = row.world.decide(at(301));
        assert_eq!(plan.actions, vec![], "{}: no Machine marked, nothing created", row.what);
        let expected: Vec<(String, String, Timestamp)> =
            row.would.iter().map(|(n, a)| (n.to_string(), a.to_string(), at(301))).collect();
        assert_eq!(listed(&plan.status.features.would_remediate), expected, "{}", row.what);
        let allowed = check_condition(&plan.status.conditions, "RemediationAllowed").map(|c| c.status.as_str());
        assert_eq!(allowed, Some(row.allowed), "{}", row.what);
        let would_notices: Vec<Option<String>> =
            plan.notices.iter().filter(|n| n.kind == NoticeKind::WouldRemediate).map(|n| n.target_key()).collect();
        assert_eq!(would_notices, row.would.iter().map(|(n, _)| Some(key(n))).collect::<Vec<_>>(), "{}", row.what);
    }
}

#[test]
fn machine_health_check_dry_run_keeps_since_tells_once_and_clears_on_recovery() {
    let mut w = MhcWorld::new().spec("dryRun", json!(true)).machine_with_node(machine("m1"), "False", t0());
    let first = w.decide(at(301));
    w.apply(&first);
    assert_eq!(notices(&first).iter().filter(|n| n.0 == NoticeKind::WouldRemediate).count(), 1);
    let later = w.decide(at(900));
    assert_eq!(
        listed(&later.status.features.would_remediate),
        listed(&first.status.features.would_remediate),
        "since is kept"
    );
    assert!(later.notices.iter().all(|n| n.kind != NoticeKind::WouldRemediate), "told once");
    w.apply(&later);
    w = w.node(node("m1").ready("True", at(950)));
    let recovered = w.decide(at(1000));
    assert_eq!(recovered.status.features.would_remediate, vec![]);
    assert_eq!(recovered.actions, vec![]);
    // Turning dry-run off remediates for real and empties the list.
    w.apply(&recovered);
    let mut real = w.spec("dryRun", json!(false));
    real = real.node(node("m1").ready("False", at(1000)));
    let plan = real.decide(at(1301));
    assert_eq!(plan.status.features.would_remediate, vec![]);
    assert!(written(&plan, "m1", "OwnerRemediated").is_some(), "a real plan marks the Machine");
}

const NS: &str = "medik8s";

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

fn snr_template() -> TemplateView {
    TemplateView::read(&json!({
        "apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate",
        "metadata": {"name": "snr", "namespace": NS},
        "spec": {"template": {"spec": {}}}
    }))
    .expect("template")
}

fn decide_nhc(
    spec: &Value,
    status: Option<&NodeHealthCheckStatus>,
    nodes: &[NodeView],
    now: Timestamp,
) -> Plan<NodeHealthCheckStatus> {
    let check = nhc(spec.clone(), status);
    let policy = vigil_api::validate::node_health_check(&check).expect("valid");
    let refs: Vec<&NodeView> = nodes.iter().collect();
    let template = snr_template();
    let templates = [Some(&template)];
    let remediations: [&RemediationView; 0] = [];
    node::decide(
        &NhcInput {
            check: &check,
            policy: &policy,
            nodes: &refs,
            templates: &templates,
            remediations: &remediations,
            around: Default::default(),
        },
        now,
    )
}

/// (what, minHealthy, nodes, would-be remediated, RemediationAllowed)
type Row<'a> = (&'a str, Value, Vec<NodeView>, Vec<&'a str>, &'a str);

#[test]
fn node_health_check_in_dry_run_lists_what_it_would_remediate() {
    let spec = |min_healthy: Value| {
        json!({
            "selector": {"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]},
            "minHealthy": min_healthy,
            "remediationTemplate": {"apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate", "name": "snr", "namespace": NS},
            "dryRun": true,
        })
    };
    let sick = |n: &str| node(n).ready("False", t0()).build();
    let well = |n: &str| node(n).ready("True", t0()).build();
    let rows: [Row<'_>; 3] = [
        ("one of three", json!(2), vec![sick("n1"), well("n2"), well("n3")], vec!["n1"], "True"),
        ("minHealthy is evaluated: 1 healthy < 2", json!(2), vec![sick("n1"), sick("n2"), well("n3")], vec![], "False"),
        ("two of four", json!("50%"), vec![sick("n1"), sick("n2"), well("n3"), well("n4")], vec!["n1", "n2"], "True"),
    ];
    for (what, min, nodes, would, allowed) in rows {
        let plan = decide_nhc(&spec(min.clone()), None, &nodes, at(301));
        assert_eq!(plan.actions, vec![], "{what}: nothing created");
        let names: Vec<&str> = plan.status.features.would_remediate.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(names, would, "{what}");
        assert!(
            plan.status.features.would_remediate.iter().all(|w| w.action == "create SelfNodeRemediation"),
            "{what}"
        );
        assert!(plan.status.unhealthy_nodes.iter().all(|e| e.remediations.is_empty()), "{what}: no request in flight");
        assert_eq!(plan.status.phase.as_deref(), Some("Enabled"), "{what}: nothing is being remediated");
        let cond = plan.status.conditions.iter().find(|c| c.type_ == "RemediationAllowed").map(|c| c.status.as_str());
        assert_eq!(cond, Some(allowed), "{what}");
        // Decided again on its own status, at a later instant: nothing moves, nothing is told again.
        let again = decide_nhc(&spec(min), Some(&plan.status), &nodes, at(400));
        assert_eq!(again.status, plan.status, "{what}: the status does not move");
        assert_eq!(again.notices, vec![], "{what}");
    }
}
