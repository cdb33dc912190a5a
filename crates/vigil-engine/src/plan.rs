//! What the engine asks for: the check's new status, the writes to make, the notices to tell the
//! operator, and when to look again.

use crate::target::{CheckRef, Target};
use jiff::{SignedDuration, Timestamp};
use serde::Serialize;
use serde_json::Value;
use vigil_api::conditions::{ConditionStatus, DesiredCondition};
use vigil_api::reason::Reason;
use vigil_api::views::CapiVersion;
use vigil_api::well_known::{HEALTH_CHECK_SUCCEEDED, OWNER_REMEDIATED};

/// Identifies an object the plan acts on.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    /// apiVersion.
    pub api_version: String,
    /// Kind.
    pub kind: String,
    /// Namespace (empty for cluster-scoped objects).
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl ObjectRef {
    /// The target a Machine's reference stands for in plans: that Machine (see [`Target`]).
    pub fn machine_target(&self) -> Target {
        Target::Machine { namespace: self.namespace.clone(), name: self.name.clone() }
    }
}

impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind, self.name)
        } else {
            write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// The object a write is about as its decision saw it: the write is carried out only while the
/// object is still that one, at that version (delete preconditions, a `resourceVersion` in the
/// patch), so it changes nothing when it lands after the object changed (docs/DECISIONS.md,
/// "Writes that land late").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    /// `metadata.uid` (none: the object did not come from an API server).
    pub uid: Option<String>,
    /// `metadata.resourceVersion`.
    pub resource_version: Option<String>,
}

impl Seen {
    /// What the decision saw of the object `meta` describes.
    pub fn of(meta: &vigil_api::views::Meta) -> Seen {
        Seen { uid: meta.uid.clone(), resource_version: meta.resource_version.clone() }
    }
}

/// A node Lease as a write makes it ([`crate::node_lease`]): created when `resource_version` is
/// `None` (refused by the API server if it exists), else an update of that version (refused if
/// anyone changed it since), so two writers never both believe they took it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseWrite {
    /// The lease namespace.
    pub namespace: String,
    /// `node-<name>`.
    pub name: String,
    /// `spec.holderIdentity`.
    pub holder: String,
    /// `spec.leaseDurationSeconds`.
    pub duration_seconds: i64,
    /// `spec.acquireTime` (microseconds, as stored).
    pub acquire_time: Timestamp,
    /// `spec.renewTime` (microseconds, as stored).
    pub renew_time: Timestamp,
    /// `spec.leaseTransitions`.
    pub transitions: i64,
    /// The Node it is for; its owner (the Lease goes with the Node).
    pub node: String,
    /// The Node's uid, for the owner reference (none without it).
    pub node_uid: Option<String>,
    /// The version an update is made against; `None`: create.
    pub resource_version: Option<String>,
    /// The uid of the Lease an update replaces.
    pub uid: Option<String>,
}

impl LeaseWrite {
    /// The Lease as the API takes it (`MicroTime` with six digits).
    pub fn manifest(&self) -> Value {
        let micro = |t: Timestamp| {
            let whole = jiff::fmt::strtime::format("%Y-%m-%dT%H:%M:%S", t).unwrap_or_default();
            format!("{whole}.{:06}Z", t.subsec_nanosecond() / 1_000)
        };
        let mut metadata = serde_json::json!({"name": self.name, "namespace": self.namespace});
        if let Some(uid) = &self.node_uid {
            metadata["ownerReferences"] =
                serde_json::json!([{"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": uid}]);
        }
        if let Some(rv) = &self.resource_version {
            metadata["resourceVersion"] = Value::String(rv.clone());
        }
        serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": self.holder,
                "leaseDurationSeconds": self.duration_seconds,
                "acquireTime": micro(self.acquire_time),
                "renewTime": micro(self.renew_time),
                "leaseTransitions": self.transitions,
            }
        })
    }
}

