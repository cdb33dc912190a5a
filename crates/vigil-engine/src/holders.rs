//! One check remediates a target at a time: who holds which target, derived from what is
//! observed (remediation objects, Machine conditions, a NodeHealthCheck's in-flight requests),
//! so that a second check selecting the same Node waits instead of remediating it twice.
//!
//! medik8s guarantees the same between NodeHealthChecks with a Lease per Node (holder
//! `NodeHealthCheck-<name>`); Cluster API calls overlapping MachineHealthChecks unsupported.
//! Vigil keeps no lease: the holder is derived from the objects themselves, so it survives a
//! restart and needs no extra write. Across kinds a Machine is identified with its Node, so a
//! MachineHealthCheck of a self-hosted cluster and a NodeHealthCheck meet on the same Node.
//!
//! Usage: every adapter collects [`Claim`]s of every check ([`nhc_claims`], [`mhc_claims`]),
//! builds [`Holders::from_claims`] and passes it to [`crate::node::decide_among`] /
//! [`crate::machine::decide_among`].

use crate::lookup::Lookup;
use crate::peers::MhcPeers;
pub use crate::plan::HeldElsewhere;
use crate::plan::{Notice, NoticeKind};
pub use crate::target::{CheckRef, LOCAL_CLUSTER, Target};
use crate::target::{is_target, made_for};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use std::collections::BTreeMap;
use vigil_api::conditions::ConditionStatus;
use vigil_api::conditions::{DesiredCondition, get_condition};
use vigil_api::reason::Reason;
use vigil_api::validate::MhcPolicy;
use vigil_api::views::{MachineView, RemediationView};
use vigil_api::well_known::{NHC_TIMED_OUT_ANNOTATION, NODE_NAME_ANNOTATION};
use vigil_api::{MachineHealthCheck, NodeHealthCheck};

/// Condition on a check that has a target it would remediate but another check holds.
pub const WAITING_FOR_OTHER_CHECK: &str = "WaitingForOtherCheck";
/// Reason of [`WAITING_FOR_OTHER_CHECK`]`=True`, of the skip notice, and of the holder's event.
pub const REASON_HELD: &str = Reason::TargetHeldByAnotherCheck.as_str();
/// Reason of [`WAITING_FOR_OTHER_CHECK`]`=False` (once it has been True).
pub const REASON_NOT_WAITING: &str = Reason::NoTargetWaiting.as_str();

/// Evidence that a check is remediating a target, and since when (`None`: not known).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The target.
    pub target: Target,
    /// The check remediating it.
    pub check: CheckRef,
    /// When that remediation started.
    pub since: Option<Timestamp>,
}

/// The check that holds a target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The holding check: the one that started first (then the smallest identity).
    pub check: CheckRef,
    /// When its remediation started, if known.
    pub since: Option<Timestamp>,
    /// Other checks that hold it too (a tie, from before this rule or a race): reported, never
    /// resolved by deleting anything. Sorted by the same order as the holder.
    pub also: Vec<CheckRef>,
}

/// Who holds which target.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holders {
    by_target: BTreeMap<Target, Holder>,
    /// Targets held only because the cross-shard rule leaves them to their holder
    /// ([`crate::cross_shard`]): nobody has started on them yet.
    left_to: std::collections::BTreeSet<Target>,
}

/// Orders claims: known start first, earliest first, then by check identity.
fn rank(since: Option<Timestamp>, check: &CheckRef) -> (bool, Option<Timestamp>, &CheckRef) {
    (since.is_none(), since, check)
}

impl Holders {
    /// Nobody holds anything (a world with a single check, or before any claim is known).
    pub fn none() -> Self {
        Self::default()
    }

