//! CEL expression rules (`spec.unhealthyExpressions`, both kinds) on Vigil's own clock. An
//! expression has no `lastTransitionTime`, so Vigil keeps one: the instant a decision first saw
//! an expression hold for a target (a Node, or a Machine with its Node) is written in the check's
//! `status.expressionMatches`, and the target is unhealthy by that expression once it has held
//! for the expression's duration since. The record is derived from the previous status, what is
//! observed and `now` alone (no clock is read), so a restart or another replica keeps the same
//! clock; an expression seen false (or not decidable) for a target starts its clock again.
//!
//! Bounded: at most [`MAX_TRACKED`] entries, in name order; a match beyond them is not tracked,
//! so it never becomes unhealthy (the safe side). An expression that cannot be evaluated for a
//! target ([`vigil_expr::Outcome::Unknown`]) never makes it unhealthy: it gets no verdict.

use crate::decision::Outputs;
use crate::plan::{Earliest, Notice, NoticeKind};
use crate::target::Target;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::BTreeMap;
use vigil_api::reason::Reason;
use vigil_api::shared::{ExpressionMatch, FeatureStatus, UnevaluatedExpression};
use vigil_api::validate::ExpressionRule;
use vigil_api::views::{MachineView, NodeView};
use vigil_expr::{Bindings, Condition, MachineFacts, NodeFacts, Outcome, Prepared, Reads, Taint};

/// Most entries `status.expressionMatches` holds (name order); keeps the status object small.
pub const MAX_TRACKED: usize = 1000;

/// What one target's expressions say at `now`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Judged {
    /// None holds.
    Clear,
    /// One holds, not yet for its duration; the first holds for its duration at this instant
    /// (`None`: never, the record being full).
    Pending(Option<Timestamp>),
    /// Expression `usize` (the first in spec order) has held for its duration.
    Matched(usize),
    /// Expression `usize` (the first in spec order) could not be evaluated, and why; no
    /// expression has held for its duration.
    Unknown(usize, String),
}

/// The clock of every expression for every target: the previous record, and the new one being
/// written as the targets are judged in name order.
#[derive(Debug, Default)]
pub(crate) struct Clock<'p> {
    prev: &'p [ExpressionMatch],
    /// The new record, in name and expression order.
    pub(crate) next: Vec<ExpressionMatch>,
}

impl<'p> Clock<'p> {
    /// A clock that goes on from the previous status' record (`prev`); a spec changed since that
    /// status (`generation` differs from the status' `observed`: indexes may name other
    /// expressions) starts every clock again.
    pub(crate) fn new(prev: &'p FeatureStatus, observed: Option<i64>, generation: Option<i64>) -> Self {
        let record = if observed == generation { &prev.expression_matches[..] } else { &[] };
        Clock { prev: record, next: Vec::new() }
    }

    /// Since when expression `index` has held for target `name`: the previous record's instant,
    /// else `now` rounded up to a whole second (status times are whole seconds, and a clock
    /// started early would remediate early). `None` when the record is full.
    fn since(&mut self, name: &str, index: usize, now: Timestamp) -> Option<Timestamp> {
        let since = held_since(self.prev, name, index).unwrap_or_else(|| ceil_second(now));
        if self.next.len() >= MAX_TRACKED {
            return None;
        }
        let expression = i32::try_from(index).ok()?;
        self.next.push(ExpressionMatch { name: name.to_string(), expression, since: Time(since) });
        Some(since)
    }
}

/// Judges target `name` by every expression at `now`, advancing `clock` and offering the instant
/// a pending expression reaches its duration to `wake`. A target is unhealthy by an expression
/// once `now - since >= duration`. The target's facts are made by `bindings` (only when there
/// are rules, and only what the rules read) and bound once for all of them.
pub(crate) fn judge(
    rules: &[ExpressionRule],
    name: &str,
    bindings: impl FnOnce(Reads) -> Bindings,
    clock: &mut Clock<'_>,
    now: Timestamp,
    wake: &mut Earliest,
) -> Judged {
    if rules.is_empty() {
        return Judged::Clear;
    }
    let reads = Reads::of(rules.iter().map(|r| &r.expression));
    let target = Prepared::new(&bindings(reads), reads);
    let (mut matched, mut unknown, mut pending) = (None, None, None);
    for (i, rule) in rules.iter().enumerate() {
        match rule.expression.evaluate_prepared(&target) {
            Outcome::True => {
                let first = pending.get_or_insert(Earliest::default());
                let Some(since) = clock.since(name, i, now) else { continue };
                match crate::plan::after(since, rule.duration) {
                    Some(deadline) if deadline <= now => {
                        matched.get_or_insert(i);
                    }
                    Some(deadline) => {
                        first.offer(deadline);
                        wake.offer(deadline);
                    }
                    None => {}
                }
            }
            Outcome::False => {}
            Outcome::Unknown(why) => {
                unknown.get_or_insert((i, why));
            }
        }
    }
    match (matched, unknown, pending) {
        (Some(i), _, _) => Judged::Matched(i),
        (None, Some((i, why)), _) => Judged::Unknown(i, why),
        (None, None, Some(first)) => Judged::Pending(first.0),
        (None, None, None) => Judged::Clear,
    }
}

