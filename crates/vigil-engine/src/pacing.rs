//! Pacing (`spec.maxInFlight`): at most N remediations of a check in flight at once; the other
//! unhealthy targets wait in the order they became unhealthy, the longest-unhealthy first. It is
//! not a short-circuit: `maxUnhealthy` / `minHealthy` stop everything when too much is broken,
//! pacing only spreads repair out when a short-circuit lifts or a wave of failures arrives, so
//! twenty Machines are not replaced in the same second. Done in the engine so `vigil simulate`,
//! `vigil check` and `vigil run` pace alike.
//!
//! What is in flight is derived from the objects, never remembered, so a restart loses nothing:
//! a target this check holds (its remediation request or object, as [`crate::holders`] derives
//! it for the overlap rule) that is not healthy again. Other checks' remediations do not count.
//! The decision asks this gate last, after every other rule let a start through (short-circuit,
//! failure domains, other checks, the pool's back-off, one control-plane Node at a time), and it
//! visits the targets in queue order ([`visit_order`]), so the queue is exactly the targets that
//! would start now but for the limit, and every first-come rule serves the longest-unhealthy
//! target first.

use crate::plan::{Notice, NoticeKind};
use crate::target::Target;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use vigil_api::conditions::{DesiredCondition, get_condition};
use vigil_api::reason::Reason;
use vigil_api::shared::QueuedTarget;
use vigil_api::threshold::{IntOrPercent, Rounding};

/// Type of the check condition that says who waits for a remediation slot.
pub const CONDITION: &str = "RemediationQueued";
/// How many queued targets a status lists (the count is always exact).
pub const LISTED: usize = 100;
/// How many queued targets a condition message names.
const NAMED: usize = 10;

/// The most remediations in flight at once among `targets` targets: a count as written; a
/// percentage rounded down (the safe direction), but at least 1, since pacing slows repair and
/// never stops it (stopping is the short-circuit's job).
pub fn limit(max: IntOrPercent, targets: usize) -> u64 {
    match max {
        IntOrPercent::Count(n) => u64::from(n),
        IntOrPercent::Percent(_) => max.scaled(targets, Rounding::Down).max(1),
    }
}

/// The order a decision visits its targets in, given each target's unhealthy-since (`None`: not
/// a candidate) and name in the decision's name order. Paced: the unhealthy ones first, the
/// longest-unhealthy first and ties by name, then the others in the given order; not paced: the
/// given order, so a check without `maxInFlight` decides exactly as before.
pub(crate) fn visit_order<'n>(paced: bool, keys: impl Iterator<Item = (Option<Timestamp>, &'n str)>) -> Vec<usize> {
    let keys: Vec<(Option<Timestamp>, &str)> = keys.collect();
    let mut order: Vec<usize> = (0..keys.len()).collect();
    if paced {
        order.sort_by(|&a, &b| {
            let (ka, kb) = (&keys[a], &keys[b]);
            (ka.0.is_none(), ka.0, ka.1, a).cmp(&(kb.0.is_none(), kb.0, kb.1, b))
        });
    }
    order
}

/// The pacing slots of one decision: how many remediations are in flight, who started now, who
/// waits.
pub(crate) struct Pacer {
    max: Option<IntOrPercent>,
    limit: Option<u64>,
    /// The targets in flight before this decision, by name.
    in_flight: Vec<String>,
    /// The targets taken down on purpose that hold a slot (`voluntaryDisruptions: Count`), by
    /// name, none of them in `in_flight`.
    disrupted: Vec<String>,
    started: Vec<String>,
    queue: Vec<(String, Timestamp)>,
}

impl Pacer {
    /// `max` of the policy (`None`: no pacing) among `targets` targets; `in_flight`: the targets
    /// this check is remediating already.
    pub(crate) fn new(max: Option<IntOrPercent>, targets: usize, mut in_flight: Vec<String>) -> Self {
        in_flight.sort();
        Pacer {
            max,
            limit: max.map(|m| limit(m, targets)),
            in_flight,
            disrupted: Vec::new(),
            started: Vec::new(),
            queue: Vec::new(),
        }
    }

