//! OpenShift Machine API Machines in a scenario: a Node's Machine (its
//! `machine.openshift.io/machine` annotation) owns the remediation object made in its namespace,
//! as medik8s makes it; with no OpenShift Machine the Machine API counts as not served.

use serde_json::{Value, json};
use vigil_simulator::{Scenario, simulate};

fn scenario(machines: &str) -> String {
    format!(
        r#"
name: openshift
duration: 5m
objects:
  - apiVersion: vigil.dev/v1alpha1
    kind: NodeHealthCheck
    metadata: {{name: workers, uid: uid-workers}}
    spec:
      selector: {{matchLabels: {{role: worker}}}}
      minHealthy: 51%
      unhealthyConditions: [{{type: Ready, status: "False", duration: 1m}}]
      remediationTemplate: {{apiVersion: self-node-remediation.medik8s.io/v1alpha1, kind: SelfNodeRemediationTemplate, name: reboot, namespace: medik8s}}
  - apiVersion: self-node-remediation.medik8s.io/v1alpha1
    kind: SelfNodeRemediationTemplate
    metadata: {{name: reboot, namespace: medik8s}}
    spec: {{template: {{spec: {{}}}}}}
  - {{apiVersion: v1, kind: Node, metadata: {{name: w-1, labels: {{role: worker, node-role.kubernetes.io/control-plane: ""}}, annotations: {{machine.openshift.io/machine: medik8s/m-1}}}}}}
  - {{apiVersion: v1, kind: Node, metadata: {{name: w-2, labels: {{role: worker}}}}}}
  - {{apiVersion: v1, kind: Node, metadata: {{name: w-3, labels: {{role: worker}}}}}}
{machines}timeline:
  - at: 1m
    setNodeCondition: {{node: w-1, type: Ready, status: "False"}}
"#
    )
}

fn object_of(text: &str) -> Value {
    let report = simulate(&Scenario::parse(text).expect("valid")).expect("runs");
    let objects: Vec<&Value> = report
        .store
        .list(
            vigil_engine::target::LOCAL_CLUSTER,
            "self-node-remediation.medik8s.io",
            "SelfNodeRemediation",
            Some("medik8s"),
        )
        .map(|(_, v)| v)
        .collect();
    assert_eq!(objects.len(), 1, "{objects:?}");
    objects[0].clone()
}

#[test]
fn the_nodes_openshift_machine_owns_its_remediation_object() {
    let machine = "  - {apiVersion: machine.openshift.io/v1beta1, kind: Machine, metadata: {name: m-1, namespace: medik8s, uid: uid-m-1}}\n";
    let o = object_of(&scenario(machine));
    assert_eq!(
        o["metadata"]["labels"],
        json!({"app.kubernetes.io/part-of": "node-healthcheck-controller", "remediation.medik8s.io/isControlPlaneNode": ""})
    );
    let owners: Vec<(&str, &str)> = o["metadata"]["ownerReferences"]
        .as_array()
        .expect("owners")
        .iter()
        .map(|r| (r["kind"].as_str().unwrap_or(""), r["uid"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(owners, [("NodeHealthCheck", "uid-workers"), ("Machine", "uid-m-1")]);
}

#[test]
fn without_openshift_machines_the_check_is_the_only_owner() {
    let o = object_of(&scenario(""));
    let owners = o["metadata"]["ownerReferences"].as_array().map_or(0, Vec::len);
    assert_eq!(owners, 1, "{o}");
}
