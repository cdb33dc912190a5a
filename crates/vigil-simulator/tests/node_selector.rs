//! `setNodeCondition` with `nodeSelector`: a whole zone fails in one timeline entry.

use vigil_simulator::{Scenario, simulate};

#[test]
fn a_node_selector_sets_the_condition_on_every_matching_node_and_only_those() {
    let scenario = Scenario::parse(
        r#"
name: zone-b
duration: 10m
objects:
  - {apiVersion: v1, kind: Node, metadata: {name: a1, labels: {zone: a}}}
  - {apiVersion: v1, kind: Node, metadata: {name: b1, labels: {zone: b}}}
  - {apiVersion: v1, kind: Node, metadata: {name: b2, labels: {zone: b, role: worker}}}
timeline:
  - at: 5m
    setNodeCondition: {nodeSelector: {zone: b}, type: Ready, status: Unknown, reason: ZoneDown}
"#,
    )
    .expect("valid");
    let report = simulate(&scenario).expect("runs");
    let set: Vec<(f64, &str)> = report
        .events
        .iter()
        .filter(|e| e.event == "NodeConditionSet")
        .map(|e| (e.t, e.target.as_deref().unwrap_or("")))
        .collect();
    assert_eq!(set, [(300.0, "b1"), (300.0, "b2")]);

    let none = Scenario::parse(
        "name: x\nduration: 10m\ntimeline:\n  - at: 1m\n    setNodeCondition: {nodeSelector: {zone: c}, type: Ready, status: Unknown}\n",
    )
    .expect("valid");
    let err = simulate(&none).expect_err("nothing matches").to_string();
    assert_eq!(err, r#"timeline[0]: no Node matches nodeSelector {"zone": "c"} at this time"#);
}