    /// The pacer with the targets taken down on purpose each holding a slot, as a remediation in
    /// flight does (`voluntaryDisruptions: Count`); one already in flight holds one slot.
    pub(crate) fn with_disrupted(mut self, names: impl IntoIterator<Item = String>) -> Self {
        if self.limit.is_none() {
            return self;
        }
        let mut disrupted: Vec<String> =
            names.into_iter().filter(|n| self.in_flight.binary_search(n).is_err()).collect();
        disrupted.sort();
        disrupted.dedup();
        self.disrupted = disrupted;
        self
    }

    /// No pacing at all (the check has no `maxInFlight`, or starts nothing in this decision).
    pub(crate) fn off() -> Self {
        Pacer::new(None, 0, Vec::new())
    }

    /// How many remediations are in flight now: before this decision and started in it.
    fn busy(&self) -> u64 {
        (self.in_flight.len() + self.disrupted.len() + self.started.len()) as u64
    }

    /// Whether a remediation of `name`, unhealthy since `since`, may start now: a slot is free.
    /// When none is, `name` joins the queue; the decision visits its targets in queue order, so
    /// the queue is in order. [`Pacer::record`] the start once it is asked for.
    pub(crate) fn gate(&mut self, name: &str, since: Timestamp) -> bool {
        let Some(limit) = self.limit else { return true };
        // a target taken down on purpose holds its slot already
        if self.busy() < limit || self.disrupted.binary_search_by(|d| d.as_str().cmp(name)).is_ok() {
            return true;
        }
        self.queue.push((name.to_string(), since));
        false
    }

    /// Records a remediation started now (after [`Pacer::gate`] let it through).
    pub(crate) fn record(&mut self, name: &str) {
        if self.limit.is_some() && self.disrupted.binary_search_by(|d| d.as_str().cmp(name)).is_err() {
            self.started.push(name.to_string());
        }
    }

    /// The report of this decision: the queue for the status (the first [`LISTED`]), its exact
    /// length, the `RemediationQueued` condition and the notices of targets that joined or left
    /// the queue since `previous` (the previous status' list). `key` gives a target's notice key
    /// and how a message names it.
    pub(crate) fn report(
        self,
        previous: &[QueuedTarget],
        previous_conditions: &[Condition],
        key: impl Fn(&str) -> (Target, String),
    ) -> PacingReport {
        let count = i32::try_from(self.queue.len()).unwrap_or(i32::MAX);
        let queued: Vec<QueuedTarget> = self
            .queue
            .iter()
            .take(LISTED)
            .enumerate()
            .map(|(i, (name, since))| QueuedTarget {
                name: name.clone(),
                unhealthy_since: Time(*since),
                position: i32::try_from(i + 1).unwrap_or(i32::MAX),
            })
            .collect();
        let notices = self.notices(previous, &queued, &key);
        let condition = self.condition(previous_conditions, &key);
        PacingReport { queued, count, condition, notices }
    }

    /// `RemediationQueued`: True naming the first waiting targets, False once nothing waits (if
    /// it was ever set); removed without `maxInFlight`.
    fn condition(&self, previous_conditions: &[Condition], key: &impl Fn(&str) -> (Target, String)) -> Change {
        let (Some(max), Some(limit)) = (self.max, self.limit) else { return Change::Remove };
        if self.queue.is_empty() {
            return match get_condition(previous_conditions, CONDITION) {
                Some(_) => Change::Set(DesiredCondition::false_(
                    CONDITION,
                    Reason::NoRemediationQueued,
                    "No target waits for a remediation slot",
                )),
                None => Change::Keep,
            };
        }
        let next = self.queue.iter().map(|(name, since)| format!("{} (unhealthy since {since})", key(name).0.key()));
        let mut busy: Vec<&String> = self.in_flight.iter().chain(&self.disrupted).chain(&self.started).collect();
        busy.sort();
        Change::Set(DesiredCondition::true_(
            CONDITION,
            Reason::RemediationQueued,
            format!(
                "{} target(s) wait for a remediation slot: {} of {limit} in flight (maxInFlight {max}{}): {}; next: {}",
                self.queue.len(),
                self.busy(),
                self.disrupted_phrase(),
                named(busy.into_iter().map(|name| key(name).0.key())),
                named(next)
            ),
        ))
    }

