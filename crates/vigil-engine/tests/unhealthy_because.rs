//! `node::unhealthy_because`: why `vigil check` says a Node is unhealthy — the same judgement as
//! `node::decide`, one row per case.

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node;
use serde_json::json;
use vigil_api::NodeHealthCheck;
use vigil_engine::node::unhealthy_because;

fn t0() -> Timestamp {
    "2030-01-01T00:00:00Z".parse().expect("timestamp")
}

fn at(secs: i64) -> Timestamp {
    t0() + SignedDuration::from_secs(secs)
}

/// (condition status, its lastTransitionTime, now, expected (rule status, since)).
type Row = (&'static str, Option<i64>, i64, Option<(&'static str, i64)>);

#[test]
fn names_the_rule_held_past_its_duration_and_since_when() {
    let check: NodeHealthCheck = serde_json::from_value(json!({
        "apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck", "metadata": {"name": "workers"},
        "spec": {"selector": {"matchLabels": {"role": "worker"}}, "minHealthy": 1,
                 "unhealthyConditions": [{"type": "Ready", "status": "False", "duration": "300s"},
                                         {"type": "Ready", "status": "Unknown", "duration": "60s"}],
                 "remediationTemplate": {"apiVersion": "self-node-remediation.medik8s.io/v1alpha1",
                     "kind": "SelfNodeRemediationTemplate", "name": "reboot", "namespace": "medik8s"}}}))
    .expect("check");
    let policy = vigil_api::validate::node_health_check(&check).expect("valid");
    // (condition status, since, now) → Some((rule status, since)) or None
    let rows: [Row; 6] = [
        ("True", Some(0), 1000, None),
        ("False", Some(0), 300, None), // exactly at the deadline: not yet (strict)
        ("False", Some(0), 301, Some(("False", 0))), // past it
        ("Unknown", Some(100), 161, Some(("Unknown", 100))),
        ("Unknown", Some(100), 150, None), // pending
        ("False", None, 1000, None),       // no lastTransitionTime: no decision
    ];
    for (status, since, now, want) in rows {
        let mut condition = json!({"type": "Ready", "status": status});
        if let Some(s) = since {
            condition["lastTransitionTime"] = json!(at(s).to_string());
        }
        let node: Node = serde_json::from_value(json!({"metadata": {"name": "n1", "labels": {"role": "worker"}},
            "status": {"conditions": [condition]}}))
        .expect("node");
        let got = unhealthy_because(&node.into(), &policy, at(now)).map(|(rule, since)| (rule.status.as_str(), since));
        assert_eq!(got, want.map(|(s, t)| (s, at(t))), "{status} since {since:?} at {now}");
    }
}
