//! Flapping targets (`spec.flapping`), as tables over timelines: a Node's rules match for a few
//! minutes and clear again, each decision's status carried to the next through its JSON (as the
//! API server keeps it, so every step is also a restart); fewer than `episodes` episodes within
//! the window never remediate, the N-th does though no episode lasted the rule's duration, old
//! episodes do not count, the budget still applies, a remediation's start clears the episodes;
//! then the property over random timelines.

mod support;

use proptest::prelude::*;
use serde_json::{Value, json};
use support::*;
use vigil_api::node_health_check::NodeHealthCheckStatus;
use vigil_api::views::NodeView;
use vigil_engine::plan::{NoticeKind, Plan};

const SNR_NS: &str = NHC_SNR_NS;

fn spec(extra: Value) -> Value {
    let mut spec = json!({
        "selector": {"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]},
        "maxUnhealthy": "100%",
        "unhealthyConditions": [{"type": "Ready", "status": "False", "duration": "5m"}],
        "remediationTemplate": {"apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate", "name": "snr", "namespace": SNR_NS},
        "plannedMaintenance": {"enabled": false},
        "flapping": {"episodes": 3, "window": "1h"},
    });
    if let (Some(spec), Value::Object(extra)) = (spec.as_object_mut(), extra) {
        spec.extend(extra);
    }
    spec
}

/// One decision of the check with `status` (its JSON text, as stored) at `now`.
fn decide(spec: &Value, status: Option<&str>, nodes: &[NodeView], now: jiff::Timestamp) -> Plan<NodeHealthCheckStatus> {
    decide_nhc_from(spec, 1, status, nodes, now)
}

/// A Node's episodes: (start minute, minutes NotReady).
type Timeline = Vec<(i64, i64)>;

/// The Node at minute `m` (seconds `s` past it): NotReady since its episode's start, else Ready.
fn node_at(name: &str, timeline: &[(i64, i64)], s: i64) -> NodeView {
    match timeline.iter().find(|(start, len)| start * 60 <= s && s < (start + len) * 60) {
        Some((start, _)) => node(name).ready("False", at(start * 60)).build(),
        None => node(name).ready("True", at(0)).build(),
    }
}

/// What a run shows: each Node's first remediation (second), the `Flapping` notices, the status
/// text of the last decision.
struct Run {
    created: Vec<(String, i64)>,
    flapping_notices: Vec<(String, i64)>,
    status: String,
}

/// Decides every `step` seconds from 0 to `until`, the status carried through its JSON text.
fn run(spec: &Value, nodes: &[(&str, Timeline)], until: i64, step: usize) -> Run {
    let mut r = Run { created: Vec::new(), flapping_notices: Vec::new(), status: String::new() };
    let mut status: Option<String> = None;
    for s in (0..=until).step_by(step) {
        let views: Vec<NodeView> = nodes.iter().map(|(n, t)| node_at(n, t, s)).collect();
        let plan = decide(spec, status.as_deref(), &views, at(s));
        for name in created_names(&plan) {
            if !r.created.iter().any(|(n, _)| *n == name) {
                r.created.push((name, s));
            }
        }
        for n in plan.notices.iter().filter(|n| n.kind == NoticeKind::Flapping) {
            r.flapping_notices.push((n.target_key().unwrap_or_default(), s));
        }
        status = Some(serde_json::to_string(&plan.status).expect("status"));
    }
    r.status = status.unwrap_or_default();
    r
}

/// NotReady for 3 minutes every 10 minutes, `count` times from minute `from`.
fn every_ten(from: i64, count: i64) -> Timeline {
    (0..count).map(|i| (from + i * 10, 3)).collect()
}

#[test]
fn fewer_episodes_than_asked_never_remediate_and_the_nth_does() {
    let r = run(&spec(json!({})), &[("a", every_ten(0, 2)), ("b", every_ten(0, 3))], 60 * 60, 30);
    assert_eq!(r.created, [("b".to_string(), 20 * 60)], "b at its third episode's start, a never");
    assert_eq!(r.flapping_notices.len(), 1, "told once: {:?}", r.flapping_notices);
    assert_eq!(r.flapping_notices[0].1, 20 * 60);
}

#[test]
fn without_flapping_a_node_that_never_stays_down_past_its_duration_is_left_alone() {
    let off = spec(json!({"flapping": null}));
    let r = run(&off, &[("b", every_ten(0, 6))], 60 * 60, 30);
    assert!(r.created.is_empty(), "{:?}", r.created);
    assert!(!r.status.contains("flapping"), "nothing written without spec.flapping: {}", r.status);
}

#[test]
fn episodes_older_than_the_window_do_not_count() {
    let sparse: Timeline = vec![(0, 3), (40, 3), (80, 3), (120, 3), (160, 3)];
    let r = run(&spec(json!({})), &[("a", sparse)], 170 * 60, 60);
    assert!(r.created.is_empty(), "never three within an hour: {:?}", r.created);
    let status: NodeHealthCheckStatus = serde_json::from_str(&r.status).expect("status");
    let a = &status.features.flapping[0];
    assert!(a.episodes.len() <= 2, "old episodes leave the record: {a:?}");
}

#[test]
fn a_restart_that_keeps_the_status_keeps_the_episodes() {
    let spec = spec(json!({}));
    let timeline = every_ten(0, 3);
    let before = run(&spec, &[("a", timeline.clone())], 19 * 60, 30);
    assert!(before.created.is_empty());
    let kept: NodeHealthCheckStatus = serde_json::from_str(&before.status).expect("status");
    assert_eq!(kept.features.flapping[0].episodes.len(), 2, "{:?}", kept.features.flapping);
    // a new process (or another replica) reads the status from the API server and decides
    let text = serde_json::to_string(&serde_json::to_value(&kept).expect("value")).expect("text");
    let plan = decide(&spec, Some(&text), &[node_at("a", &timeline, 20 * 60)], at(20 * 60));
    assert_eq!(created_names(&plan), ["a"]);
    let forgotten = decide(&spec, None, &[node_at("a", &timeline, 20 * 60)], at(20 * 60));
    assert!(created_names(&forgotten).is_empty(), "without the status there is no clock");
}

#[test]
fn the_budget_holds_a_flapping_node_back_like_any_unhealthy_one() {
    let tight = spec(json!({"maxUnhealthy": 0}));
    let r = run(&tight, &[("a", every_ten(0, 4)), ("b", vec![])], 40 * 60, 30);
    assert!(r.created.is_empty(), "maxUnhealthy 0 starts nothing: {:?}", r.created);
    let paced = spec(json!({"maxInFlight": 1}));
    let r = run(&paced, &[("a", every_ten(0, 3)), ("b", every_ten(0, 3))], 21 * 60, 30);
    let at_once = r.created.iter().filter(|(_, s)| *s == 20 * 60).count();
    assert_eq!(at_once, 1, "both flap a third time at once, one slot: {:?}", r.created);
}

#[test]
fn a_remediation_start_clears_the_episodes() {
    let spec = spec(json!({}));
    let timeline = every_ten(0, 3);
    let before = run(&spec, &[("a", timeline.clone())], 19 * 60, 30);
    let plan = decide(&spec, Some(&before.status), &[node_at("a", &timeline, 20 * 60)], at(20 * 60));
    assert_eq!(created_names(&plan), ["a"]);
    assert!(plan.status.features.flapping.iter().all(|t| t.name != "a"), "{:?}", plan.status.features.flapping);
}

#[test]
fn no_episode_is_counted_while_the_node_is_being_remediated() {
    let spec = spec(json!({}));
    let timeline = every_ten(0, 3);
    let before = run(&spec, &[("a", timeline.clone())], 19 * 60, 30);
    let started = decide(&spec, Some(&before.status), &[node_at("a", &timeline, 20 * 60)], at(20 * 60));
    assert_eq!(created_names(&started), ["a"]);
    let status = serde_json::to_string(&started.status).expect("status");
    // still NotReady half a minute later, its remediation listed: no new episode opens
    let later = decide(&spec, Some(&status), &[node_at("a", &timeline, 20 * 60 + 30)], at(20 * 60 + 30));
    assert!(later.status.features.flapping.is_empty(), "{:?}", later.status.features.flapping);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Random flap timelines with fewer than N episodes within any hour never produce a
    /// remediation, and the same input gives the same plan.
    #[test]
    fn fewer_than_n_episodes_within_any_window_never_remediate(
        (n, a, b) in (2usize..5).prop_flat_map(|n| (Just(n), sparse_timeline(n), sparse_timeline(n))),
    ) {
        let spec = spec(json!({"flapping": {"episodes": n, "window": "1h"}}));
        let until = a.iter().chain(b.iter()).map(|(s, l)| s + l + 1).max().unwrap_or(1) * 60;
        let r = run(&spec, &[("a", a.clone()), ("b", b.clone())], until, 60);
        prop_assert!(r.created.is_empty(), "{:?}", r.created);
        let views = [node_at("a", &a, 600), node_at("b", &b, 600)];
        let once = decide(&spec, Some(&r.status), &views, at(600));
        let twice = decide(&spec, Some(&r.status), &views, at(600));
        prop_assert_eq!(format!("{once:?}"), format!("{twice:?}"));
    }
}
