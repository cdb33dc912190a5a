//! Judging the Nodes: each against the condition rules (with the stale-signal guard), the counts
//! the budget reads, and the subjects a decision acts on (Nodes, and Nodes gone with objects left).

use super::input::NhcInput;
use super::objects::Owned;
use crate::disruptions;
use crate::domains::Tally;
use crate::expressions::{self, Clock, Judged};
use crate::lookup::Observed;
use crate::plan::Earliest;
use crate::plan::{ONE_NS, after};
use crate::target::is_control_plane;
use jiff::Timestamp;
use std::ops::Range;
use vigil_api::node_health_check::{ExpressionMatch, NodeHealthCheckStatus};
use vigil_api::shared::FlappingTarget;
use vigil_api::validate::{ConditionRule, DomainKey, NhcPolicy};
use vigil_api::views::{MaintenanceView, NodeView};

/// What a Node's conditions show against the rules alone (remediation objects not considered);
/// named apart from the MachineHealthCheck [`crate::machine::Verdict`], which is a full verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Finding {
    /// Matches no rule.
    Clear,
    /// Matches a rule whose duration has not passed yet.
    Pending,
    /// Matches this rule with a condition that has no `lastTransitionTime`: no decision.
    Undecided(usize),
    /// Has matched this rule for longer than its duration.
    Unhealthy(usize),
    /// Has matched this expression (`spec.unhealthyExpressions`) for its duration, on Vigil's
    /// clock, and no condition rule for longer than its duration.
    Expression(usize),
    /// This expression could not be evaluated for it, and nothing else decides: no decision
    /// (never remediated for it, not counted healthy).
    Unevaluated(usize),
}

/// Judges a Node against the rules; offers the instant its verdict can change. A matching
/// condition set aside by the stale-signal guard ([`crate::stale`]) matches nothing and is put in
/// `stale` (the first one); a guarded fresh one offers the instant it turns stale.
pub(super) fn judge(
    node: &NodeView,
    rules: &[ConditionRule],
    now: Timestamp,
    wake: &mut Earliest,
    stale: &mut Option<crate::stale::Stale>,
) -> Finding {
    let conds = &node.conditions[..];
    let mut undecided = None;
    let mut unhealthy = None;
    let mut pending = false;
    let mut first_deadline: Option<Timestamp> = None;
    // A condition one guarded rule sets aside matches no rule, guarded or not.
    let guarded = rules.iter().any(|r| r.max_age.is_some());
    for (i, rule) in rules.iter().enumerate() {
        for c in conds.iter().filter(|c| crate::stale::matches(c, rule)) {
            if guarded {
                match crate::stale::freshness(c, rules, now) {
                    crate::stale::Freshness::Stale(s) => {
                        stale.get_or_insert(s);
                        continue;
                    }
                    crate::stale::Freshness::FreshUntil(t) => wake.offer(t),
                    crate::stale::Freshness::Unguarded => {}
                }
            }
            if unhealthy.is_some() {
                continue; // already decided; only staleness is still looked for
            }
            match &c.last_transition_time {
                None => {
                    undecided.get_or_insert(i);
                }
                Some(since) => {
                    pending = true;
                    match after(*since, rule.timeout) {
                        Some(deadline) if deadline < now => unhealthy = Some(i),
                        Some(deadline) => {
                            first_deadline = Some(first_deadline.map_or(deadline, |d| d.min(deadline)));
                        }
                        None => {}
                    }
                }
            }
        }
    }
    if let Some(i) = unhealthy {
        return Finding::Unhealthy(i);
    }
    if let Some(t) = first_deadline.and_then(|d| after(d, ONE_NS)) {
        wake.offer(t);
    }
    match (undecided, pending) {
        (Some(i), _) => Finding::Undecided(i),
        (None, true) => Finding::Pending,
        (None, false) => Finding::Clear,
    }
}

/// The rule a Node has broken past its duration at `now` and since when, judged exactly as
/// [`decide`] judges it, so `vigil check` can say why a Node is unhealthy without a second rule.
pub fn unhealthy_because<'p>(
    node: &NodeView,
    policy: &'p NhcPolicy,
    now: Timestamp,
) -> Option<(&'p ConditionRule, Timestamp)> {
    let Finding::Unhealthy(i) = judge(node, &policy.conditions, now, &mut Earliest::default(), &mut None) else {
        return None;
    };
    let rule = policy.conditions.get(i)?;
    unhealthy_since(node, rule).map(|since| (rule, since))
}