    /// `, 2 of them taken down on purpose`, or nothing.
    fn disrupted_phrase(&self) -> String {
        match self.disrupted.len() {
            0 => String::new(),
            n => format!(", {n} of them taken down on purpose"),
        }
    }

    /// A notice for each listed target that was not listed before, and one for each target that
    /// was listed before and waits no more.
    fn notices(
        &self,
        previous: &[QueuedTarget],
        queued: &[QueuedTarget],
        key: &impl Fn(&str) -> (Target, String),
    ) -> Vec<Notice> {
        let mut notices = Vec::new();
        let in_flight = self.busy();
        for q in queued.iter().filter(|q| !previous.iter().any(|p| p.name == q.name)) {
            let (target, what) = key(&q.name);
            notices.push(Notice {
                kind: NoticeKind::RemediationQueued,
                target: Some(target),
                reason: Reason::RemediationQueued,
                message: format!(
                    "{what} waits for a remediation slot: {in_flight} of {} in flight (maxInFlight {}); it is number {} in the queue, unhealthy since {}",
                    self.limit.unwrap_or(0),
                    self.max.map_or_else(String::new, |m| m.to_string()),
                    q.position,
                    q.unhealthy_since.0
                ),
            });
        }
        for p in previous.iter().filter(|p| !self.queue.iter().any(|(name, _)| *name == p.name)) {
            let (target, what) = key(&p.name);
            let why = if self.started.contains(&p.name) {
                "a remediation slot is free for it"
            } else {
                "it no longer waits for a remediation slot (healthy again, no longer a target, or held back by another rule)"
            };
            notices.push(Notice {
                kind: NoticeKind::RemediationDequeued,
                target: Some(target),
                reason: Reason::RemediationDequeued,
                message: format!("{what} left the remediation queue: {why}"),
            });
        }
        notices
    }
}

/// The first [`NAMED`] of `names`, then how many more.
fn named(names: impl ExactSizeIterator<Item = String>) -> String {
    let total = names.len();
    let mut out: Vec<String> = names.take(NAMED).collect();
    if total > NAMED {
        out.push(format!("and {} more", total - NAMED));
    }
    out.join(", ")
}

/// What to do with a condition.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Change {
    /// Set it to this.
    Set(DesiredCondition),
    /// Leave it as it is (absent stays absent).
    Keep,
    /// Take it out (the feature is off).
    Remove,
}

/// What pacing reports in one decision.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PacingReport {
    /// `status.queued`: the first [`LISTED`] waiting targets, next first.
    pub(crate) queued: Vec<QueuedTarget>,
    /// `status.queuedCount`: how many wait.
    pub(crate) count: i32,
    /// The `RemediationQueued` condition.
    pub(crate) condition: Change,
    /// Targets that joined or left the queue.
    pub(crate) notices: Vec<Notice>,
}

impl Change {
    /// Applies the change to a list of conditions.
    pub(crate) fn apply(&self, conditions: &mut Vec<Condition>, now: Timestamp, generation: Option<i64>) {
        match self {
            Change::Set(c) => vigil_api::conditions::set_condition(conditions, c, now, generation),
            Change::Keep => {}
            Change::Remove => conditions.retain(|c| c.type_ != CONDITION),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_900_000_000 + secs).expect("in range")
    }

    /// A percentage rounds down, with a floor of 1; a count is taken as written.
    #[test]
    fn limits_round_down_with_a_floor_of_one() {
        let table = [
            (IntOrPercent::Count(2), 10, 2),
            (IntOrPercent::Count(5), 2, 5),
            (IntOrPercent::Percent(25), 10, 2),
            (IntOrPercent::Percent(25), 12, 3),
            (IntOrPercent::Percent(10), 5, 1),
            (IntOrPercent::Percent(1), 0, 1),
            (IntOrPercent::Percent(100), 7, 7),
            (IntOrPercent::Percent(50), 3, 1),
        ];
        for (max, targets, want) in table {
            assert_eq!(limit(max, targets), want, "{max} of {targets}");
        }
    }

