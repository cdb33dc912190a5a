//! CEL expression rules (`spec.unhealthyExpressions`) on Vigil's own clock. An expression has no
//! `lastTransitionTime`, so Vigil keeps one: the instant a decision first saw an expression hold
//! for a Node is written in the check's `status.expressionMatches`, and the Node is unhealthy by
//! that expression once it has held for the expression's `duration` since. The record is derived
//! from the previous status, what is observed and `now` alone (no clock is read), so a restart
//! or another replica keeps the same clock; an expression seen false (or not decidable) for a
//! Node starts its clock again.
//!
//! Bounded: at most [`MAX_TRACKED`] entries, in name order; a match beyond them is not tracked,
//! so it never becomes unhealthy (the safe side). An expression that cannot be evaluated for a
//! Node ([`vigil_expr::Outcome::Unknown`]) never makes it unhealthy: the Node gets no verdict.

use crate::plan::Earliest;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::BTreeMap;
use vigil_api::node_health_check::ExpressionMatch;
use vigil_api::validate::ExpressionRule;
use vigil_api::views::NodeView;
use vigil_expr::{Bindings, Condition, NodeFacts, Outcome, Taint};

/// Most entries `status.expressionMatches` holds (name order); keeps the status object small.
pub const MAX_TRACKED: usize = 1000;

/// What one Node's expressions say at `now`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Judged {
    /// None holds.
    Clear,
    /// One holds, not yet for its duration.
    Pending,
    /// Expression `usize` (the first in spec order) has held for its duration.
    Matched(usize),
    /// Expression `usize` (the first in spec order) could not be evaluated, and why; no
    /// expression has held for its duration.
    Unknown(usize, String),
}

/// The clock of every expression for every Node: the previous record, and the new one being
/// written as the Nodes are judged in name order.
#[derive(Debug, Default)]
pub(crate) struct Clock<'p> {
    prev: &'p [ExpressionMatch],
    /// The new record, in name and expression order.
    pub(crate) next: Vec<ExpressionMatch>,
}

impl<'p> Clock<'p> {
    /// A clock that goes on from `prev`, the previous status' record; `restart` (the spec
    /// changed since that status, so indexes may name other expressions) starts every clock
    /// again.
    pub(crate) fn new(prev: &'p [ExpressionMatch], restart: bool) -> Self {
        Clock { prev: if restart { &[] } else { prev }, next: Vec::new() }
    }

    /// Since when expression `index` has held for Node `name`: the previous record's instant,
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

/// Judges Node `node` by every expression at `now`, advancing `clock` and offering the instant
/// a pending expression reaches its duration to `wake`. A Node is unhealthy by an expression
/// once `now - since >= duration`.
pub(crate) fn judge(
    rules: &[ExpressionRule],
    node: &NodeView,
    clock: &mut Clock<'_>,
    now: Timestamp,
    wake: &mut Earliest,
) -> Judged {
    if rules.is_empty() {
        return Judged::Clear;
    }
    let bindings = Bindings::node(facts(node));
    let (mut matched, mut unknown, mut pending) = (None, None, false);
    for (i, rule) in rules.iter().enumerate() {
        match rule.expression.evaluate(&bindings) {
            Outcome::True => {
                pending = true;
                let Some(since) = clock.since(&node.name, i, now) else { continue };
                match crate::plan::after(since, rule.duration) {
                    Some(deadline) if deadline <= now => {
                        matched.get_or_insert(i);
                    }
                    Some(deadline) => wake.offer(deadline),
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
        (None, None, true) => Judged::Pending,
        (None, None, false) => Judged::Clear,
    }
}

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

/// What an expression reads of a Node: what Vigil's view of it keeps (all labels; the
/// annotations and taint keys the view keeps; conditions by type, the first of a type, without
/// messages).
pub fn facts(node: &NodeView) -> NodeFacts {
    let mut conditions = BTreeMap::new();
    for c in node.conditions.iter() {
        conditions.entry(c.type_.to_string()).or_insert_with(|| Condition {
            status: c.status.to_string(),
            reason: c.reason.as_deref().unwrap_or_default().to_string(),
            message: String::new(),
        });
    }
    NodeFacts {
        name: node.name.clone(),
        labels: node.labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        annotations: node.annotations.clone(),
        taints: node.taints.iter().map(|k| Taint { key: k.to_string(), ..Taint::default() }).collect(),
        unschedulable: node.unschedulable,
        conditions,
    }
}

/// `t` rounded up to a whole second.
fn ceil_second(t: Timestamp) -> Timestamp {
    let floor = Timestamp::from_second(t.as_second()).unwrap_or(t);
    if floor == t { t } else { Timestamp::from_second(t.as_second() + 1).unwrap_or(t) }
}