/// One write. Actions are idempotent: applying a plan twice changes nothing the second time.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Set these conditions on a Machine (only the ones that differ from what it carries);
    /// see [`crate::machine_write`] for how each API form stores them.
    SetMachineConditions {
        /// The Machine.
        machine: ObjectRef,
        /// Its API form.
        version: CapiVersion,
        /// Conditions with the transition time to write.
        conditions: Vec<(DesiredCondition, Timestamp)>,
    },
    /// Create a remediation object (a full manifest; `metadata.generateName` may stand for
    /// the name).
    CreateRemediation {
        /// The manifest.
        object: Value,
        /// The target it remediates (a MachineHealthCheck's Machine, a NodeHealthCheck's Node).
        target: Target,
        /// The Node's Lease to take (or renew) first; when that write fails the object is not
        /// created (a NodeHealthCheck's; see [`crate::node_lease`]).
        lease: Option<LeaseWrite>,
        /// The previous steps' objects this plan gives up (their [`Action::AnnotateRemediation`]):
        /// the object is created only once the API server has written every one of those
        /// annotations, so that two steps of one Node are never live at once. Every adapter
        /// obeys this order; a refused annotation means no create.
        after: Vec<ObjectRef>,
    },
    /// Delete a remediation object (only if it is still the one seen, at that version).
    DeleteRemediation {
        /// The object.
        object: ObjectRef,
        /// The target it remediated.
        target: Target,
        /// What the decision saw of it: the delete's preconditions.
        seen: Seen,
    },
    /// Renew a Node's Lease this check holds while its remediation runs (see
    /// [`crate::node_lease`]).
    WriteLease(LeaseWrite),
    /// Release a Node's Lease this check holds (delete it, only if still that version).
    DeleteLease {
        /// The Lease.
        lease: ObjectRef,
        /// Its uid and version: the delete's preconditions.
        uid: Option<String>,
        /// Its `resourceVersion`.
        resource_version: Option<String>,
        /// The Node it is for.
        node: String,
    },
    /// Add an annotation to a remediation object (medik8s' `nhc-timed-out`).
    AnnotateRemediation {
        /// The object.
        object: ObjectRef,
        /// The Node it remediates.
        target: Target,
        /// Annotation key.
        key: String,
        /// Annotation value.
        value: String,
        /// What the decision saw of it: the patch is refused once the object changed.
        seen: Seen,
    },
}

impl Action {
    /// The objects whose annotation must be written before this action is sent
    /// ([`Action::CreateRemediation`]'s `after`; none for every other action).
    pub fn after(&self) -> &[ObjectRef] {
        match self {
            Action::CreateRemediation { after, .. } => after,
            _ => &[],
        }
    }

    /// The name of the target (Machine or Node) or object the action is about, without namespace.
    pub fn target_name(&self) -> &str {
        match self {
            Action::CreateRemediation { target, .. } | Action::DeleteRemediation { target, .. } => target.name(),
            Action::SetMachineConditions { machine, .. } => machine.name.as_str(),
            Action::AnnotateRemediation { object, .. } => object.name.as_str(),
            Action::WriteLease(lease) => lease.node.as_str(),
            Action::DeleteLease { node, .. } => node.as_str(),
        }
    }

    /// The target this action remediates (asks to be repaired), if it does: a Machine marked
    /// unhealthy (`HealthCheckSucceeded=False`) or for its owner's remediation
    /// (`OwnerRemediated=False`), or the target of a remediation object. Adapters confirm these
    /// before they send them; no other action needs it.
    pub fn remediates(&self) -> Option<Target> {
        match self {
            Action::SetMachineConditions { machine, conditions, .. } => conditions
                .iter()
                .any(|(c, _)| {
                    c.status == ConditionStatus::False
                        && (c.type_ == HEALTH_CHECK_SUCCEEDED || c.type_ == OWNER_REMEDIATED)
                })
                .then(|| machine.machine_target()),
            Action::CreateRemediation { target, .. } => Some(target.clone()),
            Action::DeleteRemediation { .. }
            | Action::WriteLease(_)
            | Action::DeleteLease { .. }
            | Action::AnnotateRemediation { .. } => None,
        }
    }
}

