//! What the engine asks for: the check's new status, the writes to make, the notices to tell the
//! operator, and when to look again.

use crate::target::CheckRef;
use jiff::Timestamp;
use serde::Serialize;
use serde_json::Value;
use vigil_api::conditions::DesiredCondition;
use vigil_api::reason::Reason;
use vigil_api::views::CapiVersion;

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

impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind, self.name)
        } else {
            write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
        }
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
        /// The target (Machine `namespace/name` or Node name) it remediates.
        target: String,
    },
    /// Delete a remediation object.
    DeleteRemediation {
        /// The object.
        object: ObjectRef,
        /// The target it remediated.
        target: String,
    },
    /// Add an annotation to a remediation object (medik8s' `nhc-timed-out`).
    AnnotateRemediation {
        /// The object.
        object: ObjectRef,
        /// Annotation key.
        key: String,
        /// Annotation value.
        value: String,
    },
}

impl Action {
    /// The name of the target (Machine or Node) or object the action is about, without namespace.
    pub fn target_name(&self) -> &str {
        match self {
            Action::CreateRemediation { target, .. } | Action::DeleteRemediation { target, .. } => {
                target.rsplit('/').next().unwrap_or(target)
            }
            Action::SetMachineConditions { machine, .. } => machine.name.as_str(),
            Action::AnnotateRemediation { object, .. } => object.name.as_str(),
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
}

impl NoticeKind {
    /// Whether this calls for an operator's attention (a Warning event).
    pub fn is_warning(self) -> bool {
        matches!(
            self,
            NoticeKind::Unhealthy
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
    /// The target concerned (Machine `namespace/name` or Node name), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Machine-readable reason (a condition reason where there is one).
    pub reason: Reason,
    /// What happened and why, for a person.
    pub message: String,
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
    /// The target (Machine `namespace/name` or Node name, as in notices).
    pub target: String,
    /// [`Reason::TargetHeldByAnotherCheck`].
    pub reason: Reason,
    /// For a person: which target, held by whom, who waits.
    pub message: String,
}
