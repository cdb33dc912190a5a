//! Invariants of what a NodeHealthCheck reads around its Nodes, over random clusters:
//! - no Node is ever remediated while a Lease of another holder is unexpired, nor while the
//!   cluster upgrades, nor while it is under planned maintenance; every create takes (or holds)
//!   the Node's Lease for this check;
//! - over any lifecycle of remediation objects that remediators hold for a while after their
//!   deletion, the Nodes with remediation objects (being deleted included) never exceed what
//!   `minHealthy` allows.

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node;
use proptest::prelude::*;
use serde_json::{Value, json};
use vigil_api::NodeHealthCheck;
use vigil_api::node_health_check::NodeHealthCheckStatus;
use vigil_api::views::{ClusterVersionView, LeaseView, MaintenanceView, NodeView, RemediationView, TemplateView};
use vigil_engine::lookup::Observed;
use vigil_engine::node::{Around, NhcInput, decide};
use vigil_engine::{Action, Plan};

const SNR_API: &str = "self-node-remediation.medik8s.io/v1alpha1";
const ME: &str = "NodeHealthCheck-nhc";

fn t0() -> Timestamp {
    "2030-01-01T00:00:00Z".parse().expect("timestamp")
}

fn at(secs: i64) -> Timestamp {
    t0() + SignedDuration::from_secs(secs)
}