    /// Derives the holder of every claimed target; a check's claims on one target count once,
    /// from its earliest start.
    pub fn from_claims(claims: impl IntoIterator<Item = Claim>) -> Self {
        let mut per_target: BTreeMap<Target, BTreeMap<CheckRef, Option<Timestamp>>> = BTreeMap::new();
        for c in claims {
            let since = per_target.entry(c.target).or_default().entry(c.check).or_insert(c.since);
            *since = match (*since, c.since) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        let by_target = per_target
            .into_iter()
            .filter_map(|(target, checks)| {
                let mut ranked: Vec<(CheckRef, Option<Timestamp>)> = checks.into_iter().collect();
                ranked.sort_by(|a, b| rank(a.1, &a.0).cmp(&rank(b.1, &b.0)));
                let mut it = ranked.into_iter();
                let (check, since) = it.next()?;
                Some((target, Holder { check, since, also: it.map(|(c, _)| c).collect() }))
            })
            .collect();
        Holders { by_target, left_to: Default::default() }
    }

    /// Leaves `target` to `check` when nobody holds it yet (a started remediation keeps its
    /// holder: the cross-shard rule only decides who may start, [`crate::cross_shard`]).
    pub(crate) fn leave_to(&mut self, target: Target, check: CheckRef) {
        if let std::collections::btree_map::Entry::Vacant(e) = self.by_target.entry(target.clone()) {
            e.insert(Holder { check, since: None, also: Vec::new() });
            self.left_to.insert(target);
        }
    }

    /// Whether `target`'s holder holds it only by the cross-shard rule (has not started on it).
    pub fn is_left_to_holder(&self, target: &Target) -> bool {
        self.left_to.contains(target)
    }

    /// The holder of `target`, if any check holds it.
    pub fn holder(&self, target: &Target) -> Option<&Holder> {
        self.by_target.get(target)
    }

    /// Targets held by more than one check, with their holders (for a warning; nothing is
    /// deleted to resolve them).
    pub fn ties(&self) -> impl Iterator<Item = (&Target, &Holder)> {
        self.by_target.iter().filter(|(_, h)| !h.also.is_empty())
    }

    /// The holder of `target` when it is not `me`.
    pub(crate) fn other_than(&self, target: &Target, me: &CheckRef) -> Option<&Holder> {
        self.holder(target).filter(|h| h.check != *me)
    }
}

fn owned_by_nhc(view: &RemediationView, name: &str, uid: Option<&str>) -> bool {
    view.meta
        .owners
        .iter()
        .any(|o| o.kind == "NodeHealthCheck" && o.name == name && (o.uid.is_empty() || uid.is_none_or(|u| u == o.uid)))
}

/// What a NodeHealthCheck holds: the Node of each remediation object it owns that it has not
/// given up on (no `nhc-timed-out` annotation; one being deleted still holds, its remediator is
/// still at work), and each request of its status not seen as an object yet (no uid, not timed
/// out). `remediations` may hold anyone's objects; only the check's own count.
pub fn nhc_claims(check: &NodeHealthCheck, remediations: &[&RemediationView]) -> Vec<Claim> {
    let me = CheckRef::of_nhc(check);
    nhc_held(check, remediations)
        .map(|(node, since)| Claim { target: Target::local_node(node), check: me.clone(), since })
        .collect()
}

/// The Nodes a NodeHealthCheck holds, each with when its remediation started (see
/// [`nhc_claims`]); a Node may come more than once. The one reading of "held" for the overlap
/// rule and for pacing ([`crate::pacing`]).
pub(crate) fn nhc_held<'a>(
    check: &'a NodeHealthCheck,
    remediations: &'a [&'a RemediationView],
) -> impl Iterator<Item = (&'a str, Option<Timestamp>)> {
    let name = check.metadata.name.as_deref().unwrap_or("");
    let uid = check.metadata.uid.as_deref().filter(|u| !u.is_empty());
    let objects = remediations
        .iter()
        .filter(move |r| owned_by_nhc(r, name, uid) && !r.meta.annotations.contains_key(NHC_TIMED_OUT_ANNOTATION))
        .filter_map(|r| Some((r.meta.annotations.get(NODE_NAME_ANNOTATION)?.as_str(), r.meta.created)));
    let requests = check.status.iter().flat_map(|s| &s.unhealthy_nodes).flat_map(|entry| {
        entry
            .remediations
            .iter()
            .filter(|r| r.resource.uid.is_none() && r.timed_out.is_none())
            .map(move |r| (entry.name.as_str(), Some(r.started.0)))
    });
    objects.chain(requests)
}