    /// Paced: unhealthy first, oldest first, ties by name; the rest after, in the given order.
    #[test]
    fn the_visit_order_is_the_queue_order_when_paced_and_the_given_order_otherwise() {
        let keys = [(None, "a"), (Some(at(30)), "b"), (Some(at(10)), "d"), (None, "e"), (Some(at(10)), "c")];
        assert_eq!(visit_order(true, keys.iter().copied()), [4, 2, 1, 0, 3]);
        assert_eq!(visit_order(false, keys.iter().copied()), [0, 1, 2, 3, 4]);
    }

    /// The slots: at most `limit - in_flight` pass, a gate that passed but is not recorded gives
    /// its slot to the next, and every other candidate is queued in visit order.
    #[test]
    fn the_gate_lets_through_the_free_slots_and_queues_the_rest() {
        let mut p = Pacer::new(Some(IntOrPercent::Count(3)), 10, vec!["z".into()]);
        assert!(p.gate("a", at(1)));
        p.record("a");
        assert!(p.gate("b", at(2))); // let through, but its request could not be made
        assert!(p.gate("c", at(3)));
        p.record("c");
        assert!(!p.gate("d", at(4)));
        assert!(!p.gate("e", at(5)));
        let r = p.report(&[], &[], |n| (Target::local_node(n), format!("Node {n}")));
        assert_eq!(r.count, 2);
        assert_eq!(r.queued.iter().map(|q| (q.name.as_str(), q.position)).collect::<Vec<_>>(), [("d", 1), ("e", 2)]);
        let Change::Set(c) = r.condition else { panic!("{:?}", r.condition) };
        assert_eq!(
            c.message,
            "2 target(s) wait for a remediation slot: 3 of 3 in flight (maxInFlight 3): a, c, z; next: \
             d (unhealthy since 2030-03-17T17:46:44Z), e (unhealthy since 2030-03-17T17:46:45Z)"
        );
        // No pacing: every gate passes, nothing is reported and the condition goes.
        let mut off = Pacer::new(None, 10, vec!["z".into()]);
        assert!(off.gate("a", at(1)));
        assert_eq!(off.report(&[], &[], |n| (Target::local_node(n), n.into())).condition, Change::Remove);
    }

    /// Joining and leaving are told once, from the previous list; the condition turns False once
    /// the queue empties and is not created on a check that never queued.
    #[test]
    fn notices_follow_the_previous_list() {
        let key = |n: &str| (Target::local_node(n), format!("Node {n}"));
        let mut p = Pacer::new(Some(IntOrPercent::Count(1)), 4, Vec::new());
        assert!(p.gate("a", at(1)));
        p.record("a");
        assert!(!p.gate("b", at(2)));
        let first = p.report(&[], &[], key);
        assert_eq!(first.notices.len(), 1);
        assert_eq!(
            (first.notices[0].kind, first.notices[0].target.as_ref().map(Target::key).as_deref()),
            (NoticeKind::RemediationQueued, Some("b"))
        );
        // Same again: nothing new.
        let mut p = Pacer::new(Some(IntOrPercent::Count(1)), 4, vec!["a".into()]);
        assert!(!p.gate("b", at(2)));
        assert!(p.report(&first.queued, &[], key).notices.is_empty());
        // b starts: it leaves the queue, with a free slot.
        let mut p = Pacer::new(Some(IntOrPercent::Count(1)), 4, Vec::new());
        assert!(p.gate("b", at(2)));
        p.record("b");
        let conditions = vec![Condition {
            type_: CONDITION.into(),
            status: "True".into(),
            reason: "RemediationQueued".into(),
            message: String::new(),
            last_transition_time: Time(at(0)),
            observed_generation: None,
        }];
        let r = p.report(&first.queued, &conditions, key);
        assert_eq!(r.notices.len(), 1);
        assert_eq!(r.notices[0].kind, NoticeKind::RemediationDequeued);
        assert!(r.notices[0].message.contains("a remediation slot is free for it"), "{}", r.notices[0].message);
        assert!(matches!(&r.condition, Change::Set(c) if c.reason == Reason::NoRemediationQueued));
        // A check that never queued gets no condition.
        let p = Pacer::new(Some(IntOrPercent::Count(1)), 4, Vec::new());
        assert_eq!(p.report(&[], &[], key).condition, Change::Keep);
    }
}
