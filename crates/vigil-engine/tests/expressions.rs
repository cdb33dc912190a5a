//! CEL expression rules (`spec.unhealthyExpressions`) on Vigil's own clock, as tables over
//! timelines: each decision's status is carried to the next through its JSON (as the API server
//! keeps it, so every step is also a restart). An expression true for less than its duration
//! never remediates, true past it does (its notice names the expression), one that cannot be
//! evaluated never does and says why, the clock survives a restart but not a false reading or a
//! spec change, a match opens a flapping episode; then the property over random timelines.

mod support;

use proptest::prelude::*;
use serde_json::{Value, json};
use support::*;
use vigil_api::node_health_check::NodeHealthCheckStatus;
use vigil_api::reason::Reason;
use vigil_api::views::NodeView;
use vigil_engine::plan::{NoticeKind, Plan};

const SNR_NS: &str = NHC_SNR_NS;
/// True while the Node carries `health=bad`; false (never unknown) without the label.
const BAD: &str = "'health' in node.labels && node.labels['health'] == 'bad'";
/// Unknown for a Node without the `health` label: indexing a missing key is a run-time error.
const INDEXES_MISSING: &str = "node.labels['health'] == 'bad'";

fn spec(expression: &str, duration: &str) -> Value {
    json!({
        "selector": {"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]},
        "maxUnhealthy": "100%",
        "unhealthyConditions": [{"type": "Ready", "status": "False", "duration": "5m"}],
        "unhealthyExpressions": [{"expression": expression, "duration": duration}],
        "remediationTemplate": {"apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate", "name": "snr", "namespace": SNR_NS},
        "plannedMaintenance": {"enabled": false},
    })
}

/// One decision of the check (at spec `generation`) with `status` (its JSON text) at `now`.
fn decide(
    spec: &Value,
    generation: i64,
    status: Option<&str>,
    nodes: &[NodeView],
    now: jiff::Timestamp,
) -> Plan<NodeHealthCheckStatus> {
    decide_nhc_from(spec, generation, status, nodes, now)
}

/// Ready, labelled `health=bad` when `bad`.
fn node_at(name: &str, bad: bool) -> NodeView {
    let n = node(name).ready("True", at(0));
    if bad { n.label("health", "bad").build() } else { n.build() }
}

/// What a run shows: the second of the first remediation (if any), the last plan's notices of
/// a kind, the last status text.
struct Run {
    created: Option<i64>,
    last: Plan<NodeHealthCheckStatus>,
    status: String,
}

/// Decides every `step` seconds from `from` to `until` (inclusive), the Node `bad` as `bad(s)`
/// says, the status carried through its JSON text from `status`.
fn run(spec: &Value, status: Option<String>, (from, until, step): (i64, i64, usize), bad: impl Fn(i64) -> bool) -> Run {
    let mut status = status;
    let mut created = None;
    let mut last = None;
    for s in (from..=until).step_by(step) {
        let plan = decide(spec, 1, status.as_deref(), &[node_at("a", bad(s))], at(s));
        if created.is_none() && !created_names(&plan).is_empty() {
            created = Some(s);
        }
        status = Some(serde_json::to_string(&plan.status).expect("status"));
        last = Some(plan);
    }
    let last = last.expect("at least one decision");
    Run { created, last, status: status.unwrap_or_default() }
}

#[test]
fn true_for_less_than_its_duration_never_remediates_and_past_it_does() {
    // (duration, seconds the label is on from 0, decide until, expected first remediation)
    let rows: [(&str, i64, i64, Option<i64>); 5] = [
        ("10m", 9 * 60 + 59, 3600, None),
        ("10m", 3600, 3600, Some(600)),
        ("10m", 600, 3600, Some(600)),
        ("0s", 3600, 120, Some(0)),
        ("1h", 3599, 7200, None),
    ];
    for (duration, on_until, until, expected) in rows {
        let r = run(&spec(BAD, duration), None, (0, until, 30), |s| s <= on_until);
        assert_eq!(r.created, expected, "duration {duration}, on for {on_until}s: {}", r.status);
    }
}

#[test]
fn the_notice_names_the_expression_and_the_clock_is_in_status() {
    let r = run(&spec(BAD, "10m"), None, (0, 570, 30), |_| true);
    let status: Value = serde_json::from_str(&r.status).expect("json");
    assert_eq!(
        status["expressionMatches"],
        json!([{"name": "a", "expression": 0, "since": "2030-01-01T00:00:00Z"}]),
        "the clock started at the first decision that saw it: {}",
        r.status
    );
    let plan = decide(&spec(BAD, "10m"), 1, Some(&r.status), &[node_at("a", true)], at(600));
    let unhealthy: Vec<_> = plan.notices.iter().filter(|n| n.kind == NoticeKind::Unhealthy).collect();
    assert_eq!(unhealthy.len(), 1, "{:?}", plan.notices);
    assert_eq!(unhealthy[0].reason, Reason::ExpressionMatched);
    assert!(unhealthy[0].message.contains("spec.unhealthyExpressions[0].expression"), "{}", unhealthy[0].message);
    assert!(unhealthy[0].message.contains(BAD), "{}", unhealthy[0].message);
    assert_eq!(created_names(&plan), ["a"]);
}

#[test]
fn a_pending_expression_wakes_the_check_when_its_duration_ends() {
    let r = run(&spec(BAD, "10m"), None, (0, 120, 30), |_| true);
    assert_eq!(r.last.next_wake, Some(at(600)), "woken at since + duration");
}

#[test]
fn an_expression_that_cannot_be_evaluated_never_remediates_and_says_why() {
    let r = run(&spec(INDEXES_MISSING, "1m"), None, (0, 3600, 60), |_| false);
    assert_eq!(r.created, None, "{}", r.status);
    assert_eq!(r.last.status.healthy_nodes, 0, "not counted healthy: {}", r.status);
    assert_eq!(r.last.status.observed_nodes, 1);
    let first = decide(&spec(INDEXES_MISSING, "1m"), 1, None, &[node_at("a", false)], at(0));
    let told: Vec<_> = first.notices.iter().filter(|n| n.reason == Reason::ExpressionUnknown).collect();
    assert_eq!(told.len(), 1, "{:?}", first.notices);
    assert_eq!(told[0].kind, NoticeKind::NoDecision);
    assert!(
        told[0].message.contains("spec.unhealthyExpressions[0].expression could not be evaluated for Node a"),
        "{}",
        told[0].message
    );
    let status: Value = serde_json::to_value(&first.status).expect("json");
    let listed = &status["unevaluatedExpressions"];
    assert_eq!((&listed[0]["name"], &listed[0]["expression"]), (&json!("a"), &json!(0)), "{status}");
    assert!(listed[0]["message"].as_str().is_some_and(|m| !m.is_empty()), "the status says why: {status}");
    let text = serde_json::to_string(&first.status).expect("json");
    let again = decide(&spec(INDEXES_MISSING, "1m"), 1, Some(&text), &[node_at("a", false)], at(60));
    assert!(again.notices.iter().all(|n| n.reason != Reason::ExpressionUnknown), "told once: {:?}", again.notices);
    // Once it can be evaluated, it is judged as any other expression.
    let r = run(&spec(INDEXES_MISSING, "1m"), Some(r.status), (3660, 3780, 30), |_| true);
    assert_eq!(r.created, Some(3720));
}

#[test]
fn the_clock_survives_a_restart_but_not_a_lost_status_or_a_spec_change() {
    let before = run(&spec(BAD, "10m"), None, (0, 300, 300), |_| true);
    // A new process decides from the written status alone.
    let plan = decide(&spec(BAD, "10m"), 1, Some(&before.status), &[node_at("a", true)], at(600));
    assert_eq!(created_names(&plan), ["a"], "the clock went on from the status");
    let plan = decide(&spec(BAD, "10m"), 1, None, &[node_at("a", true)], at(600));
    assert!(created_names(&plan).is_empty(), "without the status the clock starts again");
    let plan = decide(&spec(BAD, "10m"), 2, Some(&before.status), &[node_at("a", true)], at(600));
    assert!(created_names(&plan).is_empty(), "a changed spec starts every clock again");
    let status: Value = serde_json::to_value(&plan.status).expect("json");
    assert_eq!(status["expressionMatches"][0]["since"], json!("2030-01-01T00:10:00Z"));
}

#[test]
fn an_expression_that_became_false_starts_its_clock_again() {
    // on 0..8m, off at 8m, on again from 8m30s: 10m from 8m30s is 18m30s
    let r = run(&spec(BAD, "10m"), None, (0, 3600, 30), |s| !(480..510).contains(&s));
    assert_eq!(r.created, Some(1110));
}

#[test]
fn an_expression_that_holds_and_clears_again_opens_flapping_episodes() {
    let mut flapping = spec(BAD, "10m");
    flapping["flapping"] = json!({"episodes": 3, "window": "1h"});
    // labelled bad for 3m every 10m: never 10m in a row, the third episode at 20m is a flap
    let bad = |s: i64| s % 600 < 180;
    let r = run(&flapping, None, (0, 3600, 30), bad);
    assert_eq!(r.created, Some(1200), "{}", r.status);
    let r = run(&spec(BAD, "10m"), None, (0, 3600, 30), bad);
    assert_eq!(r.created, None, "without flapping never");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// An expression true for less than its duration never remediates: whenever a remediation
    /// starts, every decision for at least the duration before it saw the expression true.
    #[test]
    fn an_expression_true_for_less_than_its_duration_never_remediates(
        minutes in 1i64..15,
        flips in proptest::collection::vec(any::<bool>(), 1..80),
    ) {
        let step = 30i64;
        let spec = spec(BAD, &format!("{minutes}m"));
        let bad = |s: i64| flips.get(usize::try_from(s / step).unwrap_or(0)).copied().unwrap_or(false);
        let until = step * i64::try_from(flips.len()).unwrap_or(1);
        let r = run(&spec, None, (0, until, 30), bad);
        if let Some(s) = r.created {
            let mut start = s;
            while start >= step && bad(start - step) {
                start -= step;
            }
            prop_assert!(s - start >= minutes * 60, "created at {s}s, true since {start}s, duration {minutes}m");
        }
    }
}