/// Since when a Node has broken `rule`: the earliest `lastTransitionTime` of its conditions that
/// match the rule (what `vigil check` shows, and the pacing queue's order).
pub(super) fn unhealthy_since(node: &NodeView, rule: &ConditionRule) -> Option<Timestamp> {
    let conds = &node.conditions[..];
    conds.iter().filter(|c| crate::stale::matches(c, rule)).filter_map(|c| c.last_transition_time).min()
}

/// A Node the second pass looks at: selected, or owning objects of the check (or both).
pub(super) struct Subject<'a> {
    pub(super) name: &'a str,
    pub(super) node: Option<&'a NodeView>,
    /// `Some` for a selected Node.
    pub(super) verdict: Option<Finding>,
    pub(super) objs: Range<usize>,
    /// Unhealthy for flapping (`spec.flapping`): its episodes within the window.
    pub(super) flaps: Option<usize>,
    /// Unhealthy by an expression: since when Vigil has seen it hold.
    pub(super) since: Option<Timestamp>,
}

/// What pass 1 found.
pub(super) struct Scan<'a> {
    /// Whether the Nodes were strictly sorted by name; when not, nothing else is meaningful.
    pub(super) sorted: bool,
    /// Nodes with something to decide (not healthy, or owning objects), in name order.
    pub(super) subjects: Vec<Subject<'a>>,
    /// Per Node (same index as the scanned list): selected, matching no rule, without objects.
    pub(super) healthy_at: Vec<bool>,
    pub(super) observed: usize,
    pub(super) healthy: usize,
    /// With `voluntaryDisruptions: Count`: the healthy Nodes without objects taken down on
    /// purpose (counted in `healthy`, not available to the budgets).
    pub(super) taken: Taken<'a>,
    /// Control-plane Nodes, sorted.
    pub(super) cp_names: Vec<&'a str>,
    /// Selected Nodes with a matching condition set aside as stale, in name order.
    pub(super) stale: Vec<(String, crate::stale::Stale)>,
    pub(super) wake: Earliest,
    /// Per failure domain, with `spec.failureDomains`.
    pub(super) tally: Option<Tally>,
    /// The expressions' clock (`status.expressionMatches`).
    pub(super) clock: Clock<'a>,
    /// Selected Nodes an expression could not be evaluated for: name, expression, why.
    pub(super) unknown: Vec<(&'a str, usize, String)>,
}

/// Healthy Nodes taken down on purpose (`voluntaryDisruptions: Count`).
#[derive(Default)]
pub(super) struct Taken<'a> {
    /// By name, in name order.
    pub(super) names: Vec<&'a str>,
    /// Counted by signal.
    pub(super) by_signal: disruptions::Disrupted,
}

/// Pass 1: one look at every Node (name order, labels, conditions), merged with the check's
/// objects by Node name. Healthy Nodes without objects are only counted: nothing is decided for
/// them, which keeps the common case to a few comparisons a Node.
pub(super) fn scan_nodes<'a>(
    all: &[&'a NodeView],
    owned: &[Owned<'a>],
    policy: &NhcPolicy,
    disrupting: Option<&Maintained<'_>>,
    clock: Clock<'a>,
    now: Timestamp,
) -> Scan<'a> {
    let mut scan = Scan {
        sorted: true,
        subjects: Vec::new(),
        healthy_at: vec![false; all.len()],
        observed: 0,
        healthy: 0,
        taken: Taken::default(),
        cp_names: Vec::new(),
        stale: Vec::new(),
        wake: Earliest::default(),
        tally: policy.failure_domains.as_ref().map(|_| Tally::default()),
        clock,
        unknown: Vec::new(),
    };
    let domain_key = domain_label(policy);
    let mut b = 0usize;
    let mut last = "";
    for (i, &node) in all.iter().enumerate() {
        let name = node.name.as_str();
        if name <= last {
            // out of order, a duplicate, or no name ("" sorts first)
            scan.sorted = false;
            return scan;
        }
        last = name;
        gone_before(owned, &mut b, Some(name), &mut scan.subjects);
        let start = b;
        while b < owned.len() && owned[b].node == name {
            b += 1;
        }
        if is_control_plane(node) {
            scan.cp_names.push(name);
        }
        if node.labels.selected_by(&policy.selector) {
            scan.observed += 1;
            let (verdict, since) = verdict_of(node, policy, &mut scan, now);
            let clear = verdict == Finding::Clear && start == b;
            let signal = disrupting.filter(|_| clear).and_then(|m| disruptions::of_node(node, m.names(name)));
            if let Some(signal) = signal {
                scan.taken.names.push(name);
                scan.taken.by_signal.add(signal);
            }
            if let Some(tally) = &mut scan.tally {
                tally.add(domain_key.and_then(|k| node_domain(node, k)), clear && signal.is_none());
            }
            if clear {
                scan.healthy += 1;
                scan.healthy_at[i] = true;
            } else {
                scan.subjects.push(Subject {
                    name,
                    node: Some(node),
                    verdict: Some(verdict),
                    objs: start..b,
                    flaps: None,
                    since,
                });
            }
        } else if start < b {
            let objs = start..b;
            scan.subjects.push(Subject { name, node: Some(node), verdict: None, objs, flaps: None, since: None });
        }
    }
    gone_before(owned, &mut b, None, &mut scan.subjects);
    scan
}

