//! A MachineHealthCheck's rules on Vigil's own clock, applied over the verdicts of the condition
//! rules: CEL expressions over a Machine and its Node (`spec.unhealthyExpressions`, see
//! [`crate::expressions`]) and flapping (`spec.flapping`, see [`crate::flapping`]), each the
//! same rule as a NodeHealthCheck's, keyed by Machine name.
//!
//! An expression is judged only for a readable Machine with a Node (the Node is half of what it
//! reads; a Machine without one is judged by `nodeStartupTimeout`). A condition rule past its
//! timeout, the remediate annotation, a failure or a Node gone decide first; a verdict that makes
//! no decision (cluster not ready, a condition that cannot be timed) stays so. An expression that
//! cannot be evaluated leaves the Machine without a verdict (not healthy, never remediated).

use super::judge::Verdict;
use crate::expressions::{self, Clock, Judged};
use crate::flapping;
use crate::plan::Earliest;
use jiff::Timestamp;
use vigil_api::conditions;
use vigil_api::duration::format_go_duration;
use vigil_api::machine_health_check::MachineHealthCheck;
use vigil_api::reason::Reason;
use vigil_api::shared::{ExpressionMatch, FlappingTarget};
use vigil_api::validate::{ExpressionRule, MhcPolicy};
use vigil_api::views::{MachineView, NodeView};
use vigil_expr::Bindings;

/// What the own-clock rules found, for the status.
#[derive(Debug, Default)]
pub(super) struct OwnClock<'a> {
    /// The expressions' new clock (`status.expressionMatches`).
    pub(super) matches: Vec<ExpressionMatch>,
    /// Targets an expression could not be evaluated for: name, expression, why.
    pub(super) unknown: Vec<(&'a str, usize, String)>,
    /// The new flapping record (`status.flapping`).
    pub(super) flapping: Vec<FlappingTarget>,
}

/// Applies the expressions, then flapping, to the verdicts of `targets` (name order; `nodes`
/// their Nodes, `verdicts` their verdicts by the other rules, same indexes). `under_way` says
/// whether a target's remediation is under way: no flapping episode is counted for it.
pub(super) fn apply<'a>(
    check: &MachineHealthCheck,
    policy: &MhcPolicy,
    (targets, nodes): (&[&'a MachineView], &[Option<&NodeView>]),
    verdicts: &mut [Verdict],
    under_way: impl Fn(&MachineView) -> bool,
    now: Timestamp,
    wake: &mut Earliest,
) -> OwnClock<'a> {
    let mut found = OwnClock::default();
    if !policy.expressions.is_empty() {
        let status = check.status.as_ref();
        let mut clock = match status {
            Some(s) => Clock::new(&s.features, s.observed_generation, check.metadata.generation),
            None => Clock::default(),
        };
        for (k, machine) in targets.iter().enumerate() {
            let (Some(node), Some(verdict)) = (nodes.get(k).copied().flatten(), verdicts.get_mut(k)) else { continue };
            if !machine.problems.is_empty() {
                continue;
            }
            let bindings = |reads: vigil_expr::Reads| {
                let node = expressions::facts(node, reads);
                if reads.machine() {
                    Bindings::node_and_machine(node, expressions::machine_facts(machine))
                } else {
                    Bindings::node(node)
                }
            };
            let name = machine.meta.name.as_str();
            let judged = expressions::judge(&policy.expressions, name, bindings, &mut clock, now, wake);
            if let Some(why) = combine(policy, machine, judged, &clock.next, verdict) {
                found.unknown.push((name, why.0, why.1));
            }
        }
        found.matches = clock.next;
    }
    let prev = check.status.as_ref().map_or(&[][..], |s| s.features.flapping.as_slice());
    found.flapping = flaps(policy, prev, (targets, nodes), verdicts, &found.matches, under_way, now);
    found
}

/// A target's verdict with its expressions' judgement: an expression held for its timeout makes a
/// healthy or pending target unhealthy; one that cannot be evaluated leaves it without a verdict
/// (returned: which expression and why); a pending one makes a healthy target pending. Verdicts
/// already unhealthy or without a decision stand.
fn combine(
    policy: &MhcPolicy,
    machine: &MachineView,
    judged: Judged,
    held: &[ExpressionMatch],
    verdict: &mut Verdict,
) -> Option<(usize, String)> {
    if !matches!(verdict, Verdict::Healthy | Verdict::Pending { .. }) {
        return None;
    }
    let name = machine.meta.name.as_str();
    match judged {
        Judged::Clear => None,
        Judged::Matched(i) => {
            let rule = policy.expressions.get(i)?;
            *verdict = Verdict::Unhealthy {
                reason: Reason::ExpressionMatched,
                message: expression_message(rule, name),
                rule: Some(policy.expression_rule(i)),
                since: expressions::held_since(held, name, i),
            };
            None
        }
        Judged::Unknown(i, why) => {
            let path = policy.expressions.get(i).map_or("spec.unhealthyExpressions", |r| r.path.as_str());
            *verdict = Verdict::NotEvaluated {
                why: format!("expression {path}.expression could not be evaluated: {why}"),
                counts_healthy: false,
            };
            Some((i, why))
        }
        Judged::Pending(at) => {
            let at = at.unwrap_or(Timestamp::MAX);
            let until = match verdict {
                Verdict::Pending { until } => (*until).min(at),
                _ => at,
            };
            *verdict = Verdict::Pending { until };
            None
        }
    }
}

