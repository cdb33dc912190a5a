//! A fleet with more checks than one check may take decisions in one instant still settles:
//! the guard against a check that never settles counts per check.

use vigil_simulator::{Scenario, simulate};

#[test]
fn eighty_checks_deciding_at_the_same_instant_settle() {
    let mut text = String::from("name: many\nduration: 10m\nobjects:\n");
    for i in 0..80 {
        text.push_str(&format!(
            "  - {{apiVersion: v1, kind: Node, metadata: {{name: n{i}, labels: {{group: g{i}}}}}, status: {{conditions: [{{type: Ready, status: \"False\", lastTransitionTime: \"2029-12-31T23:50:00Z\"}}]}}}}\n"
        ));
        text.push_str(&format!(
            "  - {{apiVersion: vigil.dev/v1alpha1, kind: NodeHealthCheck, metadata: {{name: c{i}}}, spec: {{selector: {{matchLabels: {{group: g{i}}}}}, maxUnhealthy: 1, remediationTemplate: {{apiVersion: self-node-remediation.medik8s.io/v1alpha1, kind: SelfNodeRemediationTemplate, name: t, namespace: ns}}}}}}\n"
        ));
    }
    text.push_str("  - {apiVersion: self-node-remediation.medik8s.io/v1alpha1, kind: SelfNodeRemediationTemplate, metadata: {name: t, namespace: ns}, spec: {template: {spec: {}}}}\n");
    let report = simulate(&Scenario::parse(&text).expect("valid")).expect("settles");
    let created = report.events.iter().filter(|e| e.event == "RemediationCreated" && e.t == 0.0).count();
    assert_eq!(created, 80, "every check remediates its one unhealthy Node at once");
}
