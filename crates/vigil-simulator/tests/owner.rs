//! The stand-in owner behaves as Cluster API's MachineSet did against Vigil
//! (`crates/vigil-controller/tests/capi_e2e.rs`): it replaces only a Machine that is still
//! unhealthy and still asked for (`HealthCheckSucceeded=False` and `OwnerRemediated=False`), and
//! not while its Cluster is paused.

use vigil_simulator::{Scenario, simulate};

/// One worker fails at 1m; Vigil marks it at 6m (5m timeout); the owner acts 4m after the mark.
fn scenario(timeline_extra: &str) -> Scenario {
    let text = format!(
        r#"
name: owner
start: "2030-01-01T00:00:00Z"
duration: 30m
objects:
  - &cluster
    apiVersion: cluster.x-k8s.io/v1beta2
    kind: Cluster
    metadata: {{name: prod, namespace: default}}
    spec: {{}}
    status:
      initialization: {{infrastructureProvisioned: true, controlPlaneInitialized: true}}
      conditions:
        - {{type: InfrastructureReady, status: "True", reason: Ready, message: "", lastTransitionTime: "2029-12-01T00:00:00Z"}}
        - {{type: ControlPlaneInitialized, status: "True", reason: Initialized, message: "", lastTransitionTime: "2029-12-01T00:00:00Z"}}
  - apiVersion: vigil.dev/v1alpha1
    kind: MachineHealthCheck
    metadata: {{name: workers, namespace: default}}
    spec:
      clusterName: prod
      selector: {{matchLabels: {{pool: workers}}}}
      unhealthyConditions:
        - {{type: Ready, status: "False", timeout: 300s}}
  - &machine
    apiVersion: cluster.x-k8s.io/v1beta2
    kind: Machine
    metadata: {{name: w-a, namespace: default, labels: {{cluster.x-k8s.io/cluster-name: prod, pool: workers}}, creationTimestamp: "2029-12-01T00:00:00Z"}}
    spec: {{clusterName: prod}}
    status: {{nodeRef: {{name: w-a}}}}
  - {{<<: *machine, metadata: {{name: w-b, namespace: default, labels: {{cluster.x-k8s.io/cluster-name: prod, pool: workers}}, creationTimestamp: "2029-12-01T00:00:00Z"}}, status: {{nodeRef: {{name: w-b}}}}}}
  - &node
    apiVersion: v1
    kind: Node
    metadata: {{name: w-a}}
    status:
      conditions:
        - {{type: Ready, status: "True", reason: KubeletReady, lastHeartbeatTime: "2029-12-31T23:59:50Z", lastTransitionTime: "2029-12-01T00:00:00Z"}}
  - {{<<: *node, metadata: {{name: w-b}}}}
timeline:
  - at: 1m
    setNodeCondition: {{node: w-b, type: Ready, status: "False", reason: KubeletNotReady}}
{timeline_extra}
models:
  owner: {{replaceAfter: 4m, nodeReadyAfter: 1m}}
"#
    );
    Scenario::parse(&text).expect("valid scenario")
}

fn replacements(s: &Scenario) -> Vec<f64> {
    let report = simulate(s).expect("runs");
    report.events.iter().filter(|e| e.event == "MachineReplaced").map(|e| e.t).collect()
}

#[test]
fn the_owner_replaces_a_machine_still_unhealthy() {
    assert_eq!(replacements(&scenario("")), [600.0]);
}

#[test]
fn a_machine_that_recovered_before_the_owner_acted_is_not_replaced() {
    let recovers =
        "  - at: 8m\n    setNodeCondition: {node: w-b, type: Ready, status: \"True\", reason: KubeletReady}\n";
    assert_eq!(replacements(&scenario(recovers)), Vec::<f64>::new());
}

#[test]
fn the_owner_waits_while_the_cluster_is_paused_and_acts_once_it_is_not() {
    let cluster = |paused: bool| {
        format!(
            "  - at: {}\n    apply: {{apiVersion: cluster.x-k8s.io/v1beta2, kind: Cluster, metadata: {{name: prod, namespace: default}}, spec: {{paused: {paused}}}, status: {{initialization: {{infrastructureProvisioned: true, controlPlaneInitialized: true}}, conditions: [{{type: InfrastructureReady, status: \"True\", reason: Ready, message: \"\", lastTransitionTime: \"2029-12-01T00:00:00Z\"}}, {{type: ControlPlaneInitialized, status: \"True\", reason: Initialized, message: \"\", lastTransitionTime: \"2029-12-01T00:00:00Z\"}}]}}}}\n",
            if paused { "7m" } else { "15m" }
        )
    };
    let replaced = replacements(&scenario(&format!("{}{}", cluster(true), cluster(false))));
    assert_eq!(replaced.len(), 1, "replaced once: {replaced:?}");
    assert!(replaced[0] >= 900.0, "not while the Cluster is paused (7m to 15m): {replaced:?}");
}
