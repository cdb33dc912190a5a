//! Heartbeat models and the stale-signal guard in the simulator: a detector that dies and comes
//! back. The heartbeat that revives a stale condition wakes the check at that instant (the same
//! `concerns::heartbeat_revives` the controller uses); heartbeats that change nothing wake nothing.

use vigil_simulator::output::Event;
use vigil_simulator::{Report, Scenario, simulate};

const SCENARIO: &str = r#"
name: detector-returns
duration: 30m
objects:
  - apiVersion: vigil.dev/v1alpha1
    kind: NodeHealthCheck
    metadata: {name: workers}
    spec:
      selector: {matchLabels: {role: worker}}
      unhealthyConditions:
        - {type: KernelDeadlock, status: "True", duration: 10m, maxConditionAge: 3m}
      minHealthy: 0
      remediationTemplate: {apiVersion: self-node-remediation.medik8s.io/v1alpha1, kind: SelfNodeRemediationTemplate, name: reboot, namespace: medik8s}
  - apiVersion: self-node-remediation.medik8s.io/v1alpha1
    kind: SelfNodeRemediationTemplate
    metadata: {name: reboot, namespace: medik8s}
    spec: {template: {spec: {}}}
  - apiVersion: v1
    kind: Node
    metadata: {name: n1, labels: {role: worker}}
    status:
      conditions:
        - {type: Ready, status: "True", reason: KubeletReady, lastHeartbeatTime: "2030-01-01T00:00:00Z", lastTransitionTime: "2029-12-01T00:00:00Z"}
timeline:
  - {at: 1m, setNodeCondition: {node: n1, type: KernelDeadlock, status: "True", reason: DockerHung}}
models:
  heartbeats:
    - {type: KernelDeadlock, every: 1m, until: 5m}
    - {type: KernelDeadlock, every: 1m, from: 15m}
"#;

fn run() -> Report {
    simulate(&Scenario::parse(SCENARIO).expect("parses")).expect("runs")
}

fn times(r: &Report, event: &str) -> Vec<f64> {
    r.events.iter().filter(|e: &&Event| e.event == event).map(|e| e.t).collect()
}

#[test]
fn a_detector_that_comes_back_revives_its_condition_at_once() {
    let r = run();
    // Last heartbeat at 4m, stale at 7m (before the 10m duration ran out at 11m)...
    assert_eq!(times(&r, "StaleCondition"), [420.0]);
    assert_eq!(times(&r, "HeartbeatsStopped"), [300.0]);
    // ...and the first heartbeat of the returned detector (15m) revives it: deadlocked since 1m,
    // past its 10m, so it is remediated at that very instant, not at the next wake-up.
    assert_eq!(times(&r, "DetectedUnhealthy"), [900.0]);
    assert_eq!(times(&r, "RemediationCreated"), [900.0]);
}
