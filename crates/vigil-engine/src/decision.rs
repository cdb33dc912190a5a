//! The one shape of a decision, shared by [`crate::machine`] and [`crate::node`]: what it reads
//! ([`Context`]), what it gives ([`Outputs`]), what decides whether a new remediation may start
//! besides the check's own budget and which one ([`Features`]: back-off, failure domains, pacing,
//! the remediation each incident chose), the order its targets are visited in ([`Pacing`]) and
//! what other checks hold ([`Overlap`]).
//!
//! Both decisions build these parts, visit their targets one by one with them at hand, and
//! finish by handing the features' memory to their status and the outputs to a [`Plan`].
//!
//! What stays different, on purpose:
//! - the status: a MachineHealthCheck decision sets the check's conditions as it goes, each
//!   compared with the previous status (`machine::status::Builder`, which carries the
//!   [`Outputs`]), and writes conditions on every Machine (`MachineWrites`); a NodeHealthCheck
//!   decision rebuilds `unhealthyNodes` Node by Node (`node::objects::Book`) and builds the whole
//!   status once at the end (`node::status::Outcome`);
//! - the gates of one kind only: a Node's last gates (cluster upgrade, planned maintenance, its
//!   Lease, one control-plane Node at a time) and the check's templates and steps
//!   (`node::remediate::Setting`); a Machine's peers (another MachineHealthCheck selecting it)
//!   and its owner as a remediator;
//! - how a target is found in a failure domain (a Node's label, a Machine's failure domain) and
//!   in the back-off's pools, and when it is in flight: each decision works these out and asks
//!   [`Features`] with the answer.

use crate::backoff::{Gate, Ledger};
use crate::domains::Budgets;
use crate::holders::{Holders, Waits};
use crate::pacing::{Pacer, visit_order};
use crate::plan::{Action, Earliest, HeldElsewhere, Notice, ObjectRef, Plan};
use crate::target::{CheckRef, Target};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use vigil_api::conditions::DesiredCondition;
use vigil_api::shared::ChosenRemediation;
use vigil_api::validate::RuleRef;

/// What every step of a decision reads and none changes, so it is passed by value.
#[derive(Clone, Copy)]
pub(crate) struct Context<'a, P> {
    /// The check's validated spec.
    pub(crate) policy: &'a P,
    /// The decision's instant (the engine never reads a clock).
    pub(crate) now: Timestamp,
}

/// What a decision has decided so far: its actions and notices in the order they are made, and
/// the earliest instant it must be made again.
#[derive(Default)]
pub(crate) struct Outputs {
    actions: Vec<Action>,
    notices: Vec<Notice>,
    wake: Earliest,
}

impl Outputs {
    /// Adds an action (applied in this order).
    pub(crate) fn act(&mut self, action: Action) {
        self.actions.push(action);
    }

    /// Adds a notice (told in this order).
    pub(crate) fn tell(&mut self, notice: Notice) {
        self.notices.push(notice);
    }

    /// Adds notices, if any (told in this order).
    pub(crate) fn tell_all(&mut self, notices: impl IntoIterator<Item = Notice>) {
        self.notices.extend(notices);
    }

    /// Asks to decide again at `t` at the latest.
    pub(crate) fn wake_at(&mut self, t: Timestamp) {
        self.wake.offer(t);
    }

    /// The earliest wake-up, for the features that offer instants themselves.
    pub(crate) fn wake(&mut self) -> &mut Earliest {
        &mut self.wake
    }

    /// Where the actions end now, to ask later what was added since.
    pub(crate) fn mark(&self) -> usize {
        self.actions.len()
    }

    /// The objects of `target` this plan gives up (annotates) so far: a next step's create
    /// waits for them.
    pub(crate) fn annotated_for(&self, target: &Target) -> Vec<ObjectRef> {
        self.actions
            .iter()
            .filter_map(|a| match a {
                Action::AnnotateRemediation { object, target: t, .. } if t == target => Some(object.clone()),
                _ => None,
            })
            .collect()
    }

    /// Whether a remediation object was asked for since `mark`.
    pub(crate) fn creates_since(&self, mark: usize) -> bool {
        self.actions[mark..].iter().any(|a| matches!(a, Action::CreateRemediation { .. }))
    }