/// What a MachineHealthCheck holds: each target Machine's Node (or the Machine, without one)
/// when the owner was asked to remediate it (`OwnerRemediated=False`, for a check without a
/// template), or, for a check with a template, when its remediation object exists (named after
/// the Machine and owned by it) or was just requested (`ExternallyRemediated=False` while the
/// Machine is unhealthy); with remediation per condition a rule's template counts as the check's.
/// `node_cluster` is where the check's Nodes live ([`LOCAL_CLUSTER`] for a self-hosted cluster);
/// `remediations` are the objects of each of `MhcPolicy::templates`' kinds in the check's
/// namespace, by name (as `MhcInput::remediations`).
pub fn mhc_claims(
    check: &MachineHealthCheck,
    policy: &MhcPolicy,
    node_cluster: &str,
    machines: &[&MachineView],
    remediations: &[&dyn Lookup<RemediationView>],
) -> Vec<Claim> {
    mhc_claims_among(check, policy, &MhcPeers::none(), node_cluster, machines, remediations)
}

/// [`mhc_claims`] among other MachineHealthChecks: a Machine whose conditions another check owns
/// ([`crate::peers`]) is not claimed, since its `OwnerRemediated` was written by that check.
pub fn mhc_claims_among(
    check: &MachineHealthCheck,
    policy: &MhcPolicy,
    peers: &MhcPeers<'_>,
    node_cluster: &str,
    machines: &[&MachineView],
    remediations: &[&dyn Lookup<RemediationView>],
) -> Vec<Claim> {
    let me = CheckRef::of_mhc(check);
    let owners = peers.owners_for(&me);
    let namespace = check.metadata.namespace.as_deref().unwrap_or("default");
    let mut claims = Vec::new();
    // The request is looked for first: few Machines have one, and finding the owner among the
    // namespace's checks is the costly part (the order of these tests changes no answer).
    for m in machines.iter().filter(|m| m.meta.namespace == namespace) {
        if let Some(since) = mhc_request(policy, m, remediations)
            && is_target(policy, m)
            && owners.other_than_me(m).is_none()
        {
            claims.push(Claim { target: Target::of_machine(node_cluster, m), check: me.clone(), since });
        }
    }
    claims
}

/// Whether a MachineHealthCheck's remediation request stands on Machine `m`, and since when
/// (`Some(None)`: since an unknown time): `OwnerRemediated=False` for a check without a template;
/// for a check with one, or with a rule that names its own (remediation per condition), a
/// remediation object of one of `remediations`' kinds (named after the Machine and owned by it) or
/// a request just made (`ExternallyRemediated=False/WaitingForRemediation` while
/// `HealthCheckSucceeded=False`). The one reading of "requested" for the overlap rule and for
/// pacing ([`crate::pacing`]).
pub(crate) fn mhc_request(
    policy: &MhcPolicy,
    m: &MachineView,
    remediations: &[&dyn Lookup<RemediationView>],
) -> Option<Option<Timestamp>> {
    // The owner is asked only by a check without a template of its own; objects are made
    // from the check's template or, with remediation per condition, a rule's.
    let owner = policy
        .remediation_template
        .is_none()
        .then(|| m.owner_remediated().filter(|c| c.status == ConditionStatus::False).map(|c| c.last_transition_time))
        .flatten();
    let external = policy.remediation_template.is_some() || policy.per_rule_remediation();
    let object = external
        .then(|| remediations.iter().find_map(|l| l.lookup(&m.meta.name).filter(|o| made_for(o, m))))
        .flatten()
        .map(|o| o.meta.created);
    let unhealthy = || m.health_check_succeeded().is_some_and(|c| c.status == ConditionStatus::False);
    let requested = m
        .externally_remediated()
        .filter(|c| {
            external
                && c.status == ConditionStatus::False
                && c.reason.as_deref() == Some(Reason::WaitingForRemediation.as_str())
                && unhealthy()
        })
        .map(|c| c.last_transition_time);
    owner.or(object).or(requested)
}

