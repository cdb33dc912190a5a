//! Which NodeHealthChecks a remediation object wakes: its owner always; the others only when it
//! may hold the one-control-plane-node lock (a control-plane Node, or a Node not known).

use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};
use vigil_api::NodeHealthCheck;
use vigil_api::views::Meta;
use vigil_api::views::NodeView;
use vigil_engine::concerns::{nhc_concerns_remediation_object, remediation_node_name};

const SNR: &str = "self-node-remediation.medik8s.io/v1alpha1";

fn check(name: &str) -> NodeHealthCheck {
    serde_json::from_value(json!({
        "apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck", "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": {"pool": name}}, "minHealthy": "51%",
                 "unhealthyConditions": [{"type": "Ready", "status": "False", "duration": "5m"}],
                 "remediationTemplate": {"apiVersion": SNR, "kind": "SelfNodeRemediationTemplate",
                                         "name": "reboot", "namespace": "medik8s"}}}))
    .expect("check")
}

fn object(kind: &str, name: &str, owner: &str, node: Option<&str>) -> Meta {
    let annotations = node.map_or(json!({}), |n| json!({"remediation.medik8s.io/node-name": n}));
    let v = json!({"apiVersion": SNR, "kind": kind,
        "metadata": {"name": name, "namespace": "medik8s", "annotations": annotations,
                     "ownerReferences": [{"apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck",
                                          "name": owner, "uid": "u"}]}});
    Meta::read(&v, &mut Vec::new()).expect("meta")
}

fn node(name: &str, labels: Value) -> NodeView {
    let node: Node = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}),
    )
    .expect("node");
    NodeView::from(node)
}

#[test]
fn a_remediation_object_wakes_its_owner_and_only_lock_holders_wake_the_others() {
    let (a, b) = (check("a"), check("b"));
    let (pa, pb) = (
        vigil_api::validate::node_health_check(&a).expect("valid"),
        vigil_api::validate::node_health_check(&b).expect("valid"),
    );
    let worker = node("w1", json!({"pool": "a"}));
    let cp = node("cp1", json!({"node-role.kubernetes.io/control-plane": ""}));
    let snr = object("SelfNodeRemediation", "w1", "a", None);
    let cp_snr = object("SelfNodeRemediation", "x-1", "a", Some("cp1"));
    assert_eq!(remediation_node_name(&cp_snr), "cp1", "the annotation names the Node");
    // b lists w1 in its status (it waits on it, e.g. on a's node Lease).
    let mut b_listing = b.clone();
    b_listing.status = Some(serde_json::from_value(json!({"unhealthyNodes": [{"name": "w1"}]})).expect("status"));
    let cases = [
        ("owner, worker Node", &a, &pa, &snr, Some(&worker), true),
        ("other check, worker Node the check lists", &b_listing, &pb, &snr, Some(&worker), true),
        ("other check, worker Node", &b, &pb, &snr, Some(&worker), false),
        ("other check, control-plane Node", &b, &pb, &cp_snr, Some(&cp), true),
        ("other check, unknown Node", &b, &pb, &snr, None, true),
        ("template the check uses", &b, &pb, &object("SelfNodeRemediationTemplate", "reboot", "x", None), None, true),
        ("another template", &b, &pb, &object("SelfNodeRemediationTemplate", "other", "x", None), None, false),
        ("unrelated kind", &b, &pb, &object("FenceAgentsRemediation", "w1", "a", None), None, false),
    ];
    for (what, check, policy, meta, node, want) in cases {
        assert_eq!(nhc_concerns_remediation_object(check, policy, meta, node), want, "{what}");
    }
}

/// With remediation per condition a rule's own template and its objects concern the check as its
/// own do, on both kinds (a change to them can change what the check does for that rule's targets).
#[test]
fn a_rules_own_template_and_its_objects_concern_the_check() {
    let far = "fence-agents-remediation.medik8s.io/v1alpha1";
    let mut nhc = check("a");
    nhc.spec.unhealthy_conditions[0].remediation_template = Some(
        serde_json::from_value(json!({"apiVersion": far, "kind": "FenceAgentsRemediationTemplate", "name": "fence", "namespace": "medik8s"}))
            .expect("template"),
    );
    let policy = vigil_api::validate::node_health_check(&nhc).expect("valid");
    let fence = |kind: &str, name: &str| {
        let v = json!({"apiVersion": far, "kind": kind, "metadata": {"name": name, "namespace": "medik8s",
            "ownerReferences": [{"apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck", "name": "a", "uid": "u"}]}});
        Meta::read(&v, &mut Vec::new()).expect("meta")
    };
    let worker = node("w1", json!({"pool": "a"}));
    assert!(nhc_concerns_remediation_object(&nhc, &policy, &fence("FenceAgentsRemediation", "w1"), Some(&worker)));
    assert!(nhc_concerns_remediation_object(&nhc, &policy, &fence("FenceAgentsRemediationTemplate", "fence"), None));

    let mhc: vigil_api::MachineHealthCheck = serde_json::from_value(json!({
        "apiVersion": "vigil.dev/v1alpha1", "kind": "MachineHealthCheck", "metadata": {"name": "m", "namespace": "ns"},
        "spec": {"clusterName": "c", "selector": {"matchLabels": {"pool": "a"}},
                 "unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": "5m",
                     "remediationTemplate": {"apiVersion": far, "kind": "FenceAgentsRemediationTemplate", "name": "fence"}}]}}))
    .expect("check");
    let mpolicy = vigil_api::validate::machine_health_check(&mhc).expect("valid");
    let in_ns = |kind: &str, name: &str| {
        Meta::read(
            &json!({"apiVersion": far, "kind": kind, "metadata": {"name": name, "namespace": "ns"}}),
            &mut Vec::new(),
        )
        .expect("meta")
    };
    use vigil_engine::concerns::mhc_concerns_remediation_object;
    assert!(mhc_concerns_remediation_object(&mhc, &mpolicy, &in_ns("FenceAgentsRemediation", "m1")));
    assert!(mhc_concerns_remediation_object(&mhc, &mpolicy, &in_ns("FenceAgentsRemediationTemplate", "fence")));
    assert!(!mhc_concerns_remediation_object(&mhc, &mpolicy, &in_ns("SelfNodeRemediation", "m1")));
}
