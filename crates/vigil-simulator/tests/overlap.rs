//! Overlapping checks in the simulator beyond the shipped examples: a target two checks already
//! hold (from before the one-check-at-a-time rule) is reported once and nothing is deleted.

use vigil_simulator::{Scenario, simulate};

const TIE: &str = r#"
name: tie
duration: 20m
objects:
  - apiVersion: remediation.medik8s.io/v1alpha1
    kind: NodeHealthCheck
    metadata: {name: a, uid: uid-a}
    spec:
      selector: {matchExpressions: [{key: node-role.kubernetes.io/worker, operator: Exists}]}
      minHealthy: 51%
      remediationTemplate: {apiVersion: self-node-remediation.medik8s.io/v1alpha1, kind: SelfNodeRemediationTemplate, name: reboot, namespace: medik8s}
  - apiVersion: remediation.medik8s.io/v1alpha1
    kind: NodeHealthCheck
    metadata: {name: b, uid: uid-b}
    spec:
      selector: {matchExpressions: [{key: node-role.kubernetes.io/worker, operator: Exists}]}
      minHealthy: 51%
      remediationTemplate: {apiVersion: fence-agents-remediation.medik8s.io/v1alpha1, kind: FenceAgentsRemediationTemplate, name: ipmi, namespace: medik8s}
  - apiVersion: self-node-remediation.medik8s.io/v1alpha1
    kind: SelfNodeRemediationTemplate
    metadata: {name: reboot, namespace: medik8s}
    spec: {template: {spec: {}}}
  - apiVersion: fence-agents-remediation.medik8s.io/v1alpha1
    kind: FenceAgentsRemediationTemplate
    metadata: {name: ipmi, namespace: medik8s}
    spec: {template: {spec: {}}}
  - apiVersion: self-node-remediation.medik8s.io/v1alpha1
    kind: SelfNodeRemediation
    metadata:
      name: w-1
      namespace: medik8s
      creationTimestamp: "2029-12-31T23:50:00Z"
      annotations: {remediation.medik8s.io/node-name: w-1, remediation.medik8s.io/template-name: reboot}
      ownerReferences: [{apiVersion: vigil.dev/v1alpha1, kind: NodeHealthCheck, name: a, uid: uid-a}]
  - apiVersion: fence-agents-remediation.medik8s.io/v1alpha1
    kind: FenceAgentsRemediation
    metadata:
      name: w-1
      namespace: medik8s
      creationTimestamp: "2029-12-31T23:55:00Z"
      annotations: {remediation.medik8s.io/node-name: w-1, remediation.medik8s.io/template-name: ipmi}
      ownerReferences: [{apiVersion: vigil.dev/v1alpha1, kind: NodeHealthCheck, name: b, uid: uid-b}]
  - &node
    apiVersion: v1
    kind: Node
    metadata: {name: w-1, labels: {node-role.kubernetes.io/worker: ""}}
    status:
      conditions:
        - {type: Ready, status: "False", reason: KubeletNotReady, lastHeartbeatTime: "2029-12-31T23:59:50Z", lastTransitionTime: "2029-12-31T23:40:00Z"}
  - {<<: *node, metadata: {name: w-2, labels: {node-role.kubernetes.io/worker: ""}}, status: {conditions: [{type: Ready, status: "True", reason: KubeletReady, lastTransitionTime: "2029-12-01T00:00:00Z"}]}}
  - {<<: *node, metadata: {name: w-3, labels: {node-role.kubernetes.io/worker: ""}}, status: {conditions: [{type: Ready, status: "True", reason: KubeletReady, lastTransitionTime: "2029-12-01T00:00:00Z"}]}}
timeline:
  - {at: 5m, setNodeCondition: {node: w-1, type: Ready, status: "True", reason: KubeletReady}}
"#;

#[test]
fn a_target_two_checks_already_hold_is_reported_once_and_nothing_is_deleted() {
    let scenario = Scenario::parse(TIE).expect("scenario parses");
    let r = simulate(&scenario).expect("runs");
    let ties: Vec<_> = r.events.iter().filter(|e| e.event == "TargetHeldTwice").collect();
    assert_eq!(ties.len(), 1, "told once, not at every decision");
    assert_eq!(
        (ties[0].t, ties[0].check.as_deref(), ties[0].target.as_deref()),
        (0.0, Some("NodeHealthCheck/a"), Some("w-1"))
    );
    assert_eq!(
        ties[0].details["message"],
        "node w-1 is being remediated by NodeHealthCheck/a and also by NodeHealthCheck/b; nothing is deleted to resolve it, and no other check starts on it"
    );
    // Both objects stay until the Node recovers at 5m; neither check waits for the other.
    let deleted: Vec<_> = r.events.iter().filter(|e| e.event == "RemediationRemoved").map(|e| e.t).collect();
    assert_eq!(deleted, [300.0, 300.0]);
    assert!(r.events.iter().all(|e| e.event != "RemediationSkipped" && e.event != "RemediationCreated"));
}
