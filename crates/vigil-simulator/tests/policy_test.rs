//! `vigil simulate` as an operator's policy test: scenarios written like the manifests users
//! apply (no namespace, pauses lifted by re-applying, large fleets) behave as a cluster would.

use vigil_simulator::output::Event;
use vigil_simulator::{Report, Scenario, simulate};

fn run(text: &str) -> Report {
    let scenario = Scenario::parse(text).unwrap_or_else(|e| panic!("parses: {e}"));
    simulate(&scenario).unwrap_or_else(|e| panic!("runs: {e}"))
}

fn events<'a>(r: &'a Report, event: &str) -> Vec<&'a Event> {
    r.events.iter().filter(|e| e.event == event).collect()
}

#[test]
fn lifting_pause_requests_by_reapplying_the_check_says_resumed_and_remediates() {
    let text = r#"
name: pause-lifted
duration: 20m
objects:
  - &nhc
    apiVersion: remediation.medik8s.io/v1alpha1
    kind: NodeHealthCheck
    metadata: {name: workers}
    spec:
      selector: {matchLabels: {role: worker}}
      minHealthy: 51%
      pauseRequests: ["upgrade by alice"]
      remediationTemplate: {apiVersion: self-node-remediation.medik8s.io/v1alpha1, kind: SelfNodeRemediationTemplate, name: snr, namespace: medik8s}
  - apiVersion: self-node-remediation.medik8s.io/v1alpha1
    kind: SelfNodeRemediationTemplate
    metadata: {name: snr, namespace: medik8s}
    spec: {template: {spec: {}}}
  - &node {apiVersion: v1, kind: Node, metadata: {name: n1, labels: {role: worker}}, status: {conditions: [{type: Ready, status: "True", lastTransitionTime: "2029-12-31T00:00:00Z"}]}}
  - {<<: *node, metadata: {name: n2, labels: {role: worker}}}
  - {<<: *node, metadata: {name: n3, labels: {role: worker}}}
timeline:
  - at: 1m
    setNodeCondition: {node: n1, type: Ready, status: "False"}
  - at: 10m
    apply:
      apiVersion: remediation.medik8s.io/v1alpha1
      kind: NodeHealthCheck
      metadata: {name: workers}
      spec:
        selector: {matchLabels: {role: worker}}
        minHealthy: 51%
        remediationTemplate: {apiVersion: self-node-remediation.medik8s.io/v1alpha1, kind: SelfNodeRemediationTemplate, name: snr, namespace: medik8s}
"#;
    let r = run(text);
    let at = |name: &str| events(&r, name).iter().map(|e| (e.t, e.target.clone())).collect::<Vec<_>>();
    assert_eq!(at("Paused"), [(0.0, None)]);
    assert_eq!(at("Resumed"), [(600.0, None)], "docs/scenario.md promises a Resumed event");
    assert_eq!(
        at("DetectedUnhealthy"),
        [(360.0, Some("n1".to_string()))],
        "no second DetectedUnhealthy for the same Node"
    );
    assert_eq!(at("RemediationCreated"), [(600.0, Some("n1".to_string()))]);
}

#[test]
fn namespaced_objects_without_a_namespace_are_in_default_as_kubectl_would_put_them() {
    let text = r#"
name: no-namespace
duration: 10m
objects:
  - apiVersion: cluster.x-k8s.io/v1beta2
    kind: MachineHealthCheck
    metadata: {name: workers}
    spec:
      clusterName: prod
      selector: {matchLabels: {pool: a}}
      checks:
        unhealthyNodeConditions: [{type: Ready, status: "False", timeoutSeconds: 60}]
  - {apiVersion: cluster.x-k8s.io/v1beta2, kind: Cluster, metadata: {name: prod}, spec: {}, status: {initialization: {infrastructureProvisioned: true, controlPlaneInitialized: true}, conditions: [{type: InfrastructureReady, status: "True", reason: Ready, lastTransitionTime: "2029-12-01T00:00:00Z"}, {type: ControlPlaneInitialized, status: "True", reason: Ready, lastTransitionTime: "2029-12-01T00:00:00Z"}]}}
  - {apiVersion: cluster.x-k8s.io/v1beta2, kind: Machine, metadata: {name: m1, labels: {pool: a, cluster.x-k8s.io/cluster-name: prod}, creationTimestamp: "2029-12-01T00:00:00Z"}, spec: {clusterName: prod}, status: {nodeRef: {name: n1}}}
  - {apiVersion: v1, kind: Node, metadata: {name: n1}, status: {conditions: [{type: Ready, status: "True", lastTransitionTime: "2029-12-31T00:00:00Z"}]}}
timeline:
  - at: 1m
    setNodeCondition: {node: n1, type: Ready, status: "False", reason: KubeletDown}
  - at: 5m
    delete: {apiVersion: cluster.x-k8s.io/v1beta2, kind: Machine, name: m1}
"#;
    let r = run(text);
    let status = r.final_statuses.get("MachineHealthCheck/default/workers").expect("the check runs in default");
    assert_eq!(status["expectedMachines"], 0, "m1 was found, then deleted from default");
    let unhealthy = events(&r, "MachineMarkedUnhealthy");
    assert_eq!(unhealthy.len(), 1, "{:?}", r.events);
    assert_eq!((unhealthy[0].t, unhealthy[0].target.as_deref()), (120.0, Some("default/m1")));
    assert_eq!(events(&r, "Deleted")[0].target.as_deref(), Some("default/m1"));
}

#[test]
fn a_fleet_of_20000_nodes_loads() {
    let mut text = String::from(
        "name: fleet\nduration: 10m\nobjects:\n  - &node {apiVersion: v1, kind: Node, metadata: {name: n00000, labels: {role: worker}}, status: {conditions: [{type: Ready, status: \"True\", lastTransitionTime: \"2029-12-31T00:00:00Z\"}]}}\n",
    );
    for i in 1..20_000 {
        text.push_str(&format!("  - {{<<: *node, metadata: {{name: n{i:05}, labels: {{role: worker}}}}}}\n"));
    }
    let scenario = Scenario::parse(&text).unwrap_or_else(|e| panic!("a 20 000-Node fleet must load: {e}"));
    assert_eq!(scenario.objects.len(), 20_000);
}

#[test]
fn a_file_beyond_the_reading_limits_is_refused_in_a_users_words() {
    let deep = format!("name: deep\nduration: 1m\nobjects: [{}{}]\n", "[".repeat(80), "]".repeat(80));
    let err = Scenario::parse(&deep).expect_err("too deep").to_string();
    assert!(
        err.starts_with("not a valid scenario: the file is too large for the simulator: it has values nested"),
        "{err}"
    );
    assert!(err.contains("(the limit is 64)") && err.contains("split the fleet into several scenarios"), "{err}");
    assert!(!err.contains("budget"), "no internal words: {err}");
}