    /// The plan carrying `status` and everything decided; what it tells other checks, and how
    /// many targets it remediates, are the caller's to add.
    pub(crate) fn plan<S>(self, status: S) -> Plan<S> {
        Plan {
            status,
            actions: self.actions,
            notices: self.notices,
            next_wake: self.wake.0,
            held_elsewhere: Vec::new(),
            short_circuited: false,
            remediating: 0,
        }
    }
}

/// The previous and the new `status.chosenRemediations` (remediation per condition), so an
/// incident keeps the remediation it started with.
pub(crate) struct Choices<'a> {
    previous: &'a [ChosenRemediation],
    chosen: Vec<ChosenRemediation>,
}

impl<'a> Choices<'a> {
    /// The choices of a decision whose previous status listed `previous`.
    pub(crate) fn new(previous: &'a [ChosenRemediation]) -> Self {
        Choices { previous, chosen: Vec::new() }
    }

    /// What the previous status said target `name`'s incident chose.
    pub(crate) fn before(&self, name: &str) -> Option<&'a ChosenRemediation> {
        crate::chosen::previous(self.previous, name)
    }

    /// Records a choice made now ([`crate::chosen::record`]), telling it when it is news.
    pub(crate) fn record(&mut self, (entry, notice): (ChosenRemediation, Option<Notice>), out: &mut Outputs) {
        self.chosen.push(entry);
        out.tell_all(notice);
    }

    /// Keeps target `name`'s choice while its incident goes on without a verdict that chooses
    /// ([`crate::chosen::kept`]): the previous one, else its object's `annotated` rule.
    pub(crate) fn keep<'r>(
        &mut self,
        name: &str,
        annotated: Option<&str>,
        rules: impl Iterator<Item = RuleRef<'r>>,
        remediation: impl FnOnce(usize) -> String,
        now: Timestamp,
    ) {
        let before = self.before(name);
        self.chosen.extend(crate::chosen::kept(name, before, annotated, rules, remediation, now));
    }
}

/// A start the back-off and the pacer let through, to be recorded once it is made.
pub(crate) struct Admitted {
    pool: String,
    name: String,
    /// The back-off counts it (not a repeat of a start already in its history).
    counted: bool,
    /// It is in flight already and keeps its pacing slot.
    in_flight: bool,
}

/// Vigil's features that decide, target by target, whether a new remediation may start and
/// which one: the back-off ([`crate::backoff`]), failure-domain budgets ([`crate::domains`]),
/// pacing ([`crate::pacing`]) and with remediation per condition the incidents' choices
/// ([`crate::chosen`]).
pub(crate) struct Features<'a> {
    ledger: Ledger<'a>,
    pacer: Pacer,
    budgets: Option<&'a Budgets>,
    choices: Option<Choices<'a>>,
}

impl<'a> Features<'a> {
    /// The features of one decision.
    pub(crate) fn new(
        ledger: Ledger<'a>,
        pacer: Pacer,
        budgets: Option<&'a Budgets>,
        choices: Option<Choices<'a>>,
    ) -> Self {
        Features { ledger, pacer, budgets, choices }
    }

    /// Whether failure domain `domain` is paused: nothing new starts there.
    pub(crate) fn domain_paused(&self, domain: Option<&str>) -> bool {
        self.budgets.is_some_and(|b| b.is_paused(domain))
    }

    /// Whether target `name` already started within the back-off's history.
    pub(crate) fn recorded(&self, name: &str) -> bool {
        self.ledger.recorded(name)
    }

    /// Whether target `name` of back-off pool `pool` may start now: the pool's back-off (a
    /// `repeat` is not counted twice), then a free pacing slot unless it is `in_flight` already
    /// (when none is free it joins the queue, unhealthy `since`). Nothing is recorded until
    /// [`Features::start`].
    pub(crate) fn admit(
        &mut self,
        pool: String,
        name: &str,
        repeat: bool,
        since: Timestamp,
        in_flight: bool,
    ) -> Option<Admitted> {
        let gate = self.ledger.gate(&pool, name, repeat);
        if gate == Gate::Wait || (!in_flight && !self.pacer.gate(name, since)) {
            return None;
        }
        Some(Admitted { pool, name: name.to_string(), counted: gate == Gate::Start, in_flight })
    }