/// What an operator is told (an Event in the controller, a line in the simulator).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum NoticeKind {
    /// A target was found unhealthy.
    Unhealthy,
    /// The owner was asked to remediate (`OwnerRemediated=False`).
    RemediationRequested,
    /// A remediation object was created (reported by the applier once it exists).
    RemediationCreated,
    /// A remediation object was deleted (reported by the applier once it is gone).
    RemediationDeleted,
    /// Creating a remediation object failed (reported by the applier; it is retried).
    RemediationFailed,
    /// Another check waits for a target this check remediates (reported to the holder by the
    /// controller from [`Plan::held_elsewhere`]).
    OtherCheckWaiting,
    /// A remediation step timed out or failed and the next one starts.
    RemediationTimedOut,
    /// Every remediation step was tried; nothing is left.
    NoTemplateLeft,
    /// Remediation could not be requested for a target (template missing or invalid, …).
    RemediationSkipped,
    /// The short-circuit stopped remediation.
    RemediationBlocked,
    /// The short-circuit allows remediation again.
    RemediationAllowed,
    /// A target that was unhealthy is healthy again.
    Healthy,
    /// The check was paused.
    Paused,
    /// The check was resumed.
    Resumed,
    /// Vigil could not read what it needs and made no decision (safety first).
    NoDecision,
    /// A check in dry-run would remediate this target now (and did nothing).
    WouldRemediate,
    /// A matching Node condition of this target was set aside: its reporter stopped heartbeating
    /// for longer than the rule's `maxConditionAge` (see [`crate::stale`]).
    StaleCondition,
    /// Another MachineHealthCheck writes the conditions of some of this check's Machines (see
    /// [`crate::peers`]); told when the set of such Machines changes.
    MachinesSelectedByAnotherCheck,
    /// A pool started `maxRemediations` remediations within the back-off window and one of its
    /// targets has to wait (see [`crate::backoff`]).
    RemediationBackoff,
    /// A pool is no longer backed off: none of its targets waits any more.
    RemediationBackoffEnded,
    /// Failure domains went over their budget: no new remediation starts there (see
    /// [`crate::domains`]).
    FailureDomainShortCircuit,
    /// Failure domains are within their budget again.
    FailureDomainResumed,
    /// The rule that started a target's incident chose its remediation (remediation per
    /// condition, see [`crate::chosen`]); told once per incident.
    RemediationChosen,
    /// A target waits for a remediation slot (`spec.maxInFlight`, see [`crate::pacing`]).
    RemediationQueued,
    /// A target left the remediation queue: a slot is free for it, or it no longer waits.
    RemediationDequeued,
    /// New remediations wait: the cluster is being upgraded, or a Node is under planned
    /// maintenance (see [`crate::upgrade`], [`crate::maintenance`]).
    RemediationPostponed,
    /// New remediations may start again after an upgrade or a Node's maintenance.
    RemediationResumed,
    /// A target was found unhealthy for flapping (see [`crate::flapping`]).
    Flapping,
}

impl NoticeKind {
    /// Every kind, for tests that must cover them all (a new kind fails to compile in
    /// [`NoticeKind::event_reason`] until it has a reason, and in this module's test of the list).
    pub const ALL: [NoticeKind; 28] = [
        NoticeKind::Unhealthy,
        NoticeKind::RemediationRequested,
        NoticeKind::RemediationCreated,
        NoticeKind::RemediationDeleted,
        NoticeKind::RemediationFailed,
        NoticeKind::OtherCheckWaiting,
        NoticeKind::RemediationTimedOut,
        NoticeKind::NoTemplateLeft,
        NoticeKind::RemediationSkipped,
        NoticeKind::RemediationBlocked,
        NoticeKind::RemediationAllowed,
        NoticeKind::Healthy,
        NoticeKind::Paused,
        NoticeKind::Resumed,
        NoticeKind::NoDecision,
        NoticeKind::WouldRemediate,
        NoticeKind::StaleCondition,
        NoticeKind::MachinesSelectedByAnotherCheck,
        NoticeKind::RemediationBackoff,
        NoticeKind::RemediationBackoffEnded,
        NoticeKind::FailureDomainShortCircuit,
        NoticeKind::FailureDomainResumed,
        NoticeKind::RemediationChosen,
        NoticeKind::RemediationQueued,
        NoticeKind::RemediationDequeued,
        NoticeKind::RemediationPostponed,
        NoticeKind::RemediationResumed,
        NoticeKind::Flapping,
    ];