/// Collects one decision's waits, and turns them into notices, the condition and the holder
/// events. A wait is news when the previous condition did not already list it.
pub(crate) struct Waits {
    me: CheckRef,
    previous: Vec<String>,
    was_present: bool,
    phrases: Vec<String>,
    /// The holder events for news.
    pub(crate) held_elsewhere: Vec<HeldElsewhere>,
}

impl Waits {
    pub(crate) fn new(me: CheckRef, previous_conditions: &[Condition]) -> Self {
        let prev = get_condition(previous_conditions, WAITING_FOR_OTHER_CHECK);
        let previous = prev
            .filter(|c| c.status == ConditionStatus::True)
            .map(|c| c.message.split("; ").map(str::to_string).collect())
            .unwrap_or_default();
        Waits { me, previous, was_present: prev.is_some(), phrases: Vec::new(), held_elsewhere: Vec::new() }
    }

    /// The waiting check.
    pub(crate) fn me(&self) -> &CheckRef {
        &self.me
    }

    /// Records that `notice_target` (standing for `target`) waits for `holder`; returns the skip
    /// notice for the waiting check when the wait is news.
    /// `left_to`: the holder has not started, the cross-shard rule leaves the target to it.
    pub(crate) fn wait(
        &mut self,
        notice_target: Target,
        target: &Target,
        holder: &Holder,
        left_to: bool,
    ) -> Option<Notice> {
        let phrase = if left_to {
            format!("{target} is left to {}, the first of the checks in different shards selecting it", holder.check)
        } else {
            format!("{target} is being remediated by {}", holder.check)
        };
        let news = !self.previous.contains(&phrase);
        let notice = news.then(|| {
            let message = format!("{phrase}; {} waits", self.me);
            self.held_elsewhere.push(HeldElsewhere {
                holder: holder.check.clone(),
                waiter: self.me.clone(),
                target: notice_target.clone(),
                reason: Reason::TargetHeldByAnotherCheck,
                message: message.clone(),
            });
            Notice {
                kind: NoticeKind::RemediationSkipped,
                target: Some(notice_target),
                reason: Reason::TargetHeldByAnotherCheck,
                message,
            }
        });
        self.phrases.push(phrase);
        notice
    }

    /// The condition to set: True while something waits, False once it has been present, none
    /// for a check that never waited (so checks without overlap show nothing new).
    pub(crate) fn condition(&self) -> Option<DesiredCondition> {
        if !self.phrases.is_empty() {
            Some(DesiredCondition::true_(
                WAITING_FOR_OTHER_CHECK,
                Reason::TargetHeldByAnotherCheck,
                self.phrases.join("; "),
            ))
        } else if self.was_present {
            Some(DesiredCondition::false_(
                WAITING_FOR_OTHER_CHECK,
                Reason::NoTargetWaiting,
                "No target of this check is held by another check",
            ))
        } else {
            None
        }
    }
}

/// Whether a check's conditions say it waits for another check: such a check is concerned by
/// every remediation object and Machine change (any may release the target it waits for).
pub fn is_waiting(conditions: &[Condition]) -> bool {
    get_condition(conditions, WAITING_FOR_OTHER_CHECK).is_some_and(|c| c.status == ConditionStatus::True)
}
