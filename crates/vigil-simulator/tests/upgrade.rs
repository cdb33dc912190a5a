//! The cluster upgrade pause in a scenario: its signals are read only where the scenario has a
//! `ClusterVersion` (a kind with no object counts as not served), as the controller reads them
//! only where the API server serves the kind.

use vigil_simulator::{Scenario, simulate};

fn scenario(cluster_version: &str) -> String {
    format!(
        r#"
name: upgrade
duration: 3m
objects:
  - apiVersion: self-node-remediation.medik8s.io/v1alpha1
    kind: SelfNodeRemediationTemplate
    metadata: {{name: reboot, namespace: medik8s}}
    spec: {{template: {{spec: {{remediationStrategy: Automatic}}}}}}
  - apiVersion: vigil.dev/v1alpha1
    kind: NodeHealthCheck
    metadata: {{name: workers}}
    spec:
      selector: {{matchLabels: {{role: worker}}}}
      minHealthy: 1
      unhealthyConditions: [{{type: Ready, status: "False", duration: 1m}}]
      remediationTemplate: {{apiVersion: self-node-remediation.medik8s.io/v1alpha1, kind: SelfNodeRemediationTemplate, name: reboot, namespace: medik8s}}
  - apiVersion: v1
    kind: Node
    metadata:
      name: w1
      labels: {{role: worker}}
      annotations: {{machineconfiguration.openshift.io/currentConfig: rendered-a, machineconfiguration.openshift.io/desiredConfig: rendered-b}}
  - {{apiVersion: v1, kind: Node, metadata: {{name: w2, labels: {{role: worker}}}}}}
  - {{apiVersion: v1, kind: Node, metadata: {{name: w3, labels: {{role: worker}}}}}}
{cluster_version}timeline:
  - {{at: 0s, setNodeCondition: {{node: w1, type: Ready, status: "False", reason: KubeletNotReady}}}}
"#
    )
}

/// (event, reason) of every line about the check.
fn told(text: &str) -> Vec<(String, String)> {
    let report = simulate(&Scenario::parse(text).expect("scenario")).expect("runs");
    report
        .events
        .iter()
        .map(|e| (e.event.clone(), e.details.get("reason").and_then(|r| r.as_str()).unwrap_or("").to_string()))
        .collect()
}

#[test]
fn a_nodes_machine_config_postpones_only_where_a_cluster_version_is() {
    // No ClusterVersion: not OpenShift; the annotations are nobody's upgrade.
    let elsewhere = told(&scenario(""));
    assert!(elsewhere.iter().any(|(e, _)| e == "RemediationCreated"), "{elsewhere:?}");
    assert!(!elsewhere.iter().any(|(_, r)| r == "ClusterUpgrading"), "{elsewhere:?}");
    // A ClusterVersion done upgrading: OpenShift; w1 still moves to its new machine config.
    let version = r#"  - apiVersion: config.openshift.io/v1
    kind: ClusterVersion
    metadata: {name: version}
    status: {desired: {version: 4.19.1}, conditions: [{type: Progressing, status: "False", lastTransitionTime: "2029-01-01T00:00:00Z"}]}
"#;
    let openshift = told(&scenario(version));
    assert!(!openshift.iter().any(|(e, _)| e == "RemediationCreated"), "{openshift:?}");
    assert!(openshift.iter().any(|(_, r)| r == "ClusterUpgrading"), "{openshift:?}");
}
