//! Every line the simulator prints has one shape per event: a line about an object carries that
//! object's `kind`, `namespace` and `name` fields (not only in its message), and every event a
//! run prints is documented in docs/scenario.md, "Output". Checked over every shipped example
//! and the scenarios of this crate's tests that print the rarer events.

use std::collections::BTreeSet;
use vigil_simulator::output::Event;
use vigil_simulator::{Scenario, simulate};

/// The events about one object: a remediation object (made, removed, given up, let go by its
/// remediator, failed, finished), a scenario's applied or deleted object, a refused node Lease.
const ABOUT_AN_OBJECT: [&str; 9] = [
    "RemediationCreated",
    "RemediationRemoved",
    "RemediationTimedOut",
    "RemediationFinished",
    "RemediationFailed",
    "NodeRecovered",
    "Applied",
    "Deleted",
    "LeaseRefused",
];

fn examples() -> Vec<(String, Vec<Event>)> {
    let dir = format!("{}/../../examples", env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    let mut paths: Vec<_> =
        std::fs::read_dir(&dir).expect("examples/").filter_map(Result::ok).map(|e| e.path()).collect();
    paths.sort();
    for path in paths.into_iter().filter(|p| p.extension().is_some_and(|e| e == "yaml")) {
        let text = std::fs::read_to_string(&path).expect("example readable");
        let scenario = Scenario::parse(&text).expect("example parses");
        let report = simulate(&scenario).expect("example runs");
        out.push((path.display().to_string(), report.events));
    }
    out
}

#[test]
fn every_line_about_an_object_names_it_in_its_fields() {
    let mut seen = BTreeSet::new();
    for (example, events) in examples() {
        for e in &events {
            seen.insert(e.event.clone());
            if !ABOUT_AN_OBJECT.contains(&e.event.as_str()) {
                continue;
            }
            for field in ["kind", "namespace", "name"] {
                assert!(
                    e.details.get(field).and_then(|v| v.as_str()).is_some(),
                    "{example}: {} at {} has no {field}: {e:?}",
                    e.event,
                    e.t
                );
            }
        }
    }
    for object_event in ["RemediationCreated", "RemediationRemoved", "RemediationTimedOut", "RemediationFinished"] {
        assert!(seen.contains(object_event), "no example prints {object_event}: the check above saw none");
    }
}

#[test]
fn every_event_an_example_prints_is_documented() {
    let doc = std::fs::read_to_string(format!("{}/../../docs/scenario.md", env!("CARGO_MANIFEST_DIR")))
        .expect("docs/scenario.md");
    let output = doc.split("## Output").nth(1).expect("an Output section");
    let mut missing = BTreeSet::new();
    for (_, events) in examples() {
        for e in events {
            if !output.contains(&format!("`{}`", e.event)) {
                missing.insert(e.event);
            }
        }
    }
    assert!(missing.is_empty(), "events printed but not in docs/scenario.md, Output: {missing:?}");
}
