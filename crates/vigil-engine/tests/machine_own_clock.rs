//! A MachineHealthCheck's rules on Vigil's own clock, as tables over timelines: CEL expressions
//! over a Machine and its Node (`spec.unhealthyExpressions`) and flapping (`spec.flapping`).
//! Each decision's plan is applied as the controller would and its status carried to the next
//! through its JSON (as the API server keeps it, so every step is also a restart). An expression
//! true for less than its timeout never remediates, past it does; one that cannot be evaluated
//! never does and says why; the clock survives a restart but not a spec change; an expression's
//! own template is used for the Machines it made unhealthy; fewer flaps than asked never
//! remediate, the N-th does; then the properties over random timelines.

mod support;

use proptest::prelude::*;
use serde_json::{Value, json};
use support::*;
use vigil_api::machine_health_check::MachineHealthCheckStatus;
use vigil_api::reason::Reason;
use vigil_engine::plan::{NoticeKind, Plan};

/// True while the Node carries `health=bad`; false (never unknown) without the label.
const BAD: &str = "'health' in node.labels && node.labels['health'] == 'bad'";

/// Machines m1 and m2 with healthy Nodes of the same name, and the spec's `extra` fields.
fn world(extra: Value) -> MhcWorld {
    let mut w =
        MhcWorld::new().machine_with_node(machine("m1"), "True", t0()).machine_with_node(machine("m2"), "True", t0());
    if let Value::Object(extra) = extra {
        for (k, v) in extra {
            w = w.spec(&k, v);
        }
    }
    w
}

/// One expression rule with this timeout.
fn expression(source: &str, timeout: &str) -> Value {
    json!({"unhealthyExpressions": [{"expression": source, "timeout": timeout}]})
}

/// Decides at `s` seconds and applies the plan, the status carried through its JSON text.
fn step(w: &mut MhcWorld, s: i64) -> Plan<MachineHealthCheckStatus> {
    let plan = w.decide(at(s));
    w.apply(&plan);
    let text = serde_json::to_string(&w.status).expect("status");
    w.status = serde_json::from_str(&text).expect("status reads back");
    plan
}

/// The Node `name`: Ready, labelled `health=bad` when `bad`.
fn labelled(name: &str, bad: bool) -> NodeBuilder {
    let n = node(name).ready("True", t0());
    if bad { n.label("health", "bad") } else { n }
}

/// Decides every `every` seconds from `from` to `until`, m1's Node as `m1(s)` makes it; the
/// second each Machine was first asked to be remediated (by its owner or an object).
fn run(
    w: &mut MhcWorld,
    (from, until, every): (i64, i64, usize),
    m1: impl Fn(i64) -> NodeBuilder,
) -> Vec<(String, i64)> {
    let mut first = Vec::new();
    for s in (from..=until).step_by(every) {
        w.nodes.insert("m1".into(), m1(s).build());
        let plan = step(w, s);
        for name in owner_asked(&plan).into_iter().chain(created_names(&plan)) {
            if !first.iter().any(|(n, _)| *n == name) {
                first.push((name, s));
            }
        }
    }
    first
}

#[test]
fn an_expression_true_for_less_than_its_timeout_never_remediates_and_past_it_does() {
    // (timeout, seconds the label is on from 0, decide until, expected first remediation)
    let rows: [(&str, i64, i64, Option<i64>); 4] = [
        ("10m", 9 * 60 + 59, 3600, None),
        ("10m", 3600, 3600, Some(600)),
        ("0s", 120, 120, Some(0)),
        ("1h", 3599, 7200, None),
    ];
    for (timeout, on_until, until, expected) in rows {
        let mut w = world(expression(BAD, timeout));
        let asked = run(&mut w, (0, until, 30), |s| labelled("m1", s <= on_until));
        let expected: Vec<(String, i64)> = expected.map(|s| ("m1".to_string(), s)).into_iter().collect();
        assert_eq!(asked, expected, "timeout {timeout}, on for {on_until}s");
    }
}

#[test]
fn the_verdict_names_the_expression_and_the_clock_is_in_status() {
    let mut w = world(expression(BAD, "10m"));
    run(&mut w, (0, 570, 30), |_| labelled("m1", true));
    let status = serde_json::to_value(&w.status).expect("json");
    assert_eq!(
        status["expressionMatches"],
        json!([{"name": "m1", "expression": 0, "since": "2030-01-01T00:00:00Z"}]),
        "the clock started at the first decision that saw it: {status}"
    );
    w.nodes.insert("m1".into(), labelled("m1", true).build());
    let plan = step(&mut w, 600);
    let (condition, _) = written(&plan, "m1", "HealthCheckSucceeded").expect("m1 is marked");
    assert_eq!((condition.status.as_str(), condition.reason.as_str()), ("False", "ExpressionMatched"));
    assert!(condition.message.contains("spec.unhealthyExpressions[0].expression"), "{}", condition.message);
    assert!(condition.message.contains(BAD), "{}", condition.message);
    assert_eq!(owner_asked(&plan), ["m1"]);
    let told: Vec<_> = plan.notices.iter().filter(|n| n.kind == NoticeKind::Unhealthy).collect();
    assert_eq!(told.len(), 1, "{:?}", plan.notices);
    assert_eq!(told[0].reason, Reason::ExpressionMatched);
}