/// `status.unevaluatedExpressions` from what a decision found (`found`: target name,
/// expression, why; name order; at most [`MAX_TRACKED`], each reason cut to
/// [`UNEVALUATED_MESSAGE_CHARS`]); an entry not in the previous status (`prev`, or with another
/// reason) is told once, about the target `target` makes of a name (`what`: `Node`, `Machine`).
pub(crate) fn unevaluated(
    rules: &[ExpressionRule],
    prev: &[UnevaluatedExpression],
    found: &[(&str, usize, String)],
    (what, target): (&str, &dyn Fn(&str) -> Target),
    out: &mut Outputs,
) -> Vec<UnevaluatedExpression> {
    let mut list = Vec::new();
    for (name, i, why) in found.iter().take(MAX_TRACKED) {
        let Ok(expression) = i32::try_from(*i) else { continue };
        let message: String = why.chars().take(UNEVALUATED_MESSAGE_CHARS).collect();
        let entry = UnevaluatedExpression { name: name.to_string(), expression, message };
        if !prev.contains(&entry) {
            let path = rules.get(*i).map_or("spec.unhealthyExpressions", |r| r.path.as_str());
            let lower = what.to_lowercase();
            out.tell(Notice {
                kind: NoticeKind::NoDecision,
                target: Some(target(name)),
                reason: Reason::ExpressionUnknown,
                message: format!(
                    "expression {path}.expression could not be evaluated for {what} {name}: {why}; no decision is made for this {lower} by it"
                ),
            });
        }
        list.push(entry);
    }
    list
}

/// The longest reason `status.unevaluatedExpressions` keeps of an evaluator's error.
const UNEVALUATED_MESSAGE_CHARS: usize = 256;

/// Since when the record says expression `index` has held for Node `name` (Vigil writes the
/// record sorted; one written otherwise is searched in full).
pub fn held_since(record: &[ExpressionMatch], name: &str, index: usize) -> Option<Timestamp> {
    let index = i32::try_from(index).ok()?;
    let key = |m: &ExpressionMatch| (m.name.as_str(), m.expression).cmp(&(name, index));
    let found = match record.binary_search_by(key) {
        Ok(i) => record.get(i),
        Err(_) => record.iter().find(|m| m.name == name && m.expression == index),
    };
    found.map(|m| m.since.0)
}

/// The first expression the record says holds for target `name`, and since when (the record is
/// sorted by name and expression as [`Clock`] writes it; one written otherwise is searched in
/// full).
pub fn first_held<'r>(record: &'r [ExpressionMatch], name: &str) -> Option<&'r ExpressionMatch> {
    let at = record.partition_point(|m| m.name.as_str() < name);
    match record.get(at) {
        Some(m) if m.name == name => Some(m),
        _ => record.iter().find(|m| m.name == name),
    }
}

/// What an expression reads of a Node: what Vigil's view of it keeps (all labels; the
/// annotations and taint keys the view keeps; conditions by type, the first of a type, without
/// messages), of it only the fields `reads` names (the others stay empty: no expression reads
/// them, and copying them for every target at every decision was most of the cost).
pub fn facts(node: &NodeView, reads: Reads) -> NodeFacts {
    let mut conditions = BTreeMap::new();
    if reads.node_field("conditions") {
        for c in node.conditions.iter() {
            conditions.entry(c.type_.to_string()).or_insert_with(|| Condition {
                status: c.status.to_string(),
                reason: c.reason.as_deref().unwrap_or_default().to_string(),
                message: String::new(),
            });
        }
    }
    let read = |field: &str| reads.node_field(field);
    NodeFacts {
        name: if read("name") { node.name.clone() } else { String::new() },
        labels: if read("labels") {
            node.labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        } else {
            BTreeMap::new()
        },
        annotations: if read("annotations") { node.annotations.clone() } else { BTreeMap::new() },
        taints: if read("taints") {
            node.taints.iter().map(|k| Taint { key: k.to_string(), ..Taint::default() }).collect()
        } else {
            Vec::new()
        },
        unschedulable: node.unschedulable,
        conditions,
    }
}

/// What an expression reads of a Machine: its name, labels and annotations, `status.phase` and
/// whether it is being deleted.
pub fn machine_facts(machine: &MachineView) -> MachineFacts {
    MachineFacts {
        name: machine.meta.name.clone(),
        labels: machine.meta.labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        annotations: machine.meta.annotations.clone(),
        phase: machine.phase.clone().unwrap_or_default(),
        deleting: machine.meta.deleting,
    }
}

/// `t` rounded up to a whole second.
fn ceil_second(t: Timestamp) -> Timestamp {
    let floor = Timestamp::from_second(t.as_second()).unwrap_or(t);
    if floor == t { t } else { Timestamp::from_second(t.as_second() + 1).unwrap_or(t) }
}
