//! A remediator finishing holds a MachineHealthCheck's budget as it holds a NodeHealthCheck's
//! (docs/beside-medik8s.md, "Remediators finishing"): a MachineHealthCheck with an external
//! template and `maxUnhealthy: 1` over four Machines; m1 fails and gets its object; m1 recovers
//! at 1m and its object, deleted, is held by the remediator's finalizer until 4m; m2 fails at
//! 1m30. m2's object must wait until m1's is gone.

use vigil_simulator::{Scenario, simulate};

fn scenario() -> Scenario {
    let machines: String = ["m1", "m2", "m3", "m4"]
        .iter()
        .map(|m| {
            format!(
                "  - {{<<: *machine, metadata: {{name: {m}, namespace: infra, labels: {{cluster.x-k8s.io/cluster-name: metal, pool: metal}}, creationTimestamp: \"2029-12-01T00:00:00Z\"}}, status: {{nodeRef: {{apiVersion: v1, kind: Node, name: {m}}}}}}}\n  - {{<<: *node, metadata: {{name: {m}}}}}\n"
            )
        })
        .collect();
    let text = format!(
        r#"
name: finishing
start: "2030-01-01T00:00:00Z"
duration: 8m
objects:
  - apiVersion: cluster.x-k8s.io/v1beta2
    kind: Cluster
    metadata: {{name: metal, namespace: infra}}
    spec: {{}}
    status:
      initialization: {{infrastructureProvisioned: true, controlPlaneInitialized: true}}
      conditions:
        - {{type: InfrastructureReady, status: "True", reason: Ready, message: "", lastTransitionTime: "2029-12-01T00:00:00Z"}}
        - {{type: ControlPlaneInitialized, status: "True", reason: Initialized, message: "", lastTransitionTime: "2029-12-01T00:00:00Z"}}
  - apiVersion: infrastructure.cluster.x-k8s.io/v1beta1
    kind: Metal3RemediationTemplate
    metadata: {{name: reboot, namespace: infra}}
    spec: {{template: {{spec: {{strategy: {{type: Reboot}}}}}}}}
  - apiVersion: vigil.dev/v1alpha1
    kind: MachineHealthCheck
    metadata: {{name: metal-workers, namespace: infra}}
    spec:
      clusterName: metal
      selector: {{matchLabels: {{pool: metal}}}}
      maxUnhealthy: 1
      unhealthyConditions:
        - {{type: Ready, status: "False", timeout: 10s}}
      remediationTemplate: {{apiVersion: infrastructure.cluster.x-k8s.io/v1beta1, kind: Metal3RemediationTemplate, name: reboot}}
  - &machine
    apiVersion: cluster.x-k8s.io/v1beta2
    kind: Machine
    metadata: {{name: m0, namespace: infra, labels: {{cluster.x-k8s.io/cluster-name: metal, other: pool}}, creationTimestamp: "2029-12-01T00:00:00Z"}}
    spec: {{clusterName: metal}}
    status: {{nodeRef: {{apiVersion: v1, kind: Node, name: m0}}}}
  - &node
    apiVersion: v1
    kind: Node
    metadata: {{name: m0}}
    status:
      conditions:
        - {{type: Ready, status: "True", reason: KubeletReady, lastHeartbeatTime: "2029-12-31T23:59:50Z", lastTransitionTime: "2029-12-01T00:00:00Z"}}
{machines}timeline:
  - {{at: 0s, setNodeCondition: {{node: m1, type: Ready, status: "False", reason: KubeletNotReady}}}}
  - {{at: 90s, setNodeCondition: {{node: m2, type: Ready, status: "False", reason: KubeletNotReady}}}}
models:
  remediators:
    - {{kind: Metal3Remediation, recoverAfter: 50s, holdsDeletion: 3m}}
"#
    );
    Scenario::parse(&text).expect("valid scenario")
}

#[test]
fn a_machines_object_waits_while_another_machines_remediator_finishes() {
    let report = simulate(&scenario()).expect("runs");
    let at = |event: &str, target: &str| -> Vec<f64> {
        report.events.iter().filter(|e| e.event == event && e.target.as_deref() == Some(target)).map(|e| e.t).collect()
    };
    let lines: Vec<String> =
        report.events.iter().map(|e| format!("{} {} {:?} {:?}", e.t, e.event, e.target, e.details)).collect();
    let m1_created = at("RemediationCreated", "infra/m1");
    assert_eq!(m1_created.len(), 1, "m1 is remediated once: {lines:#?}");
    // m1's remediator brings its Node back at about 1m; the object is deleted then and held
    // until about 4m.
    let m1_gone = at("RemediationFinished", "infra/m1");
    assert_eq!(m1_gone.len(), 1, "m1's object is let go once: {lines:#?}");
    assert!(m1_gone[0] >= 230.0, "held by the finalizer until about 4m: {lines:#?}");
    let m2_created = at("RemediationCreated", "infra/m2");
    assert_eq!(m2_created.len(), 1, "m2 is remediated once: {lines:#?}");
    assert!(
        m2_created[0] >= m1_gone[0],
        "m2's object made at {} while m1's still existed (gone at {}): {lines:#?}",
        m2_created[0],
        m1_gone[0]
    );
}