/// A selected Node's verdict: by its conditions (with the stale-signal guard), then by its
/// expressions; a condition rule past its duration first, then an expression past its
/// duration, then a condition that cannot be timed, then an expression that cannot be
/// evaluated (no decision, told with why), then anything matching at all (pending). Returns
/// since when an expression that made it unhealthy has held.
fn verdict_of<'a>(
    node: &'a NodeView,
    policy: &NhcPolicy,
    scan: &mut Scan<'a>,
    now: Timestamp,
) -> (Finding, Option<Timestamp>) {
    let mut stale = None;
    let by_conditions = judge(node, &policy.conditions, now, &mut scan.wake, &mut stale);
    if let Some(stale) = stale {
        scan.stale.push((node.name.to_string(), stale));
    }
    let bindings = |reads| vigil_expr::Bindings::node(expressions::facts(node, reads));
    let by_expressions =
        expressions::judge(&policy.expressions, &node.name, bindings, &mut scan.clock, now, &mut scan.wake);
    match (by_conditions, by_expressions) {
        (f @ Finding::Unhealthy(_), _) => (f, None),
        (_, Judged::Matched(i)) => {
            (Finding::Expression(i), expressions::held_since(&scan.clock.next, node.name.as_str(), i))
        }
        (f @ Finding::Undecided(_), _) => (f, None),
        (_, Judged::Unknown(i, why)) => {
            scan.unknown.push((node.name.as_str(), i, why));
            (Finding::Unevaluated(i), None)
        }
        (Finding::Clear, Judged::Pending(_)) => (Finding::Pending, None),
        (f, _) => (f, None),
    }
}

/// The Node label naming failure domains, with `spec.failureDomains` (validation admits only a
/// label key on a NodeHealthCheck; any other key puts every Node in no domain, where the
/// check-wide budget alone applies).
pub(super) fn domain_label(policy: &NhcPolicy) -> Option<&str> {
    match policy.failure_domains.as_ref().map(|fd| &fd.key) {
        Some(DomainKey::NodeLabel(key)) => Some(key.as_str()),
        _ => None,
    }
}

/// A Node's failure domain: the label's value; a Node without it (or with an empty value) is in
/// no domain.
pub(super) fn node_domain<'n>(node: &'n NodeView, key: &str) -> Option<&'n str> {
    node.labels.get(key).filter(|v| !v.is_empty())
}

/// Adds a subject for each Node from `owned[*b..]` named before `limit` (all when `None`): the
/// scan passed their place, so they are not in the cluster.
pub(super) fn gone_before<'a>(
    owned: &[Owned<'a>],
    b: &mut usize,
    limit: Option<&str>,
    subjects: &mut Vec<Subject<'a>>,
) {
    while *b < owned.len() && limit.is_none_or(|l| owned[*b].node < l) {
        let gone = owned[*b].node;
        let start = *b;
        while *b < owned.len() && owned[*b].node == gone {
            *b += 1;
        }
        subjects.push(Subject { name: gone, node: None, verdict: None, objs: start..*b, flaps: None, since: None });
    }
}