fn check(min_healthy: &str, maintenance: bool) -> NodeHealthCheck {
    serde_json::from_value(json!({
        "apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck",
        "metadata": {"name": "nhc", "uid": "nhc-uid"},
        "spec": {
            "selector": {"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]},
            "minHealthy": min_healthy,
            "remediationTemplate": {"apiVersion": SNR_API, "kind": "SelfNodeRemediationTemplate", "name": "snr", "namespace": "medik8s"},
            "plannedMaintenance": {"enabled": maintenance},
        }
    }))
    .expect("check")
}

fn template() -> TemplateView {
    TemplateView::read(&json!({
        "apiVersion": SNR_API, "kind": "SelfNodeRemediationTemplate",
        "metadata": {"name": "snr", "namespace": "medik8s"},
        "spec": {"template": {"spec": {}}}
    }))
    .expect("template")
}

fn node(i: usize, sick: bool, drained: bool) -> NodeView {
    let mut v = json!({"metadata": {"name": format!("n{i:02}"), "uid": format!("u{i}")},
                       "status": {"conditions": [{"type": "Ready", "status": if sick { "False" } else { "True" },
                                                  "lastTransitionTime": t0().to_string()}]}});
    if drained {
        v["spec"] = json!({"unschedulable": true, "taints": [{"key": "medik8s.io/drain", "effect": "NoSchedule"}]});
    }
    NodeView::from(serde_json::from_value::<Node>(v).expect("node"))
}

/// A Lease on Node `i`: (holder, renewed this many seconds before now, duration seconds).
fn lease(i: usize, holder: &str, renewed_ago: i64, seconds: i64, now: Timestamp) -> LeaseView {
    let renew = now - SignedDuration::from_secs(renewed_ago);
    LeaseView::read(&json!({
        "metadata": {"name": format!("node-n{i:02}"), "namespace": "medik8s-leases", "uid": format!("l{i}"), "resourceVersion": "5"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": seconds,
                 "acquireTime": renew.to_string(), "renewTime": renew.to_string()}
    }))
    .expect("named")
}

fn holder_name(h: u8) -> &'static str {
    match h % 4 {
        0 => "node-maintenance",
        1 => ME,
        2 => "NodeHealthCheck-other",
        _ => "",
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn no_node_is_remediated_over_another_holders_lease_an_upgrade_or_maintenance(
        nodes in proptest::collection::vec((any::<bool>(), any::<bool>(), proptest::option::of((any::<u8>(), 0i64..7200, 0i64..7200))), 1..12),
        upgrading in any::<bool>(),
        maintenance_rule in any::<bool>(),
        at_secs in 301i64..4000,
    ) {
        let now = at(at_secs);
        let check = check("1%", maintenance_rule);
        let policy = vigil_api::validate::node_health_check(&check).expect("valid");
        let views: Vec<NodeView> = nodes.iter().enumerate().map(|(i, (sick, drained, _))| node(i, *sick, *drained)).collect();
        let refs: Vec<&NodeView> = views.iter().collect();
        let leases: Vec<LeaseView> = nodes.iter().enumerate()
            .filter_map(|(i, (_, _, l))| l.map(|(h, ago, secs)| lease(i, holder_name(h), ago, secs, now)))
            .collect();
        let lease_refs: Vec<&LeaseView> = leases.iter().collect();
        let version = ClusterVersionView::read(&json!({"metadata": {"name": "version"}, "status": {"conditions": [
            {"type": "Progressing", "status": if upgrading { "True" } else { "False" }, "lastTransitionTime": t0().to_string()}]}}))
            .expect("named");
        let versions = [&version];
        let no_maintenances: [&MaintenanceView; 0] = [];
        let tv = template();
        let templates = [Some(&tv)];
        let input = NhcInput {
            check: &check, policy: &policy, nodes: &refs, templates: &templates, remediations: &[],
            around: Around { leases: &lease_refs, lease_namespace: "medik8s-leases",
                             maintenances: Observed::Known(&no_maintenances), cluster_versions: Observed::Known(&versions), machines: Observed::NotServed },
        };
        let plan = decide(&input, now);
        for a in &plan.actions {
            let Action::CreateRemediation { target, lease: taken, .. } = a else { continue };
            prop_assert!(!upgrading, "created during an upgrade: {target}");
            let i: usize = target.name().trim_start_matches('n').parse().expect("index");
            prop_assert!(!(maintenance_rule && nodes[i].1), "created on a Node under maintenance: {target}");
            let held = leases.iter().find(|l| l.meta.name == format!("node-{}", target.name()));
            if let Some(l) = held {
                let holder = l.holder.as_deref().unwrap_or("");
                let expiry = vigil_engine::node_lease::expiry(l);
                prop_assert!(
                    holder == ME || holder.is_empty() || expiry.is_none_or(|e| e < now),
                    "created on {target} while {holder} holds its Lease until {expiry:?}"
                );
            }
            // The Lease is this check's after the create: held long enough already, or taken.
            let mine_long_enough = held.is_some_and(|l| l.holder.as_deref() == Some(ME)
                && vigil_engine::node_lease::expiry(l).is_some_and(|e| e >= now + SignedDuration::from_mins(10)));
            match taken {
                Some(w) => prop_assert_eq!(w.holder.as_str(), ME),
                None => prop_assert!(mine_long_enough, "{target}: created without taking its Lease"),
            }
        }
        // A Lease is only ever renewed or released by its holder.
        for a in &plan.actions {
            if let Action::DeleteLease { lease: l, .. } = a {
                let before = leases.iter().find(|x| x.meta.name == l.name).expect("an existing Lease");
                prop_assert_eq!(before.holder.as_deref(), Some(ME));
            }
            if let Action::WriteLease(w) = a {
                prop_assert_eq!(w.holder.as_str(), ME);
            }
        }
    }

    #[test]
    fn terminating_objects_keep_every_budget(
        steps in proptest::collection::vec((0usize..6, any::<bool>(), 0u8..4), 1..40),
    ) {
        // Six Nodes, minHealthy 51% (4 healthy needed): at most 2 Nodes may have objects.
        let check = check("51%", false);
        let policy = vigil_api::validate::node_health_check(&check).expect("valid");
        let mut check = check;
        let mut sick = [false; 6];
        // Objects by Node: (object, steps left before its remediator lets go once deleted).
        let mut objects: Vec<(usize, Value, Option<u8>)> = Vec::new();
        let tv = template();
        let templates = [Some(&tv)];
        for (k, (i, fails, hold)) in steps.into_iter().enumerate() {
            let now = at(400 + 10 * k as i64);
            sick[i] = fails;
            // Remediators finish: an object whose hold ran out goes.
            objects.retain_mut(|(_, _, left)| match left {
                Some(0) => false,
                Some(n) => { *n -= 1; true }
                None => true,
            });
            let views: Vec<NodeView> = (0..6).map(|n| node(n, sick[n], false)).collect();
            let refs: Vec<&NodeView> = views.iter().collect();
            let rviews: Vec<RemediationView> = objects.iter().filter_map(|(_, o, _)| RemediationView::read(o)).collect();
            let rrefs: Vec<&RemediationView> = rviews.iter().collect();
            let input = NhcInput { check: &check, policy: &policy, nodes: &refs, templates: &templates, remediations: &rrefs, around: Around::default() };
            let plan: Plan<NodeHealthCheckStatus> = decide(&input, now);
            for a in &plan.actions {
                match a {
                    Action::CreateRemediation { object, target, .. } => {
                        let n: usize = target.name().trim_start_matches('n').parse().expect("index");
                        let mut o = object.clone();
                        o["metadata"]["uid"] = json!(format!("o{k}"));
                        o["metadata"]["creationTimestamp"] = json!(now.to_string());
                        objects.push((n, o, None));
                    }
                    Action::DeleteRemediation { object, .. } => {
                        for (_, o, left) in objects.iter_mut().filter(|(_, o, _)| o["metadata"]["name"] == object.name.as_str()) {
                            o["metadata"]["deletionTimestamp"] = json!(now.to_string());
                            *left = Some(hold);
                        }
                    }
                    _ => {}
                }
            }
            check.status = Some(plan.status.clone());
            let mut with_objects: Vec<usize> = objects.iter().map(|(n, _, _)| *n).collect();
            with_objects.sort_unstable();
            with_objects.dedup();
            prop_assert!(with_objects.len() <= 2, "Nodes with remediation objects {with_objects:?} at step {k}: minHealthy allows 2");
        }
    }
}
