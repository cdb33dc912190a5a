//! Visiting the subjects of pass 2 one by one, each with its previous status entry: a Node that
//! matches no rule recovers, an unhealthy one is started or escalated, an undecided one is noted,
//! a deleted or deselected one loses its objects; and the Nodes listed before that are gone.

use super::Pass;
use crate::decision::Pacing;
use crate::node::gates::{Wait, maintenance_wait};
use crate::node::judge::{Finding, Subject, rule_text};
use crate::node::objects::{Book, Owned};
use crate::plan::{Notice, NoticeKind};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use vigil_api::duration::format_go_duration;
use vigil_api::node_health_check::UnhealthyNode;
use vigil_api::reason::Reason;
use vigil_api::validate::{ConditionRule, ExpressionRule, NhcPolicy};
use vigil_api::views::NodeView;
use vigil_api::well_known::EXCLUDE_FROM_REMEDIATION_LABEL;

/// Remediate (pass 2): each subject in `pacing`'s order (name order unless paced), with its
/// previous status entry — start, escalate, recover or clean up — giving the new `unhealthyNodes`
/// (by name) and the Nodes that could not be judged (by name).
impl<'a> Pass<'a> {
    pub(in crate::node) fn remediate(
        &mut self,
        subjects: &[Subject<'a>],
        owned: &[Owned<'a>],
        prev_entries: &[&'a UnhealthyNode],
        all: &[&'a NodeView],
        healthy_at: &[bool],
        pacing: &Pacing,
    ) -> (Vec<UnhealthyNode>, Vec<(&'a str, usize)>) {
        // A listed Node that is not a subject any more and is healthy now has recovered.
        let recovered = |name: &str| {
            all.binary_search_by(|n| n.name.as_str().cmp(name)).is_ok_and(|i| healthy_at[i]).then(|| {
                Notice::about_node(
                    NoticeKind::Healthy,
                    name,
                    Reason::NodeHealthy,
                    format!("Node {name} is healthy and has no remediation objects left"),
                )
            })
        };
        let matched = match_previous(subjects, prev_entries);
        let mut entries: Vec<Option<UnhealthyNode>> = (0..subjects.len()).map(|_| None).collect();
        let mut undecided: Vec<(&str, usize)> = Vec::new();
        for k in 0..subjects.len() {
            let i = pacing.nth(k);
            for e in &prev_entries[matched.gone_before[i].clone()] {
                self.out.tell_all(recovered(&e.name));
            }
            let s = &subjects[i];
            let since = pacing.since(i, self.cx.now);
            entries[i] = self.subject(s, &owned[s.objs.clone()], matched.prev_of[i], &mut undecided, since);
        }
        for e in &prev_entries[matched.gone_before[subjects.len()].clone()] {
            self.out.tell_all(recovered(&e.name));
        }
        undecided.sort_by_key(|(name, _)| *name);
        (entries.into_iter().flatten().collect(), undecided)
    }
}

/// The previous entries walked alongside the subjects (both by name): each subject's own, and
/// the entries of Nodes that are no subject any more, placed before the subject that follows
/// them (the last range: after every subject).
struct Matched<'a> {
    prev_of: Vec<Option<&'a UnhealthyNode>>,
    gone_before: Vec<std::ops::Range<usize>>,
}

fn match_previous<'a>(subjects: &[Subject<'_>], prev_entries: &[&'a UnhealthyNode]) -> Matched<'a> {
    let mut prev_of = Vec::with_capacity(subjects.len());
    let mut gone_before = Vec::with_capacity(subjects.len() + 1);
    let mut p = 0usize;
    for s in subjects {
        let start = p;
        while p < prev_entries.len() && prev_entries[p].name.as_str() < s.name {
            p += 1;
        }
        gone_before.push(start..p);
        prev_of.push(match prev_entries.get(p) {
            Some(e) if e.name == s.name => {
                p += 1;
                Some(*e)
            }
            _ => None,
        });
    }
    gone_before.push(p..prev_entries.len());
    Matched { prev_of, gone_before }
}

impl<'a> Pass<'a> {
    /// One subject: a Node that matches no rule any more recovers, an unhealthy one is started or
    /// escalated (unless excluded by label), an undecided one is noted, a deleted or deselected
    /// one loses its objects. Its entry when it stays listed.
    fn subject(
        &mut self,
        s: &Subject<'a>,
        objs: &[Owned<'a>],
        prev_entry: Option<&'a UnhealthyNode>,
        undecided: &mut Vec<(&'a str, usize)>,
        since: Timestamp,
    ) -> Option<UnhealthyNode> {
        let mut book = Book::new(objs, prev_entry, self.cx.now);
        let mut healthy_since = None;
        let mut delayed = false;
        let mut chose = false;
        self.waiting.before = prev_entry.and_then(|e| e.waiting.as_ref());
        self.waiting.now = None;
        let mark = self.out.mark();
        let listed = match (s.verdict, s.node) {
            (Some(Finding::Clear), Some(node)) => {
                // a subject that matches no rule still has objects (pass 1 kept only those)
                let (since, wait) = self.recover(node, objs, prev_entry);
                healthy_since = Some(Time(since));
                delayed = wait;
                !objs.is_empty()
            }
            (Some(verdict @ (Finding::Unhealthy(_) | Finding::Expression(_))), Some(node)) => {
                if prev_entry.is_none() {
                    self.tell_unhealthy(s, node, verdict);
                }
                let incident = self.incident(s.name, objs, verdict);
                chose = true;
                let maintenance = self.gates.maintenance(node, self.waiting.before, self.out.wake());
                if let Some(wait) = maintenance_wait(s.name, &maintenance) {
                    self.hold(s.name, wait, NoticeKind::RemediationPostponed);
                }
                if !excluded(node) {
                    if objs.is_empty() {
                        self.start(s.name, node, prev_entry.is_some(), &mut book, &incident, since);
                    } else {
                        self.escalate(s.name, node, objs, &mut book, &incident);
                    }
                }
                true
            }
            (Some(verdict), _) => {
                if let Finding::Undecided(rule) = verdict {
                    undecided.push((s.name, rule));
                }
                !objs.is_empty()
            }
            (None, _) => {
                // Deleted or no longer selected: nothing will watch this Node for the check.
                self.delete_all(objs, true);
                !objs.is_empty()
            }
        };
        if listed && !chose {
            self.keep_choice(s.name, objs);
        }
        if self.waiting.now.is_none() && !objs.is_empty() && objs.iter().all(|o| o.view.meta.deleting) {
            self.waiting.now = Some(finishing(objs));
        }
        // The Lease stays while a remediation of this check is live (an object or a request not
        // given up); once every step gave up, nobody remediates the Node and it is released.
        if self.out.creates_since(mark) || book.records.iter().any(|r| r.timed_out.is_none()) {
            self.keep_leases.push(s.name);
        }
        let waiting = self.waiting.now.take().map(|w| w.entry(self.waiting.before, self.cx.now));
        listed.then(|| UnhealthyNode {
            name: s.name.to_string(),
            remediations: book.finish(),
            conditions_healthy_timestamp: healthy_since,
            healthy_delayed: delayed.then_some(true),
            waiting,
        })
    }
}

impl Pass<'_> {
    /// Tells that a subject is newly found unhealthy: by which rule or expression, or flapping.
    fn tell_unhealthy(&mut self, s: &Subject<'_>, node: &NodeView, verdict: Finding) {
        let policy = self.cx.policy;
        let notice = match (s.flaps, verdict) {
            (Some(count), _) => Some(flapping_notice(policy, count, s.name)),
            (None, Finding::Unhealthy(rule)) => policy.conditions.get(rule).map(|r| unhealthy_notice(node, r, s.name)),
            (None, Finding::Expression(i)) => policy.expressions.get(i).map(|r| expression_notice(r, s.name)),
            _ => None,
        };
        if let Some(notice) = notice {
            self.out.tell(notice);
        }
    }
}

/// The `Unhealthy` notice of a Node newly found unhealthy by an expression: which one, written
/// where, and for how long it has held.
fn expression_notice(rule: &ExpressionRule, name: &str) -> Notice {
    Notice::about_node(
        NoticeKind::Unhealthy,
        name,
        Reason::ExpressionMatched,
        format!(
            "Node {name} has matched expression {}.expression ({}) for {} or more",
            rule.path,
            rule.expression.source(),
            format_go_duration(rule.duration)
        ),
    )
}

/// The wait of a Node whose remediation objects are all being deleted: their remediators still
/// hold them (finalizers) while they finish, fencing included, so the Node still counts as
/// remediated, in every budget, until they are gone.
fn finishing(objs: &[Owned<'_>]) -> Wait {
    let names: Vec<String> =
        objs.iter().map(|o| format!("{} {}/{}", o.view.meta.kind, o.view.meta.namespace, o.view.meta.name)).collect();
    Wait {
        reason: Reason::RemediatorFinishing,
        message: format!(
            "waiting for the remediator to finish: {} {} being deleted and still held by its remediator",
            names.join(", "),
            if names.len() == 1 { "is" } else { "are" }
        ),
        until: None,
    }
}

/// The `Unhealthy` notice of a Node newly found unhealthy by `rule`; the condition's reason says
/// what broke, as upstream's messages do.
fn unhealthy_notice(node: &NodeView, rule: &ConditionRule, name: &str) -> Notice {
    let why = node
        .conditions
        .iter()
        .find(|c| crate::stale::matches(c, rule))
        .and_then(|c| c.reason.as_deref())
        .filter(|reason| !reason.is_empty())
        .map_or_else(String::new, |reason| format!(" with reason {reason}"));
    Notice::about_node(
        NoticeKind::Unhealthy,
        name,
        Reason::Rule(rule_text(rule)),
        format!(
            "Node {name} has had condition {}{why} for more than {}",
            rule_text(rule),
            format_go_duration(rule.timeout)
        ),
    )
}

/// The `Flapping` notice of a Node newly found unhealthy for flapping: how many episodes within
/// which window.
fn flapping_notice(policy: &NhcPolicy, count: usize, name: &str) -> Notice {
    let window = policy.flapping.map_or_else(String::new, |f| format_go_duration(f.window));
    Notice::about_node(
        NoticeKind::Flapping,
        name,
        Reason::Flapping,
        format!(
            "Node {name} is flapping: its conditions matched a rule and cleared again {count} times within {window}"
        ),
    )
}

/// Whether `node` opted out of remediation (its exclude label set to `true`).
fn excluded(node: &NodeView) -> bool {
    node.labels.get(EXCLUDE_FROM_REMEDIATION_LABEL).is_some_and(|v| v == "true")
}