#[test]
fn an_expression_reads_the_machine_and_its_node() {
    let gpu = "'role' in machine.labels && machine.labels['role'] == 'gpu' && machine.phase == 'Running' \
               && node.unschedulable";
    let mut w = MhcWorld::new()
        .spec("unhealthyExpressions", json!([{"expression": gpu, "timeout": "0s"}]))
        .machine(machine("m1").node("m1").label("role", "gpu").status_field("phase", json!("Running")))
        .node(node("m1").ready("True", t0()).cordoned())
        .machine(machine("m2").node("m2").status_field("phase", json!("Running")))
        .node(node("m2").ready("True", t0()).cordoned())
        .machine(machine("m3").node("m3").label("role", "gpu").status_field("phase", json!("Provisioned")))
        .node(node("m3").ready("True", t0()).cordoned());
    let plan = step(&mut w, 60);
    assert_eq!(owner_asked(&plan), ["m1"], "only the cordoned, running GPU Machine");
}

#[test]
fn an_expression_that_cannot_be_evaluated_leaves_the_machine_without_a_verdict() {
    // indexing a label the Machine does not carry is a run-time error
    let unknown = "machine.labels['role'] == 'gpu'";
    let mut w = world(expression(unknown, "1m"));
    let first = step(&mut w, 0);
    let told: Vec<_> = first.notices.iter().filter(|n| n.reason == Reason::ExpressionUnknown).collect();
    assert_eq!(told.len(), 2, "one for each Machine: {:?}", first.notices);
    assert_eq!(told[0].kind, NoticeKind::NoDecision);
    assert!(
        told[0].message.contains("spec.unhealthyExpressions[0].expression could not be evaluated for Machine m1"),
        "{}",
        told[0].message
    );
    assert_eq!(first.status.current_healthy, 0, "not counted healthy");
    let listed = &first.status.features.unevaluated_expressions;
    assert_eq!(listed.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["m1", "m2"]);
    assert!(listed.iter().all(|e| e.expression == 0 && !e.message.is_empty()), "{listed:?}");
    let again = step(&mut w, 60);
    assert!(again.notices.iter().all(|n| n.reason != Reason::ExpressionUnknown), "told once: {:?}", again.notices);
    let asked = run(&mut w, (120, 3600, 60), |_| labelled("m1", true));
    assert!(asked.is_empty(), "never remediated for it: {asked:?}");
}

#[test]
fn the_clock_survives_a_restart_but_not_a_lost_status_or_a_spec_change() {
    let mut w = world(expression(BAD, "10m"));
    run(&mut w, (0, 300, 300), |_| labelled("m1", true));
    let kept = w.clone();
    let plan = step(&mut w, 600);
    assert_eq!(owner_asked(&plan), ["m1"], "the clock went on from the status");
    let mut lost = kept.clone();
    lost.status = None;
    assert!(owner_asked(&step(&mut lost, 600)).is_empty(), "without the status the clock starts again");
    let mut edited = kept;
    if let Some(s) = edited.status.as_mut() {
        s.observed_generation = Some(0);
    }
    let plan = step(&mut edited, 600);
    assert!(owner_asked(&plan).is_empty(), "a changed spec starts every clock again");
    let status = serde_json::to_value(&plan.status).expect("json");
    assert_eq!(status["expressionMatches"][0]["since"], json!("2030-01-01T00:10:00Z"));
}

#[test]
fn an_expressions_own_template_is_used_for_the_machines_it_made_unhealthy() {
    let mut w = world(json!({"unhealthyExpressions": [
        {"expression": BAD, "timeout": "0s", "remediationTemplate": template_ref_json()}]}));
    w.template = Some(template(NS));
    w.nodes.insert("m1".into(), labelled("m1", true).build());
    w.nodes.insert("m2".into(), node("m2").ready("False", t0()).build());
    let plan = step(&mut w, 301);
    assert_eq!(created_names(&plan).len(), 1, "one object, for m1: {:?}", plan.actions);
    assert_eq!(owner_asked(&plan), ["m2"], "a condition rule without its own: the owner");
    let chosen: Vec<(&str, &str)> =
        plan.status.features.chosen_remediations.iter().map(|c| (c.name.as_str(), c.rule.as_str())).collect();
    let rule = format!("spec.unhealthyExpressions[0] {BAD}");
    assert_eq!(chosen, [("m1", rule.as_str()), ("m2", "spec.unhealthyConditions[0] Ready=False")]);
}