/// The `HealthCheckSucceeded` message of a Machine an expression made unhealthy.
fn expression_message(rule: &ExpressionRule, name: &str) -> String {
    format!(
        "Health check failed: Machine {name} has matched expression {}.expression ({}) for {} or more",
        rule.path,
        rule.expression.source(),
        format_go_duration(rule.duration)
    )
}

/// Flapping: advances the record by what the verdicts show (a target with a Node that some rule
/// matches, however briefly, is in an episode; none is counted while its remediation is under
/// way) and makes a pending target unhealthy (reason `Flapping`, by the rule it matches now)
/// once at least `episodes` of its episodes started within the window. The new record, empty
/// without `spec.flapping`.
fn flaps(
    policy: &MhcPolicy,
    prev: &[FlappingTarget],
    (targets, nodes): (&[&MachineView], &[Option<&NodeView>]),
    verdicts: &mut [Verdict],
    held: &[ExpressionMatch],
    under_way: impl Fn(&MachineView) -> bool,
    now: Timestamp,
) -> Vec<FlappingTarget> {
    let Some(f) = policy.flapping else {
        return Vec::new();
    };
    let matching: Vec<&str> = targets
        .iter()
        .zip(nodes)
        .zip(verdicts.iter())
        .filter(|((m, node), v)| node.is_some() && matches_a_rule(v) && !under_way(m))
        .map(|((m, _), _)| m.meta.name.as_str())
        .collect();
    let record = flapping::advance(prev, &matching, f, now);
    for (k, machine) in targets.iter().enumerate() {
        let (Some(node), Some(verdict)) = (nodes.get(k).copied().flatten(), verdicts.get_mut(k)) else { continue };
        if !matches!(verdict, Verdict::Pending { .. }) {
            continue;
        }
        let name = machine.meta.name.as_str();
        let Some(count) = flapping::flapping(&record, name, f, now) else { continue };
        let Some(rule) = rule_matching(policy, (machine, node), held, now) else { continue };
        let since = flapping::find(&record, name).and_then(|t| t.episodes.first()).map(|e| e.start.0);
        *verdict = Verdict::Unhealthy {
            reason: Reason::Flapping,
            message: format!(
                "Health check failed: Machine {name} is flapping: its rules matched and cleared again {count} times within {}",
                format_go_duration(f.window)
            ),
            rule: Some(rule),
            since,
        };
    }
    record
}

/// Whether a verdict shows some rule matching: pending, or unhealthy by a rule (a condition or an
/// expression; flapping keeps its rule).
fn matches_a_rule(verdict: &Verdict) -> bool {
    matches!(verdict, Verdict::Pending { .. } | Verdict::Unhealthy { rule: Some(_), .. })
}

/// The first rule (in [`MhcPolicy::rules`] order) a target matches now, its timeout aside: a
/// Machine condition rule, a Node condition rule (a stale condition matches none), else an
/// expression holding (`held`, the new clock).
fn rule_matching(
    policy: &MhcPolicy,
    (machine, node): (&MachineView, &NodeView),
    held: &[ExpressionMatch],
    now: Timestamp,
) -> Option<usize> {
    let by_machine = policy.machine_conditions.iter().position(|r| {
        conditions::find(&machine.conditions, &r.type_)
            .is_some_and(|c| r.matches(&r.type_, &c.status, c.reason.as_deref().filter(|w| !w.is_empty())))
    });
    if by_machine.is_some() {
        return by_machine;
    }
    let guarded = policy.node_conditions.iter().any(|r| r.max_age.is_some());
    let fresh = |c: &vigil_api::views::NodeConditionView| {
        !guarded
            || !matches!(crate::stale::freshness(c, &policy.node_conditions, now), crate::stale::Freshness::Stale(_))
    };
    let by_node = policy
        .node_conditions
        .iter()
        .position(|r| node.conditions.iter().any(|c| crate::stale::matches(c, r) && fresh(c)));
    if let Some(i) = by_node {
        return Some(policy.machine_conditions.len() + i);
    }
    let name = machine.meta.name.as_str();
    let m = expressions::first_held(held, name)?;
    usize::try_from(m.expression).ok().map(|i| policy.expression_rule(i))
}