/// Judge (pass 1). Nodes usually come sorted by name (adapters index them in sorted maps): the
/// scan checks that as it goes, and only when they are not (or some has no name, or two share
/// one) is it redone over a sorted copy without those (the first of a name wins). Returns the
/// list the scan's indexes refer to.
pub(super) fn judge_nodes<'a>(
    input: &NhcInput<'a>,
    owned: &[Owned<'a>],
    now: Timestamp,
) -> (std::borrow::Cow<'a, [&'a NodeView]>, Scan<'a>) {
    let maintained = input.policy.count_disruptions.then(|| Maintained::of(input.around.maintenances));
    let clock = || match input.check.status.as_ref() {
        // a spec changed since the status may have moved the expressions: every clock restarts
        Some(s) => Clock::new(&s.features, s.observed_generation, input.check.metadata.generation),
        None => Clock::default(),
    };
    let scan = scan_nodes(input.nodes, owned, input.policy, maintained.as_ref(), clock(), now);
    if scan.sorted {
        return (std::borrow::Cow::Borrowed(input.nodes), scan);
    }
    let mut copy: Vec<&NodeView> = input.nodes.iter().copied().filter(|n| !n.name.is_empty()).collect();
    copy.sort_by(|a, b| a.name.as_str().cmp(b.name.as_str()));
    copy.dedup_by(|a, b| a.name.as_str() == b.name.as_str());
    let scan = scan_nodes(&copy, owned, input.policy, maintained.as_ref(), clock(), now);
    (std::borrow::Cow::Owned(copy), scan)
}

/// Flapping (`spec.flapping`): advances the check's record of episodes by what the scan saw (a
/// selected Node some rule matches, however briefly, is in an episode) and judges a Node that
/// matches a rule not past its duration yet as unhealthy by that rule when at least
/// `episodes` of its episodes started within the window. A Node the previous status lists with
/// remediations is being remediated: no episode is counted for it until its remediation ends.
/// The record, empty when off.
pub(super) fn flaps(
    policy: &NhcPolicy,
    prev: &NodeHealthCheckStatus,
    subjects: &mut [Subject<'_>],
    held: &[ExpressionMatch],
    now: Timestamp,
) -> Vec<FlappingTarget> {
    let Some(f) = policy.flapping else {
        return Vec::new();
    };
    let remediated = |name: &str| prev.unhealthy_nodes.iter().any(|e| e.name == name && !e.remediations.is_empty());
    let matching: Vec<&str> = subjects
        .iter()
        .filter(|s| s.node.is_some() && !matches!(s.verdict, None | Some(Finding::Clear | Finding::Unevaluated(_))))
        .map(|s| s.name)
        .filter(|name| !remediated(name))
        .collect();
    let record = crate::flapping::advance(&prev.features.flapping, &matching, f, now);
    for s in subjects.iter_mut().filter(|s| s.verdict == Some(Finding::Pending)) {
        let Some(node) = s.node else { continue };
        let Some(count) = crate::flapping::flapping(&record, s.name, f, now) else { continue };
        let rule = policy.conditions.iter().position(|r| node.conditions.iter().any(|c| crate::stale::matches(c, r)));
        let holding = expressions::first_held(held, s.name);
        let verdict = match (rule, holding) {
            (Some(rule), _) => Finding::Unhealthy(rule),
            (None, Some(m)) => match usize::try_from(m.expression) {
                Ok(i) => {
                    s.since = Some(m.since.0);
                    Finding::Expression(i)
                }
                Err(_) => continue,
            },
            (None, None) => continue,
        };
        s.verdict = Some(verdict);
        s.flaps = Some(count);
    }
    record
}

/// The Nodes a `NodeMaintenance` names, sorted (none when they cannot be read: a Node is then
/// counted by what it carries itself), for counting voluntary disruptions.
pub(super) struct Maintained<'a>(Vec<&'a str>);

impl<'a> Maintained<'a> {
    fn of(maintenances: Observed<'a, &'a [&'a MaintenanceView]>) -> Self {
        let mut names: Vec<&str> = match maintenances {
            Observed::Known(list) => list.iter().filter_map(|m| m.node_name.as_deref()).collect(),
            _ => Vec::new(),
        };
        names.sort_unstable();
        Maintained(names)
    }

    /// Whether a `NodeMaintenance` names Node `name`.
    fn names(&self, name: &str) -> bool {
        self.0.binary_search(&name).is_ok()
    }
}

/// A rule as people read it: `Ready=False`.
pub(super) fn rule_text(rule: &ConditionRule) -> String {
    format!("{}={}", rule.type_, rule.status)
}
