//! Every condition and event reason Vigil writes, each spelled once. Reasons are part of the
//! contract with operators (alerts and dashboards match them) and with Cluster API (its owners
//! read `HealthCheckSucceeded` / `OwnerRemediated` reasons), so code names them through this type
//! and never through a literal: renaming one is a change here that every user sees.

use serde::{Serialize, Serializer};

macro_rules! reasons {
    ($( $(#[$doc:meta])* $variant:ident = $text:literal, )*) => {
        /// A condition or event reason; [`Reason::Rule`] is the one that is not a fixed word.
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Reason {
            $( $(#[$doc])* $variant, )*
            /// A NodeHealthCheck rule a Node broke, spelled `Type=Status` (medik8s' event reason).
            Rule(String),
        }

        impl Reason {
            /// A reason read back from an API object: the fixed one of that spelling, else the
            /// text as [`Reason::Rule`] (what another writer put there is kept, never refused).
            pub fn read(text: &str) -> Reason {
                match text {
                    $( $text => Reason::$variant, )*
                    other => Reason::Rule(other.to_string()),
                }
            }

            /// Every fixed reason, for tests and documentation.
            pub const ALL: &[Reason] = &[$( Reason::$variant, )*];

            /// The API spelling.
            pub const fn as_str(&self) -> &str {
                match self {
                    $( Reason::$variant => $text, )*
                    Reason::Rule(text) => text.as_str(),
                }
            }
        }
    };
}

reasons! {
    // MachineHealthCheck: `HealthCheckSucceeded=False` reasons, as Cluster API v1beta2 names them.
    /// A Node condition matched for longer than its timeout.
    UnhealthyNode = "UnhealthyNode",
    /// A Machine condition matched for longer than its timeout.
    UnhealthyMachine = "UnhealthyMachine",
    /// No Node joined within `nodeStartupTimeout`.
    NodeStartupTimeout = "NodeStartupTimeout",
    /// The Machine's Node was deleted.
    NodeDeleted = "NodeDeleted",
    /// The user asked for remediation with the annotation.
    HasRemediateAnnotation = "HasRemediateAnnotation",
    /// The Machine reports a terminal failure.
    MachineHasFailure = "MachineHasFailure",
    /// The Machine passed every check (`HealthCheckSucceeded=True`).
    HealthCheckSucceeded = "HealthCheckSucceeded",
    /// `OwnerRemediated` / `ExternallyRemediated` is waiting for the remediator.
    WaitingForRemediation = "WaitingForRemediation",
    /// The remediation template does not exist.
    RemediationTemplateNotFound = "RemediationTemplateNotFound",
    /// The remediation object could not be built (template without `spec.template`).
    RemediationRequestCreationFailed = "RemediationRequestCreationFailed",
    /// The MachineHealthCheck's short-circuit tripped.
    TooManyUnhealthy = "TooManyUnhealthy",
    /// Remediation is allowed.
    RemediationAllowed = "RemediationAllowed",
    /// The Cluster of the check was not found.
    ClusterNotFound = "ClusterNotFound",
    /// The workload cluster's API could not be reached.
    WorkloadClusterUnreachable = "WorkloadClusterUnreachable",
    /// The check is paused (also the NodeHealthCheck phase's reason while pause requests exist).
    Paused = "Paused",
    /// The check is not paused.
    NotPaused = "NotPaused",
    /// The check was resumed.
    Resumed = "Resumed",
    /// A target matched its rules and cleared again `flapping.episodes` times within the window
    /// (both kinds).
    Flapping = "Flapping",
    /// A target matched an `unhealthyExpressions` rule for its duration (both kinds).
    ExpressionMatched = "ExpressionMatched",
    // NodeHealthCheck.
    /// The NodeHealthCheck's short-circuit tripped: fewer healthy Nodes than `minHealthy`.
    TooFewHealthy = "TooFewHealthy",
    /// The NodeHealthCheck waits for its storm cool-down to pass.
    StormCooldown = "StormCooldown",
    /// A remediation template lacks what an object is made from.
    RemediationTemplateInvalid = "RemediationTemplateInvalid",
    /// A remediation step timed out and the next one starts.
    RemediationTimedOut = "RemediationTimedOut",
    /// Every remediation step was tried; nothing is left.
    NoTemplateLeft = "NoTemplateLeft",
    /// A matching condition has no `lastTransitionTime`: no decision for its Node.
    MissingLastTransitionTime = "MissingLastTransitionTime",
    /// An `unhealthyExpressions` expression could not be evaluated for a Node: no decision.
    ExpressionUnknown = "ExpressionUnknown",
    /// A Node that was unhealthy is healthy again.
    NodeHealthy = "NodeHealthy",
    /// Every template was found and is valid (`Disabled=False`).
    Enabled = "Enabled",
    /// Another control-plane Node is being remediated.
    ControlPlaneRemediationInProgress = "ControlPlaneRemediationInProgress",
    /// A remediation object of the name this check would use belongs to someone else.
    RemediationObjectExists = "RemediationObjectExists",
    /// Another holder (the node maintenance operator, another check) holds the Node's Lease.
    NodeLeaseHeld = "NodeLeaseHeld",
    /// The Node is under planned maintenance (a `NodeMaintenance`, a drain that says so).
    NodeUnderMaintenance = "NodeUnderMaintenance",
    /// The Node's planned maintenance ended a short while ago (`plannedMaintenance.grace`).
    MaintenanceGrace = "MaintenanceGrace",
    /// Whether the Node is under maintenance cannot be read: nothing new starts.
    MaintenanceUnknown = "MaintenanceUnknown",
    /// The cluster is being upgraded: nothing new starts.
    ClusterUpgrading = "ClusterUpgrading",
    /// Whether the cluster is being upgraded cannot be read: nothing new starts.
    UpgradeStateUnknown = "UpgradeStateUnknown",
    /// Nothing postpones new remediations (`RemediationPostponed=False`).
    NotPostponed = "NotPostponed",
    /// A remediation object is being deleted and its remediator still holds it (finalizer).
    RemediatorFinishing = "RemediatorFinishing",
    /// The Node's Lease was held past three step timeouts: the step is given up.
    NodeLeaseOverdue = "NodeLeaseOverdue",
    /// The Node's OpenShift Machine, which owns its remediation objects, cannot be read (not
    /// listed yet, or not found): no object is made without its owner.
    NodeMachineUnknown = "NodeMachineUnknown",
    // Features of both kinds.
    /// A pool is backed off.
    RemediationBackoff = "RemediationBackoff",
    /// No pool is backed off (`RemediationBackoff=False`).
    NoPoolBackedOff = "NoPoolBackedOff",
    /// A pool's back-off ended.
    RemediationBackoffEnded = "RemediationBackoffEnded",
    /// Dry-run: a target would be remediated now.
    WouldRemediate = "WouldRemediate",
    /// A matching condition's reporter stopped heartbeating.
    StaleCondition = "StaleCondition",
    /// Remediation per condition: the rule that started a target's incident chose its remediation.
    RemediationChosen = "RemediationChosen",
    /// Another MachineHealthCheck writes the conditions of some of this check's Machines.
    OverlappingMachineHealthChecks = "OverlappingMachineHealthChecks",
    /// No Machine of this check is selected by an older check.
    NoOverlap = "NoOverlap",
    /// A target is held by another check.
    TargetHeldByAnotherCheck = "TargetHeldByAnotherCheck",
    /// More than one check holds a target (a tie, reported; nothing is deleted to resolve it).
    TargetHeldByMoreThanOneCheck = "TargetHeldByMoreThanOneCheck",
    /// No target waits for another check any more.
    NoTargetWaiting = "NoTargetWaiting",
    /// Every failure domain is within its budget.
    WithinBudget = "WithinBudget",
    /// A failure domain went over its budget.
    FailureDomainShortCircuit = "FailureDomainShortCircuit",
    /// Failure domains are within their budget again.
    FailureDomainResumed = "FailureDomainResumed",
    /// Targets wait for a remediation slot (`maxInFlight`); also told when one joins the queue.
    RemediationQueued = "RemediationQueued",
    /// No target waits for a remediation slot (`RemediationQueued=False`).
    NoRemediationQueued = "NoRemediationQueued",
    /// A target left the remediation queue (its remediation started, or it no longer waits).
    RemediationDequeued = "RemediationDequeued",
    // The controller's own.
    /// A source is not listed completely yet, or its watch failed: no decision.
    WaitingForCaches = "WaitingForCaches",
    /// The spec cannot be read or validated: no decision.
    InvalidSpec = "InvalidSpec",
    /// `vigil run --serve-medik8s`: the NodeHealthCheck operator runs, so Vigil does not decide
    /// medik8s' checks (two controllers would remediate the same Nodes).
    OperatorRunning = "NodeHealthCheckOperatorRunning",
    /// `vigil run --serve-medik8s`: a `vigil.dev` NodeHealthCheck of the same name is served instead.
    NameTakenByVigilCheck = "NameTakenByVigilCheck",
    /// A Node field could not be read.
    UnreadableCondition = "UnreadableCondition",
    /// Another check waits for a target this check holds.
    OtherCheckWaiting = "OtherCheckWaiting",
    /// A remediation object was created.
    RemediationCreated = "RemediationCreated",
    /// A remediation object was removed.
    RemediationRemoved = "RemediationRemoved",
    /// Creating a remediation object failed.
    RemediationFailed = "RemediationFailed",
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl AsRef<str> for Reason {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl From<Reason> for String {
    fn from(r: Reason) -> String {
        r.as_str().to_string()
    }
}

impl Serialize for Reason {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl PartialEq<str> for Reason {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Reason {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for Reason {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<Reason> for str {
    fn eq(&self, other: &Reason) -> bool {
        self == other.as_str()
    }
}

impl PartialEq<Reason> for String {
    fn eq(&self, other: &Reason) -> bool {
        self == other.as_str()
    }
}

#[cfg(test)]
mod tests {
    /// A fixed reason's spelling is usable where a constant `&str` is wanted.
    const TOO_FEW: &str = Reason::TooFewHealthy.as_str();

    use super::*;

    #[test]
    fn every_reason_is_spelled_once() {
        assert_eq!(TOO_FEW, "TooFewHealthy");
        let mut seen = std::collections::BTreeSet::new();
        for r in Reason::ALL {
            assert!(seen.insert(r.as_str()), "{r} is spelled twice");
            assert_eq!(&Reason::read(r.as_str()), r, "{r} reads back as itself");
            assert!(r.as_str().chars().next().is_some_and(|c| c.is_ascii_uppercase()), "{r} is not CamelCase");
        }
    }
}