/// m1's Node: NotReady since its episode's start (`timeline`: start minute, minutes), else Ready.
fn flapping_node(timeline: &[(i64, i64)], s: i64) -> NodeBuilder {
    match timeline.iter().find(|(start, len)| start * 60 <= s && s < (start + len) * 60) {
        Some((start, _)) => node("m1").ready("False", at(start * 60)),
        None => node("m1").ready("True", t0()),
    }
}

/// NotReady for 3 minutes every 10 minutes, `count` times from minute 0.
fn every_ten(count: i64) -> Vec<(i64, i64)> {
    (0..count).map(|i| (i * 10, 3)).collect()
}

#[test]
fn fewer_flaps_than_asked_never_remediate_and_the_nth_does() {
    let flapping = json!({"flapping": {"episodes": 3, "window": "1h"}});
    let mut w = world(flapping.clone());
    assert!(run(&mut w, (0, 3600, 30), |s| flapping_node(&every_ten(2), s)).is_empty(), "two episodes");
    let mut w = world(json!({}));
    assert!(run(&mut w, (0, 3600, 30), |s| flapping_node(&every_ten(6), s)).is_empty(), "without flapping never");
    let mut w = world(flapping);
    let asked = run(&mut w, (0, 1170, 30), |s| flapping_node(&every_ten(3), s));
    assert!(asked.is_empty(), "{asked:?}");
    w.nodes.insert("m1".into(), flapping_node(&every_ten(3), 1200).build());
    let plan = step(&mut w, 1200);
    assert_eq!(owner_asked(&plan), ["m1"], "the third episode's start");
    let (condition, _) = written(&plan, "m1", "HealthCheckSucceeded").expect("m1 is marked");
    assert_eq!(condition.reason.as_str(), "Flapping");
    assert!(condition.message.contains("3 times within 1h"), "{}", condition.message);
    let told: Vec<_> = plan.notices.iter().filter(|n| n.kind == NoticeKind::Flapping).collect();
    assert_eq!(told.len(), 1, "{:?}", plan.notices);
    assert!(plan.status.features.flapping.iter().all(|t| t.name != "m1"), "a remediation clears the episodes");
    // its owner now remediates it: still NotReady, no new episode opens
    w.nodes.insert("m1".into(), flapping_node(&every_ten(3), 1230).build());
    let later = step(&mut w, 1230);
    assert!(later.status.features.flapping.is_empty(), "{:?}", later.status.features.flapping);
}

#[test]
fn a_flapping_machine_waits_for_the_budget_like_any_unhealthy_one() {
    let mut w = world(json!({"flapping": {"episodes": 3, "window": "1h"}, "maxUnhealthy": 0}));
    let asked = run(&mut w, (0, 2400, 30), |s| flapping_node(&every_ten(4), s));
    assert!(asked.is_empty(), "maxUnhealthy 0 starts nothing: {asked:?}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// An expression true for less than its timeout never remediates: whenever a Machine is
    /// asked to be remediated, every decision for at least the timeout before saw it true.
    #[test]
    fn an_expression_true_for_less_than_its_timeout_never_remediates(
        minutes in 1i64..15,
        flips in proptest::collection::vec(any::<bool>(), 1..80),
    ) {
        let step_s = 30i64;
        let bad = |s: i64| flips.get(usize::try_from(s / step_s).unwrap_or(0)).copied().unwrap_or(false);
        let until = step_s * i64::try_from(flips.len()).unwrap_or(1);
        let mut w = world(expression(BAD, &format!("{minutes}m")));
        let asked = run(&mut w, (0, until, 30), |s| labelled("m1", bad(s)));
        if let Some((_, s)) = asked.first() {
            let mut start = *s;
            while start >= step_s && bad(start - step_s) {
                start -= step_s;
            }
            prop_assert!(s - start >= minutes * 60, "asked at {s}s, true since {start}s, timeout {minutes}m");
        }
    }

    /// Random flap timelines with fewer than N episodes within any hour never remediate.
    #[test]
    fn fewer_than_n_flaps_within_any_window_never_remediate(
        (n, timeline) in (2usize..5).prop_flat_map(|n| (Just(n), sparse_timeline(n))),
    ) {
        let mut w = world(json!({"flapping": {"episodes": n, "window": "1h"}}));
        let until = timeline.iter().map(|(s, l)| s + l + 1).max().unwrap_or(1) * 60;
        let asked = run(&mut w, (0, until, 60), |s| flapping_node(&timeline, s));
        prop_assert!(asked.is_empty(), "{:?}", asked);
    }
}

#[test]
fn a_pending_expression_wakes_the_check_when_its_timeout_ends() {
    let mut w = world(expression(BAD, "10m"));
    run(&mut w, (0, 120, 30), |_| labelled("m1", true));
    let plan = w.decide(at(150));
    assert_eq!(plan.next_wake, Some(at(600)), "woken at since + timeout");
}