    /// The reason an operator reads, in the controller's Events and in the simulator's output
    /// alike: Cluster API's and medik8s' own reasons where they have one, so alerts and
    /// dashboards written for upstream keep working.
    pub fn event_reason(self, check: &CheckRef) -> &'static str {
        let machine = matches!(check, CheckRef::Machine { .. });
        match self {
            NoticeKind::Unhealthy if machine => "MachineMarkedUnhealthy",
            NoticeKind::Unhealthy => "DetectedUnhealthy",
            NoticeKind::RemediationRequested => "RemediationRequested",
            NoticeKind::RemediationCreated => "RemediationCreated",
            NoticeKind::RemediationDeleted => "RemediationRemoved",
            NoticeKind::RemediationTimedOut => "RemediationTimedOut",
            NoticeKind::NoTemplateLeft => "NoTemplateLeft",
            NoticeKind::RemediationSkipped => "RemediationSkipped",
            NoticeKind::RemediationBlocked => "RemediationRestricted",
            NoticeKind::RemediationAllowed => "RemediationAllowed",
            NoticeKind::Healthy if machine => "MachineHealthy",
            NoticeKind::Healthy => "NodeHealthy",
            NoticeKind::Paused => "Paused",
            NoticeKind::Resumed => "Resumed",
            NoticeKind::NoDecision => "NoDecision",
            NoticeKind::WouldRemediate => "WouldRemediate",
            NoticeKind::StaleCondition => "StaleCondition",
            NoticeKind::MachinesSelectedByAnotherCheck => "MachinesSelectedByAnotherCheck",
            NoticeKind::RemediationFailed => "RemediationFailed",
            NoticeKind::OtherCheckWaiting => "OtherCheckWaiting",
            NoticeKind::RemediationBackoff => "RemediationBackoff",
            NoticeKind::RemediationBackoffEnded => "RemediationBackoffEnded",
            NoticeKind::FailureDomainShortCircuit => "FailureDomainShortCircuit",
            NoticeKind::FailureDomainResumed => "FailureDomainResumed",
            NoticeKind::RemediationChosen => "RemediationChosen",
            NoticeKind::RemediationQueued => "RemediationQueued",
            NoticeKind::RemediationDequeued => "RemediationDequeued",
            // medik8s tells an upgrade's postponement as a skipped remediation.
            NoticeKind::RemediationPostponed => "RemediationSkipped",
            NoticeKind::RemediationResumed => "RemediationResumed",
            NoticeKind::Flapping => "Flapping",
        }
    }

    /// Whether this calls for an operator's attention (a Warning event).
    pub fn is_warning(self) -> bool {
        matches!(
            self,
            NoticeKind::Unhealthy
                | NoticeKind::Flapping
                | NoticeKind::NoTemplateLeft
                | NoticeKind::RemediationSkipped
                | NoticeKind::RemediationBlocked
                | NoticeKind::RemediationTimedOut
                | NoticeKind::NoDecision
                | NoticeKind::MachinesSelectedByAnotherCheck
                | NoticeKind::RemediationFailed
                | NoticeKind::OtherCheckWaiting
                | NoticeKind::RemediationBackoff
                | NoticeKind::FailureDomainShortCircuit
                | NoticeKind::StaleCondition
        )
    }
}

/// One notice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Notice {
    /// What happened.
    pub kind: NoticeKind,
    /// The target concerned, if any (serialized as its [`Target::key`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<Target>,
    /// Machine-readable reason (a condition reason where there is one).
    pub reason: Reason,
    /// What happened and why, for a person.
    pub message: String,
}

impl Notice {
    /// A notice about a Node of the cluster Vigil runs in (what a NodeHealthCheck's are about).
    pub(crate) fn about_node(kind: NoticeKind, node: &str, reason: Reason, message: String) -> Notice {
        Notice { kind, target: Some(Target::local_node(node)), reason, message }
    }

    /// The target as plans have always written it ([`Target::key`]): what the simulator's
    /// output and the tests compare.
    pub fn target_key(&self) -> Option<String> {
        self.target.as_ref().map(Target::key)
    }
}

/// The engine's answer for one check.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan<S> {
    /// The check's status as it should be; write it only if it differs.
    pub status: S,
    /// Writes to make, in order.
    pub actions: Vec<Action>,
    /// What to tell the operator.
    pub notices: Vec<Notice>,
    /// The earliest instant at which a verdict can change without any object changing; `None`
    /// when only a change to some object can change a verdict.
    pub next_wake: Option<Timestamp>,
    /// Targets this check started waiting for, to tell their holders (an event on the holding
    /// check); see [`crate::holders`].
    pub held_elsewhere: Vec<HeldElsewhere>,
    /// Whether the check-wide short-circuit (`maxUnhealthy`, `unhealthyRange`, `minHealthy`, the
    /// storm cool-down) stops remediation now: adapters report it (a gauge) without reading
    /// reasons back out of the status.
    pub short_circuited: bool,
    /// Targets whose remediation is under way once this plan is written (a gauge and the
    /// dashboard show it): for a MachineHealthCheck, the ones it writes that carry
    /// `OwnerRemediated=False` or have a remediation object made for them, observed or asked for
    /// by this plan; for a NodeHealthCheck, the unhealthy Nodes its status lists with
    /// remediation objects. In dry-run only what was observed; 0 while the check is paused or
    /// decides nothing.
    pub remediating: usize,
}

impl<S> Plan<S> {
    /// The plan that decides nothing: `status` as it stands, nothing written, told or woken for.
    pub fn unchanged(status: S) -> Self {
        Plan {
            status,
            actions: Vec::new(),
            notices: Vec::new(),
            next_wake: None,
            held_elsewhere: Vec::new(),
            short_circuited: false,
            remediating: 0,
        }
    }