    /// Records an admitted start in the back-off's history and the pacing slots.
    pub(crate) fn start(&mut self, admitted: Admitted) {
        if admitted.counted {
            self.ledger.record(&admitted.pool, &admitted.name);
        }
        if !admitted.in_flight {
            self.pacer.record(&admitted.name);
        }
    }

    /// The incidents' choices, with remediation per condition.
    pub(crate) fn choices(&mut self) -> Option<&mut Choices<'a>> {
        self.choices.as_mut()
    }

    /// What the features remember for the status: the back-off's ledger, the pacer and the
    /// choices made (empty without remediation per condition).
    pub(crate) fn finish(self) -> (Ledger<'a>, Pacer, Vec<ChosenRemediation>) {
        (self.ledger, self.pacer, self.choices.map(|c| c.chosen).unwrap_or_default())
    }
}

/// Pacing's view of a decision's targets (`spec.maxInFlight`, see [`crate::pacing`]), so both
/// decisions visit them in queue order: the order, when each that may start became unhealthy
/// (its place in the queue) and whether this check has it in flight already.
pub(crate) struct Pacing {
    /// Indexes into the targets in queue order when paced; `None`: name order.
    order: Option<Vec<usize>>,
    /// Per target (empty when not paced): when it became unhealthy; `None` for the others.
    since: Vec<Option<Timestamp>>,
    /// Per target (empty when not paced, or when nothing is known in flight per target).
    in_flight: Vec<bool>,
}

impl Pacing {
    /// A decision without `maxInFlight`: name order, no queue.
    pub(crate) fn unpaced() -> Self {
        Pacing { order: None, since: Vec::new(), in_flight: Vec::new() }
    }

    /// A paced decision over targets named `names` (in name order) that became unhealthy at
    /// `since` and are `in_flight` (may be empty).
    pub(crate) fn paced<'n>(
        since: Vec<Option<Timestamp>>,
        names: impl Iterator<Item = &'n str>,
        in_flight: Vec<bool>,
    ) -> Self {
        let order = Some(visit_order(true, since.iter().copied().zip(names)));
        Pacing { order, since, in_flight }
    }

    /// The index of the `k`-th target to visit.
    pub(crate) fn nth(&self, k: usize) -> usize {
        self.order.as_ref().map_or(k, |order| order[k])
    }

    /// When target `i` became unhealthy, for its place in the queue; `now` when unpaced.
    pub(crate) fn since(&self, i: usize, now: Timestamp) -> Timestamp {
        self.since.get(i).copied().flatten().unwrap_or(now)
    }

    /// Whether this check has target `i`'s remediation in flight already.
    pub(crate) fn in_flight(&self, i: usize) -> bool {
        self.in_flight.get(i).copied().unwrap_or(false)
    }
}

/// What other checks hold ([`crate::holders`]): a target another check holds is never started
/// here, and the wait is reported.
pub(crate) struct Overlap<'h> {
    holders: &'h Holders,
    waits: Waits,
}

impl<'h> Overlap<'h> {
    /// The overlap seen by check `me`, whose previous conditions are `previous_conditions`.
    pub(crate) fn new(holders: &'h Holders, me: CheckRef, previous_conditions: &[Condition]) -> Self {
        Overlap { holders, waits: Waits::new(me, previous_conditions) }
    }

    /// Whether another check holds `target`; if so, records that `subject` (standing for it in
    /// notices) waits, telling it when it is news.
    pub(crate) fn held_elsewhere(&mut self, subject: Target, target: &Target, out: &mut Outputs) -> bool {
        let holders = self.holders;
        let Some(holder) = holders.other_than(target, self.waits.me()) else { return false };
        out.tell_all(self.waits.wait(subject, target, holder, holders.is_left_to_holder(target)));
        true
    }

    /// The `WaitingForOtherCheck` condition to set, if any.
    pub(crate) fn condition(&self) -> Option<DesiredCondition> {
        self.waits.condition()
    }

    /// The holders to tell that this check waits for them.
    pub(crate) fn into_held_elsewhere(self) -> Vec<HeldElsewhere> {
        self.waits.held_elsewhere
    }
}