    /// The object a notice is about: for a [`NoticeKind::RemediationTimedOut`], the object of its
    /// target this plan gives up (annotates); every adapter tells it with the notice.
    pub fn given_up_object(&self, notice: &Notice) -> Option<&ObjectRef> {
        if notice.kind != NoticeKind::RemediationTimedOut {
            return None;
        }
        self.actions.iter().find_map(|a| match a {
            Action::AnnotateRemediation { object, target, .. } if notice.target.as_ref() == Some(target) => {
                Some(object)
            }
            _ => None,
        })
    }
}

/// The smallest step of time: a verdict due at `deadline` changes at `deadline + 1ns`.
pub(crate) const ONE_NS: SignedDuration = SignedDuration::from_nanos(1);

/// `t + d`, or `None` beyond the representable range (that instant never comes).
pub(crate) fn after(t: Timestamp, d: SignedDuration) -> Option<Timestamp> {
    t.checked_add(d).ok()
}

/// A count as the status' `int32` (a count past it reads as the largest).
pub(crate) fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Tracks the earliest of several wake-up times.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Earliest(pub Option<Timestamp>);

impl Earliest {
    pub(crate) fn offer(&mut self, t: Timestamp) {
        self.0 = Some(match self.0 {
            Some(cur) if cur <= t => cur,
            _ => t,
        });
    }
}

/// Told to the holder of a target when another check starts waiting for it (an event on the
/// holding check; the waiting check gets a [`NoticeKind::RemediationSkipped`] notice).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HeldElsewhere {
    /// The holding check, which the event is about.
    pub holder: CheckRef,
    /// The waiting check.
    pub waiter: CheckRef,
    /// The target, as in notices.
    pub target: Target,
    /// [`Reason::TargetHeldByAnotherCheck`].
    pub reason: Reason,
    /// For a person: which target, held by whom, who waits.
    pub message: String,
}

impl HeldElsewhere {
    /// The notice the holding check publishes, the same in every adapter: the controller's
    /// Event on the holder and the simulator's line say the same words.
    pub fn notice(&self) -> Notice {
        Notice {
            kind: NoticeKind::OtherCheckWaiting,
            target: Some(self.target.clone()),
            reason: self.reason.clone(),
            message: self.message.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Exhaustive: a new kind does not compile here until it is named, and then fails until
    /// it is in [`NoticeKind::ALL`].
    fn in_all(kind: NoticeKind) -> bool {
        match kind {
            NoticeKind::Unhealthy
            | NoticeKind::RemediationRequested
            | NoticeKind::RemediationCreated
            | NoticeKind::RemediationDeleted
            | NoticeKind::RemediationFailed
            | NoticeKind::OtherCheckWaiting
            | NoticeKind::RemediationTimedOut
            | NoticeKind::NoTemplateLeft
            | NoticeKind::RemediationSkipped
            | NoticeKind::RemediationBlocked
            | NoticeKind::RemediationAllowed
            | NoticeKind::Healthy
            | NoticeKind::Paused
            | NoticeKind::Resumed
            | NoticeKind::NoDecision
            | NoticeKind::WouldRemediate
            | NoticeKind::StaleCondition
            | NoticeKind::MachinesSelectedByAnotherCheck
            | NoticeKind::RemediationBackoff
            | NoticeKind::RemediationBackoffEnded
            | NoticeKind::FailureDomainShortCircuit
            | NoticeKind::FailureDomainResumed
            | NoticeKind::RemediationChosen
            | NoticeKind::RemediationQueued
            | NoticeKind::RemediationDequeued
            | NoticeKind::RemediationPostponed
            | NoticeKind::RemediationResumed
            | NoticeKind::Flapping => NoticeKind::ALL.contains(&kind),
        }
    }

    #[test]
    fn every_kind_is_listed_once_and_has_a_reason_per_check_kind() {
        let machine = CheckRef::Machine { namespace: "ns".into(), name: "m".into() };
        let node = CheckRef::Node { name: "n".into() };
        let mut seen = std::collections::BTreeSet::new();
        for kind in NoticeKind::ALL {
            assert!(in_all(kind) && seen.insert(kind), "{kind:?} listed twice");
            for check in [&machine, &node] {
                let reason = kind.event_reason(check);
                assert!(!reason.is_empty() && reason.chars().all(char::is_alphanumeric), "{kind:?}: {reason:?}");
            }
        }
        assert_eq!(NoticeKind::Unhealthy.event_reason(&machine), "MachineMarkedUnhealthy");
        assert_eq!(NoticeKind::Unhealthy.event_reason(&node), "DetectedUnhealthy");
        assert_eq!(NoticeKind::RemediationBlocked.event_reason(&node), "RemediationRestricted");
    }
}
